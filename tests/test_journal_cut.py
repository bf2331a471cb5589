"""A coordinator cut off mid-write: its Raft journal as a power cut leaves it, at the byte level.

pysyncobj's journal (``<group>.journal``, ``pysyncobj/journal.py``) is a 40-byte header (name,
version, format, and the ``end`` offset just past the last record) then records
``size(4) | idx(8) | term(8) | command | size(4)``, written through an ``mmap``.
:class:`consensus.durability.JournalSync` flushes it before this node acknowledges anything, so a
power cut keeps every acknowledged record and may tear only the record being written; but which
pages the kernel wrote back by then is arbitrary: the header's ``end`` may already point past a
record whose bytes are missing (the file cut short), zero (the file was extended but the page
never written) or stale (garbage).

What pysyncobj 0.3.17 does with such a tail on its own (before
:func:`consensus.durability.repair_journal`): a file cut short raises ``struct.error`` in
``SyncObj.__init__`` (the coordinator cannot start; an empty file: ``ValueError`` from ``mmap``);
a zeroed or garbage tail, or a file cut below 1 KiB (which pysyncobj pads with zeros), loads as
entries with the torn bytes (``idx``/``term`` 0 or random).  An entry the commit index covers is
applied: a torn command makes every tick raise, wedging the node.  A random ``term`` becomes the
node's current term: it wins the next election with a garbage log and overwrites committed
entries on the others.  A zeroed trailing size is walked when the leader truncates the log, which
leaves the file misframed for the next restart.

The tests below tear records that were acknowledged and committed, and whose commit index already
reached the ``.meta`` file: the harshest case (a disk losing synced data, or a record torn before
its commit was recorded) for "nothing corrupt is applied"; "nothing acknowledged lost" then
rests on the other two members.
"""

from __future__ import annotations

import asyncio
import random
import shutil
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from pysyncobj import SyncObj
from pysyncobj.pickle import loads as pysyncobj_loads
from pysyncobj.transport import Transport

import consensus.group
from certs import tls
from consensus.durability import JournalError
from consensus.group import ConsensusError, RaftGroup
from consensus.transport import RaftTls, mesh_authorizer
from policy.store import PolicyStore
from tests.test_consensus import POLICY_KINDS, Trio, quota

HEADER = 40  # pysyncobj.journal.FIRST_RECORD_OFFSET, restated so the test parses independently
END_AT = 36  # where the header keeps the end offset (LAST_RECORD_OFFSET_OFFSET)
REGULAR = 0  # pysyncobj's command type byte for a replicated call

Entry = tuple[bytes, int, int]  # (command, idx, term), as pysyncobj's journal holds them


@dataclass(frozen=True)
class Record:
    start: int
    end: int
    entry: Entry


def parse(data: bytes) -> list[Record]:
    """The records of an intact journal (asserts it is intact)."""
    end = struct.unpack_from("<I", data, END_AT)[0]
    out = []
    off = HEADER
    while off < end:
        size = struct.unpack_from("<I", data, off)[0]
        idx, term = struct.unpack_from("<QQ", data, off + 4)
        trailer = struct.unpack_from("<I", data, off + 4 + size)[0]
        assert trailer == size, f"record {idx} at {off}: size {size}, trailing size {trailer}"
        out.append(Record(off, off + size + 8, (data[off + 20:off + 4 + size], idx, term)))
        off += size + 8
    assert off == end
    return out


def set_end(data: bytearray, end: int) -> None:
    struct.pack_into("<I", data, END_AT, end)


def journal_entries(grp: RaftGroup) -> list[Entry]:
    log = grp.syncobj._SyncObj__raftLog
    return [tuple(log[i]) for i in range(len(log))]  # type: ignore[misc]


