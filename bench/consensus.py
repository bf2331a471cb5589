"""Consensus: Raft commit latency, forwarded writes, reads, leader failover and catch-up.

    .venv/bin/python bench/consensus.py [--quick] [--only raft,admin,failover,catchup]

Sections (``--only`` keys):

* ``raft`` - the Raft layer alone: three child processes of this script, each running one
  :class:`consensus.group.RaftGroup` (the ``policy`` group, mTLS transport with minted node
  identities, journal and dump in a temp dir, default LAN ``Timing``) on 127.0.0.2..4.  In the
  leader's process, ``await group.propose({"op": "put", ...}, timeout=5)`` sequentially
  ``--proposals`` times (after a warm-up), ``perf_counter_ns`` around each call.  The same on a
  follower (pysyncobj forwards the command to the leader).  Also from the leader: the time spent
  in :class:`consensus.durability.JournalSync` (msync/fsync) per commit.
  Bars: leader commit p50 <= 2 ms, p99 <= 10 ms.
* ``admin`` - real meshd processes (``testbed/cluster.py``): three coordinators
  (``--role coordinator --bootstrap-expect 3``) and one plain node.  A client in this process
  (``grpc`` sync stubs over mTLS as an admin, one long-lived channel per node) makes sequential
  unary calls, the rows interleaved in blocks so drift on the machine is spread over all of
  them: ``PolicyApply`` (one TenantQuota) on the leader, on a coordinator follower and on the
  plain node (forwarded with ``Consensus.Propose``); ``PolicyGet`` of the local copy and
  ``PolicyGet consistent=true`` (a read through the log) on the plain node, the leader and the
  follower; and ``Whoami`` on the leader, the admin API's floor (mTLS + RBAC, no consensus).
  Bar: forwarded write (plain node) p50 <= 5 ms.
* ``failover`` - a writer thread sends one ``PolicyApply`` every ~5 ms (1 s deadline; each write
  a unique value for one of 16 keys) to the plain node or a coordinator follower (alternating
  kill by kill); the bench waits until the policy group has 3 voters that agree on the leader and
  are caught up, SIGKILLs the leader, and measures from the kill to the acknowledgement of the
  first write *sent after* the kill.  The killed coordinator is restarted (same data dir) before
  the next kill.  ``--kills`` times (50; quick 5): p50/p95/max.  At the end every key is read
  with ``consistent=true`` and every acknowledged write is checked: the key's final version must
  be >= the version the write was acknowledged with, and the final value must be that write's
  or one sent after it (a later write superseded it).  Bars: failover <= 2 s (max), zero lost
  acknowledged writes.
* ``catchup`` - a coordinator follower is SIGKILLed, ``--policies`` documents (10,000; quick
  2,000) are written to the leader (200 per ``PolicyApply``, 4 calls in flight), the follower is
  restarted, and the time from its restart until its ``RaftStatus`` shows the leader's version
  and last_applied is measured (with the milestones: admin API up, Raft group started).  Then
  the same for a brand-new coordinator (empty data dir) that the leader adds as a 4th voter.
  Every copy is checked to hold all written documents.

Prints one table and writes ``bench/results/consensus.json``.  ``--quick`` runs smaller sizes
(a smoke check, about two minutes) and says so.
"""

from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import contextlib
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
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# Run as a script, this file's folder comes first on sys.path and its name would shadow the
# ``consensus`` package: put the project root first instead.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from bench.table import (  # noqa: E402
    machine_busy_s,
    machine_info,
    print_table,
    proc_cpu_s,
)

SECTIONS = ("raft", "admin", "failover", "catchup")
TRUST_DOMAIN = "mesh.test"
COMMIT_P50_BAR_MS = 2.0
COMMIT_P99_BAR_MS = 10.0
FORWARD_P50_BAR_MS = 5.0
FAILOVER_BAR_S = 2.0
WRITE_PERIOD = 0.005
WRITE_TIMEOUT = 1.0
FAILOVER_KEYS = 16
BATCH = 200
BATCH_THREADS = 4
DIVERGED_AFTER = 10.0
"""Seconds a restarted coordinator may show the leader's last_applied but another store
version before the catch-up is called diverged (its state machine is not the leader's)."""
HEAD = ("metric", "value", "bar", "result")


# --- small helpers ------------------------------------------------------------------------------


