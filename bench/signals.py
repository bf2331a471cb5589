"""Signal plane: how stale the queue figure a router sees is (gossip only vs subscribed), and
what the Triton adapter costs in CPU.

    ./dev bench signals [--quick] [--duration 120] [--agents 8] [--tritons 4] [--only ...]
    .venv/bin/python bench/signals.py ...

Sections (``--only`` keys):

* ``freshness`` - ``--tritons`` real Triton servers (``meshd.dev.triton``, the shipped models
  ``add_sub`` and ``delay``) and ``--agents`` real meshd processes (``testbed/cluster.py``, LAN
  profile, ``--gpu off``).  Agents n2..n(T+1) each poll one Triton (``--triton
  GRPC,metrics=URL``, default intervals: queue 100 ms, statistics 1 s).  Observers: the last
  agent and n1 are *gossip only*; the agents in between run ``--subscribe '*'`` (a Subscribe
  stream to every peer whose gossiped telemetry lists replicas; the fused view keeps whichever
  copy is newest by the publisher's (epoch, seq)).  With 8 agents and 4 Tritons: publishers
  n2..n5, subscribed n6 n7, gossip only n1 n8.

  Load, from a child process of this script (``tritonclient.grpc.aio``): ``--load-rate``
  ``add_sub`` requests per second to every Triton (at most 4 in flight), and a square wave on
  each Triton's ``delay`` model with a random phase: stall it (the control file the model
  re-reads), send ``--burst`` requests at once (one executes and hangs, the rest queue: the
  pending count rises), hold ``--hold`` (2.5-4 s), release (the queue drains to 0 in a few
  ms), wait ``--gap`` (2.5-4 s), repeat.  Both levels last longer than the gossip bar, so a
  slow gossip delivery is timed, not cut short by the next transition (see ``HOLD_S``).

  Ground truth: this process scrapes every Triton's ``/metrics`` every ``--scrape-ms`` for
  ``nv_inference_pending_request_count{model="delay"}`` (the gauge the adapter itself reads).
  A transition (0 -> >=1, or >=1 -> 0) is placed midway between the last scrape showing the old
  level and the first showing the new one.  Observation: ``StatePlane.State(model="delay")``
  on every observer every ``--poll-ms`` (mTLS as the cluster's admin), each reply stamped with
  the midpoint of the call.  CLOCK_MONOTONIC is shared by all processes on the machine.

  Staleness of a transition at an observer = the first reply showing the new level (queue >= 1
  rising, 0 falling) minus the transition's time: it includes up to one poll of detection
  delay and the truth time is +-half a scrape interval (both measured and reported).  A
  transition the observer never shows before the next one starts is *missed*; the bars count
  missed transitions as later than any seen one (they are in the tail).  A transition the
  observer already showed before it happened (it never showed the previous level: it missed
  that one) is counted apart and not timed.  A second table sets the ``queue_age`` the State
  reply gave at first sight next to the measured staleness (what the router is told vs what
  it is), and checks every reply's age against the truth: the level it shows must be the
  truth's at ``now - queue_age`` (else the age is understated or overstated).

  Bars: subscribed p99 <= 250 ms; gossip only p99 <= 2 s.

* ``cpu`` - ``adapters.triton.TritonAdapter`` alone in a child process of this script (asyncio,
  default intervals, its own event loop and worker threads) against one real Triton serving
  the shipped 2 models, and one serving 4 (the shipped two plus renamed copies), both under
  the same light load (background ``add_sub`` requests and the ``delay`` square wave).  The
  child measures its own CPU (``getrusage``: user + system, all threads) over ``--cpu-seconds``
  after discovery and a warm-up.  Bar: <= 3 % of one core per Triton.

The machine is shared (2 cores, other sessions' tests run at the same time): the core count,
load averages and how much CPU others used during each measurement are recorded next to the
numbers.  Prints the tables and writes ``bench/results/signals.json`` and ``signals.md``.
``--quick`` (about 30 s of measurement) is a smoke check and says so.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import json
import os
import platform
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# Run as a script, this file's folder comes first on sys.path and a bench module could shadow
# a package of the project: put the project root first instead.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from bench.child import read_line  # noqa: E402
from bench.table import (  # noqa: E402
    format_table,
    loadavg,
    machine_busy_s,
    machine_info,
    print_table,
    proc_cpu_s,
)

SECTIONS = ("freshness", "cpu")
SUBSCRIBED_P99_BAR_S = 0.25
GOSSIP_P99_BAR_S = 2.0
ADAPTER_CPU_BAR_PCT = 3.0
DELAY = ("delay", "1")
"""The model whose queue the square wave moves (name, version label in Triton's metrics)."""
HOLD_S = (2.5, 4.0)
GAP_S = (2.5, 4.0)
"""Default stall hold and release gap, seconds (uniform).  Both start above the gossip bar: a
level that lasts less than the time gossip takes to carry it is never shown (missed) and its
staleness is not measured, so shorter segments would censor exactly the gossip tail the bar
is about (``--hold 1,3 --gap 1,3`` gives the faster wave, with that caveat)."""
TAIL_S = 4.0
"""Seconds the observers are still polled after the load stopped (the last release)."""
READY_TIMEOUT_S = 90.0
HEAD = ("metric", "value", "bar", "result")


# --- small helpers ------------------------------------------------------------------------------


def _quantile(values: list[float], q: float) -> float:
    """Nearest-rank quantile of a non-empty list (inf sorts last)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _dist(values: list[float]) -> dict[str, float]:
    if not values:
        return {"n": 0}
    return {"n": len(values), "min": min(values), "p50": statistics.median(values),
            "p90": _quantile(values, 0.90), "p99": _quantile(values, 0.99), "max": max(values),
            "mean": statistics.fmean(values)}


def _ms(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds == float("inf"):
        return "missed"
    return f"{seconds * 1000:.0f} ms"


def _log(msg: str) -> None:
    print(f"  {msg}", file=sys.stderr, flush=True)


class CpuWatch:
    """CPU used during a measurement by groups of our processes (``groups()`` -> {name: pids},
    asked at the start and the end, so processes that come and go are caught) and by the rest
    of the machine (others' jobs)."""

    def __init__(self, groups: Callable[[], dict[str, list[int]]]) -> None:
        self.groups = groups
        self.t0 = time.monotonic()
        self.busy0 = machine_busy_s()
        self.load0 = loadavg()
        self.cpu0 = self._sample()

    def _sample(self) -> dict[str, dict[int, float]]:
        out: dict[str, dict[int, float]] = {}
        for name, pids in self.groups().items():
            out[name] = {p: v for p in pids if (v := proc_cpu_s(p)) is not None}
        return out

    def done(self) -> dict[str, Any]:
        wall = time.monotonic() - self.t0
        busy1 = machine_busy_s()
        cpu1 = self._sample()
        groups: dict[str, dict[str, float]] = {}
        ours = 0.0
        for name in sorted(set(self.cpu0) | set(cpu1)):
            before, after = self.cpu0.get(name, {}), cpu1.get(name, {})
            used = sum(v - before.get(p, 0.0) for p, v in after.items())
            ours += used
            groups[name] = {"cores": used / max(wall, 1e-9), "processes": len(after)}
        other = None
        if self.busy0 is not None and busy1 is not None and wall > 0:
            other = max(0.0, busy1 - self.busy0 - ours) / wall
        return {"wall_s": wall, "groups": groups, "our_cores": ours / max(wall, 1e-9),
                "other_cores": other, "loadavg_before": self.load0, "loadavg_after": loadavg()}


def _git() -> dict[str, Any]:
    def run(*cmd: str) -> str:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            return subprocess.run(["git", *cmd], cwd=ROOT, capture_output=True, text=True,
                                  timeout=10).stdout
        return ""

    dirty = [line[3:] for line in run("status", "--porcelain").splitlines() if line.strip()]
    return {"commit": run("rev-parse", "HEAD").strip(), "dirty_files": dirty}


# --- the load: a child process ------------------------------------------------------------------


def load_child(spec: dict[str, Any]) -> int:
    """Background ``add_sub`` load and the ``delay`` square wave on every server in ``spec``
    until a line (or EOF) on stdin; prints ``{"ready": true}`` then one summary line."""
    return asyncio.run(_load_main(spec))


async def _load_main(spec: dict[str, Any]) -> int:
    import numpy as np
    import tritonclient.grpc.aio as tc

    from meshd.dev.triton import CONTROL_REFRESH_S, write_behaviour

    rng = random.Random(spec.get("seed"))
    stop = asyncio.Event()
    hold, gap, burst, rate = spec["hold"], spec["gap"], int(spec["burst"]), float(spec["rate"])
    servers = spec["servers"]
    clients = {s["name"]: tc.InferenceServerClient(s["grpc"]) for s in servers}
    stats: dict[str, dict[str, Any]] = {
        s["name"]: {"bg_ok": 0, "bg_errors": Counter(), "burst_ok": 0,
                    "burst_errors": Counter(), "cycles": []} for s in servers}

    def add_sub_inputs() -> list[Any]:
        value = np.ones((1, 16), dtype=np.float32)
        inputs = []
        for name in ("INPUT0", "INPUT1"):
            t = tc.InferInput(name, [1, 16], "FP32")
            t.set_data_from_numpy(value)
            inputs.append(t)
        return inputs

    def delay_inputs() -> list[Any]:
        payload = np.zeros(256, dtype=np.float32)
        t = tc.InferInput("PAYLOAD", [256], "FP32")
        t.set_data_from_numpy(payload)
        return [t]

    async def pause(seconds: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), max(0.0, seconds))

    async def background(name: str) -> None:
        if rate <= 0:
            return
        client, st = clients[name], stats[name]
        sem = asyncio.Semaphore(4)
        tasks: set[asyncio.Task[None]] = set()

        async def one() -> None:
            try:
                await client.infer("add_sub", add_sub_inputs(), client_timeout=10)
                st["bg_ok"] += 1
            except Exception as exc:  # noqa: BLE001 - counted
                st["bg_errors"][type(exc).__name__] += 1
            finally:
                sem.release()

        nxt = time.monotonic() + rng.uniform(0, 1 / rate)
        while not stop.is_set():
            await pause(nxt - time.monotonic())
            if stop.is_set():
                break
            await sem.acquire()
            task = asyncio.get_running_loop().create_task(one())
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            nxt = max(nxt + 1 / rate, time.monotonic() - 1.0)
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)

    async def square(server: dict[str, Any]) -> None:
        name, control = server["name"], Path(server["control"])
        client, st = clients[name], stats[name]
        await pause(rng.uniform(0, hold[1] + gap[1]))
        while not stop.is_set():
            write_behaviour(control, {"delay": {"stall": True}})
            await asyncio.sleep(CONTROL_REFRESH_S + 0.02)  # the model has read it
            t_stall = time.monotonic()
            calls = [asyncio.ensure_future(client.infer("delay", delay_inputs(),
                                                        client_timeout=hold[1] + 30))
                     for _ in range(burst)]
            await pause(rng.uniform(*hold))
            write_behaviour(control, {})
            t_release = time.monotonic()
            for r in await asyncio.gather(*calls, return_exceptions=True):
                if isinstance(r, BaseException):
                    st["burst_errors"][type(r).__name__] += 1
                else:
                    st["burst_ok"] += 1
            st["cycles"].append([t_stall, t_release, time.monotonic()])
            await pause(rng.uniform(*gap))

    async def wait_stdin() -> None:
        await asyncio.to_thread(sys.stdin.readline)
        stop.set()

    tasks = [asyncio.ensure_future(background(s["name"])) for s in servers]
    tasks += [asyncio.ensure_future(square(s)) for s in servers if s.get("square", True)]
    waiter = asyncio.ensure_future(wait_stdin())
    t0 = time.monotonic()
    print(json.dumps({"ready": True, "t0": t0}), flush=True)
    try:
        await asyncio.gather(*tasks)
    finally:
        for s in servers:  # never leave a model stalled
            if s.get("square", True):
                write_behaviour(Path(s["control"]), {})
        waiter.cancel()
        for c in clients.values():
            with contextlib.suppress(Exception):
                await c.close()
    out = {name: {**st, "bg_errors": dict(st["bg_errors"]),
                  "burst_errors": dict(st["burst_errors"])} for name, st in stats.items()}
    print(json.dumps({"summary": out, "wall_s": time.monotonic() - t0}), flush=True)
    return 0


