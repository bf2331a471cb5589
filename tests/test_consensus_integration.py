"""Raft groups end to end: real meshd processes, real mTLS, real pysyncobj (testbed/cluster.py).

Coordinators run with ``--role coordinator --bootstrap-expect N --raft IP:PORT`` (the two groups
listen on PORT and PORT+1); the other nodes forward writes and follow a coordinator's log.  Every
scenario builds its own small cluster, drives it through the admin API (``PolicyApply``,
``PolicyGet``, ``PolicyList``, ``RaftStatus``, ``Members``, ``Cordon``) and kills processes with
SIGKILL (crash) or SIGTERM (graceful leave).

What is asserted, and the bounds (generous for a loaded 2-core machine; ``bench/`` measures the
tight numbers):

- bootstrap forms both groups with every expected voter; writes from a plain node (forwarded)
  and from a follower commit and show on every node within 2 s;
- a leader crash stops writes for at most 5 s and loses no acknowledged write;
- a follower crash does not interrupt writes; a restarted coordinator catches up from disk;
- without a majority, writes fail fast (UNAVAILABLE, "no quorum") while reads still answer;
- rolling restarts, 2 of 5 down, late coordinators joining and leaving;
- a partitioned leader (iptables in a network namespace; root only) cannot commit, and heals;
- a plain node restarted with every coordinator down serves its disk copy;
- a linearizability check (``tests/linearizability.py``) of concurrent clients while the
  leader is killed and restarted three times.

Raft ports come from ``testbed/raft.py`` (32000-32766, each checked free).
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import random
import shutil
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from consensus.group import GROUPS
from meshd.dev.processes import kill_at_exit, pdeathsig_prefix
from proto.mesh.v1 import admin_pb2
from testbed.cluster import (
    ROOT,
    Cluster,
    Node,
    RpcFailed,
    _child_env,
    _LocalClient,
    member_to_dict,
    netns_create,
    netns_delete,
    netns_exec,
    netns_unavailable,
    node_ip,
)
from testbed.raft import coordinator_args, pick_raft_port
from tests.linearizability import History, check, check_monotonic, lost_writes

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"),
                       reason="needs Linux (one loopback address per node)"),
]

START = 30.0  # start -> gossip converged and both groups formed
CONVERGE = 30.0
VISIBLE = 2.0  # an acknowledged write is in every node's PolicyList within this
FAILOVER = 5.0  # leader SIGKILL -> first successful write (the bench measures the 2 s bar)
FAIL_FAST = 2.0  # a write without quorum is refused within this
CATCH_UP = 30.0  # a restarted/added coordinator converges within this


# --- clusters ---------------------------------------------------------------------------------


@dataclass
class Mesh:
    """A cluster whose first ``coordinators`` nodes run the Raft groups."""

    c: Cluster
    raft_port: int
    expect: int
    coordinators: list[Node]
    plain: list[Node]

    def node_of(self, address: str) -> Node:
        """The node that owns a Raft address ("ip:port", either group's port)."""
        host, port = address.rsplit(":", 1)
        assert int(port) - self.raft_port in range(len(GROUPS)), address
        for n in self.c.nodes:
            if n.ip == host:
                return n
        raise KeyError(address)

    def coordinator_args(self, index: int, expect: int | None = None) -> list[str]:
        return coordinator_args(index, self.raft_port,
                                self.expect if expect is None else expect)

    def live(self) -> list[Node]:
        return [n for n in self.c.nodes if n.running]


@pytest.fixture
def meshes(tmp_path: Path) -> Iterator[Callable[..., Mesh]]:
    """A factory of started meshes; every process is killed when the test ends, pass or fail."""
    made: list[Cluster] = []

    def make(coordinators: int = 3, plain: int = 1, *, expect: int | None = None,
             spare: int = 0, start: bool = True, extra: dict[int, list[str]] | None = None,
             **kw: Any) -> Mesh:
        expect = coordinators if expect is None else expect
        total = coordinators + plain + spare
        port = pick_raft_port([node_ip(i) for i in range(1, total + 1)])
        more = extra or {}
        c = Cluster(coordinators + plain, tmp_path / f"cluster{len(made)}", spare=spare,
                    node_args=lambda i: (coordinator_args(i, port, expect)
                                         if i <= coordinators else []) + more.get(i, []),
                    **kw)
        made.append(c)
        mesh = Mesh(c, port, expect, c.nodes[:coordinators], c.nodes[coordinators:])
        if start:
            c.start()
            c.wait_converged(CONVERGE)
            wait_ready(mesh, voters=expect)
        return mesh

    try:
        yield make
    finally:
        for c in made:
            c.close()


# --- admin calls ------------------------------------------------------------------------------


def call(c: Cluster, node: Node, method: str, request: Any, timeout: float = 5.0,
         client: Any = None) -> Any:
    rpc: Any = client or c.client
    return rpc._call(node.admin, method, request, timeout)


def quota(name: str, rps: float) -> str:
    return json.dumps({"kind": "TenantQuota", "name": name, "spec": {"requests_per_second": rps}})


def apply(c: Cluster, node: Node, text: str, *, if_version: int | None = None,
          timeout: float = 3.0, client: Any = None) -> int:
    """PolicyApply of one document; its new version (raises RpcFailed)."""
    req = admin_pb2.PolicyApplyRequest(text=text, timeout_seconds=timeout)
    if if_version is not None:
        req.if_version = if_version
    resp = call(c, node, "PolicyApply", req, timeout + 2.0, client)
    assert len(resp.results) == 1, resp
    return int(resp.results[0].version)


def get(c: Cluster, node: Node, name: str, *, consistent: bool = True, timeout: float = 3.0,
        kind: str = "TenantQuota", client: Any = None) -> dict[str, Any] | None:
    """PolicyGet: the stored document (with its ``version``) or None."""
    resp = call(c, node, "PolicyGet", admin_pb2.PolicyGetRequest(
        kind=kind, name=name, consistent=consistent, timeout_seconds=timeout), timeout + 2.0,
        client)
    return json.loads(resp.document_json) if resp.found else None


def policy_list(c: Cluster, node: Node, timeout: float = 3.0) -> tuple[list[str], dict[str, int]]:
    """PolicyList: (sorted document JSON, group -> version) of the node's copy."""
    resp = call(c, node, "PolicyList", admin_pb2.PolicyListRequest(), timeout)
    return sorted(resp.documents_json), dict(resp.versions)


def policy_names(c: Cluster, node: Node) -> dict[tuple[str, str], int]:
    """(kind, name) -> version of every document in the node's copy."""
    docs, _ = policy_list(c, node)
    return {(d["kind"], d["name"]): int(d["version"]) for d in map(json.loads, docs)}


def raft_status(c: Cluster, via: Node, timeout: float = 5.0) -> admin_pb2.RaftStatusResponse:
    return call(c, via, "RaftStatus", admin_pb2.RaftStatusRequest(), timeout)


def group_leaders(resp: admin_pb2.RaftStatusResponse) -> dict[str, admin_pb2.RaftGroupStatus]:
    """group -> the status of the coordinator that claims leadership (highest term wins)."""
    best: dict[str, admin_pb2.RaftGroupStatus] = {}
    for g in resp.groups:
        if g.error or g.state != "leader":
            continue
        if g.group not in best or g.term > best[g.group].term:
            best[g.group] = g
    return best


def describe_status(mesh: Mesh) -> str:
    lines = []
    for via in mesh.live():
        try:
            resp = raft_status(mesh.c, via, 3.0)
        except RpcFailed as exc:
            lines.append(f"  via {via.name}: {exc}")
            continue
        for g in resp.groups:
            lines.append(f"  via {via.name}: {g.group}@{g.node} {g.state or g.error} "
                         f"leader={g.leader} term={g.term} members={list(g.members)} "
                         f"reachable={list(g.reachable)} v={g.version}")
        break
    for n in mesh.c.nodes:
        if n.proc is not None and not n.running:
            lines.append(f"  {n.name}: exited {n.proc.returncode}")
    return "\n".join(lines) or "  (no node answered)"


def ready(mesh: Mesh, voters: int,
          coordinators: list[Node] | None = None) -> dict[str, Node] | None:
    """group -> leader node when every group has a leader with quorum and ``voters`` voters,
    and every coordinator in ``coordinators`` (default: the running ones) agrees."""
    coords = [n for n in (coordinators or mesh.coordinators) if n.running]
    for v in coords:
        try:
            resp = raft_status(mesh.c, v, 3.0)
            break
        except RpcFailed:
            continue
    else:
        return None
    leaders = group_leaders(resp)
    out: dict[str, Node] = {}
    for group in GROUPS:
        ld = leaders.get(group)
        if ld is None or not ld.has_quorum or len(ld.members) != voters:
            return None
        by_node = {g.node: g for g in resp.groups if g.group == group and not g.error}
        for n in coords:
            s = by_node.get(n.name)
            if s is None or s.leader != ld.address or len(s.members) != voters:
                return None
        out[group] = mesh.node_of(ld.address)
    return out


def wait_ready(mesh: Mesh, voters: int, timeout: float = START,
               coordinators: list[Node] | None = None) -> dict[str, Node]:
    leaders = mesh.c.wait_for(lambda: ready(mesh, voters, coordinators), timeout,
                              f"both Raft groups with {voters} voters and a leader",
                              interval=0.2, on_timeout=lambda: describe_status(mesh))
    assert leaders is not None
    return leaders


def write_until(c: Cluster, nodes: list[Node], text: str, timeout: float,
                attempt_timeout: float = 1.0) -> tuple[int, Node, float]:
    """Retry a write (round robin over the running ``nodes``) until one is acknowledged:
    (version, node that took it, seconds it took).  Raises AssertionError with the errors."""
    t0 = time.monotonic()
    errors: list[str] = []
    i = 0
    while True:
        live = [n for n in nodes if n.running] or nodes
        node = live[i % len(live)]
        i += 1
        try:
            version = apply(c, node, text, timeout=attempt_timeout)
            return version, node, time.monotonic() - t0
        except RpcFailed as exc:
            errors.append(f"{time.monotonic() - t0:.2f}s {node.name}: {exc}")
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"no write acknowledged within {timeout:g} s:\n  "
                                 + "\n  ".join(errors[-12:]))
        time.sleep(0.05)


