"""The control plane on every node: Raft groups on coordinators, a read copy everywhere, and the
one write path (local proposal or forwarding to the leader).

Why it lives in ``meshd/``: it is the only place that knows gossip (who the coordinators are and
their addresses), the identity (TLS for Raft and for forwarding) and the groups together.  The
decisions themselves are pure and live elsewhere: :mod:`consensus.bootstrap` (when to form or
join, whom to add or remove), :class:`policy.store.PolicyStore` (what a command does).

- Coordinators (``--role coordinator``) run one :class:`~consensus.group.RaftGroup` per group in
  :data:`~consensus.group.GROUPS` and publish a ``raft`` node-state section (leader, term,
  voters) so others find the leader without asking.
- Every node keeps a :class:`~consensus.view.GroupView` per group, saved on disk.  A running
  Raft member feeds its own view from its state machine; every other node follows a
  coordinator's ``Consensus.Follow`` stream (the leader when known).
- Writes on a coordinator go into its Raft node (pysyncobj forwards a follower's command to the
  leader); on other nodes they are forwarded with ``Consensus.Propose`` to the leader.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import shutil
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Collection, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import grpc
import msgpack

from consensus.bootstrap import Coordinator, Start, plan_start, reconcile
from consensus.group import GROUPS, ConsensusError, GroupStatus, RaftGroup, Timing
from consensus.view import GroupView
from gossip.protocol import Swim
from gossip.state import Addr, Status
from meshd.security.peers import PeerChannels
from meshd.security.plane import Security
from policy.model import KINDS
from policy.store import COMMAND_VERSION, Change, PolicyStore
from proto.mesh.v1 import admin_pb2, admin_pb2_grpc

log = logging.getLogger("meshd.control")

RAFT_SECTION = "raft"
"""Node-state section of coordinators: ``{group: [leader address, term, [voters]]}``."""
TICK = 0.25
"""Seconds between bootstrap/reconcile/follow checks."""
SETTLE = 1.0
"""Bootstrap waits until the set of coordinators it sees was unchanged this long."""
FOLLOW_RETRY = 0.5
FOLLOW_HEARTBEAT = 1.0
"""A coordinator's Follow stream sends an empty message after this many seconds of quiet."""
FOLLOW_SILENCE = 3.5
"""A follower drops a Follow stream silent this long (its coordinator is gone or cut off)."""
READ_YOUR_WRITE_WAIT = 2.0
"""After a write commits, how long it waits for this node's copy to show it."""
MEMBERSHIP_TIMEOUT = 5.0
MEMBERSHIP_HISTORY = 1000
FAILED_BACKOFF = 2.0
"""Seconds a coordinator that could not be reached is not picked for forwarding."""
SLOW_AFTER = 0.5
"""Seconds a forwarded write may go unanswered before its coordinator is picked last, until it
answers: a stalled process keeps its connections up, so only the silence tells.  A healthy
group commits in milliseconds, and a voter with no leader refuses at once."""
CONNECT_DEADLINE = 0.5
"""Longest wait for a connection to a coordinator before a forwarded write picks another.

A blackholed peer would otherwise hold the write until its whole deadline; on loopback or
a LAN a connection takes milliseconds, and nothing was sent yet, so trying another voter
is safe."""


def kinds_of(group: str) -> frozenset[str]:
    return frozenset(k for k, g in KINDS.items() if g == group)


COMMAND_VERSION_KEY = "cmdv"
"""The raft section's key for the newest command format a coordinator applies (not a group:
builds that predate it skip it, as they skip groups they do not run)."""


def encode_section(groups: dict[str, GroupStatus]) -> bytes:
    doc: dict[str, object] = {g: [s.leader or "", s.term, s.members]
                              for g, s in sorted(groups.items())}
    doc[COMMAND_VERSION_KEY] = COMMAND_VERSION
    return bytes(msgpack.packb(doc, use_bin_type=True))