class Child:
    """A child process of this script speaking JSON lines on stdout."""

    def __init__(self, flag: str, spec: dict[str, Any], log: Path) -> None:
        from meshd.dev.processes import pdeathsig_prefix

        self.flag = flag
        self.log = open(log, "ab")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            [*pdeathsig_prefix(), sys.executable, str(Path(__file__).resolve()), flag,
             json.dumps(spec)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.log,
            text=True, bufsize=1, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})

    @property
    def pid(self) -> int:
        return self.proc.pid

    def read(self, timeout: float) -> dict[str, Any]:
        """The next JSON line (RuntimeError if the child exits or is silent too long)."""
        return read_line(self.proc, timeout, f"child {self.flag}", self.log.name)

    def tell_stop(self) -> None:
        with contextlib.suppress(Exception):
            assert self.proc.stdin is not None
            self.proc.stdin.write("stop\n")
            self.proc.stdin.flush()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


# --- ground truth and observation: threads in this process --------------------------------------


class Scraper(threading.Thread):
    """Scrapes one Triton's metrics page every ``interval``: ``(t_send, t_recv, pending)``."""

    def __init__(self, name: str, url: str, interval: float, stop: threading.Event) -> None:
        super().__init__(name=f"scrape-{name}", daemon=True)
        parts = urllib.parse.urlsplit(url)
        self.host, self.port, self.path = parts.hostname or "127.0.0.1", parts.port or 80, \
            parts.path or "/metrics"
        self.interval = interval
        self.stop = stop
        self.samples: list[tuple[float, float, int]] = []
        self.errors: Counter[str] = Counter()

    def run(self) -> None:
        from adapters.triton_stats import parse_pending

        conn: http.client.HTTPConnection | None = None
        nxt = time.monotonic()
        while not self.stop.is_set():
            t0 = time.monotonic()
            try:
                if conn is None:
                    conn = http.client.HTTPConnection(self.host, self.port, timeout=2)
                conn.request("GET", self.path)
                resp = conn.getresponse()
                body = resp.read()
                t1 = time.monotonic()
                if resp.status != 200:
                    raise OSError(f"HTTP {resp.status}")
                value = parse_pending(body.decode("utf-8", "replace")).pending.get(DELAY, 0)
                self.samples.append((t0, t1, value))
            except (OSError, http.client.HTTPException) as exc:
                self.errors[type(exc).__name__] += 1
                if conn is not None:
                    conn.close()
                conn = None
            nxt += self.interval
            now = time.monotonic()
            if nxt < now:
                nxt = now  # behind (a slow scrape): no burst to catch up
            time.sleep(nxt - now)
        if conn is not None:
            conn.close()