def read_until(c: Cluster, nodes: list[Node], name: str, timeout: float = 15.0,
               client: Any = None) -> dict[str, Any] | None:
    """A consistent read, retried over the running ``nodes`` until it succeeds."""
    t0 = time.monotonic()
    i = 0
    while True:
        live = [n for n in nodes if n.running] or nodes
        node = live[i % len(live)]
        i += 1
        try:
            return get(c, node, name, consistent=True, client=client)
        except RpcFailed as exc:
            if time.monotonic() - t0 > timeout:
                raise AssertionError(f"no consistent read of {name} in {timeout:g} s: "
                                     f"{exc}") from None
        time.sleep(0.1)


def same_policies(c: Cluster, nodes: list[Node]) -> bool:
    """Every node answers PolicyList with the same documents and versions."""
    seen = []
    for n in nodes:
        try:
            seen.append(policy_list(c, n))
        except RpcFailed:
            return False
    return all(s == seen[0] for s in seen)


def wait_same_policies(mesh: Mesh, nodes: list[Node] | None = None,
                       timeout: float = CATCH_UP) -> None:
    nodes = nodes or mesh.live()

    def detail() -> str:
        out = []
        for n in nodes:
            try:
                docs, versions = policy_list(mesh.c, n)
                out.append(f"  {n.name}: {versions} {len(docs)} documents")
            except RpcFailed as exc:
                out.append(f"  {n.name}: {exc}")
        return "\n".join(out) + "\n" + describe_status(mesh)

    mesh.c.wait_for(lambda: same_policies(mesh.c, nodes), timeout,
                    "the same PolicyList on " + ", ".join(n.name for n in nodes),
                    interval=0.2, on_timeout=detail)