def _section_doc(raw: bytes) -> dict[Any, Any]:
    """The ``raft`` section's map; ValueError when it is not one."""
    try:
        doc = msgpack.unpackb(raw, raw=False, max_map_len=16, max_array_len=64,
                              max_str_len=256)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise ValueError(f"raft section: not msgpack: {exc}") from None
    if not isinstance(doc, dict):
        raise ValueError("raft section: expected a map")
    return doc


def _groups_in(doc: dict[Any, Any]) -> dict[str, tuple[str, int, tuple[str, ...]]]:
    out: dict[str, tuple[str, int, tuple[str, ...]]] = {}
    for group, value in doc.items():
        if group not in GROUPS:
            continue
        if (not isinstance(value, list) or len(value) != 3 or not isinstance(value[0], str)
                or not isinstance(value[1], int) or not isinstance(value[2], list)
                or not all(isinstance(m, str) for m in value[2])):
            raise ValueError(f"raft section: bad entry for {group}")
        out[group] = (value[0], value[1], tuple(value[2]))
    return out


def _command_version_in(doc: dict[Any, Any]) -> int:
    v = doc.get(COMMAND_VERSION_KEY)
    return v if type(v) is int and v >= 1 else 1  # noqa: E721


def command_version_of(raw: bytes) -> int:
    """The command format a coordinator's raft section says it applies (1: a build before
    formats, or a section that does not say)."""
    try:
        return _command_version_in(_section_doc(raw))
    except ValueError:
        return 1


def decode_section(raw: bytes) -> dict[str, tuple[str, int, tuple[str, ...]]]:
    """The ``raft`` section; malformed input raises ValueError."""
    return _groups_in(_section_doc(raw))


@dataclass(frozen=True)
class Credential:
    """How the caller of an admin write proved who they are, exactly as this node received it.

    A write forwarded to a coordinator carries it so the coordinator verifies the caller itself
    (certificate chain and revocation, or the bearer token) and applies its RBAC policy for
    ``method``, instead of taking the forwarding node's word: otherwise any node certificate
    could write policies by calling ``Consensus.Propose`` directly.  Only writes a person made
    have one; the agent's own writes (scheduler, leases, automatic quarantine) have none.
    """

    method: str
    """The admin method the write came from (RBAC is per method)."""
    certificate_pem: bytes
    """The client certificate from the TLS handshake (gRPC's ``x509_pem_cert``)."""
    bearer: str = ""
    """The ``authorization: Bearer`` token, when the caller sent one (it names the caller)."""

    def __repr__(self) -> str:  # never print a token, even in a traceback
        return f"Credential(method={self.method!r}, bearer={'yes' if self.bearer else 'no'})"


@dataclass(frozen=True)
class GroupStore:
    """The state machine of one Raft group: its store, and the commands the coordinator
    stamps with its clock before proposing (the store's ``apply`` stays a pure function)."""

    store_class: type[PolicyStore] = PolicyStore
    stamped_ops: Collection[str] = ()


