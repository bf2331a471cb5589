"""One Raft group: a :class:`policy.store.PolicyStore` replicated by pysyncobj over mutual TLS.

Why a wrapper: pysyncobj is callback- and thread-based, has sharp defaults (batching that adds
~100 ms per commit, a 30 s leader fallback, sync calls without timeouts, no fsync), and reports
quorum from TCP connections that never time out.  :class:`RaftGroup` fixes those choices in one
place and gives the agent an asyncio surface: ``await propose(command, timeout)``, ``status()``,
membership changes, and a stream of committed changes for the node's read copy.

Threading: pysyncobj applies commands on its own tick thread.  The store is only touched there
(under ``_StoreConsumer.lock`` so ``snapshot()`` can be taken from elsewhere); the agent's
read copy lives in the asyncio loop and is fed through ``on_change``/``on_reset``, which are
called on the tick thread and must hand off (``loop.call_soon_threadsafe``).
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
import weakref
from collections.abc import Callable, Collection
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from pysyncobj import FAIL_REASON, SyncObj, SyncObjConf, SyncObjConsumer, replicated
from pysyncobj.node import TCPNode

from consensus.durability import JournalSync, read_dump, repair_journal, write_dump
from consensus.transport import RaftTls, TlsTransport, tls_transport
from policy.store import COMMAND_VERSION, Change, PolicyStore, command_version

log = logging.getLogger("consensus.group")

GROUPS = ("policy", "placements")
"""The Raft groups every coordinator runs, in port order (``raft_port + i``)."""


@dataclass(frozen=True)
class Timing:
    """Raft timing.  Defaults suit a LAN or one machine; every one is documented because each
    trades failover speed against spurious elections on a loaded host.

    - ``heartbeat`` (0.1 s): the leader's append-entries period; followers time out without it.
    - ``election_min``/``election_max`` (0.5-1.0 s): a follower that hears no leader for a random
      time in this range starts an election.  Failover after a leader dies is about
      ``election_max`` plus one round trip, which is what keeps it under 2 s.
    - ``leader_fallback`` (2 s): a leader that hears from no majority for this long steps down,
      so an isolated leader stops claiming leadership quickly (pysyncobj's default is 30 s).
    - ``quorum_window`` (0.6 s): a peer counts as reachable for the quorum check if we heard
      from it this recently; six heartbeats, above ``election_min`` so a healthy leader never
      fails the check.
    - ``reconnect`` (0.5 s): retry period for a lost Raft connection (pysyncobj: 5 s).
    - ``connect_timeout`` (3.5 s): an unfinished TLS handshake is dropped after this long.
    """

    heartbeat: float = 0.1
    election_min: float = 0.5
    election_max: float = 1.0
    leader_fallback: float = 2.0
    quorum_window: float = 0.6
    reconnect: float = 0.5
    connect_timeout: float = 3.5


WAN_TIMING = Timing(heartbeat=0.25, election_min=1.5, election_max=3.0, leader_fallback=6.0,
                    quorum_window=1.8, reconnect=1.0, connect_timeout=10.0)
"""For coordinators spread over regions (round trips of 100+ ms)."""


class ConsensusError(Exception):
    """A proposal that did not (or may not have) committed; ``code`` names why:
    ``no_quorum`` and ``no_leader`` (not applied, retry later), ``unknown`` (timed out or the
    leader changed: it may still commit), ``closed``, ``version`` (a command format some voter
    would not apply: not proposed)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code

    @property
    def applied_unknown(self) -> bool:
        return self.code == "unknown"


_NOT_APPLIED = {FAIL_REASON.QUEUE_FULL: "queue full", FAIL_REASON.MISSING_LEADER: "no leader",
                FAIL_REASON.DISCARDED: "discarded by a new leader",
                FAIL_REASON.REQUEST_DENIED: "request denied"}


@dataclass
class GroupStatus:
    """What ``meshctl raft status`` shows for one group on one coordinator."""

    group: str
    address: str
    state: str  # leader | follower | candidate
    leader: str | None
    term: int
    commit_index: int
    last_applied: int
    version: int  # the store's version (policies) on this coordinator
    has_quorum: bool
    members: list[str]
    reachable: list[str]
    match_index: dict[str, int] = field(default_factory=dict)
    log_entries: int = 0

    @property
    def lag(self) -> dict[str, int]:
        """Entries each follower is behind the leader's commit (leader only)."""
        return {m: max(0, self.commit_index - i) for m, i in self.match_index.items()}


class _StoreConsumer(SyncObjConsumer):  # type: ignore[misc]
    """The replicated state: pysyncobj serializes what is set after ``super().__init__()``,
    and we make that plain data (``PolicyStore.snapshot()``), never our classes."""

    def __init__(self, kinds: Collection[str], durable: Callable[[], None],
                 on_change: Callable[[Change], None], on_reset: Callable[[dict], None],
                 store_class: type[PolicyStore] = PolicyStore) -> None:
        self.lock = threading.Lock()
        self.kinds = frozenset(kinds)
        self.store_class = store_class
        self.durable = durable
        self.on_change = on_change
        self.on_reset = on_reset
        super().__init__()
        self.store = store_class(self.kinds)

    @replicated  # type: ignore[untyped-decorator]
    def apply(self, command: dict) -> dict:
        self.durable()  # our own copy of the entry is on disk before anyone hears the result
        with self.lock:
            before = self.store.version
            result = self.store.apply(command)
            changes = self.store.changes_since(before) if self.store.version != before else []
        for change in changes or ():
            self.on_change(change)
        return result

    def snapshot(self) -> dict:
        with self.lock:
            return self.store.snapshot()

    def _serialize(self) -> dict:
        return {"snapshot": self.snapshot()}

    def _deserialize(self, data: dict) -> None:
        store = self.store_class.restore(data["snapshot"])
        with self.lock:
            self.store = store
            snap = store.snapshot()
        self.on_reset(snap)


class RaftGroup:
    """A Raft group member on this node.  Create it, then ``await wait_bound()``."""

    def __init__(self, name: str, *, address: str, partners: Collection[str], data_dir: Path,
                 tls: RaftTls, kinds: Collection[str], timing: Timing = Timing(),
                 bind: str | None = None,
                 on_change: Callable[[Change], None] = lambda c: None,
                 on_reset: Callable[[dict], None] = lambda s: None,
                 store_class: type[PolicyStore] = PolicyStore,
                 stamped_ops: Collection[str] = (),
                 command_version: Callable[[], int] = lambda: COMMAND_VERSION) -> None:
        self.name = name
        self.command_version = command_version
        """The newest command format every voter of the group applies (its owner knows the
        voters' builds): a newer command is refused before it reaches the log."""
        self.address = address
        self.timing = timing
        self.stamped_ops = frozenset(stamped_ops)
        """Commands whose ``at`` this coordinator sets from its own clock when proposing."""
        data_dir.mkdir(parents=True, exist_ok=True)
        journal = data_dir / f"{name}.journal"
        # pysyncobj trusts the journal's end offset; after a power cut it can point past a torn
        # record (see consensus.durability.repair_journal).  Raises JournalError for a file
        # that is not a journal.
        self.journal_check = repair_journal(journal)
        self.consumer = _StoreConsumer(kinds, lambda: None, on_change, on_reset, store_class)
        self.durability = JournalSync(journal, lambda: self.consumer._syncObj)
        self.durability.dump_file = data_dir / f"{name}.dump"
        self.consumer.durable = self.durability
        self._tls = replace(tls, before_send=self.durability)
        self.transport_class: type[TlsTransport] = tls_transport(self._tls)
        conf = SyncObjConf(
            appendEntriesUseBatch=False,  # else every commit waits for a batch (~100 ms)
            appendEntriesPeriod=timing.heartbeat, raftMinTimeout=timing.election_min,
            raftMaxTimeout=timing.election_max, leaderFallbackTimeout=timing.leader_fallback,
            connectionRetryTime=timing.reconnect, connectionTimeout=timing.connect_timeout,
            dynamicMembershipChange=True, commandsWaitLeader=False,
            journalFile=str(journal), fullDumpFile=str(data_dir / f"{name}.dump"),
            serializer=self._write_dump, deserializer=self._read_dump,
            useFork=False,  # forking a process with gRPC threads is unsafe
            bindAddress=bind or address, maxBindRetries=30, bindRetryTime=0.5)
        self._members = {a for a in partners if a != address}
        self.syncobj = SyncObj(address, sorted(self._members), conf, consumers=[self.consumer],
                               transportClass=self.transport_class)
        self._closed = False

    # --- snapshots ----------------------------------------------------------------------------

    def _write_dump(self, path: str, raft_data: Any) -> None:
        """pysyncobj hands a custom serializer only its own bookkeeping (last entries, cluster),
        not the state: we add the store's snapshot, taken on the tick thread at the same log
        index."""
        write_dump(path, (self.consumer._serialize(), raft_data))

    def _read_dump(self, path: str) -> Any:
        state, raft_data = read_dump(path)
        self.consumer._deserialize(state)
        return raft_data

    # --- lifecycle --------------------------------------------------------------------------

    async def wait_bound(self) -> None:
        """Wait until the Raft port is listening (raises OSError if it cannot bind)."""
        transport = self.transport
        await asyncio.to_thread(transport.waitReady)

    @property
    def transport(self) -> TlsTransport:
        return self.syncobj._SyncObj__transport  # type: ignore[no-any-return]

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self.syncobj.destroy()

    # --- proposals --------------------------------------------------------------------------

    async def propose(self, command: dict, timeout: float) -> dict:
        """Commit ``command`` and return the state machine's result, as applied on this node.

        Fails fast (``no_quorum``/``no_leader``) when this node can tell the write cannot
        commit; raises ``unknown`` when it timed out or the leader changed under it.
        """
        if self._closed:
            raise ConsensusError("closed", f"raft group {self.name} is shut down")
        self.check_quorum()
        version, understood = command_version(command), self.command_version()
        if version > understood:
            raise ConsensusError("version", f"raft group {self.name}: command format {version} "
                                 f"is newer than every voter applies ({understood}): upgrade "
                                 "the coordinators first")
        if command.get("op") in self.stamped_ops:
            command = {**command, "at": time.time()}
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[tuple[Any, int]] = loop.create_future()
        ref = weakref.ref(fut)

        def done(result: Any, error: int) -> None:
            def settle() -> None:
                f = ref()
                if f is not None and not f.done():
                    f.set_result((result, error))
            loop.call_soon_threadsafe(settle)

        self.consumer.apply(command, callback=done)
        try:
            result, error = await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            raise ConsensusError("unknown", f"raft group {self.name}: no commit within "
                                 f"{timeout:g} s; the write may still be applied") from None
        if error == FAIL_REASON.SUCCESS:
            return result  # type: ignore[no-any-return]
        if error in _NOT_APPLIED:
            code = "no_leader" if error == FAIL_REASON.MISSING_LEADER else "not_applied"
            raise ConsensusError(code, f"raft group {self.name}: {_NOT_APPLIED[error]}")
        raise ConsensusError("unknown", f"raft group {self.name}: the leader changed before the "
                             "write was acknowledged; it may still be applied")

    def check_quorum(self) -> None:
        """Raise ``no_quorum``/``no_leader`` unless a write can commit now, as far as this node
        knows: as leader, a majority heard from within ``quorum_window``; as follower, a leader
        heard from within it (the leader makes its own check)."""
        st = self.status()
        if st.has_quorum:
            return
        members = st.members
        need = len(members) // 2 + 1
        missing = sorted(set(members) - set(st.reachable))
        if st.leader is None:
            raise ConsensusError("no_leader", (
                f"no quorum in raft group {self.name}: no leader; {len(st.reachable)} of "
                f"{len(members)} coordinators reachable, {need} needed; unreachable: "
                f"{', '.join(missing) or 'none'}"))
        raise ConsensusError("no_quorum", (
            f"no quorum in raft group {self.name}: {len(st.reachable)} of {len(members)} "
            f"coordinators reachable, {need} needed; unreachable: {', '.join(missing)}"))

    # --- membership -------------------------------------------------------------------------

    async def change_member(self, op: str, address: str, timeout: float) -> None:
        """Add or remove a voter through the log (``op`` is "add" or "remove")."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[int] = loop.create_future()

        def done(_: Any, error: int) -> None:
            loop.call_soon_threadsafe(lambda: None if fut.done() else fut.set_result(error))

        self.check_quorum()
        if op == "add":
            self.syncobj.addNodeToCluster(address, callback=done)
        else:
            self.syncobj.removeNodeFromCluster(address, callback=done)
        try:
            error = await asyncio.wait_for(fut, timeout)
        except TimeoutError:
            raise ConsensusError("unknown", f"raft group {self.name}: {op} {address} not "
                                 f"committed within {timeout:g} s") from None
        if error != FAIL_REASON.SUCCESS:
            raise ConsensusError("not_applied", f"raft group {self.name}: {op} {address} failed "
                                 f"({_NOT_APPLIED.get(error, f'reason {error}')})")

    # --- inspection -------------------------------------------------------------------------

    def members(self) -> list[str]:
        """Every voter's Raft address, this node included (from the committed configuration)."""
        others = self.syncobj.otherNodes
        return sorted({self.address, *(n.address for n in others)})

    def status(self) -> GroupStatus:
        s = self.syncobj.getStatus()
        state = {0: "follower", 1: "candidate", 2: "leader"}.get(s["state"], str(s["state"]))
        leader = s["leader"]
        leader_addr = leader.address if isinstance(leader, TCPNode) else None
        members = self.members()
        now = time.monotonic()
        heard = self.transport.last_heard
        window = self.timing.quorum_window
        reachable = sorted({self.address} | {m for m in members
                                              if now - heard.get(m, -1e9) < window})
        if state == "leader":
            has_quorum = len(reachable) >= len(members) // 2 + 1
        else:
            has_quorum = leader_addr is not None and leader_addr in reachable
        match = {k.removeprefix("match_idx_server_"): v for k, v in s.items()
                 if k.startswith("match_idx_server_")}
        return GroupStatus(
            group=self.name, address=self.address, state=state, leader=leader_addr,
            term=s["raft_term"], commit_index=s["commit_idx"], last_applied=s["last_applied"],
            version=self.consumer.store.version, has_quorum=has_quorum, members=members,
            reachable=reachable, match_index=match if state == "leader" else {},
            log_entries=s["log_len"])

    def snapshot(self) -> dict:
        return self.consumer.snapshot()
