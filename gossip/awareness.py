"""Lifeguard local health awareness.

SWIM assumes the prober is healthy.  When it is not (CPU-starved, its NIC dropping packets) it
misses acks and accuses healthy peers.  Lifeguard keeps a small score of evidence that *we* are
the problem (missed nacks, having to refute suspicions of ourselves) and stretches our probe
interval and timeouts by ``score + 1``, so a sick node slows down instead of spreading false
suspicion.
"""

from __future__ import annotations


class Awareness:
    """A saturating health score in ``[0, max_multiplier - 1]``; 0 is healthy."""

    __slots__ = ("_max", "_score")

    def __init__(self, max_multiplier: int) -> None:
        self._max = max_multiplier
        self._score = 0

    @property
    def score(self) -> int:
        return self._score

    def apply_delta(self, delta: int) -> int:
        """Adjust the score by ``delta`` (clamped) and return the new score."""
        self._score = min(max(self._score + delta, 0), self._max - 1)
        return self._score

    def scale(self, duration: float) -> float:
        """``duration`` stretched by the current health score."""
        return duration * (self._score + 1)