@dataclass(slots=True)
class Seen:
    queue: int
    age: float
    """``queue_age``: what the observer says the figure's age is."""
    via: str
    node_age: float
    """Seconds since the observer received this publisher's current telemetry."""


class Poller(threading.Thread):
    """``StatePlane.State(model="delay")`` on one observer every ``interval``:
    ``(t_send, t_recv, {publisher: Seen})``."""

    def __init__(self, name: str, target: str, identity: Any, interval: float,
                 stop: threading.Event) -> None:
        super().__init__(name=f"poll-{name}", daemon=True)
        self.observer = name
        self.target = target
        self.identity = identity
        self.interval = interval
        self.stop = stop
        self.samples: list[tuple[float, float, dict[str, Seen]]] = []
        self.errors: Counter[str] = Counter()

    def run(self) -> None:
        import grpc

        from certs import tls
        from proto.mesh.v1 import state_pb2, state_pb2_grpc

        channel = tls.grpc_channel(self.target, self.identity, options=[
            ("grpc.initial_reconnect_backoff_ms", 50), ("grpc.min_reconnect_backoff_ms", 50),
            ("grpc.max_reconnect_backoff_ms", 250)])
        stub = state_pb2_grpc.StatePlaneStub(channel)
        req = state_pb2.StateRequest(model=DELAY[0])
        nxt = time.monotonic()
        try:
            while not self.stop.is_set():
                t0 = time.monotonic()
                try:
                    resp = stub.State(req, timeout=2)
                    t1 = time.monotonic()
                    node_age = {n.node: float(n.age) for n in resp.nodes}
                    seen = {r.node: Seen(int(r.queue), float(r.queue_age), r.via,
                                         node_age.get(r.node, -1.0))
                            for r in resp.replicas if r.model == DELAY[0]}
                    self.samples.append((t0, t1, seen))
                except grpc.RpcError as exc:
                    self.errors[exc.code().name] += 1  # type: ignore[attr-defined]
                nxt += self.interval
                now = time.monotonic()
                if nxt < now:
                    nxt = now
                time.sleep(nxt - now)
        finally:
            channel.close()


# --- analysis -----------------------------------------------------------------------------------


@dataclass(slots=True)
class Transition:
    publisher: str
    level: bool
    """True: the queue rose (0 -> >=1); False: it fell to 0."""
    t_old: float
    """Midpoint of the last scrape showing the old level."""
    t_new: float
    """Midpoint of the first scrape showing the new level."""
    end: float = 0.0
    """When the next transition happened (or the end of observation)."""

    @property
    def t(self) -> float:
        return (self.t_old + self.t_new) / 2


def truth_transitions(publisher: str, samples: list[tuple[float, float, int]],
                      end: float) -> list[Transition]:
    out: list[Transition] = []
    prev: tuple[float, bool] | None = None
    for t0, t1, value in samples:
        t, level = (t0 + t1) / 2, value >= 1
        if prev is not None and level != prev[1]:
            out.append(Transition(publisher, level, prev[0], t))
        prev = (t, level)
    for a, b in zip(out, out[1:], strict=False):
        a.end = b.t
    if out:
        out[-1].end = end
    return out


@dataclass
class Sample:
    observer: str
    path: str
    publisher: str
    direction: str
    truth_t: float
    category: str
    """``seen``, ``missed`` (never shown before the next transition), ``already`` (shown
    before it happened: the observer had missed the previous one) or ``absent`` (the replica
    was not in the observer's replies at all in the window)."""
    staleness: float | None = None
    age: float | None = None
    via: str = ""
    received: float | None = None
    """When the observer received the telemetry that first showed the change (its NodeView
    age at the reply), minus the transition's time: staleness without our poll's delay."""
    truth_gap: float = 0.0
    poll_gap: float = 0.0


def match(tr: Transition, observer: str, path: str,
          samples: list[tuple[float, float, dict[str, Seen]]], start: int) -> tuple[Sample, int]:
    """The observer's view of one transition; ``start`` is where to begin in ``samples``
    (they are in time order, so is the transitions' list): returns the next start."""
    s = Sample(observer, path, tr.publisher, "rise" if tr.level else "fall", tr.t, "absent",
               truth_gap=tr.t_new - tr.t_old)
    i = start
    before: bool | None = None
    prev_t: float | None = None
    # "Before" = replies received before the last scrape that still showed the old level (a
    # reply is stamped with its call's midpoint, but its content may be as late as its end).
    while i < len(samples) and samples[i][1] <= tr.t_old:
        seen = samples[i][2].get(tr.publisher)
        if seen is not None and seen.queue >= 0:
            before = seen.queue >= 1
        prev_t = (samples[i][0] + samples[i][1]) / 2
        i += 1
    nxt = i
    if before is not None and before == tr.level:
        s.category = "already"
        return s, nxt
    present = False
    while i < len(samples):
        t0, t1, seen_all = samples[i]
        t = (t0 + t1) / 2
        if t > tr.end:
            break
        seen = seen_all.get(tr.publisher)
        if seen is not None and seen.queue >= 0:
            present = True
            if (seen.queue >= 1) is tr.level:
                s.category = "seen"
                s.staleness = t - tr.t
                s.age = seen.age
                s.via = seen.via
                if seen.node_age >= 0:
                    s.received = t - seen.node_age - tr.t
                s.poll_gap = t - prev_t if prev_t is not None else 0.0
                return s, nxt
        prev_t = t
        i += 1
    s.category = "missed" if present or before is not None else "absent"
    return s, nxt


def analyse(truth: dict[str, list[tuple[float, float, int]]],
            polls: dict[str, list[tuple[float, float, dict[str, Seen]]]],
            paths: dict[str, str], end: float) -> dict[str, Any]:
    transitions = {p: truth_transitions(p, s, end) for p, s in truth.items()}
    samples: list[Sample] = []
    for observer, obs in polls.items():
        for trs in transitions.values():
            start = 0
            for tr in trs:
                sample, start = match(tr, observer, paths[observer], obs, start)
                samples.append(sample)
    out: dict[str, Any] = {"transitions": {p: len(t) for p, t in transitions.items()},
                           "paths": {}}
    for path in ("subscribed", "gossip"):
        mine = [s for s in samples if s.path == path]
        if not mine:
            continue
        out["paths"][path] = summarise(mine)
        out["paths"][path]["by_direction"] = {
            d: summarise([s for s in mine if s.direction == d]) for d in ("rise", "fall")}
        out["paths"][path]["by_observer"] = {
            o: summarise([s for s in mine if s.observer == o])
            for o in sorted({s.observer for s in mine})}
        # What a router is told at any moment (every poll, every replica), not just at changes.
        ages = [seen.age for o, obs in polls.items() if paths[o] == path
                for _t0, _t1, row in obs for seen in row.values() if seen.age >= 0]
        vias: Counter[str] = Counter(seen.via for o, obs in polls.items() if paths[o] == path
                                     for _t0, _t1, row in obs for seen in row.values())
        out["paths"][path]["age_all_polls"] = _dist(ages)
        checks = [age_check(truth[pub], [((t0 + t1) / 2, seen.queue >= 1, seen.age)
                                         for t0, t1, row in obs
                                         if (seen := row.get(pub)) is not None
                                         and seen.queue >= 0 and seen.age >= 0])
                  for o, obs in polls.items() if paths[o] == path for pub in truth]
        out["paths"][path]["age_check"] = merge_checks(checks)
        out["paths"][path]["via_all_polls"] = dict(vias)
    out["samples"] = [[s.observer, s.publisher, s.direction, round(s.truth_t, 4), s.category,
                       None if s.staleness is None else round(s.staleness, 4),
                       None if s.age is None else round(s.age, 4), s.via,
                       None if s.received is None else round(s.received, 4)]
                      for s in samples]
    out["samples_columns"] = ["observer", "publisher", "direction", "truth_t", "category",
                              "staleness_s", "reported_age_s", "via", "received_s"]
    return out