def reference_snapshots(commands: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``out[j]``: the store after the first ``j`` acknowledged commands."""
    store = PolicyStore(POLICY_KINDS)
    out = [store.snapshot()]
    for cmd in commands:
        assert store.apply(cmd)["ok"]
        out.append(store.snapshot())
    return out


async def propose(grp: RaftGroup, cmd: dict[str, Any], tries: float = 10.0) -> dict[str, Any]:
    """Commit ``cmd``, retrying only refusals that applied nothing (a retry after ``unknown``
    could apply it twice, and these tests count versions)."""
    deadline = time.monotonic() + tries
    while True:
        try:
            return await grp.propose(cmd, 10.0)
        except ConsensusError as exc:
            if exc.applied_unknown or time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.1)


def wait_for(cond: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def meta_commit(raft_dir: Path) -> int:
    try:
        return int(pysyncobj_loads((raft_dir / "policy.journal.meta").read_bytes())
                   .get("raftCommitIndex", 0))
    except (OSError, ValueError, EOFError):
        return 0


def power_cut_copy(src: Path, dst: Path) -> None:
    """The data dir as a power cut at this instant leaves it, if every page had reached the disk;
    the tests then take pages away.  File by file: pysyncobj renames ``.meta`` into place."""
    dst.mkdir(parents=True)
    for name in ("policy.journal", "policy.journal.meta", "policy.dump"):
        if (src / name).exists():
            shutil.copy(src / name, dst / name)


# --- every offset, restored in process --------------------------------------------------------


class _Offline(Transport):  # type: ignore[misc]
    """No network: ready at once and nobody answers, like a node that restarted alone."""

    def send(self, node: Any, message: Any) -> bool:
        return False


class _OfflineSyncObj(SyncObj):  # type: ignore[misc]
    """pysyncobj as :class:`RaftGroup` configures it, but ticked by the test and without sockets,
    so a restart costs a few milliseconds: loading the journal (and the dump) and applying the
    committed entries are exactly pysyncobj's own code."""

    def __init__(self, selfNode: Any, otherNodes: Any, conf: Any, consumers: Any = None,
                 transportClass: Any = None) -> None:
        conf.autoTick = False
        conf.appendEntriesUseBatch = True  # no pipe notifier: pysyncobj never closes its fds
        super().__init__(selfNode, otherNodes, conf, consumers=consumers,
                         transportClass=_Offline)


@dataclass(frozen=True)
class Loaded:
    entries: list[Entry]
    snapshot: dict[str, Any]


def restore_offline(data_dir: Path, raft_tls: RaftTls) -> Loaded:
    """Restart one member from ``data_dir`` through :class:`RaftGroup` (its journal check, dump
    reader and store), apply what its commit index covers, and report the log and the store."""
    addrs = ["127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3"]
    grp = RaftGroup("policy", address=addrs[0], partners=addrs, data_dir=data_dir, tls=raft_tls,
                    kinds=POLICY_KINDS)
    try:
        grp.syncobj.doTick(0.0)  # loads a dump if there is one, applies up to the commit index
        grp.syncobj.doTick(0.0)
        return Loaded(journal_entries(grp), grp.snapshot())
    finally:
        grp.close()


@dataclass(frozen=True)
class Case:
    label: str
    journal: bytes
    keep: int  # records that must survive: the ones before the first damaged one


def intact(journal: bytes, data: bytes, records: list[Record]) -> int:
    """How many leading records of ``data`` survive in ``journal`` byte for byte, below its
    header's end offset.  (Zeroing the high bytes of a trailing size of 208 changes nothing:
    that record is intact and must be kept.)"""
    end = min(struct.unpack_from("<I", journal, END_AT)[0], len(journal))
    n = 0
    for rec in records:
        if rec.end > end or journal[rec.start:rec.end] != data[rec.start:rec.end]:
            break
        n += 1
    return n


def torn_cases(data: bytes, records: list[Record]) -> list[Case]:
    """Every byte offset of the last record (and of the last write, should an election have
    appended a no-op after it), cut / zeroed / garbage from there to the end; a sample of offsets
    in every other record (cut and zeroed: all later records go with it); and a header that never
    advanced over the last record (a clean loss, not a tear)."""
    journals = []
    end = records[-1].end
    writes = [k for k, r in enumerate(records) if r.entry[0][0] == REGULAR]
    every = {len(records) - 1, writes[-1]}
    for k in sorted(every):
        for off in range(records[k].start, records[k].end):
            journals += [(f"cut@{off}", data[:off]),
                         (f"zero@{off}", data[:off] + bytes(end - off) + data[end:]),
                         (f"garbage@{off}",
                          data[:off] + random.Random(off).randbytes(end - off) + data[end:])]
    for rec in (r for k, r in enumerate(records) if k not in every):
        size = rec.end - rec.start
        for off in sorted({rec.start, rec.start + 1, rec.start + 4, rec.start + 12,
                           rec.start + 20, rec.start + size // 2, rec.end - 4, rec.end - 1}):
            journals += [(f"cut@{off}", data[:off]),
                         (f"zero@{off}", data[:off] + bytes(end - off) + data[end:])]
    for k in (len(records) - 1, len(records) - 4):
        stale = bytearray(data)
        set_end(stale, records[k].start)
        journals.append((f"end-at-record-{k}", bytes(stale)))
    cases = [Case(label, j, intact(j, data, records)) for label, j in journals]
    assert sum(c.keep == len(records) for c in cases) < 10  # nearly every case tears something
    return cases


@pytest.fixture(scope="module")
def cut_node(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[dict[str, Any]],
                                                                   RaftTls]:
    """A trio that acknowledged eight writes; one follower's data dir copied as it is on disk
    once its commit index covering all of them reached ``.meta``, then the trio stops."""
    tmp = tmp_path_factory.mktemp("journal_cut")
    trio = Trio(tmp)
    try:
        for i in range(3):
            trio.start(i)
        lead = trio.leader()
        commands = [quota(f"t{k}", k + 1.0) for k in range(8)]

        async def write() -> list[dict[str, Any]]:
            return [await propose(trio.groups[lead], c) for c in commands]  # type: ignore[arg-type]

        acked = asyncio.run(write())
        assert [r["version"] for r in acked if r["ok"]] == list(range(1, 9))
        f = (lead + 1) % 3
        grp = trio.groups[f]
        assert grp is not None
        wait_for(lambda: grp.status().last_applied == grp.status().commit_index
                 and grp.snapshot()["version"] == 8, 10, "the follower to apply all writes")
        last = journal_entries(grp)[-1][1]
        wait_for(lambda: meta_commit(trio.dirs[f] / "raft") == last, 5,
                 "the commit index to reach .meta")
        power_cut_copy(trio.dirs[f] / "raft", tmp / "cut")
        d = trio.dirs[f]
        raft_tls = RaftTls(tls.server_context(d / "identity"), tls.client_context(d / "identity"),
                           mesh_authorizer(trio.verifier), node_names=trio.names)
    finally:
        trio.close()
    return tmp / "cut", commands, raft_tls


def test_torn_journal_tail_loads_a_clean_prefix(cut_node: tuple[Path, list[dict[str, Any]],
                                                                   RaftTls],
                                                 tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """For every case: the member starts, its log is exactly the records before the damage, and
    its store is exactly the acknowledged history up to there (not a record more, none torn)."""
    src, commands, raft_tls = cut_node
    monkeypatch.setattr(consensus.group, "SyncObj", _OfflineSyncObj)
    refs = reference_snapshots(commands)
    data = (src / "policy.journal").read_bytes()
    records = parse(data)
    original = [r.entry for r in records]
    assert sum(e[0][0] == REGULAR for e in original) == 8  # and pysyncobj's no-ops
    assert original[0] == (b"\x01", 1, 0)  # pysyncobj's first no-op: what an empty log restarts as
    commit = meta_commit(src)
    assert commit == original[-1][1]  # the harshest case: the torn record counts as committed

    work = tmp_path / "w"
    power_cut_copy(src, work)
    intact = restore_offline(work, raft_tls)
    assert intact.entries == original and intact.snapshot == refs[8]

    cases = torn_cases(data, records)
    failures: list[str] = []
    start = time.perf_counter()
    for case in cases:
        shutil.rmtree(work)
        power_cut_copy(src, work)
        (work / "policy.journal").write_bytes(case.journal)
        try:
            got = restore_offline(work, raft_tls)
        except Exception as exc:  # noqa: BLE001 - collected: one report for all cases
            failures.append(f"{case.label}: {type(exc).__name__}: {exc}")
            continue
        want = original[:max(case.keep, 1)]  # an empty log restarts with pysyncobj's no-op 1
        applied = sum(e[0][0] == REGULAR for e in want if e[1] <= commit)
        if got.entries != want:
            failures.append(f"{case.label}: log of {len(got.entries)} entries, last "
                            f"{got.entries[-1][1:] if got.entries else None}; want the first "
                            f"{len(want)}")
        elif got.snapshot != refs[applied]:
            failures.append(f"{case.label}: store at version {got.snapshot['version']}, want "
                            f"the first {applied} acknowledged writes")
    elapsed = time.perf_counter() - start
    assert not failures, (f"{len(failures)} of {len(cases)} torn journals ({elapsed:.1f} s):\n"
                          + "\n".join(failures[:25]))
    assert len(cases) > 3 * (records[-1].end - records[-1].start)


def test_journal_header_damage(cut_node: tuple[Path, list[dict[str, Any]], RaftTls],
                               tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A journal cut inside its header (an empty file: the power cut came right after pysyncobj
    created it, or zeros) starts as an empty log; bytes that are not a pysyncobj journal at all
    are refused, naming the file, rather than parsed as records."""
    src, _, raft_tls = cut_node
    monkeypatch.setattr(consensus.group, "SyncObj", _OfflineSyncObj)
    data = (src / "policy.journal").read_bytes()
    for label, journal in (("empty", b""), ("half-header", data[:20]),
                           ("zeroed", bytes(len(data)))):
        work = tmp_path / label
        power_cut_copy(src, work)
        (work / "policy.journal").write_bytes(journal)
        got = restore_offline(work, raft_tls)
        assert [e[1] for e in got.entries] == [1] and got.snapshot["version"] == 0, label
    work = tmp_path / "foreign"
    power_cut_copy(src, work)
    (work / "policy.journal").write_bytes(b"not a journal\n" * 100)
    with pytest.raises(JournalError, match="policy.journal"):
        restore_offline(work, raft_tls)
    assert (work / "policy.journal").read_bytes() == b"not a journal\n" * 100  # left for a human


# --- real members: cut, restart, rejoin -------------------------------------------------------


class RecordingTrio(Trio):
    """:class:`Trio` whose members record every change their store applies."""

    def __init__(self, tmp: Path) -> None:
        super().__init__(tmp)
        self.changes: list[list[dict[str, Any]]] = [[] for _ in range(3)]

    def start(self, i: int) -> RaftGroup:
        d = self.dirs[i]
        settings_ = RaftTls(tls.server_context(d / "identity"), tls.client_context(d / "identity"),
                            mesh_authorizer(self.verifier), node_names=self.names)
        seen: list[dict[str, Any]] = []
        self.changes[i] = seen
        grp = RaftGroup("policy", address=self.addrs[i], partners=self.addrs,
                        data_dir=d / "raft", tls=settings_, kinds=POLICY_KINDS,
                        on_change=lambda ch: seen.append(ch.to_dict()))
        self.groups[i] = grp
        return grp

    def cut(self, i: int) -> None:
        """Stop member ``i`` without letting it write anything more to its own dir."""
        grp = self.groups[i]
        assert grp is not None
        self.stop(i)
        wait_for(lambda: not grp.syncobj.tick_thread_alive(), 5, "the tick thread to stop")


TEARS: list[tuple[str, str, int]] = [
    # (who, how, where in the last record: >= 0 from its start, < 0 from its end)
    ("follower", "cut", 2),  # inside the size field: pysyncobj raised struct.error at start
    ("follower", "zero", 20),  # idx and term intact, command zeroed: the leader's term matches
    ("follower", "garbage", 4),  # random idx and term: a term of ~1e18 that wins elections
    ("follower", "cut", -2),  # only the trailing size lost
    ("leader", "garbage", 12),  # random term; the other two hold every acknowledged write
]


def test_torn_tail_restarts_and_refetches_acknowledged_writes(tmp_path: Path) -> None:
    """Cut a member (follower or leader) after writes everyone acknowledged, tear its last
    record, restart it into the running group: it must start, apply exactly the acknowledged
    history in order (no torn entry, no gap), end with the leader's log and store, and leave
    the group able to commit through it."""
    trio = RecordingTrio(tmp_path)
    try:
        for i in range(3):
            trio.start(i)
        commands: list[dict[str, Any]] = []

        async def write(n: int) -> None:
            lead = trio.leader()
            for _ in range(n):
                cmd = quota(f"t{len(commands)}", len(commands) + 1.0)
                res = await propose(trio.groups[lead], cmd)  # type: ignore[arg-type]
                assert res["ok"] and res["version"] == len(commands) + 1, res
                commands.append(cmd)

        def settled() -> bool:
            """Every member holds every acknowledged write and the same log end."""
            if any(g is None or g.snapshot()["version"] != len(commands) for g in trio.groups):
                return False
            return len({journal_entries(g)[-1] for g in trio.groups if g is not None}) == 1

        for n, (who, how, where) in enumerate(TEARS):
            asyncio.run(write(3))
            wait_for(settled, 10, "every member to hold every acknowledged write")
            lead = trio.leader()
            i = lead if who == "leader" else (lead + 1) % 3
            raft_dir = trio.dirs[i] / "raft"
            snap = tmp_path / f"cut{n}"
            power_cut_copy(raft_dir, snap)
            trio.cut(i)
            data = bytearray((snap / "policy.journal").read_bytes())
            last = parse(bytes(data))[-1]
            off = last.start + where if where >= 0 else last.end + where
            if how == "cut":
                del data[off:]
            elif how == "zero":
                data[off:last.end] = bytes(last.end - off)
            else:
                data[off:last.end] = random.Random(n).randbytes(last.end - off)
            (snap / "policy.journal").write_bytes(data)
            shutil.rmtree(raft_dir)
            snap.rename(raft_dir)
            if who == "leader":
                trio.leader()  # the other two elect a leader first
            grp = trio.start(i)

            wait_for(settled, 15, f"{who} torn {how}@{where} to catch up")
            lead = trio.leader()
            leader = trio.groups[lead]
            assert leader is not None
            refs = reference_snapshots(commands)
            assert grp.snapshot() == leader.snapshot() == refs[len(commands)]
            assert trio.changes[i] == refs[len(commands)]["history"], (who, how, where)
            assert journal_entries(grp) == journal_entries(leader)
            on_disk = parse((raft_dir / "policy.journal").read_bytes())
            assert [r.entry for r in on_disk] == journal_entries(grp)
            assert all(g is not None and g.status().term < 100 for g in trio.groups)

            cmd = quota(f"t{len(commands)}", len(commands) + 1.0)
            commands.append(cmd)
            res = asyncio.run(propose(grp, cmd))  # through the restarted member
            assert res["ok"] and res["version"] == len(commands), res
    finally:
        trio.close()
