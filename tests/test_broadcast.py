"""Transmit-limited broadcast queue (memberlist's TransmitLimitedQueue and retransmitLimit)."""

import pytest

from gossip.broadcast import BroadcastQueue, retransmit_limit


@pytest.mark.parametrize(("mult", "n", "expected"), [
    # memberlist util_test.go TestRetransmitLimit (mult 3), except that below 10 members the
    # node scale is 2, not 1 (memberlist: (3, 1) -> 3).
    (3, 0, 0), (3, 1, 6), (3, 99, 6),
    # LAN default (mult 4): 4 * max(2, ceil(log10(N + 1))).
    (4, 0, 0), (4, 1, 8), (4, 8, 8), (4, 9, 8), (4, 10, 8), (4, 99, 8), (4, 100, 12),
    (4, 999, 12), (4, 1000, 16), (4, 9999, 16), (4, 10_000, 20),
    # local profile (mult 2).
    (2, 5, 4), (2, 50, 4),
])
def test_retransmit_limit(mult: int, n: int, expected: int) -> None:
    assert retransmit_limit(mult, n) == expected


def _payloads(q: BroadcastQueue, budget: int = 10_000, limit: int = 100,
              overhead: int = 0) -> list[bytes]:
    return q.get(budget, limit, overhead)


def test_empty_queue_and_zero_budget() -> None:
    q = BroadcastQueue()
    assert len(q) == 0 and q.get(1000, 3) == []
    q.queue("a", b"x")
    assert q.get(0, 3) == [] and q.get(-5, 3) == []
    assert len(q) == 1  # nothing was handed out, nothing was counted


def test_newest_first_among_equally_sent() -> None:
    q = BroadcastQueue()
    for key in "abc":
        q.queue(key, key.encode())
    assert _payloads(q) == [b"c", b"b", b"a"]


def test_least_transmitted_first_then_newest() -> None:
    q = BroadcastQueue()
    q.queue("a", b"a")
    q.queue("b", b"b")
    assert _payloads(q) == [b"b", b"a"]  # both sent once
    q.queue("c", b"c")                   # never sent: goes first
    assert _payloads(q) == [b"c", b"b", b"a"]
    q.queue("d", b"d")
    # d: 0 sends, c: 1, b and a: 2 (b newer).
    assert _payloads(q) == [b"d", b"c", b"b", b"a"]


def test_same_key_supersedes_and_resets_transmits() -> None:
    q = BroadcastQueue()
    q.queue("m:x", b"suspect")
    q.queue("m:y", b"other")
    assert _payloads(q, limit=3) == [b"other", b"suspect"]
    q.queue("m:x", b"alive")
    assert len(q) == 2 and q.contains("m:x")
    assert _payloads(q, limit=3) == [b"alive", b"other"]
    # The superseded payload never travels again; the new one gets its full limit.
    assert _payloads(q, limit=3) == [b"alive", b"other"]  # other: 3rd send, dropped
    assert not q.contains("m:y")
    assert _payloads(q, limit=3) == [b"alive"]
    assert len(q) == 0


def test_items_dropped_after_limit_sends() -> None:
    q = BroadcastQueue()
    q.queue("a", b"a")
    for _ in range(4):
        assert _payloads(q, limit=4) == [b"a"]
    assert len(q) == 0 and not q.contains("a")
    assert _payloads(q, limit=4) == []


def test_limit_zero_sends_once() -> None:
    # retransmit_limit(mult, 0) == 0: an item is still handed out once, then dropped.
    q = BroadcastQueue()
    q.queue("a", b"a")
    assert _payloads(q, limit=0) == [b"a"]
    assert len(q) == 0


def test_byte_budget_respected_with_overhead() -> None:
    q = BroadcastQueue()
    for key in "abc":
        q.queue(key, bytes(10))
    out = q.get(25, 10, per_item_overhead=2)  # 12 + 12 fits, a third 12 does not
    assert len(out) == 2
    assert sum(len(p) + 2 for p in out) <= 25
    # The one left over goes first next time.
    assert q.get(12, 10, per_item_overhead=2) == [bytes(10)]


def test_too_large_item_is_skipped_but_smaller_ones_still_fit() -> None:
    q = BroadcastQueue()
    q.queue("small", b"s" * 5)
    q.queue("big", b"B" * 100)  # newest, would go first
    assert q.get(50, 10) == [b"s" * 5]
    assert q.contains("big")  # not counted as sent
    assert q.get(200, 10)[0] == b"B" * 100


def test_budget_exactly_filled() -> None:
    q = BroadcastQueue()
    q.queue("a", bytes(4))
    q.queue("b", bytes(6))
    assert sorted(map(len, q.get(10, 5))) == [4, 6]


def test_prune_keeps_bound_and_drops_most_sent_oldest_first() -> None:
    q = BroadcastQueue(max_items=3)
    for key in "abc":
        q.queue(key, key.encode())
    _payloads(q)  # a, b, c sent once each
    q.queue("d", b"d")  # prunes a (most sent, oldest)
    assert len(q) == 3 and not q.contains("a")
    q.queue("e", b"e")  # prunes b
    assert len(q) == 3
    assert [k for k in "abcde" if q.contains(k)] == ["c", "d", "e"]
    assert _payloads(q) == [b"e", b"d", b"c"]


def test_prune_bound_holds_under_many_queues() -> None:
    q = BroadcastQueue(max_items=50)
    for i in range(1000):
        q.queue(f"k{i % 300}", str(i).encode())
        assert len(q) <= 50
        if i % 7 == 0:
            q.get(100, 1000)
    # The newest never-sent items survive.
    assert q.contains("k299") or q.contains(f"k{999 % 300}")


def test_clear() -> None:
    q = BroadcastQueue()
    q.queue("a", b"a")
    q.clear()
    assert len(q) == 0 and q.get(100, 3) == []
