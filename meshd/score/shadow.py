"""Shadow mode: rank each request with a candidate strategy beside the active one and record
how often, and by how much, their first picks differ.  The candidate's picks are never used.

"By how much" is the difference in predicted seconds between the two picks (the candidate's
minus the active one's): negative means the candidate would have picked a target predicted to
answer sooner.  That is what an operator needs before switching a model's strategy.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

DIFF_BUCKETS = (-0.1, -0.025, -0.01, -0.0025, -0.001, 0.0, 0.001, 0.0025, 0.01, 0.025, 0.1)
"""Upper bounds (seconds) of the histogram of predicted-seconds differences."""


@dataclass(slots=True)
class ShadowStats:
    """One (model, candidate strategy) pair's comparison so far."""

    active: str
    candidate: str
    compared: int = 0
    differed: int = 0
    failed: int = 0
    """Decisions where the candidate raised, returned nothing or ran over the budget."""
    diff_sum: float = 0.0
    buckets: list[int] = field(default_factory=lambda: [0] * (len(DIFF_BUCKETS) + 1))

    def record(self, differs: bool, diff: float) -> None:
        self.compared += 1
        if not differs:
            return
        self.differed += 1
        self.diff_sum += diff
        self.buckets[bisect.bisect_left(DIFF_BUCKETS, diff)] += 1

    @property
    def differ_ratio(self) -> float:
        return self.differed / self.compared if self.compared else 0.0