AGE_MARGIN_S = 0.05
"""Readings whose claimed measurement time is this close to a truth transition are not judged
(the truth time is +-half a scrape; the adapter stamps a scrape when it is parsed)."""


def age_check(truth: list[tuple[float, float, int]],
              readings: list[tuple[float, bool, float]]) -> dict[str, Any]:
    """Does each reported figure match the truth at the time its age claims it was measured?

    A reading ``(t, level, age)`` claims the value was measured at ``t - age``; the truth at
    that moment must show the same level (readings within ``AGE_MARGIN_S`` of a change are not
    judged).  If it does not, the value is either older than its age says (*understated*: it
    matches the truth before the last change, by how much) or, impossibly, newer (the truth
    only reached that level after the claimed time: *overstated*)."""
    import bisect

    if not truth:
        return {}
    trans = truth_transitions("", truth, truth[-1][1])
    times = [tr.t for tr in trans]
    first, last = (truth[0][0] + truth[0][1]) / 2, (truth[-1][0] + truth[-1][1]) / 2
    initial = truth[0][2] >= 1
    ok = near = outside = 0
    under: list[float] = []
    over: list[float] = []
    for t, level, age in readings:
        tm = t - age
        if not first <= tm <= last:
            outside += 1
            continue
        k = bisect.bisect_right(times, tm)
        if any(0 <= j < len(trans) and trans[j].t_old - AGE_MARGIN_S <= tm
               <= trans[j].t_new + AGE_MARGIN_S for j in (k - 1, k)):
            near += 1
            continue
        actual = trans[k - 1].level if k > 0 else initial
        if actual == level:
            ok += 1
            continue
        u = tm - trans[k - 1].t if k > 0 else float("inf")
        o = trans[k].t - tm if k < len(trans) and trans[k].t <= t else float("inf")
        (under if u <= o else over).append(min(u, o))
    return {"judged": ok + len(under) + len(over), "consistent": ok, "understated": under,
            "overstated": over, "near_change": near, "outside_truth": outside}


def summarise(samples: list[Sample]) -> dict[str, Any]:
    seen = [s for s in samples if s.category == "seen"]
    cats = Counter(s.category for s in samples)
    stale = [s.staleness for s in seen if s.staleness is not None]
    # for the bar: a missed transition is later than any seen one
    with_missed = stale + [float("inf")] * (cats["missed"] + cats["absent"])
    ages = [s.age for s in seen if s.age is not None and s.age >= 0]
    gaps = [s.staleness - s.age for s in seen
            if s.staleness is not None and s.age is not None and s.age >= 0]
    return {
        "transitions": len(samples), "categories": dict(cats),
        "staleness": _dist(stale),
        "received": _dist([s.received for s in seen if s.received is not None]),
        "p99_counting_missed": _quantile(with_missed, 0.99) if with_missed else None,
        "p50_counting_missed": _quantile(with_missed, 0.50) if with_missed else None,
        "reported_age": _dist(ages),
        "staleness_minus_reported_age": _dist(gaps),
        "via_first_seen": dict(Counter(s.via for s in seen)),
        "truth_gap": _dist([s.truth_gap for s in samples]),
        "poll_gap": _dist([s.poll_gap for s in seen if s.poll_gap > 0]),
    }


def merge_checks(checks: list[dict[str, Any]]) -> dict[str, Any]:
    """:func:`age_check` results of several (observer, publisher) pairs as one."""
    out: dict[str, Any] = {k: sum(c.get(k, 0) for c in checks)
                           for k in ("judged", "consistent", "near_change", "outside_truth")}
    for k in ("understated", "overstated"):
        out[k] = _dist([v for c in checks for v in c.get(k, [])])
    return out


def _gaps(times: Iterable[float]) -> dict[str, float]:
    ts = list(times)
    return _dist([b - a for a, b in zip(ts, ts[1:], strict=False)])


# --- freshness ----------------------------------------------------------------------------------


@dataclass
class Roles:
    publishers: dict[str, int] = field(default_factory=dict)
    """Agent name -> index of its Triton."""
    subscribed: list[str] = field(default_factory=list)
    gossip: list[str] = field(default_factory=list)

    @property
    def paths(self) -> dict[str, str]:
        return {**{n: "subscribed" for n in self.subscribed}, **{n: "gossip" for n in self.gossip}}


def roles_for(agents: int, tritons: int) -> Roles:
    r = Roles()
    for k in range(tritons):
        r.publishers[f"n{k + 2}"] = k
    r.gossip = ["n1", f"n{agents}"]
    r.subscribed = [f"n{i}" for i in range(tritons + 2, agents)]
    return r


def _state(cluster: Any, identity: Any, node: Any) -> Any:
    from certs import tls
    from proto.mesh.v1 import state_pb2, state_pb2_grpc

    channel = tls.grpc_channel(node.admin, identity)
    try:
        return state_pb2_grpc.StatePlaneStub(channel).State(
            state_pb2.StateRequest(model=DELAY[0]), timeout=2)
    finally:
        channel.close()


def wait_visible(cluster: Any, identity: Any, roles: Roles, timeout: float) -> dict[str, Any]:
    """Until every observer lists every publisher's ``delay`` replica with a known queue (and
    the subscribed ones got it by stream); returns how long it took and what was missing."""
    t0 = time.monotonic()
    want = set(roles.publishers)
    last: dict[str, Any] = {}
    while True:
        ok = True
        for name, path in roles.paths.items():
            try:
                resp = _state(cluster, identity, cluster.node(name))
            except Exception as exc:  # noqa: BLE001 - not up yet
                last[name] = f"State failed: {exc}"
                ok = False
                continue
            have = {r.node: (r.queue, r.via) for r in resp.replicas}
            missing = sorted(want - {n for n, (q, _v) in have.items() if q >= 0})
            not_stream = sorted(n for n, (_q, v) in have.items()
                                if path == "subscribed" and n in want and v != "stream")
            last[name] = {"missing": missing, "not_via_stream": not_stream,
                          "have": {n: f"queue={q} via={v}" for n, (q, v) in sorted(have.items())}}
            ok &= not missing and not not_stream
        if ok:
            return {"ok": True, "seconds": time.monotonic() - t0}
        if time.monotonic() - t0 > timeout:
            return {"ok": False, "seconds": time.monotonic() - t0, "last": last}
        time.sleep(0.25)


