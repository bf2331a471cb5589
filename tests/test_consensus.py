"""Raft groups in one process (three RaftGroup members over real mTLS), the pure bootstrap
decisions, the gossip ``raft`` section parser, the read copy, and journal durability."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from certs import tls
from certs.ca import CertificateAuthority
from certs.spiffe import SpiffeId
from certs.verify import PeerVerifier
from consensus.bootstrap import Coordinator, Start, Wait, plan_start, reconcile
from consensus.group import ConsensusError, RaftGroup, Timing
from consensus.transport import RaftTls, mesh_authorizer
from consensus.view import GroupView
from meshd.control.plane import decode_section, encode_section
from meshd.dev.ports import free_ports
from policy.store import PolicyStore

TD = "mesh.test"
POLICY_KINDS = ("NodeFlags", "TenantQuota", "SloClass", "ModelPin")


def quota(name: str, rps: float) -> dict[str, Any]:
    return {"op": "put", "doc": {"kind": "TenantQuota", "name": name,
                                 "spec": {"requests_per_second": rps}},
            "author": "test", "at": 1.0}


class Trio:
    """Three members of one group on 127.0.0.1."""

    def __init__(self, tmp: Path, n: int = 3) -> None:
        ca = CertificateAuthority.create(TD)
        self.ports = free_ports(n)
        self.addrs = [f"127.0.0.1:{p}" for p in self.ports]
        self.names = {a: f"c{i}" for i, a in enumerate(self.addrs)}
        self.tmp = tmp
        self.dirs = []
        for i in range(n):
            d = tmp / f"c{i}"
            ca.mint(SpiffeId.node(TD, f"c{i}"), ["node"]).save(d / "identity")
            self.dirs.append(d)
        self.verifier = PeerVerifier(ca.bundle, TD)
        self.groups: list[RaftGroup | None] = [None] * n

    def start(self, i: int) -> RaftGroup:
        d = self.dirs[i]
        settings_ = RaftTls(tls.server_context(d / "identity"),
                            tls.client_context(d / "identity"),
                            mesh_authorizer(self.verifier), node_names=self.names)
        grp = RaftGroup("policy", address=self.addrs[i], partners=self.addrs,
                        data_dir=d / "raft", tls=settings_, kinds=POLICY_KINDS)
        self.groups[i] = grp
        return grp

    def stop(self, i: int) -> None:
        grp = self.groups[i]
        if grp is not None:
            grp.close()
            self.groups[i] = None

    def leader(self, timeout: float = 10.0) -> int:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for i, g in enumerate(self.groups):
                if g is not None and g.status().state == "leader" and g.status().has_quorum:
                    return i
            time.sleep(0.05)
        raise AssertionError("no leader with quorum")

    def close(self) -> None:
        for i in range(len(self.groups)):
            self.stop(i)


@pytest.fixture
def trio(tmp_path: Path):
    t = Trio(tmp_path)
    yield t
    t.close()


async def _propose(grp: RaftGroup, cmd: dict[str, Any], tries: float = 10.0) -> dict[str, Any]:
    deadline = time.monotonic() + tries
    while True:
        try:
            return await grp.propose(cmd, 2.0)
        except ConsensusError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


def test_three_members_commit_and_replicate(trio: Trio) -> None:
    for i in range(3):
        trio.start(i)
    lead = trio.leader()

    async def run() -> list[dict[str, Any]]:
        out = [await _propose(trio.groups[lead], quota("acme", 10.0))]  # type: ignore[arg-type]
        follower = trio.groups[(lead + 1) % 3]
        out.append(await _propose(follower, quota("beta", 20.0)))  # type: ignore[arg-type]
        out.append(await _propose(follower, {"op": "put", "doc": {
            "kind": "TenantQuota", "name": "bad", "spec": {"requests_per_second": -1}}}))  # type: ignore[arg-type]
        return out

    a, b, bad = asyncio.run(run())
    assert a["ok"] and a["version"] == 1 and b["ok"] and b["version"] == 2
    assert not bad["ok"] and bad["error"] == "invalid" and "requests_per_second" in bad["message"]
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(g.status().version < 2 for g in trio.groups
                                              if g is not None):
        time.sleep(0.05)
    for g in trio.groups:
        assert g is not None
        snap = g.snapshot()
        assert snap["version"] == 2, snap
        assert g.status().members == sorted(trio.addrs)
    assert all(g.durability.syncs > 0 for g in trio.groups if g is not None)


def test_restart_from_disk_keeps_committed_writes(trio: Trio) -> None:
    for i in range(3):
        trio.start(i)
    lead = trio.leader()

    async def write(n: int) -> None:
        for k in range(n):
            assert (await _propose(trio.groups[lead], quota(f"t{k}", k + 1.0)))["ok"]  # type: ignore[arg-type]

    asyncio.run(write(20))
    trio.close()
    for i in range(3):
        trio.start(i)
    trio.leader()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(g.snapshot()["version"] < 20 for g in trio.groups
                                              if g is not None):
        time.sleep(0.1)
    for g in trio.groups:
        assert g is not None and g.snapshot()["version"] == 20


def test_compacted_log_restores_the_store(trio: Trio) -> None:
    """After log compaction the state lives in the dump: a restart (and a member that
    catches up from the dump) must get the documents back, not an empty store."""
    for i in range(3):
        trio.start(i)
    lead = trio.leader()

    async def write(n: int, prefix: str) -> None:
        for k in range(n):
            assert (await _propose(trio.groups[lead], quota(f"{prefix}{k}", k + 1.0)))["ok"]  # type: ignore[arg-type]

    asyncio.run(write(10, "a"))
    for g in trio.groups:
        assert g is not None
        g.syncobj.forceLogCompaction()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and not all(
            (t.dirs[i] / "raft" / "policy.dump").exists() for i, t in enumerate([trio] * 3)):
        time.sleep(0.1)
    assert all((d / "raft" / "policy.dump").exists() for d in trio.dirs)
    trio.stop((lead + 1) % 3)  # a follower: it catches up from the leader's dump later
    asyncio.run(write(5, "b"))
    trio.close()
    for i in range(3):
        trio.start(i)
    trio.leader()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and any(g.snapshot()["version"] < 15 for g in trio.groups
                                              if g is not None):
        time.sleep(0.1)
    for g in trio.groups:
        assert g is not None
        snap = g.snapshot()
        assert snap["version"] == 15 and len(snap["docs"]) == 15, snap["version"]


def test_no_quorum_fails_fast_and_names_it(trio: Trio) -> None:
    for i in range(3):
        trio.start(i)
    lead = trio.leader()
    for i in range(3):
        if i != lead:
            trio.stop(i)
    grp = trio.groups[lead]
    assert grp is not None
    time.sleep(Timing().quorum_window + 0.2)

    async def attempt() -> ConsensusError:
        start = time.monotonic()
        with pytest.raises(ConsensusError) as info:
            await grp.propose(quota("x", 1.0), 5.0)
        assert time.monotonic() - start < 0.5  # fast: not the 5 s timeout
        return info.value

    err = asyncio.run(attempt())
    assert err.code in ("no_quorum", "no_leader")
    assert "no quorum in raft group policy" in str(err) and "needed" in str(err)


# --- bootstrap (pure) ---------------------------------------------------------------------------


def c(name: str, *, live: bool = True, left: bool = False, members: tuple[str, ...] = ()
      ) -> Coordinator:
    return Coordinator(name, f"{name}:7950", live=live, left=left, members=members)


def test_bootstrap_waits_for_expect_then_settles() -> None:
    me = c("a")
    assert isinstance(plan_start(me, 3, None, [c("b")], 10, 1), Wait)
    assert isinstance(plan_start(me, 3, None, [c("b"), c("c")], 0.2, 1), Wait)
    plan = plan_start(me, 3, None, [c("b"), c("c")], 2, 1)
    assert plan == Start(("a:7950", "b:7950", "c:7950"), plan.why)  # type: ignore[union-attr]


def test_bootstrap_picks_lowest_names_and_extra_waits() -> None:
    peers = [c("b"), c("c"), c("d")]
    plan = plan_start(c("a"), 3, None, peers, 5, 1)
    assert isinstance(plan, Start) and plan.members == ("a:7950", "b:7950", "c:7950")
    assert isinstance(plan_start(c("d"), 3, None, [c("a"), c("b"), c("c")], 5, 1), Wait)


def test_dead_and_left_coordinators_do_not_count() -> None:
    assert isinstance(plan_start(c("a"), 3, None, [c("b"), c("c", live=False)], 5, 1), Wait)
    assert isinstance(plan_start(c("a"), 3, None, [c("b"), c("c", left=True)], 5, 1), Wait)


def test_saved_configuration_wins_and_existing_group_is_joined_when_added() -> None:
    plan = plan_start(c("a"), 3, ["a:7950", "x:7950"], [], 0, 1)
    assert isinstance(plan, Start) and plan.members == ("a:7950", "x:7950")
    group = ("b:7950", "c:7950", "d:7950")
    assert isinstance(plan_start(c("a"), 0, None, [c("b", members=group)], 5, 1), Wait)
    plan = plan_start(c("a"), 0, None, [c("b", members=(*group, "a:7950"))], 5, 1)
    assert isinstance(plan, Start) and "a:7950" in plan.members


def test_no_expect_never_bootstraps() -> None:
    assert isinstance(plan_start(c("a"), 0, None, [c("b"), c("c")], 99, 1), Wait)


def test_reconcile_adds_live_and_removes_left_one_at_a_time() -> None:
    coords = {x.address: x for x in (c("a"), c("b"), c("c"), c("d"), c("e", left=True),
                                      c("f", live=False))}
    assert reconcile(["a:7950", "b:7950", "c:7950", "e:7950"], coords) == ("remove", "e:7950")
    assert reconcile(["a:7950", "b:7950", "c:7950"], coords) == ("add", "d:7950")
    assert reconcile(["a:7950", "b:7950", "c:7950", "d:7950", "f:7950"], coords) is None


# --- the gossip raft section (a network input) --------------------------------------------------


def test_section_round_trip() -> None:
    from consensus.group import GroupStatus
    s = GroupStatus("policy", "a:1", "leader", "a:1", 3, 10, 10, 4, True, ["a:1", "b:1"],
                    ["a:1"])
    assert decode_section(encode_section({"policy": s})) == {
        "policy": ("a:1", 3, ("a:1", "b:1"))}


json_values = st.recursive(st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1)
                           | st.text(max_size=8)
                           | st.binary(max_size=8),
                           lambda kids: st.lists(kids, max_size=4)
                           | st.dictionaries(st.text(max_size=8), kids, max_size=4),
                           max_leaves=20)


@settings(max_examples=300, deadline=None)
@given(st.one_of(st.binary(max_size=200), json_values.map(
    lambda v: msgpack.packb(v, use_bin_type=True))))
def test_section_fuzz_only_value_errors(raw: bytes) -> None:
    try:
        out = decode_section(raw)
    except ValueError:
        return
    for group, (leader, term, members) in out.items():
        assert group in ("policy", "placements")
        assert isinstance(leader, str) and isinstance(term, int)
        assert all(isinstance(m, str) for m in members)


# --- the read copy ------------------------------------------------------------------------------


def test_view_follows_saves_and_reloads(tmp_path: Path) -> None:
    src = PolicyStore(POLICY_KINDS)
    for k in range(5):
        src.apply(quota(f"t{k}", 1.0 + k))

    async def run() -> GroupView:
        view = GroupView("policy", POLICY_KINDS, tmp_path / "policy.json")
        changes = src.changes_since(0)
        assert changes is not None
        assert not view.apply(changes[1])  # a gap is refused
        for ch in changes:
            assert view.apply(ch)
        waiter = asyncio.create_task(view.wait_beyond(5, 2.0))
        src.apply(quota("late", 9.0))
        view.apply(src.changes_since(5)[0])  # type: ignore[index]
        assert await waiter
        view.save()
        return view

    view = asyncio.run(run())
    again = GroupView("policy", POLICY_KINDS, tmp_path / "policy.json")
    assert again.load() and again.version == 6 == view.version
    assert [d.to_dict() for d in again.store.list()] == [d.to_dict() for d in src.list()]
    (tmp_path / "policy.json").write_text("{not json")
    assert not GroupView("policy", POLICY_KINDS, tmp_path / "policy.json").load()


def test_journal_sync_flushes_only_when_the_tail_moved(tmp_path: Path) -> None:
    from consensus.durability import JournalSync

    class FakeJournal(list):  # type: ignore[type-arg]
        flushes = 0

        def flush(self) -> None:
            FakeJournal.flushes += 1

    class Owner:
        _SyncObj__raftLog = FakeJournal()

    owner = Owner()
    sync = JournalSync(tmp_path / "j", lambda: owner)
    sync()
    sync()
    assert FakeJournal.flushes == 1
    owner._SyncObj__raftLog.append((b"x", 1, 1))
    sync()
    sync()
    assert FakeJournal.flushes == 2
    meta = tmp_path / "j.meta"
    meta.write_bytes(b"term")
    sync()
    assert sync.syncs == 3
    sync()
    assert sync.syncs == 3


def test_a_command_format_some_voter_would_not_apply_is_never_proposed(trio: Trio) -> None:
    """Rolling upgrades: a command of a newer format than every voter applies is refused
    before it reaches the log (a replica that could not apply it would split from the rest);
    format 1 carries no ``v`` field, so builds that predate formats apply it."""
    from policy.store import COMMAND_VERSION

    for i in range(3):
        trio.start(i)
    lead = trio.leader()
    grp = trio.groups[lead]
    assert grp is not None

    async def run() -> tuple[dict[str, Any], str, dict[str, Any]]:
        ok = await _propose(grp, {**quota("acme", 10.0), "v": 1})
        newer = {**quota("beta", 5.0), "v": COMMAND_VERSION + 1}
        grp.command_version = lambda: COMMAND_VERSION + 1  # as if every voter were newer...
        applied = await _propose(grp, newer)  # ... each replica still refuses what it cannot
        grp.command_version = lambda: COMMAND_VERSION
        with pytest.raises(ConsensusError) as err:
            await grp.propose(newer, 2.0)
        return ok, err.value.code, applied

    ok, code, applied = asyncio.run(run())
    assert ok["ok"] and code == "version"
    assert not applied["ok"] and applied["field"] == "v" and "upgrade" in applied["message"]
    store = grp.consumer.store
    assert store.get("TenantQuota", "beta") is None
    assert store.version == 1  # the refused and the never-proposed left no document


def test_coordinators_say_which_command_format_they_apply_in_their_raft_section(
        tmp_path: Path) -> None:
    """The group's format is the oldest its coordinators publish; a coordinator that predates
    formats (no ``cmdv`` key: builds before it skip the key as a group they do not run) or one
    not heard from yet counts as format 1."""
    import msgpack

    from consensus.group import GroupStatus
    from meshd.control.plane import (
        RAFT_SECTION,
        ControlPlane,
        command_version_of,
        decode_section,
        encode_section,
    )
    from policy.store import COMMAND_VERSION
    from testbed.admin import dev_security

    status = GroupStatus("policy", "a:1", "leader", "a:1", 3, 0, 0, 0, True, ["a:1", "b:1"],
                         ["a:1", "b:1"])
    new = encode_section({"policy": status})
    old = msgpack.packb({"policy": ["a:1", 3, ["a:1", "b:1"]]})
    assert decode_section(new) == decode_section(old)  # what older builds read is unchanged
    assert (command_version_of(new), command_version_of(old)) == (COMMAND_VERSION, 1)
    assert command_version_of(b"\xc1") == 1
    sec = dev_security(tmp_path / "n", "n")
    cp = ControlPlane("n", tmp_path / "n", sec, coordinator=False)
    cp.learn("a", {RAFT_SECTION: new})
    assert cp.command_version("policy") == COMMAND_VERSION
    cp.learn("b", {RAFT_SECTION: old})
    assert cp.command_version("policy") == 1
    cp.learn("b", {})
    assert cp.command_version("policy") == COMMAND_VERSION
