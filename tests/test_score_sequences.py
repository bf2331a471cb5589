"""``meshd.score.sequences``: rendezvous order and the sequence table, and the scorer's sequence
path over a simulated fleet (no processes)."""

from __future__ import annotations

import random

from meshd.score.sequences import SequenceTable, rendezvous, sequence_key


def test_rendezvous_is_the_same_whatever_the_order_routers_see_replicas_in() -> None:
    replicas = [f"10.0.0.{i}:8001/m/1" for i in range(8)]
    for n in range(200):
        key = sequence_key("m", "", n)
        shuffled = random.Random(n).sample(replicas, len(replicas))
        assert rendezvous(key, replicas, str) == rendezvous(key, shuffled, str)


def test_a_replica_joining_moves_only_the_sequences_it_wins() -> None:
    before = [f"r{i}" for i in range(4)]
    after = before + ["r4"]
    moved = 0
    for n in range(2000):
        key = sequence_key("m", "1", f"s{n}")
        old, new = rendezvous(key, before, str)[0], rendezvous(key, after, str)[0]
        if old != new:
            assert new == "r4"
            moved += 1
    assert 300 < moved < 500  # about a fifth


def test_sequences_spread_evenly() -> None:
    replicas = ["a", "b", "c"]
    counts = {r: 0 for r in replicas}
    for n in range(3000):
        counts[rendezvous(sequence_key("m", "", n), replicas, str)[0]] += 1
    assert all(800 < c < 1200 for c in counts.values()), counts


def test_integer_and_string_ids_are_different_sequences() -> None:
    assert sequence_key("m", "", 5) != sequence_key("m", "", "5")


def test_table_forgets_idle_and_least_recently_used_records() -> None:
    table = SequenceTable(idle=10.0, capacity=2)
    table.put("a", "ra", "n1", "e1", 0.0)
    table.put("b", "rb", "n1", "e1", 1.0)
    assert table.get("a", 5.0) is not None  # a is now the most recent
    table.put("c", "rc", "n2", "e2", 6.0)
    assert table.get("b", 6.0) is None and table.evicted == 1
    assert table.get("a", 16.0) is None  # idle since 5
    rec = table.get("c", 15.0)
    assert rec is not None and rec.node == "n2"
    table.end("c")
    assert len(table) == 0
    table.put("d", "rd", "n", "e", 0.0)
    table.sweep(11.0)
    assert len(table) == 0