def agent_metrics(cluster: Any) -> dict[str, Any]:
    """Signal-plane counters from every agent's /metrics (publications, rejections, polls)."""
    out: dict[str, Any] = {}
    for n in cluster.nodes:
        try:
            samples = n.metrics(timeout=3)
        except Exception as exc:  # noqa: BLE001 - reported
            out[n.name] = {"error": str(exc)}
            continue
        row: dict[str, Any] = {}
        for name, labels, value in samples:
            if name == "meshd_signal_publications_total":
                row.setdefault("publications", {})[labels.get("reason", "")] = value
            elif name == "meshd_signal_rejected_updates_total":
                row.setdefault("rejected", {})[labels.get("reason", "")] = value
            elif name == "meshd_runtime_polls_total":
                row.setdefault("runtime_polls", {})[labels.get("kind", "")] = value
            elif name == "meshd_runtime_poll_errors_total":
                row.setdefault("runtime_poll_errors", {})[labels.get("reason", "")] = value
            elif name == "meshd_signal_known_nodes":
                row.setdefault("nodes_known", {})[labels.get("via", "")] = value
        out[n.name] = row
    return out


def freshness_bench(servers: list[Any], args: argparse.Namespace, workdir: Path
                    ) -> dict[str, Any]:
    from certs.identity import Identity
    from testbed.cluster import Cluster

    roles = roles_for(args.agents, args.tritons)
    by_index = {i: n for n, i in roles.publishers.items()}

    def node_args(i: int) -> list[str]:
        name = f"n{i}"
        a = ["--gpu", "off"]
        if name in roles.publishers:
            s = servers[roles.publishers[name]]
            a += ["--triton", f"{s.grpc_url},metrics={s.metrics_url}"]
        if name in roles.subscribed:
            a += ["--subscribe", "*"]
        return a

    cluster = Cluster(args.agents, workdir / "mesh", node_args=node_args)
    identity = Identity.load(cluster.admin_creds)
    load: Child | None = None
    stop = threading.Event()
    scrapers: list[Scraper] = []
    pollers: list[Poller] = []
    try:
        t0 = time.monotonic()
        cluster.start()
        cluster.wait_converged(90)
        _log(f"{args.agents} agents converged in {time.monotonic() - t0:.1f} s")
        visible = wait_visible(cluster, identity, roles, READY_TIMEOUT_S)
        if not visible["ok"]:
            _log(f"NOT every observer sees every replica (via stream where subscribed) after "
                 f"{visible['seconds']:.0f} s: {json.dumps(visible['last'])[:600]}")
            if all(v.get("missing") for v in visible["last"].values() if isinstance(v, dict)):
                raise RuntimeError(f"no observer sees all replicas: {visible['last']}")
        else:
            _log(f"every observer sees the {len(roles.publishers)} delay replicas "
                 f"({visible['seconds']:.1f} s after convergence)")
        for i, s in enumerate(servers):
            scrapers.append(Scraper(by_index[i], s.metrics_url, args.scrape_ms / 1000, stop))
        for name in roles.paths:
            pollers.append(Poller(name, cluster.node(name).admin, identity, args.poll_ms / 1000,
                                  stop))
        for th in [*scrapers, *pollers]:
            th.start()
        time.sleep(1.0)  # a baseline of both series before the first stall

        def groups() -> dict[str, list[int]]:
            g: dict[str, list[int]] = {"bench (scrapers, pollers)": [os.getpid()]}
            for n in cluster.nodes:
                kind = ("publisher" if n.name in roles.publishers else
                        "subscribed" if n.name in roles.subscribed else "gossip-only")
                if n.running:
                    g.setdefault(f"agents: {kind}", []).append(n.pid)
            g["tritons (server + stubs)"] = [p for s in servers for p in s.child_pids()]
            if load is not None:
                g["load generator"] = [load.pid]
            return g

        spec = {"servers": [{"name": by_index[i], "grpc": s.grpc_url,
                             "control": str(s.control_path), "square": True}
                            for i, s in enumerate(servers)],
                "rate": args.load_rate, "burst": args.burst, "hold": args.hold,
                "gap": args.gap, "seed": args.seed}
        load = Child("--load-child", spec, workdir / "load.log")
        load.read(60)
        watch = CpuWatch(groups)
        t_load = time.monotonic()
        _log(f"load running for {args.duration:.0f} s (square wave on delay, "
             f"{args.load_rate:g} add_sub/s per Triton)")
        deadline = t_load + args.duration
        while time.monotonic() < deadline:
            if load.proc.poll() is not None:
                raise RuntimeError(f"load generator exited ({load.proc.returncode}); "
                                   f"log {workdir / 'load.log'}")
            time.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
        load.tell_stop()
        summary = load.read(60)
        cpu = watch.done()
        time.sleep(TAIL_S)
        stop.set()
        for th in [*scrapers, *pollers]:
            th.join(10)
        end = time.monotonic()
        metrics = agent_metrics(cluster)
    finally:
        stop.set()
        if load is not None:
            load.close()
        cluster.close()

    truth = {sc.name.removeprefix("scrape-"): sc.samples for sc in scrapers}
    polls = {p.observer: p.samples for p in pollers}
    if args.raw:
        import gzip

        raw = {"truth": truth, "end": end, "paths": roles.paths,
               "polls": {o: [[t0, t1, {k: [v.queue, v.age, v.via, v.node_age]
                                       for k, v in row.items()}] for t0, t1, row in obs]
                         for o, obs in polls.items()}}
        with gzip.open(args.raw, "wt") as fh:
            json.dump(raw, fh)
        _log(f"raw series written to {args.raw}")
    result = analyse(truth, polls, roles.paths, end)
    cycles = {name: len(st["cycles"]) for name, st in summary["summary"].items()}
    result.update({
        "roles": {"publishers": {n: servers[i].name for n, i in roles.publishers.items()},
                  "subscribed": roles.subscribed, "gossip": roles.gossip},
        "visible": visible, "load": summary, "stall_cycles": cycles, "cpu": cpu,
        "scrape": {sc.name.removeprefix("scrape-"): {
            "n": len(sc.samples), "errors": dict(sc.errors),
            "gap_s": _gaps((a + b) / 2 for a, b, _v in sc.samples),
            "duration_s": _dist([b - a for a, b, _v in sc.samples])} for sc in scrapers},
        "poll": {p.observer: {
            "n": len(p.samples), "errors": dict(p.errors),
            "gap_s": _gaps((a + b) / 2 for a, b, _s in p.samples),
            "duration_s": _dist([b - a for a, b, _s in p.samples])} for p in pollers},
        "agent_metrics": metrics, "measured_s": end - t_load,
    })
    return result


# --- adapter CPU --------------------------------------------------------------------------------


