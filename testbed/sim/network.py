"""A deterministic discrete-event network for driving many ``gossip.Swim`` cores in one process.

Virtual clock, seeded randomness, per-packet latency and loss, partitions, crashed nodes and
stalled nodes (a stalled node is a SIGSTOPped process: its timers do not fire and packets sent to
it wait in its socket buffer until it resumes; on resume it reads that backlog before its timers
run), graceful leaves, and callbacks at a virtual time (``at``) to script faults.  Push-pull
streams are modelled as a request and a reply each crossing the network once, failing after
``tcp_timeout`` when the peer is down.  ``SimNode.bytes_sent`` counts every datagram and both
directions of push-pull (each side its own payload).
"""

from __future__ import annotations

import heapq
import itertools
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from gossip.config import Config
from gossip.events import MemberEvent
from gossip.protocol import StreamRequest, Swim
from gossip.state import Addr, Member, NodeMeta, Status

EventSink = Callable[[str, MemberEvent], None]

STARVE_PHASES = ((0.3, 1.0, 20.0), (1.5, 2.5, 15.0))
"""The CPU-starved node of ``tests/test_integration.py`` (and of the simulator's test and
``bench/gossip_refute.py``), as ``(stop seconds, period seconds, phase seconds)``.  The first
phase is the brief's: 0.3 s of every 1 s.  Stalls shorter than the probe interval (1 s) delay
acks but never fail a probe, so it raises no suspicion at all; the second phase stalls longer
than a probe round, so the node is suspected and must refute (Lifeguard's dynamic suspicion
timeout gives it the time)."""


@dataclass(slots=True)
class SimNode:
    name: str
    addr: Addr
    swim: Swim
    up: bool = True
    stalled_until: float = 0.0
    recv_delay: float = 0.0
    """Extra delay before this node handles a packet (a CPU-starved receive path)."""
    timer_at: float = float("inf")
    buffered: list[tuple[str, Any]] = field(default_factory=list)
    bytes_sent: int = 0


