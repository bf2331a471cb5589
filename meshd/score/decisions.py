"""Open decisions: what an admitted request holds until its router reports how it ended.

A decision holds admission slots (the first target's, the model's, the tenant's) and the
predictions it was made on, so an outcome can correct the target's estimate.  A router that
never reports (it crashed, or it is buggy) must not hold slots forever: every decision expires
at its deadline plus a grace, and the table is bounded, so the oldest go first.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass

from meshd.score.admission import ModelGate, TenantState
from meshd.score.target import TargetStats


@dataclass(slots=True, eq=False)
class Decision:
    id: int
    model: str
    tenant: TenantState
    model_gate: ModelGate
    """The model's gate this decision holds a slot of."""
    first: TargetStats | None
    """The first target's stats, whose admission slot this decision holds (None: Admit)."""
    first_key: str
    predicted: dict[str, tuple[float, float]]
    """Replica key -> (rtt, uncorrected queue + service seconds) when decided: what an
    outcome's latency is compared with to correct the target's estimate."""
    units: int
    started: float
    expires: float
    hedge_key: str = ""
    """The target :meth:`Scorer.hedge_target` sent this decision's hedge to, until its
    outcome is reported (only that report gives back the target's hedge count)."""
    first_open: bool = True
    """The first target's slot is still held."""
    sequence: str = ""
    """The stateful sequence the request belongs to: where it is answered is where the
    sequence lives (:mod:`meshd.score.sequences`)."""
    sequence_end: bool = False


class Decisions:
    """Decision id -> :class:`Decision`, with expiry."""

    def __init__(self, max_open: int, on_expire: Callable[[Decision], None]) -> None:
        self.max_open = max_open
        self.on_expire = on_expire
        self._open: dict[int, Decision] = {}
        self._heap: list[tuple[float, int]] = []
        self._next = 1
        self.expired = 0
        self.due = float("inf")
        """When the earliest decision expires (or an entry of a closed one goes): until then
        :meth:`sweep` has nothing to do, and the hot path need not call it."""

    def __len__(self) -> int:
        return len(self._open)

    def next_id(self) -> int:
        i = self._next
        self._next += 1
        return i

    def open(self, model: str, tenant: TenantState, model_gate: ModelGate,
             first: TargetStats | None, first_key: str,
             predicted: dict[str, tuple[float, float]], units: int, started: float,
             expires: float) -> Decision:
        """A new decision with the next id, added (one call on the scoring path for
        ``Decision(next_id(), ...)`` and :meth:`add`)."""
        i = self._next
        self._next = i + 1
        d = Decision(i, model, tenant, model_gate, first, first_key, predicted, units, started,
                     expires)
        self.add(d)
        return d

    def add(self, d: Decision) -> None:
        self._open[d.id] = d
        heap = self._heap
        heapq.heappush(heap, (d.expires, d.id))
        if d.expires < self.due:
            self.due = d.expires
        if len(self._open) > self.max_open or len(heap) > 2 * len(self._open) + 1024:
            self._bound()

    def _bound(self) -> None:
        """Too many open (the oldest expire) or too many closed ones' heap entries left."""
        if len(self._open) > self.max_open:
            self._expire_oldest()
        else:
            self._compact()

    def _compact(self) -> None:
        """Closed decisions leave their heap entries behind; drop them when they dominate."""
        self._heap = [(d.expires, d.id) for d in self._open.values()]
        heapq.heapify(self._heap)
        self.due = self._heap[0][0] if self._heap else float("inf")

    def get(self, decision_id: int) -> Decision | None:
        return self._open.get(decision_id)

    def close(self, decision_id: int) -> Decision | None:
        """Remove and return the decision (its slots are the caller's to release)."""
        return self._open.pop(decision_id, None)

    def sweep(self, now: float) -> None:
        heap = self._heap
        while heap and heap[0][0] <= now:
            _, did = heapq.heappop(heap)
            d = self._open.pop(did, None)
            if d is not None:
                self.expired += 1
                self.on_expire(d)
        if len(self._heap) > 2 * len(self._open) + 1024:
            self._compact()
        else:
            self.due = self._heap[0][0] if self._heap else float("inf")

    def _expire_oldest(self) -> None:
        while len(self._open) > self.max_open and self._heap:
            _, did = heapq.heappop(self._heap)
            d = self._open.pop(did, None)
            if d is not None:
                self.expired += 1
                self.on_expire(d)
        self.due = self._heap[0][0] if self._heap else float("inf")