def adapter_child(spec: dict[str, Any]) -> int:
    """One TritonAdapter (default intervals) against ``spec['endpoint']``; measures its own
    CPU over ``spec['seconds']`` once ``spec['models']`` replicas are ready and warmed up."""
    import logging
    import resource

    from adapters.triton import TritonAdapter, TritonEndpoint

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)

    async def main() -> dict[str, Any]:
        adapter = TritonAdapter(TritonEndpoint.parse(spec["endpoint"]))
        await adapter.start()
        try:
            t0 = time.monotonic()
            while time.monotonic() - t0 < 60:
                reps = adapter.replicas.values()
                if len(reps) >= spec["models"] and all(r.ready and r.queue is not None
                                                       for r in reps):
                    break
                await asyncio.sleep(0.1)
            discovered = time.monotonic() - t0
            await asyncio.sleep(spec["warmup"])
            r0, w0 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
            polls0, errors0 = Counter(adapter.polls), Counter(adapter.errors)
            await asyncio.sleep(spec["seconds"])
            r1, w1 = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
            wall = w1 - w0
            user, sys_ = r1.ru_utime - r0.ru_utime, r1.ru_stime - r0.ru_stime
            polls = dict(Counter(adapter.polls) - polls0)
            return {"wall_s": wall, "user_s": user, "sys_s": sys_,
                    "pct_of_core": 100 * (user + sys_) / wall,
                    "polls": polls,
                    "polls_per_s": {k: v / wall for k, v in polls.items()},
                    "errors": dict(Counter(adapter.errors) - errors0),
                    "replicas": sorted(f"{m}/{v}" for m, v in adapter.replicas),
                    "discovered_s": discovered, "threads": threading.active_count(),
                    "os_threads": len(os.listdir("/proc/self/task"))
                    if Path("/proc/self/task").is_dir() else None}
        finally:
            await adapter.close()

    print(json.dumps(asyncio.run(main())), flush=True)
    return 0


def four_model_repo(path: Path) -> Path:
    """The shipped repository plus renamed copies of both models (config edited, the version
    directories symlinked): 4 models."""
    from meshd.dev.triton import DEFAULT_REPO

    path.mkdir(parents=True, exist_ok=True)
    for model in ("add_sub", "delay"):
        (path / model).symlink_to(DEFAULT_REPO / model, target_is_directory=True)
        copy = path / f"{model}_b"
        copy.mkdir()
        config = (DEFAULT_REPO / model / "config.pbtxt").read_text()
        (copy / "config.pbtxt").write_text(config.replace(f'name: "{model}"',
                                                          f'name: "{model}_b"', 1))
        (copy / "1").symlink_to(DEFAULT_REPO / model / "1", target_is_directory=True)
    return path


def cpu_bench(servers: dict[int, Any], args: argparse.Namespace, workdir: Path
              ) -> dict[str, Any]:
    """``servers``: models served -> a running TritonServer."""
    spec = {"servers": [{"name": f"{m}-models", "grpc": s.grpc_url,
                         "control": str(s.control_path), "square": True}
                        for m, s in servers.items()],
            "rate": args.load_rate, "burst": args.burst, "hold": args.hold,
            "gap": args.gap, "seed": args.seed + 1}
    load = Child("--load-child", spec, workdir / "load-cpu.log")
    children: dict[int, Child] = {}
    out: dict[str, Any] = {}
    try:
        load.read(60)
        for m, s in servers.items():
            children[m] = Child("--adapter-child", {
                "endpoint": f"{s.grpc_url},metrics={s.metrics_url}", "models": m,
                "warmup": 3.0, "seconds": args.cpu_seconds}, workdir / f"adapter-{m}.log")

        def groups() -> dict[str, list[int]]:
            g = {f"adapter ({m} models)": [c.pid] for m, c in children.items()}
            g["tritons (server + stubs)"] = [p for s in servers.values() for p in s.child_pids()]
            g["load generator"] = [load.pid]
            return g

        watch = CpuWatch(groups)
        _log(f"adapter CPU: {', '.join(f'{m} models' for m in children)} for "
             f"{args.cpu_seconds:.0f} s (+ discovery and 3 s warm-up)")
        for m, c in children.items():
            out[f"{m}_models"] = c.read(args.cpu_seconds + 120)
        out["cpu"] = watch.done()
        load.tell_stop()
        out["load"] = load.read(60)
    finally:
        for c in children.values():
            c.close()
        load.close()
    return out


# --- report -------------------------------------------------------------------------------------


def _verdict(ok: bool | None) -> str:
    return "-" if ok is None else ("pass" if ok else "FAIL")


