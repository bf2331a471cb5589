"""One job on a trainer: the child process, its lease renewals, and fencing.

The rule that keeps two copies of a job off one GPU lives in :class:`LeaseKeeper`: the child
starts only after the first renewal is granted and is killed (SIGKILL, its whole process
group) the moment the keeper's deadline passes without a newer grant - before the lease
can lapse in the placements group and the job be placed elsewhere.  A trainer cut off from
every coordinator therefore stops its job by itself, and the child's watchdog
(:mod:`meshd.train.watchdog`), told every new deadline, stops it even if the trainer is
frozen.  Handing a job back (cancel, drain-migrate) is graceful: SIGTERM, ``STOP_GRACE``
seconds to checkpoint and exit, then SIGKILL; the lease is renewed until the child is gone.

The child's stdout is read line by line: a JSON object with ``step``, ``loss``, ``progress``,
``checkpoint`` or ``message`` is progress (sent with the next renewal); ``{"comm": {op,
seconds, bytes, ...}}`` is a collective's timing (published in the node's signals, and fed
back into placement: :mod:`meshd.train.links`); every line also goes to
``<data dir>/jobs/<id>/attempt-<n>.log``.

**Gangs.**  A job over several nodes runs one rank per node, each under this node's part of
the lease.  The rank learns its place from its environment (``MESHD_RANK``,
``MESHD_NNODES``, ``MESHD_RING``: the nodes in ring order, ``MESHD_RING_ADDRS``,
``MESHD_COMM_PORT``; and torchrun's ``MASTER_ADDR``, ``MASTER_PORT``, ``NODE_RANK``,
``NNODES``).  When one rank's part ends other than ``done`` or lapses, the others' renewals
say ``stop`` and their ranks are stopped gracefully too.  A rank (or any job) that exits with
``EXIT_RETRY`` (75, EX_TEMPFAIL: a peer vanished, say) is placed again to resume from its
last checkpoint rather than failed; that counts as a lost attempt (``MAX_ATTEMPTS``).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from opentelemetry.trace import Tracer

from adapters.model import CommStats
from consensus.group import ConsensusError
from meshd.signals.deltas import comm_from
from meshd.train.leases import LeaseKeeper
from meshd.train.logs import log_path
from meshd.train.scheduler import parts_of
from meshd.train.spans import JobSpans
from proto.mesh.v1 import state_pb2

log = logging.getLogger("meshd.train")

POLL = 0.05
"""Seconds between deadline checks: how late past its deadline a job can be killed."""
RETRY = 0.5
"""Seconds between renewal attempts that failed for want of a quorum or leader."""
STOP_GRACE = 10.0
"""Seconds a job handed back (cancel, drain-migrate) gets between SIGTERM and SIGKILL."""
EXIT_RETRY = 75
"""Exit code (EX_TEMPFAIL) by which a job asks to run again rather than fail."""
COMM_PORT_BASE = 20000
COMM_PORT_SPAN = 150
"""A gang's ranks listen on ``COMM_PORT_BASE + (token % COMM_PORT_SPAN) * 64 + rank``: ports
that differ between gangs sharing a host (unless their tokens are 150 apart) and stay below
the usual ephemeral range."""


class JobHost(Protocol):
    """What a job run needs of the trainer that started it (:class:`meshd.train.service.
    TrainService`): its node, its tracer, the placements group and the mesh's addresses."""

    node: str
    tracer: Tracer | None
    report_comm: Callable[[CommStats], None]
    """Publishes a collective's timing in the node's signals."""

    def address_of(self, node: str) -> str:
        """The address the job's peers reach ``node`` at."""
        ...

    async def write(self, cmd: dict[str, Any]) -> dict[str, Any]:
        """Commits a lease command in the placements group."""
        ...

    def drain_deadline(self) -> float | None:
        """When a drain of this node hands its jobs back (None: not draining)."""
        ...