def answers(c: Cluster, node: Node) -> bool:
    """The node's admin API answers (it may have exited: then fail at once)."""
    assert node.running, f"{node.name} exited:\n{c.tail(node)}"
    try:
        node.members(timeout=1.0)
    except RpcFailed:
        return False
    return True


def restart(mesh: Mesh, node: Node) -> None:
    """Start ``node`` again (same data dir), joining through the running nodes."""
    join = [n.gossip for n in mesh.c.nodes if n is not node and n.running]
    node.start(join=join or None)


def new_client(c: Cluster) -> Any:
    """A client with its own channels, for a thread: ``_LocalClient._call`` closes a channel
    after an error, which would cancel another thread's call on it."""
    return c.client if c.netns else _LocalClient(c.admin_creds)


# --- a background writer ----------------------------------------------------------------------


@dataclass(frozen=True)
class Acked:
    name: str
    value: int
    version: int
    node: str
    sent: float
    acked: float


@dataclass
class Writer:
    """Writes TenantQuota ``{prefix}-{k}`` (k < keys) with a unique rate each time, round robin
    over the running ``targets``, and records what was acknowledged and what failed."""

    c: Cluster
    targets: list[Node]
    prefix: str
    keys: int = 4
    interval: float = 0.02
    timeout: float = 2.0
    acked: list[Acked] = field(default_factory=list)
    errors: list[tuple[float, str, str, str]] = field(default_factory=list)
    _halt: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _client: Any = None

    def start(self) -> Writer:
        self._client = new_client(self.c)
        self._thread = threading.Thread(target=self._run, name=f"writer-{self.prefix}",
                                        daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        seq = 0
        while not self._halt.is_set():
            live = [n for n in self.targets if n.running]
            if not live:
                time.sleep(0.05)
                continue
            node = live[seq % len(live)]
            seq += 1
            name = f"{self.prefix}-{seq % self.keys}"
            t = time.monotonic()
            try:
                version = apply(self.c, node, quota(name, seq), timeout=self.timeout,
                                client=self._client)
                self.acked.append(Acked(name, seq, version, node.name, t, time.monotonic()))
            except RpcFailed as exc:
                self.errors.append((t, node.name, exc.code, exc.details))
            except Exception as exc:  # noqa: BLE001 - the test reports it
                self.errors.append((t, node.name, type(exc).__name__, str(exc)))
            time.sleep(self.interval)

    def stop(self) -> Writer:
        self._halt.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._client is not None and self._client is not self.c.client:
            self._client.close()
        return self

    def acked_between(self, a: float, b: float) -> list[Acked]:
        return [w for w in self.acked if a <= w.acked <= b]


def assert_no_lost_writes(mesh: Mesh, acked: list[Acked], via: list[Node]) -> None:
    """Every acknowledged write is readable (consistently) with its version or a later one."""
    assert acked, "the writer got no write acknowledged at all"
    finals: dict[str, dict[str, Any] | None] = {}
    for name in sorted({w.name for w in acked}):
        finals[name] = read_until(mesh.c, via, name)
    lost = []
    for w in acked:
        doc = finals[w.name]
        if doc is None:
            lost.append(f"{w}: the document is gone")
        elif doc["version"] < w.version:
            lost.append(f"{w}: now at version {doc['version']}")
        elif doc["version"] == w.version and int(doc["spec"]["requests_per_second"]) != w.value:
            lost.append(f"{w}: version {w.version} holds {doc['spec']['requests_per_second']}")
    assert not lost, "acknowledged writes lost:\n  " + "\n  ".join(lost[:20])


# --- 1. bootstrap, forwarding, flags, errors --------------------------------------------------


def test_bootstrap_forwarding_flags_and_errors(meshes: Callable[..., Mesh]) -> None:
    mesh = meshes(3, 1)
    c = mesh.c
    plain = mesh.plain[0]
    leaders = wait_ready(mesh, voters=3)
    resp = raft_status(c, plain)
    for group in GROUPS:
        rows = [g for g in resp.groups if g.group == group and not g.error]
        assert sorted(g.node for g in rows) == ["n1", "n2", "n3"], resp
        assert sum(g.state == "leader" for g in rows) == 1, resp
        assert all(len(g.members) == 3 for g in rows), resp
    follower = next(n for n in mesh.coordinators if n is not leaders["policy"])

    # A write from the plain node (forwarded to the leader) and one from a follower.
    for name, node in (("from-plain", plain), ("from-follower", follower)):
        version = apply(c, node, quota(name, 100))
        t0 = time.monotonic()

        def everywhere(name: str = name, version: int = version) -> bool:
            return all(policy_names(c, n).get(("TenantQuota", name), -1) >= version
                       for n in c.nodes)

        c.wait_for(everywhere, VISIBLE, f"{name} (version {version}) in every PolicyList")
        assert time.monotonic() - t0 <= VISIBLE
        doc = get(c, mesh.coordinators[0], name)
        assert doc is not None and doc["version"] == version
        assert doc["spec"]["requests_per_second"] == 100

    # Cordon through the plain node: every node's member table shows the flag.
    call(c, plain, "Cordon", admin_pb2.NodeFlagRequest(node="n2"))

    def flags_everywhere() -> bool:
        for n in c.nodes:
            resp = call(c, n, "Members", admin_pb2.MembersRequest())
            rows = {m.name: list(m.flags) for m in resp.members}
            if rows.get("n2") != ["cordoned"] or any(rows[k] for k in rows if k != "n2"):
                return False
        return True

    c.wait_for(flags_everywhere, VISIBLE, "n2 cordoned in every member table")
    call(c, follower, "Uncordon", admin_pb2.NodeFlagRequest(node="n2"))
    c.wait_for(lambda: all(not list(m.flags) for m in call(
        c, plain, "Members", admin_pb2.MembersRequest()).members), VISIBLE, "n2 uncordoned")

    # A bad document: INVALID_ARGUMENT naming the field, from any node.
    for node in (plain, follower, leaders["policy"]):
        with pytest.raises(RpcFailed) as bad:
            apply(c, node, quota("bad", -5))
        assert bad.value.code == "INVALID_ARGUMENT", bad.value
        assert "spec.requests_per_second" in bad.value.details, bad.value
    with pytest.raises(RpcFailed) as unknown:
        apply(c, plain, json.dumps({"kind": "TenantQuota", "name": "x",
                                    "spec": {"requests_per_sec": 1}}))
    assert unknown.value.code == "INVALID_ARGUMENT"
    assert "spec.requests_per_sec" in unknown.value.details, unknown.value
    assert get(c, plain, "bad") is None

    # Optimistic concurrency: a wrong if_version is ABORTED and changes nothing.
    current = get(c, plain, "from-plain")
    assert current is not None
    for node in (plain, follower):
        for wrong in (current["version"] + 7, 0):
            with pytest.raises(RpcFailed) as conflict:
                apply(c, node, quota("from-plain", 5), if_version=wrong)
            assert conflict.value.code == "ABORTED", conflict.value
    after = get(c, follower, "from-plain")
    assert after == current
    version = apply(c, follower, quota("from-plain", 7), if_version=current["version"])
    assert version > current["version"]
    assert apply(c, plain, quota("brand-new", 1), if_version=0) > version


# --- 2. leader crash --------------------------------------------------------------------------


def test_leader_kill_failover_no_lost_writes_and_catch_up(meshes: Callable[..., Mesh]) -> None:
    mesh = meshes(3, 1)
    c = mesh.c
    leader = wait_ready(mesh, voters=3)["policy"]
    survivors = [n for n in mesh.coordinators if n is not leader]
    writer = Writer(c, [*mesh.coordinators, *mesh.plain], "w").start()
    time.sleep(1.5)

    leader.kill()
    t_kill = time.monotonic()
    version, took_by, took = write_until(c, [*survivors, *mesh.plain], quota("after-kill", 1),
                                         timeout=20.0)
    print(f"leader {leader.name} killed: first write acknowledged after {took:.2f} s "
          f"(through {took_by.name})")
    assert took <= FAILOVER, f"writes resumed only {took:.2f} s after the leader died"

    new = wait_ready(mesh, voters=3, coordinators=survivors)
    assert new["policy"] is not leader
    time.sleep(1.0)
    writer.stop()
    during = writer.acked_between(t_kill, time.monotonic())
    assert during, f"the background writer got nothing acknowledged after the kill: " \
                   f"{writer.errors[-5:]}"
    assert_no_lost_writes(mesh, writer.acked, survivors)

    # The old leader restarts from its disk, rejoins as a follower and catches up.
    restart(mesh, leader)
    wait_ready(mesh, voters=3)
    apply(c, mesh.plain[0], quota("after-restart", 2))
    wait_same_policies(mesh, c.nodes)
    docs, _ = policy_list(c, leader)
    assert any('"after-restart"' in d for d in docs)
    assert_no_lost_writes(mesh, writer.acked, [leader])


# --- 3. follower crash ------------------------------------------------------------------------


def test_follower_kill_writes_continue_and_restart_catches_up(
        meshes: Callable[..., Mesh]) -> None:
    mesh = meshes(3, 1)
    c = mesh.c
    leaders = wait_ready(mesh, voters=3)
    leader = leaders["policy"]
    followers = [n for n in mesh.coordinators if n is not leader]
    # Prefer a node that leads neither group (the placements leader may differ).
    victim = next((n for n in followers if n not in leaders.values()), followers[0])
    writer = Writer(c, [leader, *mesh.plain], "f", interval=0.01).start()
    time.sleep(1.0)
    victim.kill()
    t_kill = time.monotonic()
    time.sleep(3.0)
    t_end = time.monotonic()
    time.sleep(0.5)
    writer.stop()
    errors = [e for e in writer.errors if e[0] >= t_kill - 0.5]
    assert not errors, f"writes failed after a follower died: {errors[:5]}"
    times = [t_kill] + [w.acked for w in writer.acked_between(t_kill, t_end)] + [t_end]
    gap = max(b - a for a, b in itertools.pairwise(times))
    print(f"follower {victim.name} killed: {len(times) - 2} writes in 3 s, longest gap "
          f"{gap:.3f} s")
    assert len(times) > 20, f"only {len(times) - 2} writes in 3 s after the follower died"
    assert gap < 1.0, f"writes stalled for {gap:.2f} s after a follower died"

    restart(mesh, victim)
    wait_ready(mesh, voters=3)
    wait_same_policies(mesh, c.nodes)
    assert_no_lost_writes(mesh, writer.acked, [victim])


# --- 4. quorum loss ---------------------------------------------------------------------------


@pytest.mark.parametrize("survivor_role", ["leader", "follower"])
def test_quorum_loss_fails_fast_reads_still_served(meshes: Callable[..., Mesh],
                                                   survivor_role: str) -> None:
    mesh = meshes(3, 1)
    c = mesh.c
    plain = mesh.plain[0]
    leader = wait_ready(mesh, voters=3)["policy"]
    for k in range(3):
        apply(c, plain, quota(f"q-{k}", 10 + k))
    wait_same_policies(mesh, c.nodes, timeout=VISIBLE + 1)
    before = policy_list(c, plain)[0]
    assert len(before) == 3

    survivor = leader if survivor_role == "leader" else next(
        n for n in mesh.coordinators if n is not leader)
    down = [n for n in mesh.coordinators if n is not survivor]
    for n in down:
        n.kill()
    # A coordinator notices a silent peer within the quorum window (0.6 s); a write sent
    # before that may wait out its timeout (outcome unknown), so give it a moment.
    time.sleep(1.5)
    for node in (survivor, plain):
        for k in range(4):
            t0 = time.monotonic()
            with pytest.raises(RpcFailed) as refused:
                apply(c, node, quota(f"nope-{node.name}-{k}", 1), timeout=5.0)
            took = time.monotonic() - t0
            assert refused.value.code == "UNAVAILABLE", (node.name, refused.value)
            assert took < FAIL_FAST, f"{node.name}: refused only after {took:.2f} s"
            assert "no quorum" in refused.value.details, (node.name, refused.value)
        with pytest.raises(RpcFailed) as consistent:
            get(c, node, "q-0", consistent=True)
        assert consistent.value.code == "UNAVAILABLE", consistent.value
    # Reads of the local copies still answer, with the last policies.
    for node in (survivor, plain):
        assert policy_list(c, node)[0] == before
        doc = get(c, node, "q-1", consistent=False)
        assert doc is not None and doc["spec"]["requests_per_second"] == 11

    for n in down:
        restart(mesh, n)
    version, _, took = write_until(c, [survivor, plain], quota("q-back", 1), timeout=CATCH_UP)
    print(f"writes resumed {took:.2f} s after restarting {[n.name for n in down]}")
    wait_ready(mesh, voters=3)
    wait_same_policies(mesh, c.nodes)
    assert not any("nope-" in d for d in policy_list(c, plain)[0])


# --- 5. rolling restart -----------------------------------------------------------------------


def test_rolling_restart_of_every_coordinator(meshes: Callable[..., Mesh]) -> None:
    mesh = meshes(3, 1)
    c = mesh.c
    writer = Writer(c, [*mesh.coordinators, *mesh.plain], "r", interval=0.05).start()
    try:
        time.sleep(1.0)
        for node in mesh.coordinators:
            others = [n for n in mesh.coordinators if n is not node]
            code = node.terminate(timeout=20.0)
            assert code is not None, f"{node.name} did not exit after SIGTERM"
            # A graceful leave removes the node from both groups.
            wait_ready(mesh, voters=2, coordinators=others)
            restart(mesh, node)
            wait_ready(mesh, voters=3, timeout=CATCH_UP)
            print(f"{node.name} restarted and rejoined; {len(writer.acked)} writes acked")
        time.sleep(1.0)
    finally:
        writer.stop()
    print(f"{len(writer.acked)} writes acknowledged, {len(writer.errors)} failed: "
          f"{Counter(f'{e[2]}: {e[3][:50]}' for e in writer.errors).most_common(4)}")
    version, _, _ = write_until(c, mesh.plain, quota("final", 1), timeout=10.0)
    assert_no_lost_writes(mesh, writer.acked, mesh.coordinators)
    wait_same_policies(mesh, c.nodes)
    assert len({w.name for w in writer.acked}) == writer.keys


# --- 6. five coordinators, two down -----------------------------------------------------------


def test_five_coordinators_survive_two_failures(meshes: Callable[..., Mesh]) -> None:
    mesh = meshes(5, 0)
    c = mesh.c
    leaders = wait_ready(mesh, voters=5)
    leader = leaders["policy"]
    follower = next(n for n in mesh.coordinators if n is not leader)
    apply(c, follower, quota("five-before", 1))
    leader.kill()
    follower.kill()
    survivors = [n for n in mesh.coordinators if n.running]
    version, _, took = write_until(c, survivors, quota("five-after", 2), timeout=15.0)
    print(f"2 of 5 down: first write after {took:.2f} s")
    assert took <= FAILOVER
    for k, node in enumerate(survivors):
        apply(c, node, quota(f"five-{k}", 3 + k))
    new = wait_ready(mesh, voters=5, coordinators=survivors)
    assert new["policy"] not in (leader, follower)
    for name in ("five-before", "five-after", "five-2"):
        assert read_until(c, survivors, name) is not None


# --- 7. a late coordinator joins and leaves ---------------------------------------------------


def test_late_coordinator_added_then_removed_on_leave(meshes: Callable[..., Mesh]) -> None:
    mesh = meshes(3, 0, spare=1)
    c = mesh.c
    wait_ready(mesh, voters=3)
    apply(c, mesh.coordinators[0], quota("late-before", 1))
    late = c.add_node(args=mesh.coordinator_args(4, expect=3))
    late.start()
    c.wait_converged(CONVERGE)
    coords = [*mesh.coordinators, late]
    wait_ready(mesh, voters=4, coordinators=coords, timeout=CATCH_UP)
    resp = raft_status(c, late)
    mine = [g for g in resp.groups if g.node == late.name]
    assert sorted(g.group for g in mine) == sorted(GROUPS)
    assert all(g.state == "follower" for g in mine), mine
    apply(c, late, quota("late-after", 2))
    wait_same_policies(mesh, coords)

    assert late.terminate(timeout=20.0) is not None
    wait_ready(mesh, voters=3, timeout=CATCH_UP)
    resp = raft_status(c, mesh.coordinators[0])
    addresses = {mesh.node_of(m).name for g in resp.groups for m in g.members}
    assert addresses == {"n1", "n2", "n3"}, resp
    apply(c, mesh.coordinators[1], quota("late-gone", 3))


# --- 8. a partitioned leader (network namespace + iptables) -----------------------------------


GID_BASE = 47000
"""Node i runs with group id GID_BASE + i, so iptables' owner match tells the nodes apart
(on one loopback every outgoing TCP connection has source address 127.0.0.1)."""


class NetnsAdmin:
    """Admin RPCs made from inside a network namespace by a helper process (the test process is
    outside it): requests and responses cross its stdin/stdout as serialized protobuf."""

    def __init__(self, netns: str, creds: Path) -> None:
        code = ("import sys; from tests.test_consensus_integration import rpc_serve; "
                "sys.exit(rpc_serve(sys.argv[1]))")
        self.proc = subprocess.Popen(
            [*pdeathsig_prefix(), "ip", "netns", "exec", netns, sys.executable, "-c", code,
             str(creds)],
            cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1,
            env=_child_env())
        kill_at_exit(self.proc)
        self._lock = threading.Lock()

    def _call(self, target: str, method: str, request: Any, timeout: float) -> Any:
        req = {"target": target, "method": method, "timeout": timeout,
               "request": base64.b64encode(request.SerializeToString()).decode()}
        assert self.proc.stdin is not None and self.proc.stdout is not None
        with self._lock:
            self.proc.stdin.write(json.dumps(req) + "\n")
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the netns RPC helper exited")
        resp = json.loads(line)
        if "error" in resp:
            raise RpcFailed(resp["error"], resp["details"])
        if "stream" in resp:  # a server-streaming call, read to its end by the helper
            return [_admin_type(method, "output_type").FromString(base64.b64decode(m))
                    for m in resp["stream"]]
        return _admin_type(method, "output_type").FromString(base64.b64decode(resp["response"]))

    def members(self, target: str, timeout: float, status: Any = (),
                role: Any = ()) -> list[dict[str, Any]]:
        resp = self._call(target, "Members", admin_pb2.MembersRequest(
            status=list(status), role=list(role)), timeout)
        return [member_to_dict(m) for m in resp.members]

    def close(self) -> None:
        with contextlib.suppress(Exception):
            assert self.proc.stdin is not None
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def _admin_type(method: str, which: str) -> Any:
    desc = admin_pb2.DESCRIPTOR.services_by_name["Admin"].methods_by_name[method]
    return getattr(admin_pb2, getattr(desc, which).name)


def rpc_serve(creds: str) -> int:
    """The helper's loop (inside the namespace): one JSON request per line, one answer."""
    client = _LocalClient(Path(creds))
    for line in sys.stdin:
        req = json.loads(line)
        try:
            request = _admin_type(req["method"], "input_type")()
            request.ParseFromString(base64.b64decode(req["request"]))
            resp = client._call(req["target"], req["method"], request, req["timeout"])
            if admin_pb2.DESCRIPTOR.services_by_name["Admin"].methods_by_name[
                    req["method"]].server_streaming:
                try:
                    out = {"stream": [base64.b64encode(m.SerializeToString()).decode()
                                      for m in resp]}
                except Exception as exc:  # grpc.RpcError, raised while reading the stream
                    raise RpcFailed(exc.code().name, exc.details()) from None  # type: ignore[attr-defined]
            else:
                out = {"response": base64.b64encode(resp.SerializeToString()).decode()}
        except RpcFailed as exc:
            out = {"error": exc.code, "details": exc.details}
        except Exception as exc:  # noqa: BLE001 - reported to the test process
            out = {"error": type(exc).__name__, "details": str(exc)}
        sys.stdout.write(json.dumps(out) + "\n")
        sys.stdout.flush()
    client.close()
    return 0


def _with_gid(node: Node, gid: int) -> None:
    """Run ``node`` with primary group ``gid`` (uid stays root, so file access is unchanged)."""
    original = node.command

    def command(join: list[str] | None = None) -> list[str]:
        cmd = original(join)
        i = cmd.index(sys.executable)
        return [*cmd[:i], "setpriv", f"--regid={gid}", "--clear-groups", *cmd[i:]]

    node.command = command  # type: ignore[method-assign]


def _iptables(ns: str, *args: str) -> None:
    r = netns_exec(ns, "iptables", *args, check=False)
    if r.returncode != 0:
        raise RuntimeError(f"iptables {' '.join(args)}: {r.stderr.strip()}")


@pytest.fixture
def partition_netns() -> Iterator[str]:
    """A fresh namespace where every new connection is marked with the group id of the
    process that opened it (so a rule can match the answering side too); always deleted."""
    reason = netns_unavailable()
    if reason:
        pytest.skip(reason)
    if shutil.which("setpriv") is None:
        pytest.skip("'setpriv' (util-linux) is needed to run nodes under distinct group ids")
    try:
        name = netns_create("meshd-raft")
    except (RuntimeError, OSError) as exc:  # e.g. a container without CAP_SYS_ADMIN
        pytest.skip(f"cannot create a network namespace: {exc}")
    try:
        try:
            for i in range(1, 9):
                _iptables(name, "-t", "mangle", "-A", "OUTPUT", "-m", "conntrack",
                          "--ctstate", "NEW", "-m", "owner", "--gid-owner", str(GID_BASE + i),
                          "-j", "CONNMARK", "--set-mark", str(GID_BASE + i))
        except RuntimeError as exc:
            pytest.skip(f"iptables owner/connmark matching is not available here: {exc}")
        yield name
    finally:
        netns_delete(name)


def isolate(ns: str, mesh: Mesh, node: Node) -> None:
    """Drop every packet between ``node`` and the other nodes, both directions, on
    connections either side opened, before or after this call (the test client is spared)."""
    g = str(GID_BASE + node.index)
    for other in mesh.c.nodes:
        if other is node:
            continue
        o = str(GID_BASE + other.index)
        for args in (["-m", "owner", "--gid-owner", o, "-d", node.ip],
                     ["-m", "owner", "--gid-owner", g, "-d", other.ip],
                     ["-m", "owner", "--gid-owner", g, "-m", "connmark", "--mark", o],
                     ["-m", "owner", "--gid-owner", o, "-m", "connmark", "--mark", g]):
            _iptables(ns, "-A", "OUTPUT", *args, "-j", "DROP")


def heal(ns: str) -> None:
    _iptables(ns, "-F", "OUTPUT")


def start_partitionable(mesh: Mesh, ns: str) -> None:
    """Start a mesh made with ``netns=ns, start=False`` so :func:`isolate` can cut any node
    off: each node under its own group id, admin calls from inside the namespace."""
    c = mesh.c
    c.client.close()
    c.client = NetnsAdmin(ns, c.admin_creds)  # type: ignore[assignment]
    for n in c.nodes:
        _with_gid(n, GID_BASE + n.index)
    c.start()
    c.wait_converged(CONVERGE)


@pytest.mark.netns
def test_partitioned_leader_cannot_commit_and_converges_after_heal(
        partition_netns: str, meshes: Callable[..., Mesh]) -> None:
    ns = partition_netns
    mesh = meshes(3, 1, netns=ns, start=False)
    c = mesh.c
    start_partitionable(mesh, ns)
    old = wait_ready(mesh, voters=3)["policy"]
    majority = [n for n in mesh.coordinators if n is not old]
    plain = mesh.plain[0]
    apply(c, plain, quota("p-before", 1))
    wait_same_policies(mesh, c.nodes, timeout=VISIBLE + 1)
    old_term = group_leaders(raft_status(c, old))["policy"].term

    isolate(ns, mesh, old)
    t_cut = time.monotonic()
    # The isolated leader never acknowledges a write: refused (no quorum) or unknown.
    outcomes = []
    for k in range(6):
        t0 = time.monotonic()
        try:
            apply(c, old, quota(f"p-isolated-{k}", 1), timeout=1.5)
            outcomes.append("OK")
        except RpcFailed as exc:
            outcomes.append(exc.code)
            assert exc.code in ("UNAVAILABLE", "DEADLINE_EXCEEDED"), exc
        print(f"isolated leader write {k} at +{t0 - t_cut:.2f}s: {outcomes[-1]} "
              f"in {time.monotonic() - t0:.2f}s")
    assert "OK" not in outcomes, outcomes

    # The majority elects a new leader and takes writes (through a coordinator and the plain
    # node, which must stop forwarding to the old leader).
    def new_leader() -> admin_pb2.RaftGroupStatus | None:
        try:
            ld = group_leaders(raft_status(c, majority[0], 3.0)).get("policy")
        except RpcFailed:
            return None
        return ld if ld is not None and mesh.node_of(ld.address) in majority else None

    ld = c.wait_for(new_leader, 15.0, "a new policy leader in the majority",
                    on_timeout=lambda: describe_status(mesh))
    assert ld is not None and ld.term > old_term
    _, _, took = write_until(c, majority, quota("p-majority", 2), timeout=10.0)
    print(f"majority write acknowledged {time.monotonic() - t_cut:.2f} s after the cut")
    _, _, took = write_until(c, [plain], quota("p-plain", 3), timeout=20.0)
    print(f"plain node write acknowledged {time.monotonic() - t_cut:.2f} s after the cut "
          f"(retried {took:.2f} s)")
    # The plain node's read copy stops following the cut-off leader (its stream just falls
    # silent) and follows the majority before the partition heals.
    wait_same_policies(mesh, [plain, *majority], timeout=VISIBLE + 4.0)
    with pytest.raises(RpcFailed) as late:
        apply(c, old, quota("p-isolated-late", 1), timeout=1.5)
    assert late.value.code in ("UNAVAILABLE", "DEADLINE_EXCEEDED"), late.value

    heal(ns)
    wait_ready(mesh, voters=3, timeout=CATCH_UP)
    wait_same_policies(mesh, c.nodes)
    names = policy_names(c, old)
    assert ("TenantQuota", "p-majority") in names and ("TenantQuota", "p-plain") in names
    # The isolated leader's entries never reached a majority: the new term overwrote them.
    assert not any(n.startswith("p-isolated") for _, n in names), names
    apply(c, old, quota("p-healed", 4))


# --- 9. a plain node restarted with every coordinator down ------------------------------------


def test_plain_node_serves_disk_copy_with_every_coordinator_down(
        meshes: Callable[..., Mesh]) -> None:
    mesh = meshes(3, 1)
    c = mesh.c
    plain = mesh.plain[0]
    for k in range(3):
        apply(c, mesh.coordinators[k], quota(f"d-{k}", 20 + k))
    call(c, plain, "Cordon", admin_pb2.NodeFlagRequest(node="n3"))
    wait_same_policies(mesh, c.nodes, timeout=VISIBLE + 1)
    before = policy_list(c, plain)
    time.sleep(1.5)  # the copy is saved to disk 0.5 s after it moves

    for n in mesh.coordinators:
        n.kill()
    plain.kill()
    plain.start()  # joins n1, which is down: --retry-join keeps it trying in the background
    c.wait_for(lambda: answers(c, plain), 20.0, "the plain node serving again")
    after = policy_list(c, plain)
    assert after[0], "the restarted plain node has no policies"
    assert after == before
    doc = get(c, plain, "d-2", consistent=False)
    assert doc is not None and doc["spec"]["requests_per_second"] == 22
    with pytest.raises(RpcFailed) as refused:
        apply(c, plain, quota("d-new", 1))
    assert refused.value.code == "UNAVAILABLE", refused.value


# --- linearizability under repeated leader crashes --------------------------------------------


NOT_APPLIED = ("no quorum", "no leader")


def test_linearizable_under_leader_crashes(meshes: Callable[..., Mesh]) -> None:
    mesh = meshes(3, 1)
    c = mesh.c
    keys = ["lin-a", "lin-b", "lin-c"]
    history = History()
    halt = threading.Event()
    # Each client has a home node (two coordinators and the plain node), falling back to
    # another running node while its home is down.
    homes = [mesh.coordinators[0], mesh.coordinators[1], mesh.plain[0]]
    counts: dict[str, int] = {"ok": 0, "fail": 0, "unknown": 0}
    errors: Counter[str] = Counter()
    lock = threading.Lock()

    def outcome(op: Any, exc: RpcFailed) -> str:
        with lock:
            errors[f"{op.client} {op.kind} {exc.code}: {exc.details[:60]}"] += 1
        if exc.code == "UNAVAILABLE" and any(s in exc.details for s in NOT_APPLIED):
            history.fail(op)
            return "fail"
        history.unknown(op)
        return "unknown"

    def client(i: int) -> None:
        rpc = new_client(c)
        rng = random.Random(i)
        seq = 0
        try:
            while not halt.is_set():
                home = homes[i]
                node = home if home.running else next(
                    (n for n in [*homes, *mesh.coordinators] if n.running), home)
                key = rng.choice(keys)
                if rng.random() < 0.5:
                    seq += 1
                    value = (i + 1) * 1_000_000 + seq
                    op = history.invoke(f"c{i}", "write", key, value)
                    try:
                        version = apply(c, node, quota(key, value), timeout=2.0, client=rpc)
                        history.ok(op, version)
                        status = "ok"
                    except RpcFailed as exc:
                        status = outcome(op, exc)
                else:
                    op = history.invoke(f"c{i}", "read", key)
                    try:
                        doc = get(c, node, key, consistent=True, timeout=2.0, client=rpc)
                        history.ok(op, (None, 0) if doc is None else
                                   (int(doc["spec"]["requests_per_second"]), doc["version"]))
                        status = "ok"
                    except RpcFailed as exc:
                        status = outcome(op, exc)
                with lock:
                    counts[status] += 1
                time.sleep(0.02)
        finally:
            if rpc is not c.client:
                rpc.close()

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(3)]
    for t in threads:
        t.start()
    try:
        for round_ in range(3):
            time.sleep(2.0)
            leader = wait_ready(mesh, voters=3, timeout=CATCH_UP)["policy"]
            leader.kill()
            print(f"round {round_}: killed leader {leader.name}; {counts}")
            time.sleep(1.5)
            restart(mesh, leader)
            wait_ready(mesh, voters=3, timeout=CATCH_UP)
        time.sleep(2.0)
    finally:
        halt.set()
        for t in threads:
            t.join(timeout=15)
    assert counts["ok"] > 100, counts

    # The final state, read linearizably (and recorded: it is part of the history).
    final: dict[str, tuple[Any, int]] = {}
    for key in keys:
        op = history.invoke("final", "read", key)
        doc = read_until(c, mesh.coordinators, key)
        final[key] = (None, 0) if doc is None else (int(doc["spec"]["requests_per_second"]),
                                                    doc["version"])
        history.ok(op, final[key])
    ops = history.operations()
    print(f"{len(ops)} operations: {counts}; final {final}")
    for what, n in errors.most_common():
        print(f"  {n:4d} x {what}")
    mono = check_monotonic(ops)
    assert mono.ok, mono.explanation
    result = check(ops)
    assert result.ok, result.explanation
    lost = lost_writes(ops, final)
    assert not lost, "acknowledged writes lost:\n  " + "\n  ".join(o.describe() for o in lost[:10])