def build_rows(results: dict[str, Any], args: argparse.Namespace
               ) -> tuple[list[list[str]], list[list[str]]]:
    rows: list[list[str]] = []
    ages: list[list[str]] = []
    fr = results.get("freshness")
    if fr:
        roles = fr["roles"]
        for path, bar, who in (("subscribed", SUBSCRIBED_P99_BAR_S, roles["subscribed"]),
                               ("gossip", GOSSIP_P99_BAR_S, roles["gossip"])):
            p = fr["paths"].get(path)
            if not p:
                rows.append([f"queue staleness, {path}", "no samples", "", "FAIL"])
                continue
            st, cats = p["staleness"], p["categories"]
            missed = cats.get("missed", 0) + cats.get("absent", 0)
            p99 = p["p99_counting_missed"]
            value = (f"p50 {_ms(st.get('p50'))}, p90 {_ms(st.get('p90'))}, "
                     f"p99 {_ms(st.get('p99'))}, max {_ms(st.get('max'))} "
                     f"({cats.get('seen', 0)} seen, {missed} missed"
                     + (f", {cats['already']} after a miss" if cats.get("already") else "")
                     + ")")
            label = ("subscribed" if path == "subscribed" else "gossip only")
            rows.append([f"queue staleness, {label} ({', '.join(who)})", value,
                         f"p99 <= {_ms(bar)}",
                         _verdict(p99 is not None and p99 <= bar)])
            for d in ("rise", "fall"):
                q = p["by_direction"][d]
                qs = q["staleness"]
                qm = q["categories"].get("missed", 0) + q["categories"].get("absent", 0)
                rows.append([f"  {'0 -> queued' if d == 'rise' else 'queued -> 0'}",
                             f"p50 {_ms(qs.get('p50'))}, p99 {_ms(qs.get('p99'))}, "
                             f"max {_ms(qs.get('max'))} ({q['categories'].get('seen', 0)} seen, "
                             f"{qm} missed)", "", "-"])
            rc = p["received"]
            if rc.get("n"):
                rows.append(["  received by the observer (its NodeView age; no poll delay)",
                             f"p50 {_ms(rc['p50'])}, p99 {_ms(rc['p99'])}, "
                             f"max {_ms(rc['max'])}", "", "-"])
            if missed:
                rows.append(["  p99 counting missed as infinitely late", _ms(p99), "", "-"])
            ra, gap, allp = p["reported_age"], p["staleness_minus_reported_age"], \
                p["age_all_polls"]
            ages.append([f"{label}: queue_age at first sight",
                         f"p50 {_ms(ra.get('p50'))}, p99 {_ms(ra.get('p99'))}, "
                         f"max {_ms(ra.get('max'))}",
                         f"p50 {_ms(st.get('p50'))}, p99 {_ms(st.get('p99'))}"])
            ages.append([f"{label}: measured - reported (at first sight)",
                         f"min {_ms(gap.get('min'))}, p50 {_ms(gap.get('p50'))}, "
                         f"p99 {_ms(gap.get('p99'))}, max {_ms(gap.get('max'))}",
                         ">= 0 (< 0: age overstated); the adapter's poll, or a later "
                         "re-measurement"])
            ck = p["age_check"]
            if ck.get("judged"):
                un, ov = ck["understated"], ck["overstated"]
                ages.append([f"{label}: level at (now - age) matches the truth",
                             f"{ck['consistent']} of {ck['judged']} readings; understated "
                             f"{un.get('n', 0)}" + (f" (by p50 {_ms(un['p50'])}, max "
                                                    f"{_ms(un['max'])})" if un.get("n") else "")
                             + f"; overstated {ov.get('n', 0)}"
                             + (f" (max {_ms(ov['max'])})" if ov.get("n") else ""),
                             f"all (readings within {_ms(AGE_MARGIN_S)} of a change not "
                             f"judged: {ck['near_change']})"])
            ages.append([f"{label}: queue_age on every poll",
                         f"p50 {_ms(allp.get('p50'))}, p99 {_ms(allp.get('p99'))}, "
                         f"max {_ms(allp.get('max'))} ({allp.get('n', 0)} readings)",
                         "vias " + ", ".join(f"{k} {v}" for k, v in
                                             sorted(p["via_all_polls"].items()))])
        sg = [v["gap_s"].get("p50", 0) for v in fr["scrape"].values() if v["gap_s"].get("n")]
        sg99 = [v["gap_s"].get("p99", 0) for v in fr["scrape"].values() if v["gap_s"].get("n")]
        pg = [v["gap_s"].get("p50", 0) for v in fr["poll"].values() if v["gap_s"].get("n")]
        pg99 = [v["gap_s"].get("p99", 0) for v in fr["poll"].values() if v["gap_s"].get("n")]
        if sg and pg:
            rows.append(["resolution: truth scrape / State poll interval (p50, p99)",
                         f"{_ms(statistics.median(sg))} ({_ms(max(sg99))}) / "
                         f"{_ms(statistics.median(pg))} ({_ms(max(pg99))}) "
                         f"(asked {args.scrape_ms:g} / {args.poll_ms:g} ms)", "", "-"])
        rows.append(["transitions (truth) per Triton; stall cycles",
                     ", ".join(f"{k} {v}" for k, v in fr["transitions"].items()) + "; " +
                     ", ".join(f"{k} {v}" for k, v in fr["stall_cycles"].items()), "", "-"])
        cpu = fr["cpu"]
        rows.append(["CPU during the measurement (cores)",
                     ", ".join(f"{k} {v['cores']:.2f} ({v['processes']} procs)"
                               for k, v in cpu["groups"].items())
                     + f"; others {cpu['other_cores'] or 0:.2f}", "", "-"])
    cb = results.get("cpu")
    if cb:
        for key in sorted(k for k in cb if k.endswith("_models")):
            r = cb[key]
            pps = r["polls_per_s"]
            rows.append([f"Triton adapter CPU, {key.split('_')[0]} models (1 Triton)",
                         f"{r['pct_of_core']:.2f} % of a core (user {r['user_s']:.2f} s, sys "
                         f"{r['sys_s']:.2f} s in {r['wall_s']:.0f} s; queue polls "
                         f"{pps.get('queue', 0):.1f}/s, stats {pps.get('stats', 0):.2f}/s"
                         + (f"; errors {r['errors']}" if r["errors"] else "") + ")",
                         f"<= {ADAPTER_CPU_BAR_PCT:g} %",
                         _verdict(r["pct_of_core"] <= ADAPTER_CPU_BAR_PCT)])
        cpu = cb.get("cpu")
        if cpu:
            rows.append(["CPU over the adapter phase, start-up included (cores)",
                         ", ".join(f"{k} {v['cores']:.2f} ({v['processes']} procs)"
                               for k, v in cpu["groups"].items())
                         + f"; others {cpu['other_cores'] or 0:.2f}", "", "-"])
    return rows, ages


AGE_HEAD = ("what the router is told (State queue_age)", "reported", "measured / note")


def build_notes(results: dict[str, Any], quick: bool) -> list[str]:
    notes = []
    if quick:
        notes.append("QUICK run: about 30 s of measurement, a smoke check; run without "
                     "--quick for the reported numbers.")
    fr = results.get("freshness")
    if fr:
        notes.append("Staleness = first State reply showing the new level - the transition's "
                     "time (midway between the last scrape with the old level and the first "
                     "with the new); it includes up to one State poll of detection delay. "
                     "'missed': the observer never showed the new level before the next "
                     "transition; the verdict counts those as later than any seen one.")
        if not fr["visible"]["ok"]:
            notes.append("SETUP: not every observer saw every replica (via stream where "
                         f"subscribed) within {READY_TIMEOUT_S:.0f} s: "
                         f"{json.dumps(fr['visible'].get('last'))[:800]}")
        for path, p in fr["paths"].items():
            notes.append(f"{path}: via of the first reply showing a change: "
                         f"{p['via_first_seen']}; per observer p99 "
                         + ", ".join(f"{o} {_ms(q['staleness'].get('p99'))}"
                                     for o, q in p["by_observer"].items()))
        pubs = {n: m.get("publications", {}) for n, m in fr["agent_metrics"].items()
                if n in fr["roles"]["publishers"]}
        if pubs and fr.get("measured_s"):
            notes.append("gossip publications per publisher (whole run, by reason): " + "; ".join(
                f"{n} " + ", ".join(f"{k} {v:.0f}" for k, v in sorted(r.items()))
                for n, r in pubs.items()))
        rej = {n: m.get("rejected") for n, m in fr["agent_metrics"].items() if m.get("rejected")}
        if rej:
            notes.append(f"signal rejections reported by agents: {rej}")
        errs = {o: v["errors"] for o, v in fr["poll"].items() if v["errors"]}
        errs.update({t: v["errors"] for t, v in fr["scrape"].items() if v["errors"]})
        if errs:
            notes.append(f"bench poll/scrape errors: {errs}")
        load = fr["load"]["summary"]
        bad = {n: (s["bg_errors"], s["burst_errors"]) for n, s in load.items()
               if s["bg_errors"] or s["burst_errors"]}
        notes.append("load: " + ", ".join(f"{n} {s['bg_ok']} add_sub + {s['burst_ok']} delay ok"
                                          for n, s in load.items())
                     + (f"; errors {bad}" if bad else ""))
        cpu = fr["cpu"]
        notes.append(f"machine: {os.cpu_count()} cores, load average {cpu['loadavg_before']} "
                     f"before and {cpu['loadavg_after']} after the freshness measurement; "
                     f"other processes used {cpu['other_cores'] or 0:.2f} cores during it.")
    cb = results.get("cpu")
    if cb and cb.get("cpu"):
        cpu = cb["cpu"]
        notes.append(f"adapter CPU measured in the adapter's own process (getrusage, all "
                     f"threads); load average {cpu['loadavg_before']} -> "
                     f"{cpu['loadavg_after']}, others used {cpu['other_cores'] or 0:.2f} cores.")
    return notes


def write_markdown(path: Path, title: str, rows: list[list[str]], ages: list[list[str]],
                   notes: list[str], report: dict[str, Any]) -> None:
    lines = [f"# {title}", "",
             f"{report['when']}, {report['cpu_count']} CPUs ({report['cpu_model']}), Python "
             f"{report['python']}, commit {report['git']['commit'][:12]}"
             + (f" + uncommitted changes in {', '.join(report['git']['dirty_files'])}"
                if report["git"]["dirty_files"] else "") + ".", "",
             f"`{' '.join(report['argv'])}`", "", format_table(HEAD, rows), ""]
    if ages:
        lines += [format_table(AGE_HEAD, ages), ""]
    lines += [f"* {n}" for n in notes]
    lines += ["", f"Wall time {report['wall_s']:.0f} s. Full data: "
              f"`{path.with_suffix('.json').name}`.", ""]
    path.write_text("\n".join(lines))


