"""Placement ranking and ring order: what the scheduler picks, and that it picks it alike on
every coordinator."""

from __future__ import annotations

import itertools
import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshd.train.placement import GpuSlot, Needs, Unplaceable, rank, slot_cost
from meshd.train.ring import ring_order, ring_rtt


def fleet() -> list[GpuSlot]:
    return [
        GpuSlot("a", "0", "A100", 80_000, 80_000, "z1"),
        GpuSlot("a", "1", "A100", 80_000, 70_000, "z1", backlog_s=600.0),
        GpuSlot("b", "0", "L4", 24_000, 24_000, "z1"),
        GpuSlot("b", "1", "L4", 24_000, 24_000, "z1", inference_load=1.0),
        GpuSlot("c", "0", "L4", 24_000, 20_000, "z2"),
    ]


def test_a_one_gpu_job_goes_where_it_finishes_first_and_fits_best() -> None:
    needs = Needs(gpus=1, work_s=100.0, min_free_vram_mb=16_000)
    best = rank(needs, fleet())
    # one candidate per node, so failover moves to another node; the tightest fit first
    # (c/0 leaves 4 GB unused, b/0 8 GB, a/0 64 GB)
    assert [(c.slots[0].node, c.slots[0].gpu) for c in best] == [
        ("c", "0"), ("b", "0"), ("a", "0")]
    assert best[0].cost == pytest.approx(slot_cost(needs, fleet()[4])) == 100.0 + 5.0
    # inference at full load halves the GPU's share of time
    got = rank(needs, fleet(), busy={("b", "0")})
    assert [c.nodes for c in got] == [("c",), ("a",), ("b",)]
    assert got[2].slots[0].gpu == "1"
    assert got[2].cost == pytest.approx(100.0 / 0.5 + 30.0 * 8 / 24)


def test_excluded_nodes_busy_gpus_and_filters_are_respected() -> None:
    needs = Needs(gpus=1, work_s=10.0, min_free_vram_mb=22_000, gpu_type="L4")
    got = rank(needs, fleet(), excluded_nodes={"b"})
    assert got == []  # c/0 is an L4 but has only 20 GB free now
    got = rank(needs, fleet(), busy={("b", "0")})
    assert [(c.slots[0].node, c.slots[0].gpu) for c in got] == [("b", "1")]
    got = rank(Needs(gpus=1, work_s=1.0, zones=("z2",)), fleet())
    assert [c.nodes for c in got] == [("c",)]


def test_asking_for_more_than_the_fleet_has_is_an_error_not_a_wait() -> None:
    with pytest.raises(Unplaceable, match="the most on one node is 2; a job over several "
                                          "nodes says so with gpus.nodes"):
        rank(Needs(gpus=3, work_s=1.0, gpu_type="A100"), fleet())
    with pytest.raises(Unplaceable, match=r">= 90000 MiB"):
        rank(Needs(gpus=1, work_s=1.0, min_free_vram_mb=90_000), fleet())
    # three L4s exist, on two nodes: a job on one node never holds them, RTTs or not
    for rtt in (None, lambda a, b: 0.001):
        with pytest.raises(Unplaceable):
            rank(Needs(gpus=3, work_s=1.0, gpu_type="L4"), fleet(), rtt=rtt)
    # busy GPUs make it wait, not fail
    assert rank(Needs(gpus=1, work_s=1.0, gpu_type="A100"), fleet(),
                busy={("a", "0"), ("a", "1")}) == []


def test_a_multi_gpu_job_stays_on_one_node_and_a_gang_takes_its_nodes_in_ring_order() -> None:
    slots = [GpuSlot(n, str(g), "T4", 16_000, 16_000, "z") for n in "pqrs" for g in range(2)]
    slots.append(GpuSlot("q", "2", "T4", 16_000, 16_000, "z"))
    pos = {"p": 0.0, "q": 3.0, "r": 1.0, "s": 2.0}

    def rtt(a: str, b: str) -> float:
        return abs(pos[a] - pos[b]) / 1000

    one = rank(Needs(gpus=3, work_s=50.0), slots, rtt=rtt)
    assert [c.nodes for c in one] == [("q",)] and one[0].parts["comm"] == 0.0
    gang = rank(Needs(gpus=8, work_s=50.0, collective_rounds=10, nodes=4), slots, rtt=rtt,
                busy={("q", "2")})
    assert len(gang) == 1
    # along the line (p-r-s-q and back), read in the direction whose second name sorts first
    assert gang[0].nodes == ("p", "q", "s", "r")
    assert gang[0].parts["comm"] == pytest.approx(10 * 0.006)
    assert [s.gpu for s in gang[0].slots if s.node == "q"] == ["0", "1"]


@given(st.integers(0, 2**32))
@settings(max_examples=50, deadline=None)
def test_every_coordinator_ranks_alike_whatever_order_it_learned_the_gpus_in(seed: int) -> None:
    rng = random.Random(seed)
    slots = [GpuSlot(f"n{rng.randrange(20)}", str(i), rng.choice(["A", "B"]), 40_000,
                     rng.choice([10_000, 40_000]), f"z{rng.randrange(2)}",
                     backlog_s=rng.choice([0.0, 100.0]), inference_load=rng.random())
             for i in range(60)]
    needs = Needs(gpus=rng.randint(1, 3), work_s=60.0, min_free_vram_mb=20_000)
    shuffled = slots[:]
    rng.shuffle(shuffled)
    assert rank(needs, slots, limit=10) == rank(needs, shuffled, limit=10)


def test_a_ring_on_a_circle_goes_round_it() -> None:
    pts = {f"n{i}": (math.cos(2 * math.pi * i / 8), math.sin(2 * math.pi * i / 8))
           for i in range(8)}
    names = list(pts)
    random.Random(1).shuffle(names)

    def rtt(a: str, b: str) -> float:
        return math.dist(pts[a], pts[b])

    assert ring_order(names, rtt) == [f"n{i}" for i in range(8)]


@given(st.integers(0, 2**32), st.integers(4, 8))
@settings(max_examples=40, deadline=None)
def test_the_ring_is_the_best_up_to_seven_nodes_and_near_it_beyond(seed: int, n: int) -> None:
    rng = random.Random(seed)
    pts = {f"n{i}": (rng.random(), rng.random()) for i in range(n)}

    def rtt(a: str, b: str) -> float:
        return math.dist(pts[a], pts[b])

    best = min(ring_rtt(("n0",) + p, rtt)
               for p in itertools.permutations([f"n{i}" for i in range(1, n)]))
    got = ring_order(list(pts), rtt)
    assert sorted(got) == sorted(pts)
    assert ring_rtt(got, rtt) <= best * (1.0 if n <= 7 else 1.1) + 1e-12
