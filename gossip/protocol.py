"""The SWIM + Lifeguard membership protocol as a sans-I/O state machine.

:class:`Swim` never touches a socket or a clock.  The caller feeds it datagrams
(:meth:`Swim.receive`), push-pull streams (:meth:`Swim.handle_stream`,
:meth:`Swim.stream_reply`) and the passing of time (:meth:`Swim.tick` at :meth:`Swim.next_timer`),
and collects what it wants sent (:meth:`Swim.datagrams_to_send`, :meth:`Swim.streams_to_open`)
and what happened (:meth:`Swim.events`).  That is what lets the same code run on real sockets
(``gossip.transport``) and thousands of times over in one deterministic simulation.

The protocol follows HashiCorp memberlist: randomized round-robin probing with indirect probes,
suspicion with incarnation numbers and refutation, dissemination piggybacked on probes and
gossip, push-pull anti-entropy, and Lifeguard's local health awareness, dynamic suspicion timeout
and nacks.

**Mesh ids.**  A node whose metadata names a mesh (:data:`~gossip.state.MESH_TAG`) refuses
members, push-pulls and datagrams of another mesh.  Every datagram it sends to a peer that
reads optional message types starts with a :data:`~gossip.codec.MESH` message; one that names
another mesh makes the receiver drop the whole datagram before applying any of it
(``other_mesh``).  Who reads optional types: a member whose metadata carries the mesh tag
(only builds that know optional types set it), or a sender whose datagram we answer carried
the message itself.  Everyone else (first contact, seeds, builds older than optional types,
which drop a whole packet holding a type they do not know) gets datagrams as before, and a
datagram without the message is accepted as before.
"""

from __future__ import annotations

import math
import random
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any, Protocol

from gossip import codec
from gossip.awareness import Awareness
from gossip.broadcast import BroadcastQueue, retransmit_limit
from gossip.config import Config
from gossip.events import EventKind, MemberEvent
from gossip.keyring import Keyring
from gossip.state import Addr, Member, MetaError, NodeMeta, Status
from gossip.stats import Stats
from gossip.suspicion import Suspicion, suspicion_timeout

PUSH_PULL_SCALE_THRESHOLD = 32
MAX_REFUSED_NAMES = 1024
"""Nodes of other meshes remembered, to report each once (forgotten all at once beyond)."""
LEAVE_DIRECT_ALL = 64
"""Up to this many live members, a leaving node tells every one of them directly."""

_PACKET_OVERHEAD = codec.HEADER_BYTES + codec.ARRAY_HEADER_MAX + codec.ENCRYPTION_OVERHEAD


def push_pull_scale(interval: float, n_members: int) -> float:
    """memberlist's ``pushPullScale``: above 32 members, back off logarithmically."""
    if n_members <= PUSH_PULL_SCALE_THRESHOLD:
        return interval
    multiplier = math.ceil(math.log2(n_members) - math.log2(PUSH_PULL_SCALE_THRESHOLD)) + 1.0
    return interval * multiplier


class ProbeHook(Protocol):
    """Lets a higher layer ride on probes without gossip knowing about it (e.g. Vivaldi)."""

    def ack_payload(self) -> bytes:
        """Bytes to attach to every ack we send (at most 512)."""

    def probe_acked(self, member: Member, rtt: float, payload: bytes) -> None:
        """A direct probe of ``member`` was acked after ``rtt`` seconds with ``payload``."""


@dataclass(slots=True)
class StreamRequest:
    """A push-pull exchange the shell should perform: send ``payload`` to ``addr`` over a
    stream and hand the reply to :meth:`Swim.stream_reply` (or report
    :meth:`Swim.stream_failed`)."""

    addr: Addr
    payload: bytes
    join: bool


@dataclass(slots=True)
class _Probe:
    target: str
    sent: float
    direct_deadline: float
    deadline: float
    indirect_sent: bool = False
    expected_nacks: int = 0
    nacks: int = 0


@dataclass(slots=True)
class _Relay:
    """An indirect probe we perform for another member."""

    requester: Addr
    requester_seq: int
    nack_at: float | None
    expires: float
    tagged: bool
    """Whether the requester reads the mesh message (our answers to it carry it)."""


@dataclass(slots=True)
class _NodeState:
    version: int
    blob: bytes


@dataclass(slots=True)
class _Timers:
    probe: float
    gossip: float
    push_pull: float
    reap: float
    leave_done: float | None = None
    pending: dict[int, _Probe] = field(default_factory=dict)
    relays: dict[int, _Relay] = field(default_factory=dict)