class ControlPlane:
    """Owns the node's Raft groups (if any), read copies, followers and forwarding.

    ``stores`` names each group's :class:`GroupStore`; the agent hands it over (the
    placements group's store belongs to the training plane, which sits above this one).  A
    coordinator needs one for every group in :data:`~consensus.group.GROUPS`.
    """

    def __init__(self, node: str, data_dir: Path, security: Security, *, coordinator: bool,
                 expect: int = 0, timing: Timing | None = None,
                 stores: Mapping[str, GroupStore] | None = None) -> None:
        self.stores = dict(stores or {})
        if coordinator and (missing := [g for g in GROUPS if g not in self.stores]):
            raise ValueError(f"a coordinator needs the store of every group: {missing} missing")
        self.node = node
        self.security = security
        self.coordinator = coordinator
        self.expect = expect
        self.timing = timing or Timing()
        self.raft_dir = data_dir / "raft"
        self.views = {g: GroupView(g, kinds_of(g), data_dir / "state" / f"{g}.json")
                      for g in GROUPS}
        for view in self.views.values():
            view.load()
        self.groups: dict[str, RaftGroup] = {}
        self.node_names: dict[str, str] = {}  # Raft address -> node name (pins TLS peers)
        self.published: dict[str, dict[str, tuple[str, int, tuple[str, ...]]]] = {}
        self.command_versions: dict[str, int] = {}
        """The newest command format each coordinator applies, from its raft section."""
        self.raft_host = ""
        self.raft_port = 0
        self.raft_bind = ""
        self.swim: Swim | None = None
        self.changed: Callable[[], None] = lambda: None  # republish our node state soon
        self.on_write: Callable[[str, str, str, float], None] = lambda g, p, o, s: None
        """(group, "local"|"forwarded", outcome, seconds) for every write (metrics)."""
        self.forwarded: Counter[str] = Counter()
        self.follow_errors: Counter[str] = Counter()
        self.raft_deferred: Counter[str] = Counter()
        """Raft connections closed for no security reason, by label
        (:data:`consensus.transport.DEFERRED_REASONS`: the peer's address not yet named by
        gossip after a restart, a peer hanging up mid-handshake).  Refusals go to
        ``security.refusals`` instead; these are what every restart brings."""
        self._deferred_lock = threading.Lock()  # SyncObj's tick threads count into it
        self._candidates: dict[str, tuple[frozenset[str], float]] = {}
        self._followers: dict[str, asyncio.Task[None]] = {}
        self._heard: dict[str, float] = {}  # group -> when its Follow stream last spoke
        self._changing: set[str] = set()
        self._peers = PeerChannels(lambda: security.identity)
        self._waiting_logged: dict[str, str] = {}
        self._failed: dict[str, float] = {}  # node -> until when not to pick it
        self._waiting: dict[str, list[float]] = {}  # node -> starts of its unanswered calls
        self._last_section: bytes | None = None
        self._tasks: set[asyncio.Task[Any]] = set()
        self._membership: deque[tuple[int, str, str, float]] = deque(maxlen=MEMBERSHIP_HISTORY)
        self.membership_seq = 0
        self.generation = 0
        self._waiters: set[asyncio.Future[None]] = set()
        for view in self.views.values():
            view.listeners.append(self._moved)

    def _moved(self) -> None:
        self.generation += 1
        for fut in self._waiters:
            if not fut.done():
                fut.set_result(None)
        self._waiters.clear()

    # --- change notifications (event streams) -----------------------------------------------

    def member_event(self, kind: str, name: str) -> None:
        """Record a membership event for ``SubscribeEvents`` (not versioned by Raft: a
        subscriber sees those that happen while it is subscribed)."""
        self.membership_seq += 1
        self._membership.append((self.membership_seq, kind, name, time.time()))
        self._moved()

    def membership_since(self, seq: int) -> list[tuple[int, str, str, float]]:
        return [e for e in self._membership if e[0] > seq]

    async def wait_moved(self, generation: int, timeout: float) -> None:
        """Wait until a view moved or a membership event arrived after ``generation`` (read
        before looking at the views), or ``timeout``."""
        if self.generation != generation:
            return
        fut = asyncio.get_running_loop().create_future()
        self._waiters.add(fut)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(fut, timeout)
        self._waiters.discard(fut)

    # --- wiring -----------------------------------------------------------------------------

    def attach(self, swim: Swim, raft: Addr | None, bind_host: str) -> None:
        self.swim = swim
        if raft is not None:
            self.raft_host, self.raft_port = raft
            self.raft_bind = bind_host

    def address(self, group: str, host: str | None = None, base: int | None = None) -> str:
        return f"{host or self.raft_host}:{(base or self.raft_port) + GROUPS.index(group)}"

    def section(self) -> bytes | None:
        if not self.groups:
            return None
        return encode_section({g: grp.status() for g, grp in self.groups.items()})

    def learn(self, member: str, sections: dict[str, bytes]) -> None:
        raw = sections.get(RAFT_SECTION)
        if raw is None:
            self.published.pop(member, None)
            self.command_versions.pop(member, None)
            return
        try:
            doc = _section_doc(raw)
            self.published[member] = _groups_in(doc)
            self.command_versions[member] = _command_version_in(doc)
        except ValueError as exc:
            log.debug("bad raft section", extra={"event": "bad_raft_section", "member": member,
                                                 "detail": str(exc)})

    def command_version(self, group: str) -> int:
        """The newest command format every coordinator running ``group`` applies: this
        build's, lowered by any coordinator whose raft section says less or predates formats.
        A coordinator this node has not heard from yet counts as the oldest format."""
        names = {m for m, groups in self.published.items() if group in groups}
        names.discard(self.node)
        grp = self.groups.get(group)
        expected = len(grp.status().members) if grp is not None else 0
        versions = [self.command_versions.get(m, 1) for m in names]
        if len(names) + 1 < expected:
            versions.append(1)
        return min([COMMAND_VERSION, *versions])

    def flags_of(self, node: str) -> list[str]:
        spec = self.views["policy"].store.node_flags(node)
        return [f for f, on in (("cordoned", spec.get("cordoned")),
                                ("draining", spec.get("draining")),
                                ("quarantined", spec.get("quarantined"))) if on]

    # --- the loop ---------------------------------------------------------------------------

    async def run(self) -> None:
        while True:
            try:
                await self._tick()
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - one bad tick must not end the control plane
                log.exception("control plane tick failed")
            await asyncio.sleep(TICK)

    def _coordinators(self, group: str) -> dict[str, Coordinator]:
        """Raft address -> what gossip says of that coordinator, for ``group``."""
        assert self.swim is not None
        out: dict[str, Coordinator] = {}
        for m in self.swim.members():
            ports = m.meta.ports_dict
            if "coordinator" not in m.meta.roles or "raft" not in ports:
                continue
            addr = self.address(group, m.addr[0], ports["raft"])
            self.node_names[addr] = m.name
            pub = self.published.get(m.name, {}).get(group)
            out[addr] = Coordinator(m.name, addr, live=m.live, left=m.status is Status.LEFT,
                                    members=pub[2] if pub else ())
        return out

    async def _tick(self) -> None:
        now = time.monotonic()
        for group in GROUPS:
            coordinators = self._coordinators(group) if self.swim is not None else {}
            if self.coordinator and self.raft_port:
                grp = self.groups.get(group)
                if grp is None:
                    await self._maybe_start(group, coordinators, now)
                else:
                    st = grp.status()
                    self._save_members(group, st.members)
                    if st.state == "leader" and group not in self._changing:
                        change = reconcile(st.members, coordinators)
                        if change is not None:
                            self._spawn(self._change_member(grp, *change))
            if group not in self.groups:
                self._ensure_follower(group)
        section = self.section()
        if section != self._last_section:  # a new leader or term: tell the mesh at once
            self._last_section = section
            self.changed()

    async def _maybe_start(self, group: str, coordinators: dict[str, Coordinator],
                           now: float) -> None:
        me_addr = self.address(group)
        me = Coordinator(self.node, me_addr, live=True)
        peers = [c for a, c in coordinators.items() if a != me_addr]
        unclustered = frozenset(c.name for c in peers if c.live and not c.members)
        seen, since = self._candidates.get(group, (None, now))
        if seen != unclustered:
            self._candidates[group] = (unclustered, now)
            since = now
        plan = plan_start(me, self.expect, self._saved_members(group), peers, now - since,
                          SETTLE)
        if not isinstance(plan, Start):
            if self._waiting_logged.get(group) != plan.why:
                self._waiting_logged[group] = plan.why
                log.info("raft group waiting", extra={"event": "raft_waiting", "group": group,
                                                      "detail": plan.why})
            return
        await self._start(group, plan.members, plan.why)

    async def _start(self, group: str, members: tuple[str, ...], why: str) -> None:
        view = self.views[group]
        loop = asyncio.get_running_loop()

        def on_change(change: Change) -> None:
            loop.call_soon_threadsafe(view.apply, change)

        def on_reset(snapshot: dict) -> None:
            loop.call_soon_threadsafe(view.reset, snapshot)

        address = self.address(group)
        bind = f"{self.raft_bind}:{address.rsplit(':', 1)[1]}" if self.raft_bind else None
        tls = replace(self.security.raft_tls(self.node_names), on_deferred=self._raft_deferred)
        grp = RaftGroup(group, address=address, partners=members,
                        data_dir=self.raft_dir, tls=tls,
                        kinds=kinds_of(group), timing=self.timing, bind=bind,
                        on_change=on_change, on_reset=on_reset,
                        store_class=self.stores[group].store_class,
                        stamped_ops=self.stores[group].stamped_ops,
                        command_version=lambda: self.command_version(group))
        try:
            await grp.wait_bound()
        except Exception as exc:
            grp.close()
            raise OSError(f"raft group {group}: cannot listen on {bind or address}") from exc
        follower = self._followers.pop(group, None)
        if follower is not None:
            follower.cancel()
        self.groups[group] = grp
        self._save_members(group, members)
        log.info("raft group started", extra={"event": "raft_started", "group": group,
                                              "address": address, "members": list(members),
                                              "detail": why})
        self.changed()

    def _raft_deferred(self, reason: str) -> None:
        with self._deferred_lock:
            self.raft_deferred[reason] += 1

    async def _change_member(self, grp: RaftGroup, op: str, address: str) -> None:
        self._changing.add(grp.name)
        try:
            await grp.change_member(op, address, MEMBERSHIP_TIMEOUT)
            log.info("raft membership changed", extra={
                "event": "raft_member_" + op, "group": grp.name, "address": address,
                "member": self.node_names.get(address, "")})
            self.changed()
        except ConsensusError as exc:
            log.warning("raft membership change failed", extra={
                "event": "raft_member_failed", "group": grp.name, "detail": str(exc)})
            await asyncio.sleep(1.0)
        finally:
            self._changing.discard(grp.name)

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    # --- saved configuration ----------------------------------------------------------------

    def _members_file(self, group: str) -> Path:
        return self.raft_dir / f"{group}.members.json"

    def _saved_members(self, group: str) -> list[str] | None:
        try:
            data = json.loads(self._members_file(group).read_text())
        except (OSError, ValueError):
            return None
        if isinstance(data, list) and all(isinstance(a, str) for a in data):
            return data
        return None

    def _save_members(self, group: str, members: list[str] | tuple[str, ...]) -> None:
        path = self._members_file(group)
        text = json.dumps(sorted(members))
        with contextlib.suppress(OSError):
            if path.exists() and path.read_text() == text:
                return
            self.raft_dir.mkdir(parents=True, exist_ok=True)
            tmp = path.with_suffix(".tmp")
            tmp.write_text(text)
            tmp.replace(path)

    # --- following (nodes without a running Raft member) ------------------------------------

    def _ensure_follower(self, group: str) -> None:
        task = self._followers.get(group)
        if task is None or task.done():
            self._followers[group] = asyncio.get_running_loop().create_task(
                self._follow(group))

    def _pick_coordinator(self, group: str) -> tuple[str, str] | None:
        """(node name, admin target) of the group's leader if known, else of a live
        coordinator that publishes the group."""
        assert self.swim is not None
        claims = [(pub[group][1], pub[group][0]) for pub in self.published.values()
                  if group in pub and pub[group][0]]
        leader_names = {self.node_names.get(max(claims)[1], "")} if claims else set()
        now = time.monotonic()
        best: tuple[int, str, str] | None = None
        for m in self.swim.members():
            if not m.live or m.name == self.node or m.name not in self.published:
                continue
            if self._failed.get(m.name, 0.0) > now:
                continue
            if group not in self.published[m.name] or "admin" not in m.meta.ports_dict:
                continue
            # Any voter hands a write to its leader; a suspect one is likely gone, and one
            # sitting on a write is likely stalled, so they come last even when they lead.
            slow = any(now - t > SLOW_AFTER for t in self._waiting.get(m.name, ()))
            rank = 2 * (m.status is Status.SUSPECT or slow) + (m.name not in leader_names)
            target = f"{m.addr[0]}:{m.meta.ports_dict['admin']}"
            if best is None or (rank, m.name) < best[:2]:
                best = (rank, m.name, target)
        return None if best is None else (best[1], best[2])

    def _stub(self, name: str, target: str) -> admin_pb2_grpc.ConsensusStub:
        return admin_pb2_grpc.ConsensusStub(self._channel(name, target))

    def _channel(self, name: str, target: str) -> grpc.aio.Channel:
        return self._peers.get(name, target)

    async def _connected(self, name: str, target: str, within: float) -> bool:
        """Whether a (TLS) connection to ``target`` is up, or comes up within ``within`` s."""
        channel = self._channel(name, target)
        deadline = time.monotonic() + within
        state = channel.get_state(try_to_connect=True)
        while state is not grpc.ChannelConnectivity.READY:
            if state in (grpc.ChannelConnectivity.TRANSIENT_FAILURE,
                         grpc.ChannelConnectivity.SHUTDOWN):
                return False  # refused, or still backing off from a failed attempt
            try:
                await asyncio.wait_for(channel.wait_for_state_change(state),
                                       deadline - time.monotonic())
            except TimeoutError:
                return False
            state = channel.get_state(try_to_connect=True)
        return True

    async def _follow(self, group: str) -> None:
        view = self.views[group]
        while True:
            picked = self._pick_coordinator(group) if self.swim is not None else None
            if picked is None:
                await asyncio.sleep(FOLLOW_RETRY)
                continue
            name, target = picked
            stream = self._stub(name, target).Follow(
                admin_pb2.FollowRequest(group=group, from_version=view.version))
            watchdog = asyncio.get_running_loop().create_task(
                self._watch_follow(group, picked, stream))
            try:
                async for msg in stream:
                    self._heard[group] = time.monotonic()
                    if msg.snapshot_json:
                        view.reset(json.loads(msg.snapshot_json))
                    elif msg.change_json:
                        if not view.apply(Change.from_dict(json.loads(msg.change_json))):
                            self.follow_errors["gap"] += 1
                            break
                    view.source = name
            except asyncio.CancelledError:
                me = asyncio.current_task()
                if not watchdog.done() or (me is not None and me.cancelling()):
                    raise  # this task was cancelled, not just the stream by the watchdog
            except grpc.aio.AioRpcError as exc:
                self.follow_errors[exc.code().name.lower()] += 1
                if exc.code() is grpc.StatusCode.UNAVAILABLE:
                    self._failed[name] = time.monotonic() + FAILED_BACKOFF
                log.debug("follow stream ended", extra={"event": "follow_ended", "group": group,
                                                        "member": name, "detail": str(exc)})
            except (ValueError, KeyError) as exc:
                self.follow_errors["bad_message"] += 1
                log.warning("bad follow message", extra={"event": "follow_bad", "group": group,
                                                         "member": name, "detail": str(exc)})
            finally:
                watchdog.cancel()
                stream.cancel()
            await asyncio.sleep(FOLLOW_RETRY)

    async def _watch_follow(self, group: str, picked: tuple[str, str],
                            stream: grpc.aio.UnaryStreamCall) -> None:
        """Ends a Follow stream when a better coordinator appears (a leader, or a new one)
        or when its coordinator falls silent: a partitioned peer never closes the stream."""
        self._heard[group] = time.monotonic()
        while True:
            await asyncio.sleep(FOLLOW_HEARTBEAT / 2)
            if self._pick_coordinator(group) != picked:
                break
            if time.monotonic() - self._heard[group] > FOLLOW_SILENCE:
                self.follow_errors["silent"] += 1
                self._failed[picked[0]] = time.monotonic() + FAILED_BACKOFF
                break
        stream.cancel()

    # --- writes and reads -------------------------------------------------------------------

    async def write(self, group: str, command: dict[str, Any], timeout: float,
                    caller: str = "", credential: Credential | None = None) -> dict[str, Any]:
        """Commit ``command`` in ``group`` from this node; waits until this node's copy shows
        the result (read-your-writes).  Raises :class:`ConsensusError`.

        ``credential``: how the person behind the write authenticated (admin writes), passed on
        when the write is forwarded so the coordinator can check them itself; None for the
        agent's own writes.  A Raft member proposes locally: it already checked the caller."""
        grp = self.groups.get(group)
        path = "local" if grp is not None else "forwarded"
        start = time.perf_counter()
        try:
            if grp is not None:
                result = await grp.propose(command, timeout)
            else:
                result = await self._forward(group, command, timeout, caller, credential)
        except ConsensusError as exc:
            self.on_write(group, path, exc.code, time.perf_counter() - start)
            raise
        self.on_write(group, path, "ok" if result.get("ok") else str(result.get("error")),
                      time.perf_counter() - start)
        version = result.get("version") if isinstance(result, dict) else None
        if result.get("ok") and isinstance(version, int) and command.get("op") != "read":
            view = self.views[group]
            deadline = time.monotonic() + READ_YOUR_WRITE_WAIT
            while view.version < version and time.monotonic() < deadline:
                await view.wait_beyond(view.version, deadline - time.monotonic())
        return result

    async def _forward(self, group: str, command: dict[str, Any], timeout: float,
                       caller: str, credential: Credential | None,
                       retry: bool = True) -> dict[str, Any]:
        picked = self._pick_coordinator(group) if self.swim is not None else None
        if picked is None:
            raise ConsensusError("no_leader", f"no quorum in raft group {group}: no "
                                 "coordinator of the group is reachable from this node")
        name, target = picked
        self.forwarded[group] += 1
        if not await self._connected(name, target, min(CONNECT_DEADLINE, timeout / 2)):
            return await self._unreachable(group, command, timeout, caller, credential, retry,
                                           name, f"no connection within {CONNECT_DEADLINE:g} s")
        request = admin_pb2.ProposeRequest(group=group, command_json=json.dumps(command),
                                           timeout_seconds=timeout, on_behalf_of=caller)
        if credential is not None:
            request.method = credential.method
            request.caller_certificate_pem = credential.certificate_pem
            request.caller_bearer = credential.bearer
        try:
            with self._waiting_on(name):
                reply = await self._stub(name, target).Propose(request, timeout=timeout + 1.0)
        except grpc.aio.AioRpcError as exc:
            code = exc.code()
            detail = exc.details() or code.name
            if code is grpc.StatusCode.UNAVAILABLE and detail.startswith("no quorum"):
                raise ConsensusError("no_quorum", detail) from None  # the voter refused it
            if code is grpc.StatusCode.UNAVAILABLE and "failed to connect" in detail:
                return await self._unreachable(group, command, timeout, caller, credential,
                                               retry, name, detail)
            # Any other failure (a connection lost mid-call included) may follow a commit.
            # These three are answered before anything is proposed: nothing was applied.
            if code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.PERMISSION_DENIED,
                        grpc.StatusCode.UNAUTHENTICATED):
                raise ConsensusError("refused", f"{name}: {detail}") from None
            raise ConsensusError("unknown", f"forwarded to {name}: {detail}") from None
        result = json.loads(reply.result_json)
        if not isinstance(result, dict):
            raise ConsensusError("unknown", f"{name} returned a malformed result")
        return result

    @contextlib.contextmanager
    def _waiting_on(self, name: str) -> Iterator[None]:
        """Marks a call to ``name`` unanswered while it runs (see :data:`SLOW_AFTER`)."""
        started = time.monotonic()
        waiting = self._waiting.setdefault(name, [])
        waiting.append(started)
        try:
            yield
        finally:
            waiting.remove(started)

    async def _unreachable(self, group: str, command: dict[str, Any], timeout: float,
                           caller: str, credential: Credential | None, retry: bool, name: str,
                           detail: str) -> dict[str, Any]:
        """The write never left: ``name`` is unreachable (it may have just died, before
        gossip says so).  Skip it for a while and try another voter once."""
        self._failed[name] = time.monotonic() + FAILED_BACKOFF
        if retry:
            return await self._forward(group, command, timeout, caller, credential,
                                       retry=False)
        raise ConsensusError("no_quorum", (
            f"no quorum in raft group {group}: no coordinator reachable from "
            f"{self.node} (last tried {name}: {detail})"))

    def local_status(self) -> list[GroupStatus]:
        return [grp.status() for grp in self.groups.values()]

    async def cluster_status(self, timeout: float = 1.0) -> list[admin_pb2.RaftGroupStatus]:
        """Every group as every live coordinator reports it (asked in parallel)."""
        out = [status_pb(s, self.node) for s in self.local_status()]
        assert self.swim is not None
        asks = []
        for m in self.swim.members():
            if (m.name == self.node or not m.live or "coordinator" not in m.meta.roles
                    or "admin" not in m.meta.ports_dict):
                continue
            target = f"{m.addr[0]}:{m.meta.ports_dict['admin']}"
            asks.append((m.name, self._stub(m.name, target).Status(
                admin_pb2.RaftStatusRequest(), timeout=timeout)))
        for name, call in asks:
            try:
                reply = await call
                out.extend(reply.groups)
            except grpc.aio.AioRpcError as exc:
                out.append(admin_pb2.RaftGroupStatus(node=name,
                                                     error=exc.details() or exc.code().name))
        return out

    # --- shutdown ---------------------------------------------------------------------------

    async def close(self, leave: bool) -> None:
        """Stop; with ``leave`` a coordinator first removes itself from its groups and forgets
        them (a later start joins afresh instead of replaying a configuration it left)."""
        for task in [*self._followers.values(), *self._tasks]:
            task.cancel()
        for group, grp in list(self.groups.items()):
            removed = False
            if leave and len(grp.members()) > 1:
                try:
                    await grp.change_member("remove", grp.address, MEMBERSHIP_TIMEOUT)
                    removed = True
                except ConsensusError as exc:
                    log.warning("could not leave the raft group", extra={
                        "event": "raft_leave_failed", "group": group, "detail": str(exc)})
            await asyncio.to_thread(grp.close)
            if removed:
                for path in self.raft_dir.glob(f"{group}.*"):
                    with contextlib.suppress(OSError):
                        path.unlink() if path.is_file() else shutil.rmtree(path)
                log.info("left the raft group", extra={"event": "raft_left", "group": group})
        self.groups.clear()
        for view in self.views.values():
            view.save()
        await self._peers.close()


def status_pb(s: GroupStatus, node: str) -> admin_pb2.RaftGroupStatus:
    return admin_pb2.RaftGroupStatus(
        group=s.group, node=node, address=s.address, state=s.state, leader=s.leader or "",
        term=s.term, commit_index=s.commit_index, last_applied=s.last_applied,
        version=s.version, has_quorum=s.has_quorum, members=s.members, reachable=s.reachable,
        lag=s.lag)
