"""An agent's fused view of the cluster: every node's telemetry with the age of each figure,
this agent's own observations of the replicas it sends to, and the policy flags in force.

Remote state arrives by two paths: gossip (every member, seconds old) and subscription streams
(chosen peers, one poll old).  Both carry the publisher's ``(epoch, seq)``; the newest wins
whichever path brought it, so a slow gossip copy never overwrites a fresher pushed one.
Ages are computed when asked, from the local clock: a figure that stops being refreshed
visibly grows old instead of silently staying "current".  Pure: time is an argument.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from adapters.model import ReplicaState
from meshd.signals.wire import NodeSignals

OUTCOME_EWMA = 0.2
"""Weight of one observed outcome in a target's latency average."""
CHANGE_LOG = 1024
"""Node changes remembered for :meth:`FusedState.changed_since` (a reader further behind
rebuilds from scratch)."""


@dataclass(slots=True)
class NodeEntry:
    signals: NodeSignals
    via: str
    """``local``, ``gossip`` or ``stream``."""
    received: float


@dataclass(slots=True)
class Observed:
    """What this agent saw of one replica: requests in flight from here, outcome latency."""

    inflight: int = 0
    latency_ewma: float | None = None
    outcomes: int = 0
    failures: int = 0
    at: float = 0.0


@dataclass(slots=True)
class FusedReplica:
    node: str
    state: ReplicaState
    flags: list[str]
    ages: dict[str, float]
    """Seconds since each figure group (``ready``, ``queue``, ``stats``) was measured."""
    via: str
    observed: Observed = field(default_factory=Observed)


class FusedState:
    def __init__(self, node: str, flags_of: Callable[[str], list[str]] = lambda n: []) -> None:
        self.node = node
        self.flags_of = flags_of
        self.nodes: dict[str, NodeEntry] = {}
        self.observed: dict[str, Observed] = {}
        self.stale_drops = 0
        """Updates ignored because a newer copy (by the other path) was already here."""
        self.generation = 0
        """Counts changes to ``nodes``: readers that cache what they derive (the scorer's
        target table) rebuild when it moves."""
        self._log: deque[str] = deque(maxlen=CHANGE_LOG)
        """The node each of the last generations changed (the newest last)."""

    def update(self, node: str, sig: NodeSignals, via: str, now: float) -> bool:
        """Take ``sig`` unless what we hold from ``node`` is newer; True when taken."""
        cur = self.nodes.get(node)
        if cur is not None and cur.signals.epoch == sig.epoch and cur.signals.seq >= sig.seq:
            if cur.signals.seq > sig.seq:
                self.stale_drops += 1
            return False
        self.nodes[node] = NodeEntry(sig, via, now)
        self.generation += 1
        self._log.append(node)
        return True

    def forget(self, node: str) -> None:
        if self.nodes.pop(node, None) is not None:
            self.generation += 1
            self._log.append(node)

    def changed_since(self, generation: int) -> set[str] | None:
        """The nodes whose entry changed after ``generation`` (None: too long ago to say), so
        that a reader can patch what it derived instead of deriving it again."""
        behind = self.generation - generation
        if behind < 0 or behind > len(self._log):
            return None
        log = self._log
        return {log[-i] for i in range(1, behind + 1)}

    def observe_start(self, replica: str, now: float) -> None:
        ob = self.observed.get(replica)
        if ob is None:
            ob = self.observed[replica] = Observed()
        ob.inflight += 1
        ob.at = now

    def observe_end(self, replica: str) -> None:
        """A request counted in flight ended without an outcome worth learning from (its
        decision expired, or it was cancelled)."""
        ob = self.observed.get(replica)
        if ob is not None and ob.inflight > 0:
            ob.inflight -= 1

    def observe_outcome(self, replica: str, latency: float, ok: bool, now: float,
                        started: bool = True) -> None:
        """A request this agent routed finished; ``started`` when it was counted in flight."""
        ob = self.observed.get(replica)
        if ob is None:
            ob = self.observed[replica] = Observed()
        if started and ob.inflight > 0:
            ob.inflight -= 1
        ob.outcomes += 1
        ob.at = now
        if not ok:
            ob.failures += 1
            return
        if math.isfinite(latency) and latency >= 0:
            ob.latency_ewma = latency if ob.latency_ewma is None else (
                ob.latency_ewma + OUTCOME_EWMA * (latency - ob.latency_ewma))

    def replicas(self, now: float, model: str | None = None) -> list[FusedReplica]:
        out = []
        for name, entry in sorted(self.nodes.items()):
            flags = self.flags_of(name)
            for rep in entry.signals.replicas:
                if model is not None and rep.model != model:
                    continue
                ages = {g: max(0.0, now - at) for g, at in rep.at.items()}
                out.append(FusedReplica(name, rep, flags, ages, entry.via,
                                        self.observed.get(rep.key, Observed())))
        return out