def _quantile(values: list[float], q: float) -> float:
    """Nearest-rank quantile of a non-empty list."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _summary_ms(ns: list[int]) -> dict[str, float]:
    ms = [v / 1e6 for v in ns]
    return {"n": len(ms), "p50_ms": statistics.median(ms), "p99_ms": _quantile(ms, 0.99),
            "mean_ms": statistics.fmean(ms), "min_ms": min(ms), "max_ms": max(ms)}


def _summary_s(values: list[float]) -> dict[str, float]:
    return {"n": len(values), "p50_s": statistics.median(values),
            "p95_s": _quantile(values, 0.95), "max_s": max(values),
            "mean_s": statistics.fmean(values), "min_s": min(values)}


class CpuWatch:
    """CPU the machine used during a measurement, split into ours (this process and the given
    children) and others' (the machine is shared: other sessions' tests run at the same time)."""

    def __init__(self, pids: Callable[[], list[int]]) -> None:
        self.pids = pids
        self.t0 = time.monotonic()
        self.busy0 = machine_busy_s()
        self.ours0 = self._ours()

    def _ours(self) -> dict[int, float]:
        return {p: (proc_cpu_s(p) or 0.0) for p in [os.getpid(), *self.pids()]}

    def done(self) -> dict[str, float | None]:
        wall = time.monotonic() - self.t0
        busy1 = machine_busy_s()
        ours1 = self._ours()
        ours = sum(v - self.ours0.get(p, 0.0) for p, v in ours1.items())
        if self.busy0 is None or busy1 is None or wall <= 0:
            return {"wall_s": wall, "our_cores": ours / max(wall, 1e-9), "other_cores": None}
        other = max(0.0, busy1 - self.busy0 - ours)
        return {"wall_s": wall, "our_cores": ours / wall, "other_cores": other / wall}


def _log(msg: str) -> None:
    print(f"  {msg}", file=sys.stderr, flush=True)


def _quota(name: str, value: float) -> dict[str, Any]:
    return {"kind": "TenantQuota", "name": name, "spec": {"requests_per_second": value}}


# --- raft: RaftGroup in child processes ---------------------------------------------------------


def raft_child(spec: dict[str, Any]) -> int:
    """One RaftGroup member; JSON commands on stdin, one JSON reply per line on stdout."""
    import logging

    from certs import tls
    from certs.identity import Identity
    from certs.verify import PeerVerifier
    from consensus.group import RaftGroup
    from consensus.transport import RaftTls, mesh_authorizer
    from policy.model import KINDS

    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    ident_dir = Path(spec["identity"])
    ident = Identity.load(ident_dir)
    settings = RaftTls(tls.server_context(ident_dir), tls.client_context(ident_dir),
                       mesh_authorizer(PeerVerifier(ident.bundle, TRUST_DOMAIN)),
                       node_names=spec["names"])

    def reply(obj: dict[str, Any]) -> None:
        sys.stdout.write(json.dumps(obj) + "\n")
        sys.stdout.flush()

    async def bench(group: RaftGroup, n: int, warmup: int, tag: str) -> dict[str, Any]:
        lat: list[int] = []
        errors: Counter[str] = Counter()
        sync = group.durability
        syncs0 = s0 = 0.0
        cpu0 = time.process_time()
        for i in range(warmup + n):
            if i == warmup:
                syncs0, s0, cpu0 = sync.syncs, sync.sync_seconds, time.process_time()
            cmd = {"op": "put", "doc": _quota(f"{tag}-{i % 100}", float(i + 1)),
                   "author": "bench", "at": time.time()}
            t0 = time.perf_counter_ns()
            try:
                result = await group.propose(cmd, timeout=5)
            except Exception as exc:  # noqa: BLE001 - counted and reported
                errors[type(exc).__name__ + ":" + getattr(exc, "code", "")] += 1
                continue
            dt = time.perf_counter_ns() - t0
            if not result.get("ok"):
                errors[str(result.get("error"))] += 1
            elif i >= warmup:
                lat.append(dt)
        return {"latency_ns": lat, "errors": dict(errors), "syncs": sync.syncs - syncs0,
                "sync_s": sync.sync_seconds - s0, "cpu_s": time.process_time() - cpu0}

    async def main() -> None:
        group = RaftGroup("policy", address=spec["self"], partners=spec["members"],
                          data_dir=Path(spec["data"]), tls=settings,
                          kinds=frozenset(k for k, g in KINDS.items() if g == "policy"))
        await group.wait_bound()
        reply({"ready": True})
        try:
            while True:
                line = await asyncio.to_thread(sys.stdin.readline)
                if not line:
                    return
                cmd = json.loads(line)
                if cmd["op"] == "status":
                    st = group.status()
                    reply({"state": st.state, "leader": st.leader, "term": st.term,
                           "has_quorum": st.has_quorum, "commit": st.commit_index,
                           "applied": st.last_applied})
                elif cmd["op"] == "bench":
                    reply(await bench(group, cmd["n"], cmd["warmup"], cmd["tag"]))
                else:
                    return
        finally:
            await asyncio.to_thread(group.close)

    asyncio.run(main())
    return 0


class _Child:
    def __init__(self, spec: dict[str, Any], log: Path) -> None:
        from meshd.dev.processes import pdeathsig_prefix

        self.addr = spec["self"]
        self.log = open(log, "ab")  # noqa: SIM115 - closed in close()
        self.proc = subprocess.Popen(
            [*pdeathsig_prefix(), sys.executable, str(Path(__file__).resolve()),
             "--raft-child", json.dumps(spec)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self.log, text=True, bufsize=1, cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)})

    def ask(self, cmd: dict[str, Any]) -> dict[str, Any]:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self.read()

    def read(self) -> dict[str, Any]:
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"raft child {self.addr} exited ({self.proc.poll()})")
        return dict(json.loads(line))

    def close(self) -> None:
        with contextlib.suppress(Exception):
            assert self.proc.stdin is not None
            self.proc.stdin.write(json.dumps({"op": "quit"}) + "\n")
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


def raft_bench(n: int, warmup: int, workdir: Path) -> dict[str, Any]:
    from certs.ca import CertificateAuthority
    from certs.spiffe import SpiffeId
    from testbed.cluster import node_ip
    from testbed.raft import pick_raft_port

    ca = CertificateAuthority.create(TRUST_DOMAIN)
    ips = [node_ip(i) for i in (1, 2, 3)]
    port = pick_raft_port(ips, span=1)
    addrs = [f"{ip}:{port}" for ip in ips]
    names = {a: f"r{i + 1}" for i, a in enumerate(addrs)}
    children: list[_Child] = []
    try:
        for i, addr in enumerate(addrs):
            d = workdir / f"r{i + 1}"
            ca.mint(SpiffeId.node(TRUST_DOMAIN, names[addr]), ["node"]).save(d / "identity")
            children.append(_Child({"identity": str(d / "identity"), "self": addr,
                                    "members": addrs, "names": names, "data": str(d / "raft")},
                                   workdir / f"r{i + 1}.log"))
        for c in children:
            c.read()  # ready
        t0 = time.monotonic()
        leader = None
        while time.monotonic() - t0 < 30:
            sts = [c.ask({"op": "status"}) for c in children]
            leaders = {s["leader"] for s in sts}
            if len(leaders) == 1 and None not in leaders and all(s["has_quorum"] for s in sts):
                leader = next(c for c in children if c.addr == sts[0]["leader"])
                break
            time.sleep(0.1)
        if leader is None:
            raise RuntimeError(f"no Raft leader among the children in 30 s: {sts}")
        elected_s = time.monotonic() - t0
        follower = next(c for c in children if c is not leader)
        pids = [c.proc.pid for c in children]
        watch = CpuWatch(lambda: pids)
        on_leader = leader.ask({"op": "bench", "n": n, "warmup": warmup, "tag": "lead"})
        cpu_leader = watch.done()
        watch = CpuWatch(lambda: pids)
        on_follower = follower.ask({"op": "bench", "n": n, "warmup": warmup, "tag": "foll"})
        cpu_follower = watch.done()
    finally:
        for c in children:
            c.close()
    out: dict[str, Any] = {"elected_s": elected_s, "proposals": n, "warmup": warmup}
    for key, r, cpu in (("leader", on_leader, cpu_leader), ("follower", on_follower,
                                                              cpu_follower)):
        lat = r["latency_ns"]
        out[key] = {**(_summary_ms(lat) if lat else {"n": 0}), "errors": r["errors"],
                    "journal_syncs_per_commit": r["syncs"] / max(1, n),
                    "journal_sync_ms_per_commit": 1000 * r["sync_s"] / max(1, n),
                    "proposer_cpu_ms_per_commit": 1000 * r["cpu_s"] / max(1, n),
                    "cpu": cpu}
    return out


# --- a meshd cluster and an admin client --------------------------------------------------------


class Admin:
    """Admin gRPC calls from this process: one long-lived mTLS channel per node, never closed
    on an error (so a failed call does not cost the next one a handshake)."""

    def __init__(self, creds: Path) -> None:
        from certs.identity import Identity

        self.identity = Identity.load(creds)
        self._stubs: dict[str, Any] = {}
        self._channels: list[Any] = []
        self._lock = threading.Lock()

    def stub(self, target: str) -> Any:
        from certs import tls
        from proto.mesh.v1 import admin_pb2_grpc

        with self._lock:
            stub = self._stubs.get(target)
            if stub is None:
                channel = tls.grpc_channel(target, self.identity, options=[
                    ("grpc.initial_reconnect_backoff_ms", 50),
                    ("grpc.min_reconnect_backoff_ms", 50),
                    ("grpc.max_reconnect_backoff_ms", 250)])
                self._channels.append(channel)
                stub = self._stubs[target] = admin_pb2_grpc.AdminStub(channel)
            return stub

    def call(self, target: str, method: str, request: Any, timeout: float) -> Any:
        return getattr(self.stub(target), method)(request, timeout=timeout)

    def apply(self, target: str, docs: list[dict[str, Any]], timeout: float) -> Any:
        from proto.mesh.v1 import admin_pb2

        return self.call(target, "PolicyApply", admin_pb2.PolicyApplyRequest(
            text=json.dumps(docs if len(docs) > 1 else docs[0]), timeout_seconds=timeout),
            timeout)

    def close(self) -> None:
        for ch in self._channels:
            ch.close()


def _shorten(text: str) -> str:
    """An error message without its varying numbers, to count kinds of errors."""
    import re

    return re.sub(r"\d+", "#", text)[:160]


def _code(exc: BaseException) -> str:
    code = getattr(exc, "code", None)
    if callable(code):
        with contextlib.suppress(Exception):
            return str(code().name)
    return type(exc).__name__


@dataclass
class Mesh:
    """3 coordinators (n1..n3) + 1 plain node (n4), and room for one more coordinator (n5)."""

    cluster: Any
    admin: Admin
    raft_port: int
    voters: int = 3

    @property
    def plain(self) -> Any:
        return self.cluster.nodes[3]

    def coordinators(self) -> list[Any]:
        return [n for n in self.cluster.nodes if "coordinator" in n.args]

    def pids(self) -> list[int]:
        return [n.proc.pid for n in self.cluster.nodes if n.running]

    def policy_status(self, via: Any, timeout: float = 2.0) -> list[Any]:
        from proto.mesh.v1 import admin_pb2

        r = self.admin.call(via.admin, "RaftStatus", admin_pb2.RaftStatusRequest(), timeout)
        return [g for g in r.groups if g.group == "policy" or g.error]

    def healthy(self, via: Any | None = None, max_lag: int = 50) -> dict[str, Any] | None:
        """The policy group's leader entry if ``self.voters`` coordinators answer, agree on the
        leader and are at most ``max_lag`` entries behind it (else None)."""
        try:
            groups = self.policy_status(via or self.plain)
        except Exception:  # noqa: BLE001 - not healthy
            return None
        if any(g.error for g in groups):
            return None
        by_node = {g.node: g for g in groups}
        if len(by_node) != self.voters:
            return None
        leaders = {g.leader for g in groups}
        if len(leaders) != 1 or "" in leaders:
            return None
        lead = [g for g in groups if g.state == "leader"]
        if len(lead) != 1 or lead[0].address not in leaders:
            return None
        ld = lead[0]
        if len(ld.members) != self.voters or len(ld.reachable) != self.voters:
            return None
        if not all(g.has_quorum and len(g.members) == self.voters for g in groups):
            return None
        if any(ld.commit_index - g.last_applied > max_lag for g in groups):
            return None
        return {"leader": ld.node, "term": ld.term, "commit": ld.commit_index,
                "version": ld.version}

    def wait_healthy(self, timeout: float, via: Any | None = None) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            h = self.healthy(via)
            if h is not None:
                return h
            if time.monotonic() > deadline:
                raise RuntimeError(f"policy group not healthy with {self.voters} voters within "
                                   f"{timeout:.0f} s: {self._describe()}")
            time.sleep(0.1)

    def _describe(self) -> str:
        try:
            return "; ".join(f"{g.node}:{g.state} leader={g.leader} term={g.term} "
                             f"applied={g.last_applied} err={g.error!r}"
                             for g in self.policy_status(self.plain))
        except Exception as exc:  # noqa: BLE001
            return f"(RaftStatus failed: {exc})"

    def node(self, name: str) -> Any:
        return self.cluster.node(name)


def start_mesh(workdir: Path, spare: int) -> Mesh:
    from testbed.cluster import Cluster, node_ip
    from testbed.raft import coordinator_args, pick_raft_port

    ips = [node_ip(i) for i in range(1, 4 + spare + 1)]
    rp = pick_raft_port([ips[i] for i in (0, 1, 2, *range(4, 4 + spare))])

    def args(i: int) -> list[str]:
        return coordinator_args(i, rp, 3) if i <= 3 else []

    cluster = Cluster(4, workdir / "mesh", node_args=args, spare=spare)
    mesh = Mesh(cluster, Admin(cluster.admin_creds), rp)
    try:
        cluster.start()
        cluster.wait_converged(60)
        mesh.wait_healthy(60)
        # both groups: the placements group shares the coordinators' CPU
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            from proto.mesh.v1 import admin_pb2

            r = mesh.admin.call(mesh.plain.admin, "RaftStatus", admin_pb2.RaftStatusRequest(),
                                2)
            if len({g.node for g in r.groups if g.state == "leader"}) >= 1 and \
                    sum(1 for g in r.groups if g.state == "leader") == 2:
                break
            time.sleep(0.2)
    except BaseException:
        cluster.close()
        raise
    return mesh


# --- admin: latencies through the admin API -----------------------------------------------------


def admin_bench(mesh: Mesh, n: int, warmup: int, block: int) -> dict[str, Any]:
    from proto.mesh.v1 import admin_pb2

    h = mesh.wait_healthy(30)
    leader = mesh.node(h["leader"])
    follower = next(c for c in mesh.coordinators() if c.name != leader.name and c.running)
    plain = mesh.plain
    admin = mesh.admin
    counter = iter(range(1, 1 << 62))
    keys = [f"lat-{i}" for i in range(100)]
    admin.apply(leader.admin, [_quota(k, 1.0) for k in keys], 10)
    time.sleep(0.5)  # let every copy have the keys

    def apply_on(node: Any) -> Callable[[], Any]:
        def call() -> Any:
            i = next(counter)
            return admin.apply(node.admin, [_quota(keys[i % 100], float(i))], 5)
        return call

    def get_on(node: Any, consistent: bool) -> Callable[[], Any]:
        req = admin_pb2.PolicyGetRequest(kind="TenantQuota", name="lat-7", consistent=consistent)

        def call() -> Any:
            r = admin.call(node.admin, "PolicyGet", req, 5)
            if not r.found:
                raise RuntimeError("PolicyGet: lat-7 not found")
            return r
        return call

    whoami = admin_pb2.WhoamiRequest()
    rows: dict[str, Callable[[], Any]] = {
        "apply_leader": apply_on(leader),
        "apply_follower": apply_on(follower),
        "apply_plain": apply_on(plain),
        "get_local_plain": get_on(plain, False),
        "get_consistent_plain": get_on(plain, True),
        "get_local_leader": get_on(leader, False),
        "get_consistent_leader": get_on(leader, True),
        "get_consistent_follower": get_on(follower, True),
        "whoami_leader": lambda: admin.call(leader.admin, "Whoami", whoami, 5),
    }
    lat: dict[str, list[int]] = {k: [] for k in rows}
    errors: dict[str, Counter[str]] = {k: Counter() for k in rows}
    for fn in rows.values():
        for _ in range(warmup):
            with contextlib.suppress(Exception):
                fn()
    watch = CpuWatch(mesh.pids)
    order = list(rows)
    rnd = 0
    while any(len(v) + sum(errors[k].values()) < n for k, v in lat.items()):
        for k in order[rnd % len(order):] + order[:rnd % len(order)]:
            fn = rows[k]
            for _ in range(min(block, n - len(lat[k]) - sum(errors[k].values()))):
                t0 = time.perf_counter_ns()
                try:
                    fn()
                except Exception as exc:  # noqa: BLE001 - counted
                    errors[k][_code(exc)] += 1
                    continue
                lat[k].append(time.perf_counter_ns() - t0)
        rnd += 1
    cpu = watch.done()
    out: dict[str, Any] = {"leader": leader.name, "follower": follower.name, "plain": plain.name,
                           "calls": n, "warmup": warmup, "block": block, "cpu": cpu}
    for k in rows:
        out[k] = {**(_summary_ms(lat[k]) if lat[k] else {"n": 0}),
                  "errors": dict(errors[k])}
    return out


# --- failover: kill the leader under a steady writer --------------------------------------------


@dataclass
class Write:
    seq: int
    key: str
    value: float
    target: str
    sent: float
    done: float = 0.0
    version: int | None = None  # acknowledged with this version
    error: str = ""
    detail: str = ""


@dataclass
class Writer:
    """One PolicyApply every ``period`` seconds (sequential: the next is sent when the previous
    returned and the period passed) to ``target`` (an admin address, changeable)."""

    admin: Admin
    target: str
    period: float = WRITE_PERIOD
    timeout: float = WRITE_TIMEOUT
    keys: int = FAILOVER_KEYS
    writes: list[Write] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)
    acked: threading.Condition = field(default_factory=threading.Condition)

    def run(self) -> None:
        seq = 0
        nxt = time.perf_counter()
        while not self.stop.is_set():
            now = time.perf_counter()
            if now < nxt:
                time.sleep(nxt - now)
            nxt = max(nxt + self.period, time.perf_counter())
            seq += 1
            # the value encodes the sequence number, so a final value tells which write it was
            w = Write(seq, f"fo-{seq % self.keys}", float(seq), self.target, time.perf_counter())
            try:
                r = self.admin.apply(w.target, [_quota(w.key, w.value)], self.timeout)
                w.version = int(r.results[0].version)
            except Exception as exc:  # noqa: BLE001 - recorded
                w.error = _code(exc)
                details = getattr(exc, "details", None)
                w.detail = (details() if callable(details) else str(exc)) or ""
            w.done = time.perf_counter()
            with self.acked:
                self.writes.append(w)
                self.acked.notify_all()

    def first_ack_after(self, t: float, timeout: float) -> Write | None:
        deadline = time.monotonic() + timeout
        start = 0
        with self.acked:
            while True:
                for w in self.writes[start:]:
                    if w.sent >= t and w.version is not None:
                        return w
                start = len(self.writes)
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self.acked.wait(left)


def _check_writes(writes: list[Write], final: dict[str, tuple[float | None, int]]
                  ) -> dict[str, Any]:
    """Every acknowledged write must be the key's final value or superseded by a write sent
    after it (else its value is lost), and the key's final version must be >= its acknowledged
    version (else the version went back: what ``if_version`` relies on).  Either counts as
    lost, as the issue defines it; the two are also counted apart."""
    lost: list[dict[str, Any]] = []
    acked = [w for w in writes if w.version is not None]
    by_seq = {w.seq: w for w in writes}
    kinds: Counter[str] = Counter()
    superseded_by_acked = superseded_by_unacked = 0
    for w in acked:
        value, version = final[w.key]
        problems = []
        if version < w.version:  # type: ignore[operator]
            problems.append(f"final version {version} < acknowledged {w.version}")
            kinds["version_went_back"] += 1
        if value is None:
            problems.append("key missing")
            kinds["value_lost"] += 1
        elif int(value) == w.seq:
            if version != w.version:
                problems.append(f"final value is this write but version {version} != "
                                f"{w.version}")
                kinds["version_changed"] += 1
        elif int(value) < w.seq:
            problems.append(f"final value is from an older write (seq {int(value)})")
            kinds["value_lost"] += 1
        else:
            later = by_seq.get(int(value))
            if later is None:
                problems.append(f"final value {value} was never written")
                kinds["value_lost"] += 1
            elif later.version is not None:
                superseded_by_acked += 1
            else:
                superseded_by_unacked += 1
        if problems:
            lost.append({"seq": w.seq, "key": w.key, "acked_version": w.version,
                         "problem": "; ".join(problems)})
    # versions must grow with acknowledgement order per key (a sequential writer)
    regressions = []
    last: dict[str, int] = {}
    for w in sorted(acked, key=lambda w: w.done):
        if w.version is not None and w.version <= last.get(w.key, 0):
            regressions.append(w)
        last[w.key] = max(last.get(w.key, 0), w.version or 0)
    first = regressions[0] if regressions else None
    return {"acked": len(acked), "lost": len(lost), "lost_by_kind": dict(kinds),
            "lost_examples": lost[:10], "version_regressions": len(regressions),
            "first_regression": None if first is None else {
                "seq": first.seq, "key": first.key, "version": first.version,
                "previous_acked_version": last.get(first.key), "done": first.done},
            "final_is_later_acked_write": superseded_by_acked,
            "final_is_later_unacked_write": superseded_by_unacked}


def failover_bench(mesh: Mesh, kills: int, workdir: Path) -> dict[str, Any]:
    from proto.mesh.v1 import admin_pb2

    h = mesh.wait_healthy(60)
    writer = Writer(mesh.admin, mesh.plain.admin)
    thread = threading.Thread(target=writer.run, name="writer", daemon=True)
    thread.start()
    rows: list[dict[str, Any]] = []
    watch = CpuWatch(mesh.pids)
    try:
        for k in range(kills):
            h = mesh.wait_healthy(90)
            leader = mesh.node(h["leader"])
            via = "plain" if k % 2 == 0 else "follower"
            if via == "plain":
                target = mesh.plain
            else:
                target = random.choice([c for c in mesh.coordinators()
                                        if c.name != leader.name and c.running])
            writer.target = target.admin
            # steady state: the writer got acks through this target for a moment
            t_switch = time.perf_counter()
            if writer.first_ack_after(t_switch, 10) is None:
                raise RuntimeError(f"no write acknowledged through {target.name} before kill {k}")
            time.sleep(0.3)
            n_before = len(writer.writes)
            t_kill = time.perf_counter()
            leader.kill()
            first = writer.first_ack_after(t_kill, 60)
            if first is None:
                raise RuntimeError(f"kill {k}: no write acknowledged within 60 s of killing "
                                   f"{leader.name}")
            failover = first.done - t_kill
            with writer.acked:
                window = [w for w in writer.writes[n_before:] if w.done <= first.done]
            inflight = [w for w in window if w.sent < t_kill]
            errs = Counter(w.error for w in window if w.error)
            details = Counter(f"{w.error}: {_shorten(w.detail)}" for w in window if w.error)
            # restart the killed coordinator (join through a live node: it may be the seed)
            time.sleep(0.2)
            t_restart = time.perf_counter()
            seed = next(n for n in mesh.cluster.nodes if n.running and n is not leader)
            leader.start(join=[seed.gossip])
            h2 = mesh.wait_healthy(90)
            back = time.perf_counter() - t_restart
            rows.append({"kill": k, "at": t_kill, "killed": leader.name, "via": via,
                         "target": target.name,
                         "failover_s": failover, "new_leader": h2["leader"],
                         "term_before": h["term"], "term_after": h2["term"],
                         "first_ack_seq": first.seq,
                         "first_ack_send_after_kill_s": first.sent - t_kill,
                         "writes_failed_in_window": dict(errs),
                         "error_details": dict(details.most_common(4)),
                         "inflight_at_kill": [{"seq": w.seq, "error": w.error,
                                               "version": w.version,
                                               "done_after_kill_s": w.done - t_kill}
                                              for w in inflight],
                         "restart_to_healthy_s": back})
            _log(f"kill {k + 1}/{kills}: {leader.name} (via {via} {target.name}) failover "
                 f"{failover:.3f} s, new leader {h2['leader']}, errors {dict(errs)}, "
                 f"back in {back:.1f} s")
    finally:
        writer.stop.set()
        thread.join(timeout=10)
    cpu = watch.done()
    mesh.wait_healthy(90)
    # final consistent read of every key
    final: dict[str, tuple[float | None, int]] = {}
    for i in range(FAILOVER_KEYS):
        key = f"fo-{i}"
        for attempt in range(20):
            try:
                r = mesh.admin.call(mesh.plain.admin, "PolicyGet", admin_pb2.PolicyGetRequest(
                    kind="TenantQuota", name=key, consistent=True, timeout_seconds=5), 6)
                break
            except Exception:  # noqa: BLE001 - retried
                if attempt == 19:
                    raise
                time.sleep(0.5)
        if r.found:
            doc = json.loads(r.document_json)
            final[key] = (float(doc["spec"]["requests_per_second"]), int(doc["version"]))
        else:
            final[key] = (None, 0)
    check = _check_writes(writer.writes, final)
    first = check["first_regression"]
    if first is not None:  # which kill it followed
        before = [r for r in rows if r["at"] <= first["done"]]
        first["after_kill"] = before[-1]["kill"] if before else None
        first["s_after_that_kill"] = first["done"] - before[-1]["at"] if before else None
    # every node's read copy ends at the same policy version, with the same failover keys
    time.sleep(1.0)
    copies: dict[str, int] = {}
    differing: dict[str, int] = {}
    for n in mesh.cluster.nodes:
        if not n.running:
            continue
        with contextlib.suppress(Exception):
            r = mesh.admin.call(n.admin, "RaftStatus", admin_pb2.RaftStatusRequest(), 3)
            copies[n.name] = int(r.local_versions["policy"])
            lst = mesh.admin.call(n.admin, "PolicyList", admin_pb2.PolicyListRequest(
                kind="TenantQuota"), 10)
            docs = {d["name"]: d for d in map(json.loads, lst.documents_json)}
            differing[n.name] = sum(
                1 for key, (value, version) in final.items()
                if (docs.get(key) is None) != (value is None) or (docs.get(key) is not None and (
                    float(docs[key]["spec"]["requests_per_second"]) != value
                    or int(docs[key]["version"]) != version)))
    by_code = Counter(w.error for w in writer.writes if w.error)
    lat = [int((w.done - w.sent) * 1e9) for w in writer.writes if w.version is not None]
    return {"kills": kills, "rows": rows,
            "failover": _summary_s([r["failover_s"] for r in rows]) if rows else {},
            "failover_plain": _summary_s([r["failover_s"] for r in rows
                                          if r["via"] == "plain"]) if rows else {},
            "failover_follower": _summary_s([r["failover_s"] for r in rows
                                             if r["via"] == "follower"]) if kills > 1 else {},
            "restart_to_healthy": _summary_s([r["restart_to_healthy_s"] for r in rows])
            if rows else {},
            "writes": len(writer.writes), "write_errors": dict(by_code),
            "acked_write_latency": _summary_ms(lat) if lat else {},
            "check": check, "read_copies_policy_version": copies,
            "read_copies_agree": len(set(copies.values())) == 1,
            "read_copies_keys_differing": differing, "cpu": cpu}


# --- catch-up: a restarted and a brand-new coordinator ------------------------------------------


def _write_many(mesh: Mesh, target: str, names: list[str]) -> dict[str, Any]:
    batches = [names[i:i + BATCH] for i in range(0, len(names), BATCH)]
    errors: Counter[str] = Counter()

    def one(batch: list[str]) -> int:
        docs = [_quota(n, float(i + 1)) for i, n in enumerate(batch)]
        for attempt in range(5):
            try:
                mesh.admin.apply(target, docs, 30)
                return len(docs)
            except Exception as exc:  # noqa: BLE001 - retried (puts are idempotent here)
                errors[_code(exc)] += 1
                time.sleep(0.5 * (attempt + 1))
        raise RuntimeError(f"PolicyApply of {len(docs)} documents failed 5 times: {errors}")

    t0 = time.perf_counter()
    watch = CpuWatch(mesh.pids)
    with concurrent.futures.ThreadPoolExecutor(BATCH_THREADS) as pool:
        written = sum(pool.map(one, batches))
    wall = time.perf_counter() - t0
    return {"documents": written, "calls": len(batches), "per_call": BATCH,
            "in_flight": BATCH_THREADS, "wall_s": wall, "docs_per_s": written / wall,
            "errors": dict(errors), "cpu": watch.done()}


def _catch_up(mesh: Mesh, node: Any, leader: Any, timeout: float) -> dict[str, Any]:
    """Start ``node`` and wait until its policy group matches the leader's version and
    last_applied (as of the start)."""
    from proto.mesh.v1 import admin_pb2

    st = [g for g in mesh.policy_status(leader) if g.node == leader.name][0]
    want_version, want_applied = st.version, st.last_applied
    t0 = time.perf_counter()
    seed = next(n for n in mesh.cluster.nodes if n.running and n is not node)
    node.start(join=[seed.gossip])
    marks: dict[str, float] = {}
    last: dict[str, Any] = {}
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            r = mesh.admin.call(node.admin, "RaftStatus", admin_pb2.RaftStatusRequest(), 1.0)
        except Exception:  # noqa: BLE001 - not up yet
            time.sleep(0.02)
            continue
        now = time.perf_counter() - t0
        marks.setdefault("admin_up_s", now)
        mine = [g for g in r.groups if g.group == "policy" and g.node == node.name]
        if mine:
            g = mine[0]
            marks.setdefault("raft_started_s", now)
            last = {"version": g.version, "last_applied": g.last_applied, "state": g.state,
                    "local_copy": int(r.local_versions["policy"])}
            if g.last_applied >= want_applied:
                marks.setdefault("log_caught_up_s", now)
                if g.version >= want_version:
                    marks.setdefault("caught_up_s", now)
                    if int(r.local_versions["policy"]) >= want_version:
                        marks["read_copy_s"] = now
                        break
                elif now - marks["log_caught_up_s"] > DIVERGED_AFTER:
                    break  # the log is applied but the store is not the leader's: diverged
        time.sleep(0.02)
    diverged = "log_caught_up_s" in marks and "caught_up_s" not in marks
    return {"node": node.name, "leader_version": want_version,
            "leader_last_applied": want_applied, **marks, "diverged": diverged,
            "last_seen": last}


def _count_docs(mesh: Mesh, node: Any, prefix: str) -> int:
    from proto.mesh.v1 import admin_pb2

    r = mesh.admin.call(node.admin, "PolicyList", admin_pb2.PolicyListRequest(
        kind="TenantQuota"), 30)
    return sum(1 for d in r.documents_json if json.loads(d)["name"].startswith(prefix))


def catchup_bench(mesh: Mesh, policies: int, new_coordinator: bool) -> dict[str, Any]:
    from testbed.cluster import node_ip

    out: dict[str, Any] = {"policies": policies}
    h = mesh.wait_healthy(90)
    leader = mesh.node(h["leader"])
    victim = next(c for c in mesh.coordinators() if c.name != leader.name and c.running)
    victim.kill()
    out["stopped"] = victim.name
    time.sleep(0.5)
    names = [f"cu-{i:05d}" for i in range(policies)]
    out["write"] = _write_many(mesh, leader.admin, names)
    _log(f"catch-up: wrote {policies} policies in {out['write']['wall_s']:.1f} s "
         f"({out['write']['docs_per_s']:.0f}/s) with {victim.name} down")
    watch = CpuWatch(mesh.pids)
    out["restart"] = _catch_up(mesh, victim, leader, 300)
    out["restart"]["cpu"] = watch.done()
    _log(f"catch-up: {victim.name} restarted, caught up in "
         f"{out['restart'].get('caught_up_s', float('nan')):.2f} s")
    mesh.wait_healthy(120)
    out["restart"]["documents"] = _count_docs(mesh, victim, "cu-")
    if new_coordinator:
        h = mesh.wait_healthy(60)
        leader = mesh.node(h["leader"])
        i = len(mesh.cluster.nodes) + 1
        node = mesh.cluster.add_node(args=["--role", "coordinator", "--bootstrap-expect", "3",
                                           "--raft", f"{node_ip(i)}:{mesh.raft_port}"])
        watch = CpuWatch(mesh.pids)
        out["new"] = _catch_up(mesh, node, leader, 300)
        out["new"]["cpu"] = watch.done()
        _log(f"catch-up: new coordinator {node.name} caught up in "
             f"{out['new'].get('caught_up_s', float('nan')):.2f} s")
        mesh.voters = 4
        with contextlib.suppress(Exception):
            mesh.wait_healthy(120)
        out["new"]["documents"] = _count_docs(mesh, node, "cu-")
    return out


# --- report ------------------------------------------------------------------------------------


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f} ms"


def _s(x: float | None) -> str:
    return "-" if x is None else f"{x:.2f} s"


def _verdict(ok: bool | None) -> str:
    return "-" if ok is None else ("pass" if ok else "FAIL")


def build_rows(results: dict[str, Any]) -> list[list[str]]:
    rows: list[list[str]] = []

    def lat(label: str, r: dict[str, Any] | None, p50_bar: float | None = None,
            p99_bar: float | None = None) -> None:
        if not r or not r.get("n"):
            rows.append([label, f"no samples ({r.get('errors') if r else ''})", "", "FAIL"])
            return
        err = sum(r.get("errors", {}).values())
        value = f"p50 {_ms(r['p50_ms'])}, p99 {_ms(r['p99_ms'])}" + (
            f" ({err} errors)" if err else "")
        bars, ok = [], None
        if p50_bar is not None:
            bars.append(f"p50 <= {p50_bar:g} ms")
            ok = r["p50_ms"] <= p50_bar
        if p99_bar is not None:
            bars.append(f"p99 <= {p99_bar:g} ms")
            ok = bool(ok) and r["p99_ms"] <= p99_bar
        rows.append([label, value, ", ".join(bars), _verdict(ok)])

    raft = results.get("raft")
    if raft:
        lat("raft propose on leader (RaftGroup, 3 processes)", raft["leader"],
            COMMIT_P50_BAR_MS, COMMIT_P99_BAR_MS)
        lat("raft propose on follower (forwarded by pysyncobj)", raft["follower"])
        rows.append(["  journal msync/fsync per leader commit",
                     f"{raft['leader']['journal_sync_ms_per_commit']:.3f} ms "
                     f"({raft['leader']['journal_syncs_per_commit']:.2f} syncs)", "", "-"])
    adm = results.get("admin")
    if adm:
        lat("admin PolicyApply on leader", adm["apply_leader"])
        lat("admin PolicyApply on coordinator follower", adm["apply_follower"])
        lat("admin PolicyApply on plain node (forwarded)", adm["apply_plain"],
            FORWARD_P50_BAR_MS)
        lat("admin PolicyGet local copy (plain node)", adm["get_local_plain"])
        lat("admin PolicyGet consistent (plain node)", adm["get_consistent_plain"])
        lat("admin PolicyGet local copy (leader)", adm["get_local_leader"])
        lat("admin PolicyGet consistent (leader)", adm["get_consistent_leader"])
        lat("admin PolicyGet consistent (follower)", adm["get_consistent_follower"])
        lat("admin Whoami on leader (API floor)", adm["whoami_leader"])
    fo = results.get("failover")
    if fo and fo.get("failover"):
        f = fo["failover"]
        rows.append([f"failover: kill leader -> first ack ({f['n']} kills)",
                     f"p50 {_s(f['p50_s'])}, p95 {_s(f['p95_s'])}, max {_s(f['max_s'])}",
                     f"max <= {FAILOVER_BAR_S:g} s", _verdict(f["max_s"] <= FAILOVER_BAR_S)])
        for via in ("plain", "follower"):
            g = fo.get(f"failover_{via}")
            if g:
                rows.append([f"  writes via {'plain node' if via == 'plain' else 'follower'}"
                             f" ({g['n']} kills)",
                             f"p50 {_s(g['p50_s'])}, p95 {_s(g['p95_s'])}, max {_s(g['max_s'])}",
                             "", "-"])
        c = fo["check"]
        kinds = ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in
                          c.get("lost_by_kind", {}).items())
        rows.append(["lost acknowledged writes",
                     f"{c['lost']} of {c['acked']} acked ({fo['writes']} sent)"
                     + (f": {kinds}" if kinds else ""), "0",
                     _verdict(c["lost"] == 0 and c["version_regressions"] == 0)])
        copies = fo.get("read_copies_keys_differing") or {}
        rows.append(["read copies after the kills (failover keys, versions)",
                     "all equal to the consistent read" if fo["read_copies_agree"] and
                     not any(copies.values()) else
                     f"DIFFER: versions {fo['read_copies_policy_version']}, keys differing "
                     f"{copies}", "equal", _verdict(fo["read_copies_agree"] and
                                                    not any(copies.values()))])
        r = fo.get("restart_to_healthy")
        if r:
            rows.append(["  killed coordinator restart -> 3 voters caught up",
                         f"p50 {_s(r['p50_s'])}, max {_s(r['max_s'])}", "", "-"])
    cu = results.get("catchup")
    if cu:
        w = cu["write"]
        rows.append([f"bulk write {w['documents']} policies ({w['per_call']}/call, "
                     f"{w['in_flight']} in flight, 2 of 3 up)",
                     f"{w['wall_s']:.1f} s ({w['docs_per_s']:.0f} docs/s)", "", "-"])
        for key, label in (("restart", "restarted coordinator"), ("new", "new coordinator")):
            r = cu.get(key)
            if not r:
                continue
            ok = "caught_up_s" in r and r.get("documents") == cu["policies"]
            if r.get("diverged"):
                seen = r.get("last_seen", {})
                value = (f"DIVERGED: log applied to {seen.get('last_applied')} in "
                         f"{_s(r.get('log_caught_up_s'))} but store version "
                         f"{seen.get('version')} != leader {r['leader_version']}; "
                         f"{r.get('documents')} of {cu['policies']} docs")
            else:
                value = (f"{_s(r.get('caught_up_s'))} (admin up {_s(r.get('admin_up_s'))}, "
                         f"raft started {_s(r.get('raft_started_s'))}, read copy "
                         f"{_s(r.get('read_copy_s'))}; {r.get('documents')} docs)")
            rows.append([f"catch-up: {label}, restart -> caught up", value,
                         "all docs", _verdict(ok)])
    return rows


def build_notes(results: dict[str, Any], quick: bool) -> list[str]:
    notes = []
    if quick:
        notes.append("QUICK run: small sizes, a smoke check; run without --quick for the "
                     "reported numbers.")
    raft, adm = results.get("raft"), results.get("admin")
    if raft and adm and raft["leader"].get("n") and adm["apply_leader"].get("n"):
        d = adm["apply_leader"]["p50_ms"] - raft["leader"]["p50_ms"]
        notes.append(f"PolicyApply on the leader costs {d:.2f} ms (p50) more than the bare "
                     f"propose: gRPC + mTLS + RBAC/audit + parse/validate + read-your-write "
                     f"wait; Whoami (the API floor) is {adm['whoami_leader']['p50_ms']:.2f} ms.")
    fo = results.get("failover")
    if fo and fo.get("rows"):
        slow = [r for r in fo["rows"] if r["failover_s"] > FAILOVER_BAR_S]
        if slow:
            notes.append("kills over the bar: " + ", ".join(
                f"#{r['kill']} {r['killed']} via {r['via']} {r['failover_s']:.2f} s"
                for r in slow[:10]))
        first = fo["check"].get("first_regression")
        if first:
            notes.append(f"acknowledged versions first went back at write #{first['seq']} "
                         f"({first['key']} acked at version {first['version']} after "
                         f"{first['previous_acked_version']}), "
                         f"{first.get('s_after_that_kill') or 0:.1f} s after kill "
                         f"#{first.get('after_kill')}.")
        plain = [r for r in fo["rows"] if r["via"] == "plain"]
        if plain:
            notes.append("kills with writes via the plain node (killed -> new leader: "
                         "failover): " + ", ".join(
                             f"{r['killed']}->{r['new_leader']}: {r['failover_s']:.2f} s"
                             for r in plain))
        top: Counter[str] = Counter()
        for r in fo["rows"]:
            top.update(r.get("error_details", {}))
        if top:
            notes.append("most common write errors in the failover windows: " + "; ".join(
                f"{n}x {d}" for d, n in top.most_common(3)))
        notes.append(f"writer: {fo['writes']} writes, errors by code {fo['write_errors']}; "
                     f"final read copies agree: {fo['read_copies_agree']} (policy versions "
                     f"{fo['read_copies_policy_version']}; failover keys differing from the "
                     f"consistent read: {fo.get('read_copies_keys_differing')})")
    cu = results.get("catchup")
    if cu and cu.get("write", {}).get("cpu"):
        cpu = cu["write"]["cpu"]
        notes.append(f"bulk write: the agents and this client used {cpu['our_cores']:.2f} of "
                     f"{os.cpu_count()} cores (others {cpu['other_cores'] or 0:.2f}).")
    for key in ("raft", "admin", "failover"):
        r = results.get(key)
        cpu = (r or {}).get("cpu") or (r or {}).get("leader", {}).get("cpu")
        if cpu and cpu.get("other_cores") is not None:
            notes.append(f"{key}: other processes used {cpu['other_cores']:.2f} cores during "
                         f"the measurement (ours {cpu['our_cores']:.2f}).")
    return notes


# --- main ----------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes: a smoke check")
    ap.add_argument("--only", default="",
                    help=f"comma-separated sections to (re)run, merged into --out's results "
                         f"({','.join(SECTIONS)})")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "consensus.json")
    ap.add_argument("--proposals", type=int, help="raft proposals per row (2,000; quick 300)")
    ap.add_argument("--calls", type=int, help="admin calls per row (2,000; quick 300)")
    ap.add_argument("--warmup", type=int, help="warm-up calls per row (200; quick 50)")
    ap.add_argument("--block", type=int, default=100, help="admin calls per timed block")
    ap.add_argument("--kills", type=int, help="leader kills (50; quick 5)")
    ap.add_argument("--policies", type=int, help="policies written while a coordinator is down "
                                                  "(10,000; quick 2,000)")
    ap.add_argument("--no-new-coordinator", action="store_true",
                    help="skip the brand-new coordinator catch-up")
    ap.add_argument("--keep", action="store_true", help="keep the work dir (logs)")
    ap.add_argument("--raft-child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.raft_child:
        return raft_child(json.loads(args.raft_child))
    q = args.quick
    args.proposals = args.proposals or (300 if q else 2000)
    args.calls = args.calls or (300 if q else 2000)
    args.warmup = args.warmup if args.warmup is not None else (50 if q else 200)
    args.kills = args.kills if args.kills is not None else (5 if q else 50)
    args.policies = args.policies or (2000 if q else 10_000)
    sections = set(SECTIONS)
    previous: dict[str, Any] = {}
    if args.only:
        sections = set(args.only.split(","))
        if sections - set(SECTIONS):
            ap.error(f"--only: unknown section(s) {sorted(sections - set(SECTIONS))}")
        if args.out.exists():
            previous = json.loads(args.out.read_text()).get("results", {})

    workdir = Path(tempfile.mkdtemp(prefix="meshd-bench-consensus-"))
    started = time.perf_counter()
    results: dict[str, Any] = dict(previous)
    print(f"consensus: sections {','.join(s for s in SECTIONS if s in sections)}"
          f"{' (quick)' if q else ''}; work dir {workdir}", file=sys.stderr, flush=True)
    failed: list[str] = []
    try:
        if "raft" in sections:
            results["raft"] = raft_bench(args.proposals, args.warmup, workdir / "raft")
            _log(f"raft done: leader p50 {results['raft']['leader'].get('p50_ms', 0):.2f} ms")
        if sections & {"admin", "failover", "catchup"}:
            t0 = time.perf_counter()
            mesh = start_mesh(workdir, spare=1)
            _log(f"mesh up in {time.perf_counter() - t0:.1f} s (raft port {mesh.raft_port})")
            try:
                for name, run in (
                        ("admin", lambda: admin_bench(mesh, args.calls, args.warmup,
                                                      args.block)),
                        ("failover", lambda: failover_bench(mesh, args.kills, workdir)),
                        ("catchup", lambda: catchup_bench(mesh, args.policies,
                                                          not args.no_new_coordinator))):
                    if name not in sections:
                        continue
                    try:
                        results[name] = run()
                        _log(f"{name} done")
                    except Exception as exc:  # noqa: BLE001 - reported, others still run
                        failed.append(f"{name}: {type(exc).__name__}: {exc}")
                        _log(f"{name} FAILED: {exc}")
                        results.pop(name, None)
            finally:
                mesh.cluster.close()
                mesh.admin.close()
    finally:
        if args.keep or failed:
            print(f"work dir kept: {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    wall = time.perf_counter() - started

    rows = build_rows(results)
    for f in failed:
        rows.append([f"section {f.split(':', 1)[0]}", f.split(":", 1)[1].strip()[:120], "",
                     "FAIL"])
    notes = build_notes(results, q)
    print(f"\nConsensus: Raft commits, forwarded writes, reads, failover, catch-up"
          f"{': QUICK sizes' if q else ''} ({os.cpu_count()} CPUs, Python "
          f"{platform.python_version()})\n")
    print_table(HEAD, rows)
    for note in notes:
        print(f"\n* {note}")
    print(f"\nwall time {wall:.0f} s")
    report = {
        "benchmark": "consensus", "quick": q, "argv": sys.argv,
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **machine_info(), "wall_s": wall,
        "setup": {"proposals": args.proposals, "admin_calls": args.calls,
                  "warmup": args.warmup, "block": args.block, "kills": args.kills,
                  "policies": args.policies, "batch": BATCH, "batch_in_flight": BATCH_THREADS,
                  "write_period_s": WRITE_PERIOD, "write_timeout_s": WRITE_TIMEOUT,
                  "failover_keys": FAILOVER_KEYS, "coordinators": 3, "plain_nodes": 1,
                  "profile": "lan",
                  "bars": {"leader_commit_p50_ms": COMMIT_P50_BAR_MS,
                           "leader_commit_p99_ms": COMMIT_P99_BAR_MS,
                           "forwarded_p50_ms": FORWARD_P50_BAR_MS,
                           "failover_max_s": FAILOVER_BAR_S, "lost_writes": 0}},
        "table": [dict(zip(HEAD, r, strict=True)) for r in rows],
        "notes": notes,
        "failed": failed,
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {args.out.relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out}")
    return 1 if any(r[3] == "FAIL" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
