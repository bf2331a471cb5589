"""Transmit-limited broadcast queue (memberlist's ``TransmitLimitedQueue``).

Membership changes are not flooded: each is piggybacked on a bounded number of outgoing
packets, ``retransmit_mult * max(2, ceil(log10(N + 1)))``, which reaches every member with high
probability in O(log N) gossip rounds.  Messages about the same subject (one node's liveness,
one node's state) replace each other, so a stale "suspect" never travels after the "alive" that
refuted it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field


def retransmit_limit(retransmit_mult: int, n_members: int) -> int:
    """How many times one broadcast is sent in a cluster of ``n_members``.

    memberlist's ``mult * ceil(log10(N + 1))``, with the node scale at least 2: up to 9
    members its scale is 1, and at the LAN's 4 sends a member misses a broadcast with a few
    percent probability.  A member that misses a refutation declares a live node dead: with
    one node stopped 1.5 s of every 2.5 s, 1.6-2.7% of simulated runs at 8-9 members did
    (``bench/gossip_refute.py``); with the floor, none.  Small clusters can afford the sends.
    """
    if n_members <= 0:
        return 0
    return retransmit_mult * max(2, math.ceil(math.log10(n_members + 1)))


@dataclass(slots=True)
class _Item:
    key: str
    payload: bytes
    id: int
    transmits: int = 0


@dataclass(slots=True)
class BroadcastQueue:
    """Pending broadcasts, handed out least-sent first, then newest first."""

    max_items: int = 4096
    """Bound on retained broadcasts; the most-sent are dropped first beyond it."""

    _items: dict[str, _Item] = field(default_factory=dict)
    _next_id: int = 0

    def __len__(self) -> int:
        return len(self._items)

    def queue(self, key: str, payload: bytes) -> None:
        """Add a broadcast; one already queued under ``key`` is superseded."""
        self._next_id += 1
        self._items[key] = _Item(key, payload, self._next_id)
        if len(self._items) > self.max_items:
            self._prune()

    def get(self, budget: int, limit: int, per_item_overhead: int = 0) -> list[bytes]:
        """Payloads that fit in ``budget`` bytes; each handed out counts one transmit.

        Items sent ``limit`` times are dropped from the queue.
        """
        if not self._items or budget <= 0:
            return []
        out: list[bytes] = []
        order = sorted(self._items.values(), key=lambda it: (it.transmits, -it.id))
        for item in order:
            cost = len(item.payload) + per_item_overhead
            if cost > budget:
                continue
            budget -= cost
            out.append(item.payload)
            item.transmits += 1
            if item.transmits >= limit:
                del self._items[item.key]
            if budget <= 0:
                break
        return out

    def contains(self, key: str) -> bool:
        return key in self._items

    def drop(self, key: str) -> None:
        """Forget the broadcast queued under ``key`` (one that would now mislead)."""
        self._items.pop(key, None)

    def clear(self) -> None:
        self._items.clear()

    def _prune(self) -> None:
        order = sorted(self._items.values(), key=lambda it: (it.transmits, -it.id))
        for item in order[self.max_items:]:
            del self._items[item.key]