def _range(text: str) -> list[float]:
    lo, _, hi = text.partition(",")
    try:
        out = [float(lo), float(hi or lo)]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: expected LO,HI seconds") from None
    if not 0 < out[0] <= out[1]:
        raise argparse.ArgumentTypeError(f"{text!r}: expected 0 < LO <= HI")
    return out


# --- main ---------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="~30 s of measurement: a smoke check")
    ap.add_argument("--only", default="", help=f"comma-separated sections ({','.join(SECTIONS)})")
    ap.add_argument("--duration", type=float, help="freshness measurement, seconds (120; quick 30)")
    ap.add_argument("--agents", type=int, default=8)
    ap.add_argument("--tritons", type=int, default=4)
    ap.add_argument("--scrape-ms", type=float, default=20.0, help="ground-truth scrape interval")
    ap.add_argument("--poll-ms", type=float, default=25.0, help="State poll interval")
    ap.add_argument("--load-rate", type=float, default=20.0,
                    help="background add_sub requests per second per Triton")
    ap.add_argument("--burst", type=int, default=6, help="delay requests sent per stall")
    ap.add_argument("--hold", type=_range, default=list(HOLD_S), metavar="LO,HI",
                    help=f"stall hold, seconds (uniform; default {HOLD_S[0]:g},{HOLD_S[1]:g})")
    ap.add_argument("--gap", type=_range, default=list(GAP_S), metavar="LO,HI",
                    help=f"gap after a release, seconds (default {GAP_S[0]:g},{GAP_S[1]:g})")
    ap.add_argument("--cpu-seconds", type=float, help="adapter CPU measurement (60; quick 15)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "signals.json")
    ap.add_argument("--keep", action="store_true", help="keep the work dir (logs)")
    ap.add_argument("--raw", type=Path, help="also write the raw truth and State series here "
                                              "(gzipped JSON; times are CLOCK_MONOTONIC)")
    ap.add_argument("--load-child", help=argparse.SUPPRESS)
    ap.add_argument("--adapter-child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.load_child:
        return load_child(json.loads(args.load_child))
    if args.adapter_child:
        return adapter_child(json.loads(args.adapter_child))
    q = args.quick
    args.duration = args.duration or (30.0 if q else 120.0)
    args.cpu_seconds = args.cpu_seconds or (15.0 if q else 60.0)
    if args.tritons < 1 or args.agents < args.tritons + 3:
        ap.error("need --tritons >= 1 and --agents >= tritons + 3 (a gossip-only observer "
                 "at each end and at least one subscribed one)")
    sections = set(args.only.split(",")) if args.only else set(SECTIONS)
    if sections - set(SECTIONS):
        ap.error(f"--only: unknown section(s) {sorted(sections - set(SECTIONS))}")

    from meshd.dev.triton import (
        DEFAULT_REPO,
        TritonServer,
        start_all,
        stop_all,
        unavailable_reason,
    )

    reason = unavailable_reason()
    if reason:
        print(f"signals: Triton is unavailable here: {reason}", file=sys.stderr)
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="meshd-bench-signals-"))
    started = time.perf_counter()
    results: dict[str, Any] = {}
    failed: list[str] = []
    print(f"signals: sections {','.join(s for s in SECTIONS if s in sections)}"
          f"{' (quick)' if q else ''}; work dir {workdir}; load average {loadavg()}",
          file=sys.stderr, flush=True)
    servers: list[Any] = []
    try:
        count = args.tritons if "freshness" in sections else 1
        servers = [TritonServer(DEFAULT_REPO, workdir / f"triton{i}", name=f"triton{i}")
                   for i in range(count)]
        t0 = time.monotonic()
        start_all(servers, timeout=180)
        _log(f"{count} Triton servers ready in {time.monotonic() - t0:.1f} s")
        if "freshness" in sections:
            try:
                results["freshness"] = freshness_bench(servers, args, workdir)
                _log("freshness done")
            except Exception as exc:  # noqa: BLE001 - reported, cpu still runs
                failed.append(f"freshness: {type(exc).__name__}: {exc}")
                _log(f"freshness FAILED: {exc}")
        if "cpu" in sections:
            stop_all(servers[1:])  # keep one (2 models), add one with 4
            servers = servers[:1]
            four = TritonServer(four_model_repo(workdir / "repo4"), workdir / "triton-4models",
                                name="triton-4models")
            servers.append(four)
            start_all([four], timeout=180)
            try:
                results["cpu"] = cpu_bench({2: servers[0], 4: four}, args, workdir)
                _log("cpu done")
            except Exception as exc:  # noqa: BLE001 - reported
                failed.append(f"cpu: {type(exc).__name__}: {exc}")
                _log(f"cpu FAILED: {exc}")
    finally:
        stop_all(servers)
        if args.keep or failed:
            print(f"work dir kept: {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    wall = time.perf_counter() - started

    rows, ages = build_rows(results, args)
    for f in failed:
        rows.append([f"section {f.split(':', 1)[0]}", f.split(":", 1)[1].strip()[:160], "",
                     "FAIL"])
    notes = build_notes(results, q)
    title = (f"Signal plane: queue freshness (gossip vs subscribed) and Triton adapter CPU"
             f"{': QUICK sizes' if q else ''}")
    print(f"\n{title} ({os.cpu_count()} CPUs, Python {platform.python_version()}, "
          f"{args.agents} agents, {args.tritons} Tritons)\n")
    print_table(HEAD, rows)
    if ages:
        print()
        print_table(AGE_HEAD, ages)
    for note in notes:
        print(f"\n* {note}")
    print(f"\nwall time {wall:.0f} s")
    report = {
        "benchmark": "signals", "quick": q, "argv": sys.argv,
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **machine_info(),
        "loadavg_end": loadavg(), "git": _git(), "wall_s": wall,
        "setup": {"agents": args.agents, "tritons": args.tritons, "duration_s": args.duration,
                  "scrape_ms": args.scrape_ms, "poll_ms": args.poll_ms,
                  "load_rate_per_triton": args.load_rate, "burst": args.burst,
                  "hold_s": args.hold, "gap_s": args.gap, "tail_s": TAIL_S,
                  "cpu_seconds": args.cpu_seconds, "profile": "lan",
                  "adapter_intervals": {"queue_s": 0.1, "stats_s": 1.0},
                  "bars": {"subscribed_p99_s": SUBSCRIBED_P99_BAR_S,
                           "gossip_p99_s": GOSSIP_P99_BAR_S,
                           "adapter_cpu_pct_of_core": ADAPTER_CPU_BAR_PCT}},
        "table": [dict(zip(HEAD, r, strict=True)) for r in rows],
        "age_table": [dict(zip(AGE_HEAD, r, strict=True)) for r in ages],
        "notes": notes, "failed": failed, "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(report, indent=1, default=str) + "\n")
    os.replace(tmp, args.out)
    md = args.out.with_suffix(".md")
    write_markdown(md, title, rows, ages, notes, report)
    for p in (args.out, md):
        print(f"wrote {p.relative_to(ROOT) if p.is_relative_to(ROOT) else p}")
    return 1 if any(r[3] == "FAIL" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
