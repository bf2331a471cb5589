"""Lifeguard dynamic suspicion timeout.

A suspicion starts with a long timeout (``max``) and shrinks towards ``min`` as independent
members confirm it, following memberlist's formula: with ``k`` expected confirmations and ``n``
received, the timeout is ``max - log(n + 1) / log(k + 1) * (max - min)``, never below ``min``.
A real failure is confirmed by many peers and declared quickly; a suspicion raised by one sick
node alone waits long enough for the accused to refute it.
"""

from __future__ import annotations

import math


def suspicion_timeout(suspicion_mult: int, n_members: int, probe_interval: float) -> float:
    """The minimum suspicion timeout: ``mult * max(1, log10(N)) * probe_interval``."""
    node_scale = max(1.0, math.log10(max(1, n_members)))
    # memberlist truncates the node scale (not the product) to thousandths, so timers are
    # reproducible and match its values: N=50, mult 3, 1 s -> 3 * 1.698 s = 5.094 s.
    return suspicion_mult * math.floor(node_scale * 1000.0) * probe_interval / 1000.0


def remaining_suspicion_time(n: int, k: int, elapsed: float, min_timeout: float,
                             max_timeout: float) -> float:
    """Time left on a suspicion after ``n`` of ``k`` expected confirmations, ``elapsed`` in."""
    frac = math.log(n + 1.0) / math.log(k + 1.0) if k > 0 else 1.0
    raw = max_timeout - frac * (max_timeout - min_timeout)
    timeout = math.floor(1000.0 * raw) / 1000.0
    return max(timeout, min_timeout) - elapsed


class Suspicion:
    """The timer for one suspected member.

    The owner checks :attr:`deadline` against its clock; :meth:`confirm` moves the deadline
    earlier when a new, independent member also reports the suspicion.
    """

    __slots__ = ("start", "k", "min_timeout", "max_timeout", "confirmers", "deadline")

    def __init__(self, from_node: str, k: int, min_timeout: float, max_timeout: float,
                 now: float) -> None:
        self.start = now
        self.k = k
        self.min_timeout = min_timeout
        self.max_timeout = max_timeout
        # The member that started the suspicion is not a confirmation.
        self.confirmers: set[str] = {from_node}
        # With no confirmations expected there is nothing to wait for beyond the minimum.
        timeout = max_timeout if k >= 1 else min_timeout
        self.deadline = now + timeout

    @property
    def confirmations(self) -> int:
        return len(self.confirmers) - 1

    def confirm(self, from_node: str, now: float) -> bool:
        """Record an independent confirmation; True when it was new and moved the deadline."""
        if self.confirmations >= self.k or from_node in self.confirmers:
            return False
        self.confirmers.add(from_node)
        elapsed = now - self.start
        remaining = remaining_suspicion_time(self.confirmations, self.k, elapsed,
                                             self.min_timeout, self.max_timeout)
        self.deadline = now + max(remaining, 0.0)
        return True
