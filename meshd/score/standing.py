"""Standing queues: overload told apart from a passing burst, so admission sheds the one and
rides out the other.

A replica that pauses, or a burst of arrivals, queues requests for a moment; the queue
drains by itself, and shedding then would refuse work the fleet can do.  Load beyond the
fleet's capacity queues requests that never drain: each waits longer than the last, clients
give up while their requests still hold the replicas, and once the overload ends the queue
takes many seconds to drain (``bench/routing``'s overload section measured the router's p50
at 2.4 s for the 20 s after 10 s at 150% load, while it admitted everything its adaptive
limits let through).  CoDel (Nichols and Jacobson, "Controlling Queue Delay", 2012) tells
the two apart by time: a queue is *standing* when the wait has stayed above a target for a
whole interval.  Then requests that would wait longer than the target are shed, those that
would not are admitted, so the queue is held near the target rather than at the clients'
deadlines; shedding ends once the wait has stayed at or below the target for an interval.

The wait is the shortest predicted queue among the targets a request was ranked (what it
would wait wherever it went): one replica buried under a strategy's picks is not an overload
of the fleet.  One detector per model and router: each router sees the replicas'
queue gauges, so routers sharing replicas shed alike.

Pure: ``now`` is an argument; the state is three numbers.
"""

from __future__ import annotations

INTERVAL = 1.0
"""Seconds the wait must stay above the target before shedding starts (and at or below it
before shedding ends).  Longer than a replica's pause or a Poisson burst at high load (the
routing bench's 250 ms pauses at 80% load never last it), short enough that an overload
is cut within about a second."""

SERVICES = 4.0
"""The target is at least this many of the request's own service times: a model whose
requests take seconds may queue a few of them without being overloaded."""


class StandingQueue:
    """One model's standing-queue state."""

    __slots__ = ("above_since", "below_since", "shedding")

    def __init__(self) -> None:
        self.above_since = -1.0
        """When the wait last went above the target (-1: it is at or below it)."""
        self.below_since = -1.0
        """While shedding, when the wait last went at or below the target (-1: above)."""
        self.shedding = False

    def shed(self, wait: float, target: float, now: float) -> bool:
        """Whether a request that would wait ``wait`` seconds is shed, the target being
        ``target`` seconds (0: never)."""
        if wait > target > 0.0:
            self.below_since = -1.0
            if self.above_since < 0.0:
                self.above_since = now
            if self.shedding or now - self.above_since >= INTERVAL:
                self.shedding = True
                return True
            return False
        self.above_since = -1.0
        if self.shedding:
            if self.below_since < 0.0:
                self.below_since = now
            elif now - self.below_since >= INTERVAL:
                self.shedding = False
        return False