class SimNetwork:
    """Many protocol cores on one virtual network."""

    def __init__(self, config: Config, *, seed: int = 0, loss: float = 0.0,
                 latency: tuple[float, float] = (0.0005, 0.002),
                 on_event: EventSink | None = None) -> None:
        self.config = config
        self.rng = random.Random(seed)
        self.loss = loss
        self.latency = latency
        self.now = 0.0
        self.nodes: dict[str, SimNode] = {}
        self.by_addr: dict[Addr, SimNode] = {}
        self.on_event = on_event
        self._heap: list[tuple[float, int, str, str, Any]] = []
        self._seq = itertools.count()
        self._partition: dict[str, int] | None = None
        self.packets_delivered = 0
        self.packets_lost = 0

    # --- building ----------------------------------------------------------------------------

    def add_node(self, name: str, *, meta: NodeMeta | None = None, join: Iterable[str] = (),
                 config: Config | None = None, node_name: str | None = None,
                 addr: Addr | None = None) -> SimNode:
        """Start a node called ``name`` in the simulation (and ``join`` it through seeds).

        ``node_name`` and ``addr`` override the protocol name and the address (by default both
        come from ``name``); with them a second node can claim an existing member's name.
        """
        addr = addr or (name, 7946)
        if addr in self.by_addr:
            raise ValueError(f"address {addr} is taken")
        swim = Swim(config or self.config, node_name or name, addr, meta, now=self.now,
                    rng=random.Random(self.rng.random()))
        node = SimNode(name, addr, swim)
        self.nodes[name] = node
        self.by_addr[addr] = node
        seeds = [self.nodes[s].addr for s in join]
        if seeds:
            swim.join(seeds)
        self._after(node)
        return node

    def add_cluster(self, n: int, prefix: str = "n", config: Config | None = None) -> list[str]:
        """``n`` nodes that already know each other (as after a converged join)."""
        names = [f"{prefix}{i}" for i in range(n)]
        cfg = config or self.config
        records: dict[str, Member] = {}
        for name in names:
            meta = NodeMeta()
            records[name] = Member(name, (name, 7946), 0, Status.ALIVE, meta, meta.encode(),
                                   self.now)
        for name in names:
            swim = Swim(cfg, name, (name, 7946), None, now=self.now,
                        rng=random.Random(self.rng.random()))
            swim.restore(records, names, now=self.now)
            node = SimNode(name, (name, 7946), swim)
            self.nodes[name] = node
            self.by_addr[node.addr] = node
            # Drop our own startup alive: everybody already knows us.
            swim._broadcasts.clear()
            self._after(node)
        return names

    # --- faults ------------------------------------------------------------------------------

    def kill(self, name: str) -> None:
        self.nodes[name].up = False

    def leave(self, name: str) -> None:
        """Graceful leave: announce it, keep running ``leave_propagate_delay``, then stop."""
        node = self.nodes[name]
        node.swim.leave(self.now)
        self._after(node)
        self._push(self.now + node.swim.config.leave_propagate_delay, "shutdown", name, None)

    def at(self, t: float, fn: Callable[[], None]) -> None:
        """Call ``fn()`` when the virtual clock reaches ``t`` (e.g. to inject a fault)."""
        self._push(max(t, self.now), "call", "", fn)

    def stall(self, name: str, duration: float) -> None:
        node = self.nodes[name]
        node.stalled_until = max(node.stalled_until, self.now + duration)
        self._push(node.stalled_until, "resume", name, None)

    def stall_in_bursts(self, name: str, phases: Iterable[tuple[float, float, float]]) -> float:
        """Stall ``name`` for ``stop`` s of every ``period`` s, phase after phase, starting now:
        ``phases`` are ``(stop, period, seconds)`` (``tests/test_integration.py``'s
        SIGSTOP/SIGCONT of a starved node).  Returns the virtual time the last phase ends."""
        t = self.now
        for stop, period, seconds in phases:
            end = t + seconds
            while t < end:
                self.at(t, lambda s=stop: self.stall(name, s))
                t += period
        return t

    def slow(self, name: str, recv_delay: float) -> None:
        """Make a node handle every packet ``recv_delay`` late while its timers run on time:
        a CPU-starved process with a receive backlog (Lifeguard's "slow member").  0 ends it."""
        self.nodes[name].recv_delay = recv_delay

    def partition(self, *groups: Iterable[str]) -> None:
        """Split the network: nodes only reach nodes of their own group (others: group -1)."""
        self._partition = {}
        for i, group in enumerate(groups):
            for name in group:
                self._partition[name] = i

    def heal(self) -> None:
        self._partition = None

    # --- running -----------------------------------------------------------------------------

    def run_until(self, t_end: float, stop: Callable[[], bool] | None = None) -> None:
        heap = self._heap
        while heap and heap[0][0] <= t_end:
            t, _, kind, name, payload = heapq.heappop(heap)
            self.now = t
            if kind == "call":
                payload()
                continue
            node = self.nodes.get(name)
            if node is None or not node.up:
                continue
            if kind == "shutdown":
                node.up = False
                continue
            if kind == "resume":
                if self.now >= node.stalled_until:
                    buffered, node.buffered = node.buffered, []
                    for k, p in buffered:
                        self._deliver(node, k, p)
                    node.timer_at = float("inf")
                    self._after(node)
                continue
            if self.now < node.stalled_until:
                if kind != "timer":
                    node.buffered.append((kind, payload))
                continue
            self._deliver(node, kind, payload)
            if stop is not None and stop():
                return
        self.now = max(self.now, t_end)

    def _deliver(self, node: SimNode, kind: str, payload: Any) -> None:
        swim = node.swim
        if kind == "timer":
            if node.timer_at <= self.now:
                node.timer_at = float("inf")
                swim.tick(self.now)
        elif kind == "packet":
            data, src = payload
            self.packets_delivered += 1
            swim.receive(data, src, self.now)
        elif kind == "stream_req":
            req, src_name = payload
            reply = swim.handle_stream(req.payload, self.nodes[src_name].addr, self.now)
            if reply is None:
                self._push(self.now + self._latency(), "stream_fail", src_name, req)
            elif self._reachable(node.name, src_name):
                node.bytes_sent += len(reply)
                self._push(self.now + self._latency(), "stream_reply", src_name, (req, reply))
            else:
                self._push(self.now + self.config.tcp_timeout, "stream_fail", src_name, req)
        elif kind == "stream_reply":
            req, reply = payload
            swim.stream_reply(reply, req, self.now)
        elif kind == "stream_fail":
            swim.stream_failed(payload, self.now)
        self._after(node)

    def _after(self, node: SimNode) -> None:
        """Flush a core's outputs into the network and reschedule its timer."""
        swim = node.swim
        # Hot path (called after every delivery): peek at the core's queues before draining.
        if swim._out:
            by_addr, rand, loss, now, src = self.by_addr, self.rng.random, self.loss, self.now, \
                node.addr
            lo, span = self.latency[0], self.latency[1] - self.latency[0]
            heap, seq = self._heap, self._seq
            for data, dst in swim.datagrams_to_send():
                node.bytes_sent += len(data)
                target = by_addr.get(dst)
                if target is None or (self._partition is not None
                                      and not self._reachable(node.name, target.name)):
                    continue
                if loss and rand() < loss:
                    self.packets_lost += 1
                    continue
                heapq.heappush(heap, (now + (lo + span * rand()) + target.recv_delay, next(seq),
                                      "packet", target.name, (data, src)))
        if swim._streams:
            for req in swim.streams_to_open():
                self._open_stream(node, req)
        if swim._events:
            if self.on_event is not None:
                for ev in swim.events():
                    self.on_event(node.name, ev)
            else:
                swim._events.clear()
        if swim.stats.probe_rtts:
            swim.stats.probe_rtts.clear()
        t = swim.next_timer()
        if t < node.timer_at:
            node.timer_at = t
            self._push(max(t, self.now), "timer", node.name, None)

    def _open_stream(self, node: SimNode, req: StreamRequest) -> None:
        node.bytes_sent += len(req.payload)
        target = self.by_addr.get(req.addr)
        if target is None or not target.up or not self._reachable(node.name, target.name):
            self._push(self.now + self.config.tcp_timeout, "stream_fail", node.name, req)
            return
        self._push(self.now + self._latency(), "stream_req", target.name, (req, node.name))

    def _reachable(self, a: str, b: str) -> bool:
        p = self._partition
        return p is None or p.get(a, -1) == p.get(b, -1)

    def _latency(self) -> float:
        lo, hi = self.latency
        return lo + (hi - lo) * self.rng.random()

    def _push(self, t: float, kind: str, name: str, payload: Any) -> None:
        heapq.heappush(self._heap, (t, next(self._seq), kind, name, payload))

    # --- observing ---------------------------------------------------------------------------

    def view(self, observer: str, member: str) -> Status | None:
        m = self.nodes[observer].swim.member(member)
        return m.status if m else None

    def live_nodes(self) -> list[SimNode]:
        return [n for n in self.nodes.values() if n.up]
