"""``meshd.score.sequences``: rendezvous order and the sequence table, and the scorer's sequence
path over a simulated fleet (no processes)."""

from __future__ import annotations

import random
from typing import Any

from adapters.model import ReplicaState
from meshd.score.scorer import Scorer, ScoreRequest, Status
from meshd.score.sequences import SequenceTable, rendezvous, sequence_key
from meshd.signals.fused import FusedState
from meshd.signals.wire import NodeSignals


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


# --- the scorer's sequence path, over a simulated fleet ------------------------------------------



class Fleet:
    """Three nodes serving model ``m``; flags per node; telemetry refreshed on demand."""

    def __init__(self) -> None:
        self.flags: dict[str, list[str]] = {}
        self.version = 0
        self.fused = FusedState("r", lambda n: self.flags.get(n, []))
        self.scorer = Scorer(self.fused, policy_version=lambda: self.version)
        self.seq = 0
        self.now = 100.0
        self.nodes = {"n1": True, "n2": True, "n3": True}
        self.refresh()

    def refresh(self) -> None:
        for node, ready in self.nodes.items():
            self.seq += 1
            rep = ReplicaState(model="m", version="1", endpoint=f"{node}:8001", ready=ready,
                               queue=0, spu=0.002,
                               at={"ready": self.now, "queue": self.now, "stats": self.now})
            self.fused.update(node, NodeSignals(1, self.seq, [rep]), "gossip", self.now)

    def ask(self, sid: int | str, start: bool = False, end: bool = False) -> Any:
        self.now += 0.01
        return self.scorer.score(ScoreRequest(
            "m", "", 64, idempotent=False, sequence=sequence_key("m", "", sid),
            sequence_start=start, sequence_end=end), self.now)

    def answer(self, scored: Any, replica: str | None = None, ok: bool = True) -> None:
        self.scorer.report(scored.decision_id, replica or scored.targets[0].replica, 0.001,
                           Status.OK if ok else Status.UNAVAILABLE, self.now, last=True)


def test_a_start_goes_to_the_rendezvous_winner_and_later_requests_follow_it() -> None:
    f = Fleet()
    s = f.ask(7, start=True)
    assert s.verdict.admit and s.hedge_after == 0 and not s.walk
    keys = [f"{n}:8001/m/1" for n in f.nodes]
    assert s.targets[0].replica == rendezvous(sequence_key("m", "", 7), keys, str)[0]
    f.answer(s)
    home = s.targets[0].node
    # The home starts draining: the sequence finishes there all the same.
    f.flags[home] = ["draining"]
    f.version += 1
    for _ in range(3):
        s2 = f.ask(7)
        assert s2.verdict.admit and [t.node for t in s2.targets] == [home]
        f.answer(s2)
    # A new sequence does not start on the draining node.
    starts = set()
    for n in range(100, 140):
        started = f.ask(n, start=True)
        f.answer(started)
        starts.add(started.targets[0].node)
    assert home not in starts and len(starts) == 2
    last = f.ask(7, end=True)
    assert last.verdict.admit
    f.answer(last)
    assert f.scorer.sequences.get(sequence_key("m", "", 7), f.now) is None


def test_without_a_record_the_request_walks_the_rendezvous_order() -> None:
    f = Fleet()
    s = f.ask("abc")  # never started here: another router took its START
    keys = [f"{n}:8001/m/1" for n in f.nodes]
    assert s.walk and [t.replica for t in s.targets] == rendezvous(
        sequence_key("m", "", "abc"), keys, str)
    f.answer(s, replica=s.targets[1].replica)  # the second in line held it
    again = f.ask("abc")
    assert not again.walk and again.targets[0].replica == s.targets[1].replica


def test_a_sequence_whose_replica_is_gone_is_lost_by_name() -> None:
    f = Fleet()
    s = f.ask(9, start=True)
    f.answer(s)
    home = s.targets[0].node
    f.nodes[home] = False  # its replica is no longer ready
    f.refresh()
    lost = f.ask(9)
    assert not lost.verdict.admit and lost.verdict.reason == "sequence_lost"
    assert lost.targets[0].node == home
    assert f.scorer.counters.shed["sequence_lost"] == 1