class JobRun:
    """Runs one lease of one job to its end (done, failed, fenced, cancelled, moved)."""

    def __init__(self, service: JobHost, name: str, job: dict[str, Any],
                 workdir: Path) -> None:
        self.service = service
        self.name = name
        self.token: int = job["token"]
        self.attempt: int = job["attempt"]
        self.spec: dict[str, Any] = job["job"]
        parts = parts_of(job)
        self.ring: list[str] = [p["node"] for p in parts]
        self.rank = self.ring.index(service.node)
        self.gpus: list[str] = list(parts[self.rank]["gpus"])
        self.workdir = workdir
        self.keeper: LeaseKeeper | None = None
        self.proc: asyncio.subprocess.Process | None = None
        self.report: dict[str, Any] = {}
        self.cancel = False
        self.finished = False
        self.outcome = ""
        self.leaving: tuple[str, str] | None = None
        """(outcome, message) to release with once the gracefully stopped child exits."""
        self.refused = ""
        """Why the table refused the first renewal (the lease was never ours to run)."""
        self.gang_stop = ""
        """Why the gang is ending (another rank's part ended or lapsed): stop ours too."""
        self._renewals: set[asyncio.Task[None]] = set()
        self._next_try = 0.0
        self._reader: asyncio.Task[None] | None = None
        tracer = service.tracer
        self.spans = None if tracer is None else JobSpans(
            tracer, name, self.token, self.attempt, self.rank, self.ring, service.node)

    # --- the loop ---------------------------------------------------------------------------

    async def run(self) -> None:
        try:
            self.outcome = await self._run()
        finally:
            self.kill("run ended")
            self.finished = True
            if self.spans is not None:
                self.spans.end(self.outcome or "stopped")
            log.info("job run ended", extra={"event": "job_run_ended", "job": self.name,
                                             "token": self.token, "detail": self.outcome})

    async def _run(self) -> str:
        while True:
            now = time.monotonic()
            k = self.keeper
            if self.refused:
                return f"refused: {self.refused}"
            if k is not None and k.fenced:
                self.kill("lease fenced")
                return "fenced"
            if k is not None and not k.may_run(now):
                self.kill("lease deadline passed without a granted renewal")
                return "cut off"
            if k is None:  # before the first grant: one renewal at a time
                due = math.inf if self._renewals else self._next_try
            else:
                due = max(k.renew_at(now), self._next_try)
            if now >= due:
                if k is not None:
                    k.sent(now)
                task = asyncio.create_task(self._renew(now))
                self._renewals.add(task)
                task.add_done_callback(self._renewals.discard)
            if self.proc is None and k is not None and k.may_run(now):
                if self.cancel:
                    await self._release("cancelled", "cancelled before it started")
                    return "cancelled"
                if self.gang_stop:
                    await self._release("moved", self.gang_stop)
                    return "moved"
                await self._start()
            if self.proc is not None and self.proc.returncode is not None:
                return await self._exited(self.proc.returncode)
            if self.proc is not None and self.leaving is None:
                if self.cancel:
                    self.stop(("cancelled", "cancelled"))
                elif self.gang_stop:
                    self.stop(("moved", self.gang_stop))
                else:
                    self._drain()
            await asyncio.sleep(POLL)

    def _drain(self) -> None:
        """Hand the job back when its node drains: at once with ``on_drain: migrate``; with
        ``finish``, only if it would still be running when the drain's deadline comes."""
        deadline = self.service.drain_deadline()
        if deadline is None:
            return
        node = self.service.node
        if self.spec.get("on_drain") == "migrate":
            self.stop(("moved", f"{node} is draining; moved to resume from its last "
                                "checkpoint"))
        elif time.time() >= deadline - STOP_GRACE:
            self.stop(("moved", f"{node}'s drain deadline came before the job finished; "
                                "moved to resume from its last checkpoint"))

    async def _exited(self, rc: int) -> str:
        """The child ended: release the lease with what that means."""
        if self._reader is not None:
            with contextlib.suppress(Exception):  # a timeout, or the reader's own error
                await asyncio.wait_for(self._reader, 2.0)
        k = self.keeper
        if rc == 0:
            outcome, message = "done", ""  # it finished, whatever it was asked meanwhile
        elif self.leaving is not None:
            outcome, message = self.leaving
        elif rc == EXIT_RETRY:
            outcome, message = "retry", (f"exit code {rc} (retry); see attempt-{self.attempt}"
                                         f".log on {self.service.node}")
        elif k is not None and not k.may_run(time.monotonic()):
            return "cut off"  # the watchdog fenced it; the lease is lapsing, not ours to end
        else:
            outcome, message = "failed", (f"exit code {rc}; see attempt-{self.attempt}.log "
                                          f"on {self.service.node}")
        await self._release(outcome, message)
        return outcome

    def stop(self, leaving: tuple[str, str]) -> None:
        """Ask the child to stop gracefully; the lease is released once it has exited."""
        self.leaving = leaving
        self._tell(f"stop {STOP_GRACE}")
        log.info("job stopping", extra={"event": "job_stopping", "job": self.name,
                                        "token": self.token, "detail": leaving[0]})

    def _payload(self) -> dict[str, Any]:
        """The child's last report, as the placements group accepts it."""
        cmd: dict[str, Any] = {}
        r = self.report
        if isinstance(r.get("progress"), int | float) and 0 <= r["progress"] <= 1:
            cmd["progress"] = float(r["progress"])
        if isinstance(r.get("step"), int) and not isinstance(r["step"], bool) and r["step"] >= 0:
            cmd["step"] = r["step"]
        if isinstance(r.get("loss"), int | float) and math.isfinite(r["loss"]):
            cmd["loss"] = float(r["loss"])
        for key in ("checkpoint", "message"):
            if isinstance(r.get(key), str):
                cmd[key] = r[key][:1024]
        return cmd

    async def _renew(self, sent: float) -> None:
        cmd = {"op": "renew", "job": self.name, "token": self.token, "node": self.service.node,
               **self._payload()}
        try:
            result = await self.service.write(cmd)
        except ConsensusError as exc:
            if self.keeper is not None:
                self.keeper.unanswered(sent)
            self._next_try = time.monotonic() + RETRY
            log.info("lease renewal failed", extra={"event": "lease_renew_failed",
                                                    "job": self.name, "detail": str(exc)})
            return
        if result.get("ok"):
            if self.keeper is None:
                self.keeper = LeaseKeeper(self.token, float(result["ttl"]))
            self.keeper.granted(sent)
            self.cancel = bool(result.get("cancel"))
            self.gang_stop = str(result.get("stop") or "")
            if self.proc is not None:  # the watchdog keeps the latest it is told
                self._tell(f"deadline {self.keeper.deadline!r}")
        else:
            error = str(result.get("error"))
            if self.keeper is None:
                self.refused = error
            else:
                self.keeper.refused(error, sent)
            if error not in ("fenced", "expired"):
                self._next_try = time.monotonic() + RETRY
            log.warning("lease renewal refused", extra={
                "event": "lease_renew_refused", "job": self.name, "token": self.token,
                "detail": f"{error}: {result.get('message', '')}"})

    async def _release(self, outcome: str, message: str) -> None:
        try:
            await self.service.write({**self._payload(), "op": "release", "job": self.name,
                                      "token": self.token, "node": self.service.node,
                                      "outcome": outcome,
                                      "message": message[:1024]})
        except ConsensusError as exc:  # the lease lapses instead; the job is placed again
            log.warning("lease release failed", extra={"event": "lease_release_failed",
                                                       "job": self.name, "detail": str(exc)})

    # --- the child --------------------------------------------------------------------------

    def argv(self) -> list[str]:
        if self.spec.get("command"):
            return list(self.spec["command"])
        module, func = str(self.spec["entry"]).split(":")
        return [sys.executable, "-c", f"import sys, importlib; "
                f"sys.exit(getattr(importlib.import_module({module!r}), {func!r})())"]

    def environment(self) -> dict[str, str]:
        checkpoints = self.spec.get("checkpoints") or str(self.workdir / "checkpoints")
        env = {**os.environ, **{k: str(v) for k, v in self.spec.get("env", {}).items()},
               "MESHD_JOB_ID": self.name, "MESHD_ATTEMPT": str(self.attempt),
               "MESHD_LEASE_TOKEN": str(self.token), "MESHD_CHECKPOINT_DIR": checkpoints,
               "MESHD_HPARAMS": json.dumps(self.spec.get("hyperparameters", {})),
               "MESHD_MODEL": str(self.spec.get("model", "")),
               "MESHD_NODE": self.service.node, "MESHD_SLOTS": ",".join(self.gpus),
               **self.gang_environment(),
               **(self.spans.environment() if self.spans is not None else {})}
        gpus = [g for g in self.gpus if not g.startswith("cpu")]
        if gpus:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(gpus)
        return env

    def gang_environment(self) -> dict[str, str]:
        """Where this rank stands in its gang (a gang of one for a single-node job)."""
        addrs = [self.service.address_of(n) or n for n in self.ring]
        port = COMM_PORT_BASE + (self.token % COMM_PORT_SPAN) * 64
        return {"MESHD_RANK": str(self.rank), "MESHD_NNODES": str(len(self.ring)),
                "MESHD_RING": ",".join(self.ring), "MESHD_RING_ADDRS": ",".join(addrs),
                "MESHD_COMM_PORT": str(port), "MASTER_ADDR": addrs[0],
                "MASTER_PORT": str(port), "NODE_RANK": str(self.rank),
                "NNODES": str(len(self.ring))}

    async def _start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        logfile = log_path(self.workdir, self.attempt)
        env = {**self.environment(), "MESHD_TRAINER_PID": str(os.getpid())}
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "meshd.train.watchdog", *self.argv(),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT, env=env, cwd=self.workdir,
            start_new_session=sys.platform != "win32")
        assert self.keeper is not None
        self._tell(f"deadline {self.keeper.deadline!r}")
        self._reader = asyncio.create_task(self._read(logfile))
        log.info("job started", extra={"event": "job_started", "job": self.name,
                                       "token": self.token, "pid": self.proc.pid,
                                       "attempt": self.attempt})

    async def _read(self, logfile: Path) -> None:
        assert self.proc is not None and self.proc.stdout is not None
        with logfile.open("ab") as out:
            async for line in self.proc.stdout:
                out.write(line)
                out.flush()
                try:
                    doc = json.loads(line)
                except ValueError:
                    continue
                if isinstance(doc, dict):
                    comm = doc.pop("comm", None)
                    if isinstance(comm, dict):
                        self._comm(comm)
                    if self.spans is not None:
                        self.spans.report(doc)
                    self.report = {**self.report, **doc}

    def _comm(self, doc: dict[str, Any]) -> None:
        """Publish one collective timing the job printed, checked as ``ReportCommStats``
        checks one (a malformed one is dropped)."""
        try:
            delta = state_pb2.CommStatsDelta(
                job=self.name, op=doc["op"], seconds=doc["seconds"], bytes=doc.get("bytes", 0),
                algorithm=doc.get("algorithm", ""), world_size=doc.get("world_size",
                                                                       len(self.ring)),
                peers=self.ring)
            stats = comm_from(delta, time.time())
        except (KeyError, TypeError, ValueError, ArithmeticError):
            return
        self.service.report_comm(stats)
        if self.spans is not None:
            self.spans.collective(stats.op, stats.seconds, stats.bytes)

    def _tell(self, line: str) -> None:
        """One command to the child's watchdog (see :mod:`meshd.train.watchdog`)."""
        pipe = self.proc.stdin if self.proc is not None else None
        if pipe is not None and not pipe.is_closing():
            with contextlib.suppress(OSError, RuntimeError):
                pipe.write(line.encode() + b"\n")

    def kill(self, why: str) -> None:
        """Stop the child and everything it started, now (SIGKILL: fencing cannot wait)."""
        proc = self.proc
        if proc is None or proc.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if sys.platform != "win32":
                os.killpg(proc.pid, signal.SIGKILL)
            else:
                proc.kill()
        log.warning("job killed", extra={"event": "job_killed", "job": self.name,
                                         "token": self.token, "detail": why})
