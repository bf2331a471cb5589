"""The garbage collector of a serving process (an agent, a router worker), settled once it
has started.

CPython collects its youngest generation every 700 net allocations of container objects.
A router holds a few dozen such objects per request in flight (its decision, the request's
coroutines and headers), and at that rate each young pass walks the live ones of every
request in flight and finds nothing to free: measured at concurrency 16 over HTTP, the
collector took 5-10 us of the router's ~250 us per request, against none in a bare proxy
(``bench/router_overhead``; its "GC" figures).  Nearly everything a request allocates is
freed by reference counting the moment it ends; the collector is there for cycles, which
the request path does not make.  So the young generation is collected less often, and what
startup built - modules, tables, the gossip state - is frozen out of the full passes, which
otherwise walk all of it and hold the loop for tens of milliseconds each time.
"""

from __future__ import annotations

import gc

YOUNG_THRESHOLD = 20_000
"""Net container allocations between young collections (CPython's default: 700).  Cyclic
garbage waits a little longer; a pass still walks only what is young and alive, about what
the requests in flight hold, so a pass costs what it did, 28 times less often."""


def settle() -> None:
    """Collect what startup left, freeze the rest, and collect the young generation every
    :data:`YOUNG_THRESHOLD` allocations (the older generations' thresholds as they were)."""
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(YOUNG_THRESHOLD, middle, old)