class Swim:
    """One node's membership protocol state.

    ``now`` arguments are seconds on any monotonic clock; all of them must come from the same
    clock.  ``rng`` makes every random choice, so a seeded instance is fully deterministic.
    """

    def __init__(self, config: Config, name: str, addr: Addr, meta: NodeMeta | None = None, *,
                 now: float, rng: random.Random | None = None, keyring: Keyring | None = None,
                 probe_hook: ProbeHook | None = None, incarnation: int = 0) -> None:
        config.validate()
        if not 0 < len(name) <= codec.MAX_NAME:
            raise ValueError(f"node name must be 1..{codec.MAX_NAME} characters")
        self.config = config
        self.name = name
        self.keyring = keyring
        self.probe_hook = probe_hook
        self.stats = Stats()
        self.awareness = Awareness(config.awareness_max_multiplier)
        self._rng = rng or random.Random()
        meta = meta or NodeMeta()
        meta_raw = meta.encode()
        if len(meta_raw) > config.max_meta_bytes:
            raise MetaError(
                f"node metadata is {len(meta_raw)} bytes, limit {config.max_meta_bytes}")
        me = Member(name, addr, incarnation, Status.ALIVE, meta, meta_raw, now)
        self.mesh = ""
        """Our mesh id (:data:`~gossip.state.MESH_TAG`): members naming another are refused."""
        self._mesh_digest = b""
        self._mesh_msg = b""  # our MESH message, put first in datagrams to peers that read it
        self._set_mesh(meta.mesh)
        self._refused: set[str] = set()  # nodes of another mesh reported once each
        self._other_meshes: dict[bytes, str] = {}  # digests of refused members' meshes
        self._members: dict[str, Member] = {name: me}
        self._nodes: list[str] = [name]  # shuffled; walked for probes, sampled for gossip
        self._probe_index = 0
        self._n_live = 1
        self._not_live: set[str] = set()  # dead/left members, for reaping without a full scan
        self._suspicions: dict[str, Suspicion] = {}
        self._states: dict[str, _NodeState] = {}
        self._deltas: dict[str, _NodeState] = {}  # newest delta past each member's state
        self._broadcasts = BroadcastQueue()
        self._out: list[tuple[bytes, Addr]] = []
        self._streams: list[StreamRequest] = []
        self._events: deque[MemberEvent] = deque()
        self._seq = 0
        self._own_state_seen = 0  # highest version of our state seen from an older life
        self._limit_n = -1  # cluster size the cached retransmit limit is for
        self._limit = 0
        self._leaving = False
        cfg = config
        self._t = _Timers(
            probe=now + self._rng.random() * cfg.probe_interval,
            gossip=now + self._rng.random() * cfg.gossip_interval,
            # Staggered within the first interval (memberlist's randomOffset): a join whose
            # broadcast missed someone is repaired within one interval, not two.
            push_pull=(now + cfg.push_pull_interval * self._rng.random()
                       if cfg.push_pull_interval > 0 else math.inf),
            reap=now + 1.0,
        )
        self._queue_alive(me)

    # --- queries ---------------------------------------------------------------------------

    @property
    def local(self) -> Member:
        return self._members[self.name]

    @property
    def incarnation(self) -> int:
        return self._members[self.name].incarnation

    @property
    def leaving(self) -> bool:
        return self._leaving

    def member(self, name: str) -> Member | None:
        return self._members.get(name)

    def members(self) -> list[Member]:
        """Every member we know of, ourselves included, in name order."""
        return [self._members[n] for n in sorted(self._members)]

    def num_live(self) -> int:
        """Members that are alive or suspect (the size estimate used for timeouts)."""
        return self._n_live

    def node_state(self, name: str) -> tuple[int, bytes] | None:
        """The newest ``(version, blob)`` a member has published, if any."""
        st = self._states.get(name)
        return (st.version, st.blob) if st else None

    def node_delta(self, name: str) -> tuple[int, bytes] | None:
        """The newest delta a member has published past its state :meth:`node_state` holds
        (None when the state is as new): the owner applies it over that state."""
        st = self._deltas.get(name)
        return (st.version, st.blob) if st else None

    def broadcast_queue_depth(self) -> int:
        return len(self._broadcasts)

    # --- outputs ---------------------------------------------------------------------------

    def datagrams_to_send(self) -> list[tuple[bytes, Addr]]:
        out, self._out = self._out, []
        return out

    def streams_to_open(self) -> list[StreamRequest]:
        out, self._streams = self._streams, []
        return out

    def events(self) -> list[MemberEvent]:
        out = list(self._events)
        self._events.clear()
        return out

    def next_timer(self) -> float:
        """The protocol time at which :meth:`tick` next has work to do."""
        t = self._t
        when = min(t.probe, t.gossip, t.push_pull, t.reap)
        for p in t.pending.values():
            when = min(when, p.deadline if p.indirect_sent else p.direct_deadline)
        for r in t.relays.values():
            when = min(when, r.nack_at if r.nack_at is not None else r.expires)
        for s in self._suspicions.values():
            when = min(when, s.deadline)
        return when

    # --- commands --------------------------------------------------------------------------

    def join(self, seeds: Iterable[Addr]) -> None:
        """Ask the shell to push-pull with each seed (a successful reply means we joined)."""
        for addr in seeds:
            self._streams.append(StreamRequest(addr, self._encode_stream(join=True), True))

    def leave(self, now: float) -> None:
        """Announce a graceful leave: others record us as *left*, not *dead*.

        Keep driving the core for ``config.leave_propagate_delay`` (see :attr:`left_done`) so
        the announcement is gossiped before the process stops.
        """
        if self._leaving:
            return
        self._leaving = True
        me = self.local
        self._set_member(replace(me, status=Status.LEFT, status_since=now))
        self._broadcasts.queue("m:" + self.name, codec.dead(me.incarnation, self.name, self.name))
        self._t.leave_done = now + self.config.leave_propagate_delay
        # Tell members directly as well as by gossip: a leave that misses one member turns into
        # a suspicion and a "dead" there, which nothing would ever correct.  Small meshes hear
        # it from us first-hand; large ones from a sample, then epidemically.
        msg = codec.dead(me.incarnation, self.name, self.name)
        limit = LEAVE_DIRECT_ALL if self._n_live <= LEAVE_DIRECT_ALL else 3 * max(
            1, self.config.gossip_nodes)
        for m in self._random_members(limit, lambda m: m.live):
            self._send(m.addr, [msg], piggyback=False, tagged=bool(m.meta.mesh))
        self._gossip(now)

    def left_done(self, now: float) -> bool:
        """True once a leave has had time to propagate."""
        return self._t.leave_done is not None and now >= self._t.leave_done

    def update_meta(self, meta: NodeMeta, now: float) -> None:
        """Publish new metadata as a new incarnation.

        Refused (``ValueError``) once :meth:`leave` was called: a new alive would supersede the
        leave announcement and peers would see us join again.
        """
        if self._leaving:
            raise ValueError("cannot update metadata after leave()")
        raw = meta.encode()
        if len(raw) > self.config.max_meta_bytes:
            raise MetaError(
                f"node metadata is {len(raw)} bytes, limit {self.config.max_meta_bytes}")
        me = self.local
        self._set_mesh(meta.mesh)
        me = replace(me, meta=meta, meta_raw=raw,
                     incarnation=min(me.incarnation + 1, codec.MAX_U64))
        self._set_member(me)
        self._queue_alive(me)

    def publish_state(self, blob: bytes, now: float, delta: bytes | None = None) -> int:
        """Publish a new version of this node's state blob; returns the version.

        A blob within ``max_state_delta_bytes`` is broadcast whole.  A larger one spreads by
        push-pull only, and ``delta`` (what changed, in a form only the owner understands)
        is broadcast instead when it fits: receivers hand it to their owner as a
        :attr:`EventKind.DELTA` over the older blob they hold, until push-pull brings the blob.
        """
        if len(blob) > self.config.max_state_bytes:
            raise ValueError(
                f"node state is {len(blob)} bytes, limit {self.config.max_state_bytes}")
        cur = self._states.get(self.name)
        # Continue past anything an older life of ours published (u64 on the wire: saturate).
        version = min(max(cur.version if cur else 0, self._own_state_seen) + 1, codec.MAX_U64)
        self._states[self.name] = _NodeState(version, blob)
        limit = self.config.max_state_delta_bytes
        if len(blob) <= limit:
            self._broadcasts.queue("s:" + self.name, codec.state(self.name, version, blob))
        elif delta is not None and len(delta) <= limit:
            self._broadcasts.queue("s:" + self.name,
                                   codec.state_delta(self.name, version, delta))
        else:
            self._broadcasts.drop("s:" + self.name)  # an older version is no use to anyone
        return version

    def restore(self, members: dict[str, Member], nodes: list[str] | None = None,
                now: float | None = None) -> None:
        """Load a known membership wholesale (a snapshot); no events, no broadcasts.

        ``members`` is copied, its records shared (they are immutable).  Our own record is kept.
        With ``now``, the first push-pull is re-staggered over the interval scaled for the
        restored size, as if the members had been learned one by one.
        """
        me = self.local
        self._members = dict(members)
        self._members[self.name] = me
        self._nodes = list(nodes) if nodes is not None else list(self._members)
        if self.name not in self._nodes:
            self._nodes.append(self.name)
        self._probe_index = 0  # the probe walk shuffles as it goes (_next_probe_target)
        # One pass, no per-record property call: a 10,000-node simulation restores 10,000 times.
        suspect = Status.SUSPECT
        self._not_live = {n for n, m in self._members.items() if m.status > suspect}
        self._n_live = len(self._members) - len(self._not_live)
        if now is not None and self.config.push_pull_interval > 0:
            scaled = push_pull_scale(self.config.push_pull_interval, self._n_live)
            self._t.push_pull = now + scaled * self._rng.random()

    # --- time ------------------------------------------------------------------------------

    def tick(self, now: float) -> None:
        """Run every timer that is due at ``now``."""
        t = self._t
        for seq, probe in list(t.pending.items()):
            if not probe.indirect_sent and now >= probe.direct_deadline:
                self._probe_direct_timeout(seq, probe, now)
            if probe.indirect_sent and now >= probe.deadline:
                del t.pending[seq]
                self._probe_failed(probe, now)
        for seq, relay in list(t.relays.items()):
            if relay.nack_at is not None and now >= relay.nack_at:
                relay.nack_at = None
                self._send(relay.requester, [codec.nack(relay.requester_seq)],
                           tagged=relay.tagged)
                self.stats.nacks_sent += 1
            if relay.nack_at is None and now >= relay.expires:
                del t.relays[seq]
        for name, susp in list(self._suspicions.items()):
            if now >= susp.deadline:
                self._suspicion_expired(name, now)
        if now >= t.probe:
            self._probe(now)
        if now >= t.gossip:
            self._gossip(now)
            t.gossip += self.config.gossip_interval
            if t.gossip <= now:  # we were stalled: skip the missed rounds, as a ticker does
                t.gossip = now + self.config.gossip_interval
        if now >= t.push_pull:
            self._push_pull(now)
        if now >= t.reap:
            self._reap(now)
            t.reap = now + 1.0

    # --- inputs ----------------------------------------------------------------------------

    def receive(self, data: bytes, addr: Addr, now: float) -> None:
        """Handle one datagram from ``addr``; malformed input is counted and dropped."""
        self.stats.packets_received += 1
        self.stats.bytes_received += len(data)
        try:
            msgs, skipped = codec.decode_compound(data, self.keyring)
        except codec.DecodeError as exc:
            self.stats.drop(exc.reason)
            return
        tagged = False  # the sender named our mesh, so it reads the mesh message
        if self._mesh_digest:
            for msg in msgs:
                if msg[0] == codec.MESH:
                    if msg[1] != self._mesh_digest:
                        self.stats.drop("other_mesh")
                        self._refuse_datagram(msg[1], msgs, addr, now)
                        return
                    tagged = True
        self.stats.skipped_messages += skipped
        for msg in msgs:
            self._dispatch(msg, addr, now, tagged)

    def handle_stream(self, data: bytes, addr: Addr, now: float) -> bytes | None:
        """Serve a push-pull request: merge the peer's tables, return ours (None if invalid)."""
        try:
            source, join, nodes, states = codec.decode_stream(data, self.keyring,
                                                              self.config.max_stream_bytes)
        except codec.DecodeError as exc:
            self.stats.drop(exc.reason, stream=True)
            return None
        if self._stream_from_other_mesh(source, nodes, now):
            self.stats.drop("other_mesh", stream=True)
            return None
        self.stats.push_pull_received += 1
        self.stats.push_pull_bytes_received += len(data)
        self._merge_remote(source, nodes, states, now)
        reply = self._encode_stream(join=False)
        self.stats.push_pull_bytes_sent += len(reply)
        return reply

    def stream_reply(self, data: bytes, request: StreamRequest, now: float) -> bool:
        """Merge the reply to a push-pull we initiated; False if it was invalid."""
        try:
            source, _join, nodes, states = codec.decode_stream(data, self.keyring,
                                                               self.config.max_stream_bytes)
        except codec.DecodeError as exc:
            self.stats.drop(exc.reason, stream=True)
            self.stats.push_pull_failed += 1
            return False
        if self._stream_from_other_mesh(source, nodes, now):
            self.stats.drop("other_mesh", stream=True)
            self.stats.push_pull_failed += 1
            return False
        self.stats.push_pull_completed += 1
        self.stats.push_pull_bytes_sent += len(request.payload)
        self.stats.push_pull_bytes_received += len(data)
        self._merge_remote(source, nodes, states, now)
        return True

    def stream_failed(self, request: StreamRequest, now: float) -> None:
        """The shell could not complete a push-pull (connect refused, timeout, reset)."""
        self.stats.push_pull_failed += 1

    # --- dispatch --------------------------------------------------------------------------

    def _dispatch(self, msg: list[Any], addr: Addr, now: float, tagged: bool) -> None:
        kind = msg[0]
        if kind == codec.PING:
            self._on_ping(msg[1], msg[2], msg[3], addr, now, tagged)
        elif kind == codec.ACK:
            self._on_ack(msg[1], msg[2], now)
        elif kind == codec.ALIVE:
            self._on_alive(msg[1], msg[2], (msg[3], msg[4]), msg[5], now)
        elif kind == codec.SUSPECT:
            self._on_suspect(msg[1], msg[2], msg[3], now)
        elif kind == codec.DEAD:
            self._on_dead(msg[1], msg[2], msg[3], now)
        elif kind == codec.INDIRECT_PING:
            self._on_indirect_ping(msg[1], msg[2], (msg[3], msg[4]), msg[5], msg[6], addr,
                                   now, tagged)
        elif kind == codec.NACK:
            probe = self._t.pending.get(msg[1])
            if probe is not None:
                probe.nacks += 1
            self.stats.nacks_received += 1
        elif kind == codec.STATE:
            self._on_state(msg[1], msg[2], msg[3], now)
        elif kind == codec.STATE_DELTA:
            self._on_state_delta(msg[1], msg[2], msg[3], now)

    # --- probing ---------------------------------------------------------------------------

    def _next_seq(self) -> int:
        self._seq = (self._seq + 1) & 0xFFFFFFFF
        return self._seq

    def _probe(self, now: float) -> None:
        self._t.probe = now + self.awareness.scale(self.config.probe_interval)
        if self._leaving:
            # A leaving node stops probing: the acks it would get back carry (and use up)
            # other members' retransmits of our own leave, and we no longer care who is alive.
            return
        target = self._next_probe_target(now)
        if target is None:
            return
        seq = self._next_seq()
        msgs = [codec.ping(seq, target.name, self.name)]
        if target.status == Status.SUSPECT:
            # Buddy system: tell the suspect directly so it can refute at once.  The suspicion
            # goes first: the target reads it, refutes, and only then answers the ping, so its
            # ack carries the refutation straight back to us (memberlist puts the ping first,
            # and the ack leaves before the refutation exists).
            msgs.insert(0, codec.suspect(target.incarnation, target.name, self.name))
        self._send(target.addr, msgs, tagged=bool(target.meta.mesh))
        self.stats.probes_sent += 1
        self._t.pending[seq] = _Probe(
            target=target.name, sent=now, direct_deadline=now + self.config.probe_timeout,
            deadline=now + self.awareness.scale(self.config.probe_interval))

    def _next_probe_target(self, now: float) -> Member | None:
        """The next member of a randomized round-robin: every live member once per round, in
        a fresh random order each round.  The order is drawn lazily (one Fisher-Yates step per
        probe) instead of shuffling the whole list at the start of a round: same distribution,
        O(1) per probe instead of O(N) per round (which at 10,000 simulated nodes matters)."""
        nodes = self._nodes
        rand = self._rng.random
        for _ in range(2):
            n = len(nodes)
            while self._probe_index < n:
                i = self._probe_index
                j = i + int(rand() * (n - i))
                nodes[i], nodes[j] = nodes[j], nodes[i]
                name = nodes[i]
                self._probe_index = i + 1
                m = self._members.get(name)
                if m is not None and name != self.name and m.live:
                    return m
            self._reset_nodes(now)
            nodes = self._nodes
        return None

    def _reset_nodes(self, now: float) -> None:
        """Start a new probe round: drop long-dead members from the list (the next round's
        order is drawn as it is walked)."""
        keep_dead = self.config.gossip_to_the_dead_time
        self._nodes = [n for n, m in self._members.items()
                       if m.live or (m.status == Status.DEAD and now - m.status_since <= keep_dead)]
        self._probe_index = 0

    def _probe_direct_timeout(self, seq: int, probe: _Probe, now: float) -> None:
        probe.indirect_sent = True
        target = self._members.get(probe.target)
        if target is None or self.config.indirect_checks == 0:
            return
        helpers = self._random_members(self.config.indirect_checks,
                                       lambda m: m.status == Status.ALIVE
                                       and m.name != probe.target)
        nack = self.config.nacks
        host, port = target.addr
        for helper in helpers:
            self._send(helper.addr, [codec.indirect_ping(seq, target.name, host, port, nack,
                                                          self.name)],
                       tagged=bool(helper.meta.mesh))
            self.stats.indirect_probes_sent += 1
        if nack:
            probe.expected_nacks = len(helpers)

    def _probe_failed(self, probe: _Probe, now: float) -> None:
        self.stats.probes_failed += 1
        # Lifeguard: missing nacks mean our own path is bad, not (only) the target.
        if probe.expected_nacks > 0:
            delta = probe.expected_nacks - min(probe.nacks, probe.expected_nacks)
        else:
            delta = 1
        self.awareness.apply_delta(delta)
        target = self._members.get(probe.target)
        if target is None or not target.live:
            return
        # Suspecting an already-suspect member is an independent confirmation.
        if target.status == Status.ALIVE:
            self.stats.suspicions_raised += 1
        self._on_suspect(target.incarnation, target.name, self.name, now)

    def _on_ping(self, seq: int, target: str, source: str, addr: Addr, now: float,
                 tagged: bool) -> None:
        if target and target != self.name:
            self.stats.drop("misdirected")
            return
        payload = self.probe_hook.ack_payload() if self.probe_hook else b""
        msgs = [codec.ack(seq, payload)]
        src = self._members.get(source)
        if src is not None and not src.live and source != self.name:
            # The sender thinks it is fine but we hold it dead/left: tell it so it can refute
            # now rather than at the next push-pull.
            accuser = src.name if src.status == Status.LEFT else self.name
            msgs.append(codec.dead(src.incarnation, src.name, accuser))
        self._send(addr, msgs, tagged=tagged or self._reads_mesh(source, addr))

    def _on_ack(self, seq: int, payload: bytes, now: float) -> None:
        self.stats.acks_received += 1
        probe = self._t.pending.pop(seq, None)
        if probe is not None:
            rtt = now - probe.sent
            target = self._members.get(probe.target)
            # Any successful probe, direct or through a helper, is evidence we are healthy
            # (memberlist's probeNode applies -1 on every path that returns on an ack).
            self.awareness.apply_delta(-1)
            if not probe.indirect_sent:
                self.stats.probe_rtts.append(rtt)
                if self.probe_hook is not None and target is not None:
                    self.probe_hook.probe_acked(target, rtt, payload)
            self.stats.probes_ok += 1
            return
        relay = self._t.relays.pop(seq, None)
        if relay is not None:
            self._send(relay.requester, [codec.ack(relay.requester_seq, b"")],
                       tagged=relay.tagged)

    def _on_indirect_ping(self, seq: int, target: str, target_addr: Addr, want_nack: bool,
                          source: str, requester: Addr, now: float, tagged: bool) -> None:
        own_seq = self._next_seq()
        timeout = self.config.probe_timeout
        self._t.relays[own_seq] = _Relay(requester, seq,
                                         now + timeout * 0.8 if want_nack else None,
                                         now + timeout,
                                         tagged or self._reads_mesh(source, requester))
        self._send(target_addr, [codec.ping(own_seq, target, self.name)],
                   tagged=self._reads_mesh(target, target_addr))

    # --- membership updates ------------------------------------------------------------------

    def _on_alive(self, inc: int, name: str, addr: Addr, meta_raw: bytes, now: float,
                  rebroadcast: bool = True) -> None:
        m = self._members.get(name)
        is_local = name == self.name
        if m is not None and m.addr != addr:
            reclaim = (not m.live
                       and now - m.status_since >= self.config.dead_node_reclaim_time)
            if not reclaim or is_local:
                self.stats.conflicts += 1
                self._emit(EventKind.CONFLICT, m, now,
                           f"{name} claimed by {addr[0]}:{addr[1]}, known at "
                           f"{m.addr[0]}:{m.addr[1]}")
                return
        elif m is not None:
            if is_local:
                if inc < m.incarnation or self._leaving:
                    return
                if inc == m.incarnation and meta_raw == m.meta_raw:
                    return
                # Someone spread an alive for us that is not ours (an old life of ours).
                self._refute(inc, now)
                return
            if inc <= m.incarnation:
                return
        if m is not None and meta_raw == m.meta_raw:
            meta = m.meta
        else:
            try:
                meta = NodeMeta.decode(meta_raw)
            except MetaError:
                self.stats.drop("meta")
                return
            if self._foreign(meta):
                self.stats.drop("other_mesh")
                self._refuse(Member(name, addr, inc, Status.ALIVE, meta, meta_raw, now), now)
                return
        if m is None:
            new = Member(name, addr, inc, Status.ALIVE, meta, meta_raw, now)
            self._set_member(new)
            # Insert at a random position so new members are probed within a round.
            self._nodes.insert(self._rng.randint(self._probe_index, len(self._nodes)), name)
            self._emit(EventKind.JOIN, new, now)
        else:
            old_status = m.status
            changed = old_status != Status.ALIVE
            new = replace(m, addr=addr, incarnation=inc, status=Status.ALIVE, meta=meta,
                          meta_raw=meta_raw, status_since=now if changed else m.status_since)
            self._set_member(new)
            if self._suspicions.pop(name, None) is not None:
                self.stats.suspicions_refuted += 1
            if old_status in (Status.DEAD, Status.LEFT):
                if name not in self._nodes:
                    self._nodes.insert(self._rng.randint(self._probe_index, len(self._nodes)),
                                       name)
                self._emit(EventKind.JOIN, new, now)
            elif old_status == Status.SUSPECT:
                self._emit(EventKind.ALIVE, new, now)
            if meta_raw != m.meta_raw:
                self._emit(EventKind.UPDATE, new, now)
        if rebroadcast:
            self._queue_alive(new)

    def _on_suspect(self, inc: int, name: str, from_node: str, now: float) -> None:
        m = self._members.get(name)
        if m is None or inc < m.incarnation:
            return
        susp = self._suspicions.get(name)
        if susp is not None and inc == m.incarnation:
            if susp.confirm(from_node, now):
                self._broadcasts.queue("m:" + name, codec.suspect(inc, name, from_node))
            return
        # A suspicion at a higher incarnation than ours means the member refuted ours (we
        # missed its alive) and is suspected afresh.  memberlist counts it as a confirmation
        # of the old suspicion, which then expires on the old timer: a member that keeps
        # refuting could be declared dead by whoever missed one refutation.  A new
        # incarnation gets a new timer instead.
        if not m.live:
            return
        if name == self.name:
            if not self._leaving:
                self._refute(inc, now)
            return
        new = replace(m, incarnation=inc, status=Status.SUSPECT, status_since=now)
        self._set_member(new)
        self._broadcasts.queue("m:" + name, codec.suspect(inc, name, from_node))
        n = self._n_live
        k = self.config.suspicion_mult - 2
        if n - 2 < k:
            k = 0
        min_t = suspicion_timeout(self.config.suspicion_mult, n, self.config.probe_interval)
        max_t = self.config.suspicion_max_timeout_mult * min_t
        self._suspicions[name] = Suspicion(from_node, k, min_t, max_t, now)
        self._emit(EventKind.SUSPECT, new, now, f"suspected by {from_node}")

    def _suspicion_expired(self, name: str, now: float) -> None:
        self._suspicions.pop(name, None)
        m = self._members.get(name)
        if m is None or m.status != Status.SUSPECT:
            return
        self._on_dead(m.incarnation, name, self.name, now)

    def _on_dead(self, inc: int, name: str, from_node: str, now: float) -> None:
        m = self._members.get(name)
        if m is None or inc < m.incarnation:
            return
        self._suspicions.pop(name, None)
        if not m.live:
            if m.status == Status.DEAD and from_node == name != self.name:
                # The member's own leave reached us after we declared it dead: it left.
                new = replace(m, incarnation=inc, status=Status.LEFT, status_since=now)
                self._set_member(new)
                self._broadcasts.queue("m:" + name, codec.dead(inc, name, name))
                self._emit(EventKind.LEFT, new, now, "left (was recorded dead)")
            return
        if name == self.name:
            if not self._leaving:
                self._refute(inc, now)
            return
        status = Status.LEFT if from_node == name else Status.DEAD
        new = replace(m, incarnation=inc, status=status, status_since=now)
        self._set_member(new)
        self._broadcasts.queue("m:" + name, codec.dead(inc, name, from_node))
        self._emit(EventKind.LEFT if status == Status.LEFT else EventKind.FAILED, new, now,
                   "" if status == Status.LEFT else f"declared dead by {from_node}")

    def _refute(self, accused_inc: int, now: float) -> None:
        """Someone thinks we are suspect/dead (or spread an old alive of ours): outbid it."""
        me = self.local
        # u64 on the wire: at the very top we cannot outbid, but must not crash either.
        me = replace(me, incarnation=min(max(me.incarnation, accused_inc) + 1, codec.MAX_U64))
        self._set_member(me)
        self._queue_alive(me)
        self.awareness.apply_delta(1)
        self.stats.refutations += 1
        self._emit(EventKind.REFUTE, me, now, f"refuted incarnation {accused_inc}")

    def _own_version_seen(self, version: int, now: float) -> None:
        cur = self._states.get(self.name)
        if cur is None:
            # Not published yet in this life: remember where the old life got to.
            self._own_state_seen = max(self._own_state_seen, version)
        elif version > cur.version:
            # An older life of ours published further: continue past it.
            self._states[self.name] = _NodeState(version, cur.blob)
            self.publish_state(cur.blob, now)

    def _on_state(self, name: str, version: int, blob: bytes, now: float) -> None:
        if name == self.name:
            self._own_version_seen(version, now)
            return
        if name not in self._members or len(blob) > self.config.max_state_bytes:
            return
        cur = self._states.get(name)
        if cur is not None and version <= cur.version:
            return
        self._states[name] = _NodeState(version, blob)
        delta = self._deltas.get(name)
        if delta is not None and delta.version <= version:
            del self._deltas[name]
            delta = None
        if len(blob) <= self.config.max_state_delta_bytes:
            self._broadcasts.queue("s:" + name, codec.state(name, version, blob))
        elif delta is None:
            self._broadcasts.drop("s:" + name)
        self._emit(EventKind.STATE, self._members[name], now, f"version {version}", state=blob,
                   delta=delta.blob if delta is not None else None)

    def _on_state_delta(self, name: str, version: int, delta: bytes, now: float) -> None:
        if name == self.name:
            self._own_version_seen(version, now)
            return
        if name not in self._members or len(delta) > self.config.max_state_delta_bytes:
            return
        cur, seen = self._states.get(name), self._deltas.get(name)
        if (cur is not None and version <= cur.version) or (
                seen is not None and version <= seen.version):
            return
        self._deltas[name] = _NodeState(version, delta)
        self._broadcasts.queue("s:" + name, codec.state_delta(name, version, delta))
        self._emit(EventKind.DELTA, self._members[name], now, f"version {version}",
                   state=cur.blob if cur is not None else None, delta=delta)

    # --- push-pull -------------------------------------------------------------------------

    def _push_pull(self, now: float) -> None:
        interval = push_pull_scale(self.config.push_pull_interval, self._n_live)
        self._t.push_pull = now + interval
        payload: bytes | None = None
        peers = self._random_members(1, lambda m: m.status == Status.ALIVE)
        if peers:
            payload = self._encode_stream(False)
            self._streams.append(StreamRequest(peers[0].addr, payload, False))
            self.stats.push_pull_started += 1
        # Reconnect (Serf's ``reconnect``): also push-pull with a random *dead* member, with
        # probability dead/live.  Without it nothing ever crosses a healed partition once each
        # side has declared the other dead: probes and push-pull only go to live members and
        # gossip to the dead stops after ``gossip_to_the_dead_time``.  A truly dead member just
        # costs one failed stream; a live one learns it was declared dead (our table says so),
        # refutes, and the exchange starts the refutations that merge both sides.
        dead = [n for n in self._not_live if self._members[n].status == Status.DEAD]
        if dead and self._rng.random() < len(dead) / max(1, self._n_live):
            dead.sort()
            target = self._members[dead[int(self._rng.random() * len(dead))]]
            if payload is None:
                payload = self._encode_stream(False)
            self._streams.append(StreamRequest(target.addr, payload, False))
            self.stats.push_pull_started += 1

    def _encode_stream(self, join: bool) -> bytes:
        nodes = [[m.name, m.addr[0], m.addr[1], m.incarnation, int(m.status), m.meta_raw]
                 for m in self._members.values()]
        states = [[n, s.version, s.blob] for n, s in self._states.items()]
        return codec.encode_stream(self.name, join, nodes, states, self.keyring)

    def _foreign(self, meta: NodeMeta) -> bool:
        """A node of another mesh: both name one, and they differ (a node that names none is
        of a build before mesh ids, or of a CA without one)."""
        return bool(self.mesh and meta.mesh and meta.mesh != self.mesh)

    def _stream_from_other_mesh(self, source: str, nodes: list[codec.NodeRecord],
                                now: float) -> bool:
        """Whether a push-pull's own record says its sender is of another mesh (then it gets
        nothing of ours, and nothing of its is merged)."""
        for name, host, port, inc, _status, meta_raw in nodes:
            if name == source:
                try:
                    meta = NodeMeta.decode(meta_raw)
                except MetaError:
                    return False
                if not self._foreign(meta):
                    return False
                self._refuse(Member(name, (host, port), inc, Status.ALIVE, meta, meta_raw, now),
                             now)
                return True
        return False

    def _refuse(self, m: Member, now: float, detail: str = "") -> None:
        """Report a node of another mesh, once per name (``detail`` defaults to the mesh its
        metadata names)."""
        if m.meta.mesh:
            if len(self._other_meshes) >= MAX_REFUSED_NAMES:
                self._other_meshes.clear()
            self._other_meshes[codec.mesh_digest(m.meta.mesh)] = m.meta.mesh
        if m.name in self._refused:
            return
        if len(self._refused) >= MAX_REFUSED_NAMES:
            self._refused.clear()
        self._refused.add(m.name)
        self._emit(EventKind.OTHER_MESH, m, now,
                   detail or f"of mesh {m.meta.mesh}; this is mesh {self.mesh}")

    def _refuse_datagram(self, digest: bytes, msgs: list[list[Any]], addr: Addr,
                         now: float) -> None:
        """Report a datagram whose mesh message names another mesh, once per sender: the
        node its ping names, else its address (a datagram need not name its sender)."""
        source = next((m[3] if m[0] == codec.PING else m[6] for m in msgs
                       if m[0] in (codec.PING, codec.INDIRECT_PING)), "")
        where = f"{addr[0]}:{addr[1]}"
        known = self._other_meshes.get(digest)
        theirs = f"mesh {known}" if known else f"another mesh (digest {digest.hex()})"
        self._refuse(Member(source or where, addr, 0, Status.ALIVE, status_since=now), now,
                     f"a datagram from {where} is of {theirs}; this is mesh {self.mesh}")

    def _set_mesh(self, mesh: str) -> None:
        self.mesh = mesh
        self._mesh_digest = codec.mesh_digest(mesh) if mesh else b""
        self._mesh_msg = codec.mesh(self._mesh_digest) if mesh else b""

    def _reads_mesh(self, name: str, addr: Addr) -> bool:
        """Whether the member ``name``, at ``addr``, reads the mesh message (its metadata
        carries the mesh tag); unknown names and moved addresses do not."""
        m = self._members.get(name)
        return m is not None and m.addr == addr and bool(m.meta.mesh)

    def _merge_remote(self, source: str, nodes: list[codec.NodeRecord],
                      states: list[codec.StateRecord], now: float) -> None:
        for name, host, port, inc, status, meta_raw in nodes:
            if status == Status.ALIVE:
                self._on_alive(inc, name, (host, port), meta_raw, now)
            elif status == Status.LEFT:
                self._on_dead(inc, name, name, now)
            else:
                # A remote "dead" may be stale or wrong; suspect first and let the node refute.
                if name not in self._members and status == Status.DEAD:
                    continue
                self._on_suspect(inc, name, source, now)
        for name, version, blob in states:
            self._on_state(name, version, blob, now)

    # --- gossip ----------------------------------------------------------------------------

    def _gossip(self, now: float) -> None:
        if not len(self._broadcasts):
            return
        dead_window = self.config.gossip_to_the_dead_time
        targets = self._random_members(
            self.config.gossip_nodes,
            lambda m: m.live or (m.status == Status.DEAD and now - m.status_since <= dead_window))
        for target in targets:
            if not self._send(target.addr, [], need_broadcasts=True,
                              tagged=bool(target.meta.mesh)):
                return
            self.stats.gossip_sent += 1

    def _random_members(self, k: int, accept: Any) -> list[Member]:
        """Up to ``k`` distinct random members (not us) passing ``accept``, sampled from the
        shuffled node list without scanning it, as memberlist's ``kRandomNodes``."""
        nodes = self._nodes
        n = len(nodes)
        out: list[Member] = []
        seen: set[str] = set()
        rand = self._rng.random
        for _ in range(3 * n):
            if len(out) >= k:
                break
            name = nodes[int(rand() * n)]
            if name == self.name or name in seen:
                continue
            seen.add(name)
            m = self._members.get(name)
            if m is not None and accept(m):
                out.append(m)
        return out

    # --- sending ---------------------------------------------------------------------------

    def _send(self, addr: Addr, msgs: list[bytes], need_broadcasts: bool = False,
              piggyback: bool = True, tagged: bool = False) -> bool:
        """Queue one packet of ``msgs`` plus as many piggybacked broadcasts as fit; with
        ``tagged`` (the peer reads it), our mesh message first, charged to the budget."""
        if tagged and self._mesh_msg:
            msgs = [self._mesh_msg, *msgs]
        budget = self.config.packet_size - _PACKET_OVERHEAD
        for m in msgs:
            budget -= len(m)
        extra = self._broadcasts.get(budget, self._retransmit_limit()) \
            if self._broadcasts and piggyback else []
        if need_broadcasts and not extra:
            return False
        packet = codec.seal(codec.compound(msgs + extra if extra else msgs), self.keyring)
        self._out.append((packet, addr))
        self.stats.packets_sent += 1
        self.stats.bytes_sent += len(packet)
        return True

    def _retransmit_limit(self) -> int:
        n = self._n_live
        if n != self._limit_n:
            self._limit_n = n
            self._limit = retransmit_limit(self.config.retransmit_mult, n)
        return self._limit

    def _queue_alive(self, m: Member) -> None:
        host, port = m.addr
        self._broadcasts.queue("m:" + m.name,
                               codec.alive(m.incarnation, m.name, host, port, m.meta_raw))

    # --- bookkeeping -----------------------------------------------------------------------

    def _set_member(self, m: Member) -> None:
        old = self._members.get(m.name)
        self._members[m.name] = m
        self._n_live += int(m.live) - (int(old.live) if old is not None else 0)
        if m.live:
            self._not_live.discard(m.name)
        else:
            self._not_live.add(m.name)

    def _reap(self, now: float) -> None:
        limit = self.config.reap_time
        if not self._not_live:
            return
        gone = sorted(n for n in self._not_live
                      if n != self.name and now - self._members[n].status_since > limit)
        for name in gone:
            del self._members[name]
            self._not_live.discard(name)
            self._states.pop(name, None)
            self._deltas.pop(name, None)
            self._emit(EventKind.REAP, Member(name, ("", 0), 0, Status.DEAD), now)
        if gone:
            gone_set = set(gone)
            # Keep the probe walk where it was: only the already-probed prefix shifts.
            self._probe_index -= sum(1 for n in self._nodes[:self._probe_index] if n in gone_set)
            self._nodes = [n for n in self._nodes if n not in gone_set]

    def _emit(self, kind: EventKind, member: Member, now: float, detail: str = "",
              state: bytes | None = None, delta: bytes | None = None) -> None:
        self._events.append(MemberEvent(kind, member, now, detail, state, delta))
