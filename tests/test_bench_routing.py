"""The routing bench's clairvoyant router: the yardstick its hedging bar is read against."""

from __future__ import annotations

import pytest

from bench.routing import clairvoyant

SERVICE = [0.005, 0.005, 0.010, 0.025]


def test_an_idle_fleet_serves_each_request_on_the_fastest_replica_at_once() -> None:
    out = clairvoyant(SERVICE, 1, 0.25, 0.0, rate=1.0, duration=200.0, seed=3)
    assert out["n"] > 100
    assert out["min"] == pytest.approx(5.0) and out["max"] == pytest.approx(5.0)


def test_stalls_raise_the_tail_under_load_even_with_free_instant_hedges() -> None:
    """At 80% load a stall on a 1x replica leaves the rest short of capacity: the queue it
    builds shows in the p99.9 however requests are routed."""
    rate = 0.8 * sum(1 / s for s in SERVICE)
    calm = clairvoyant(SERVICE, 1, 0.25, 0.0, rate, 20.0, seed=1)
    stalls = clairvoyant(SERVICE, 1, 0.25, 0.002, rate, 20.0, seed=1)
    assert stalls["p999"] > 1.5 * calm["p999"]
    assert stalls["max"] < 250.0  # no request waits out a stall: it is moved at once


def test_a_stall_on_a_replica_the_rest_can_cover_barely_shows() -> None:
    rate = 0.5 * sum(1 / s for s in SERVICE)
    calm = clairvoyant(SERVICE, 3, 0.25, 0.0, rate, 20.0, seed=2)
    stalls = clairvoyant(SERVICE, 3, 0.25, 0.002, rate, 20.0, seed=2)
    assert stalls["p999"] < 1.5 * calm["p999"]
