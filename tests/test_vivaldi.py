"""Vivaldi network coordinates: config, coordinate math, client, wire form, zones and estimates.

The coordinate and client tests mirror Serf's ``coordinate/coordinate_test.go`` and
``client_test.go`` (expected values recomputed here, not copied); the property tests check the
one promise that matters most in production: nothing a peer sends can poison our coordinate.
"""

from __future__ import annotations

import dataclasses
import math
import random
import struct

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from topology.client import REJECT_REASONS, VivaldiClient
from topology.config import MAX_DIMENSIONS, VivaldiConfig
from topology.coordinate import ZERO_THRESHOLD, Coordinate, unit_vector_at
from topology.estimate import CONTRADICTION_PENALTY, estimate
from topology.wire import DECODE_REASONS, VERSION, CoordinateError, decode, encode
from topology.zones import Place, Relation, ZonePriors, relation

NAN, INF = math.nan, math.inf
CFG = VivaldiConfig()
ORIGIN = Coordinate.origin(CFG)

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def coord(*vec: float, error: float = 0.5, adjustment: float = 0.0,
          height: float = 10.0e-6, dims: int = 8) -> Coordinate:
    """A coordinate whose first components are ``vec``, zero-padded to ``dims``."""
    return Coordinate(tuple(vec) + (0.0,) * (dims - len(vec)), error, adjustment, height)


def client(seed: int = 0, **config: object) -> VivaldiClient:
    return VivaldiClient(VivaldiConfig.serf(**config), rng=random.Random(seed))


def close(a: tuple[float, ...], b: tuple[float, ...], tol: float = 1e-12) -> bool:
    return len(a) == len(b) and all(math.isclose(x, y, abs_tol=tol)
                                    for x, y in zip(a, b, strict=True))


# --- config ----------------------------------------------------------------------------------


def test_config_defaults_are_serfs() -> None:
    # Serf coordinate.DefaultConfig().
    assert dataclasses.asdict(VivaldiConfig()) == {
        "dimensionality": 8, "error_max": 1.5, "ce": 0.25, "cc": 0.25,
        "adjustment_window_size": 20, "height_min": 10.0e-6, "latency_filter_size": 3,
        "gravity_rho": 150.0, "max_rtt": 10.0,
    }
    assert VivaldiConfig.serf() == VivaldiConfig()
    assert VivaldiConfig.serf(dimensionality=2).dimensionality == 2


@pytest.mark.parametrize(("field", "value"), [
    ("dimensionality", 0), ("dimensionality", -1), ("dimensionality", MAX_DIMENSIONS + 1),
    ("error_max", 0.0), ("error_max", -1.5), ("error_max", NAN),
    ("ce", 0.0), ("ce", -0.25), ("ce", NAN),
    ("cc", 0.0), ("cc", -0.25),
    ("height_min", 0.0), ("height_min", -1e-6),
    ("gravity_rho", 0.0), ("gravity_rho", -150.0),
    ("max_rtt", 0.0), ("max_rtt", -10.0), ("max_rtt", NAN),
    ("adjustment_window_size", -1),
    ("latency_filter_size", 0), ("latency_filter_size", -3),
])
def test_config_validate_rejects_bad_values_naming_the_field(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=field):
        VivaldiConfig(**{field: value}).validate()  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=field):
        VivaldiConfig.serf(**{field: value})
    with pytest.raises(ValueError, match=field):
        VivaldiConfig().replace(**{field: value})
    with pytest.raises(ValueError, match=field):
        VivaldiClient(VivaldiConfig(**{field: value}))  # type: ignore[arg-type]


@pytest.mark.parametrize("changes", [
    {"dimensionality": 1}, {"dimensionality": MAX_DIMENSIONS}, {"adjustment_window_size": 0},
    {"latency_filter_size": 1}, {"cc": 1.0, "ce": 1.0},
])
def test_config_validate_accepts_edges(changes: dict[str, object]) -> None:
    cfg = VivaldiConfig().replace(**changes)
    assert cfg.validate() is cfg


# --- coordinate math (Serf coordinate_test.go) -------------------------------------------------


def test_origin_is_maximally_unsure_at_zero() -> None:
    cfg = VivaldiConfig(dimensionality=3)
    o = Coordinate.origin(cfg)
    assert o == Coordinate((0.0, 0.0, 0.0), 1.5, 0.0, 10.0e-6)
    assert o.is_valid()


@pytest.mark.parametrize("bad", [NAN, INF, -INF])
@pytest.mark.parametrize("where", ["vec0", "vec7", "error", "adjustment", "height"])
def test_coordinate_is_valid_refuses_non_finite(where: str, bad: float) -> None:
    c = ORIGIN
    if where.startswith("vec"):
        vec = list(c.vec)
        vec[int(where[3:])] = bad
        c = dataclasses.replace(c, vec=tuple(vec))
    else:
        c = dataclasses.replace(c, **{where: bad})
    assert not c.is_valid()


def test_coordinate_is_valid_refuses_negative_error_and_height_only() -> None:
    assert not dataclasses.replace(ORIGIN, error=-1e-9).is_valid()
    assert not dataclasses.replace(ORIGIN, height=-1e-9).is_valid()
    assert dataclasses.replace(ORIGIN, adjustment=-5.0, vec=(-1.0,) * 8).is_valid()
    assert dataclasses.replace(ORIGIN, error=0.0, height=0.0).is_valid()


def test_is_compatible_with_compares_dimensionality() -> None:
    assert ORIGIN.is_compatible_with(coord(1.0))
    assert not ORIGIN.is_compatible_with(coord(1.0, dims=3))
    assert not coord(dims=9).is_compatible_with(ORIGIN)


def test_distance_to_adds_heights_and_adjustments() -> None:
    c1 = Coordinate((-0.5, 1.3, 2.4), 1.5, 0.0, 0.0)
    c2 = Coordinate((1.2, -2.3, 3.4), 1.5, 0.0, 0.0)
    euclid = math.sqrt(1.7 ** 2 + 3.6 ** 2 + 1.0 ** 2)  # 4.1048751503547...
    assert c1.distance_to(c1) == 0.0
    assert c1.distance_to(c2) == pytest.approx(euclid, abs=1e-12)
    assert c1.distance_to(c2) == c2.distance_to(c1)
    # Positive adjustments add to the distance.
    c1, c2 = dataclasses.replace(c1, adjustment=0.1), dataclasses.replace(c2, adjustment=0.2)
    assert c1.distance_to(c2) == pytest.approx(euclid + 0.3, abs=1e-12)
    # Heights add (both of them: each packet crosses both access links).
    c1, c2 = dataclasses.replace(c1, height=0.7), dataclasses.replace(c2, height=0.1)
    assert c1.distance_to(c2) == pytest.approx(euclid + 0.3 + 0.8, abs=1e-12)
    # The raw distance ignores the adjustments but keeps the heights.
    assert c1.raw_distance_to(c2) == pytest.approx(euclid + 0.8, abs=1e-12)


def test_distance_to_ignores_adjustments_that_would_make_it_non_positive() -> None:
    a = Coordinate((0.0, 0.0), 1.5, 0.0, 0.0)
    b = Coordinate((3.0, 4.0), 1.5, 0.0, 0.0)
    # Serf: a hugely negative adjustment is ignored rather than giving a negative RTT.
    assert dataclasses.replace(a, adjustment=-1.0e6).distance_to(b) == 5.0
    # Exactly zero is not positive either: fall back to the raw distance.
    a0, b0 = dataclasses.replace(a, adjustment=-2.5), dataclasses.replace(b, adjustment=-2.5)
    assert a0.distance_to(b0) == 5.0
    # Just above zero is used as is.
    a1 = dataclasses.replace(a, adjustment=-4.0)
    assert a1.distance_to(b) == pytest.approx(1.0)
    assert dataclasses.replace(a, adjustment=-1.0).distance_to(b) == 4.0


def test_apply_force_moves_along_the_unit_vector() -> None:
    cfg = VivaldiConfig(dimensionality=3, height_min=0.0)  # Serf's test disables height_min
    rng = random.Random(0)
    origin = Coordinate.origin(cfg)
    above = dataclasses.replace(origin, vec=(0.0, 0.0, 2.9))
    # Normalised, away from ``above`` (positive force), by exactly the force.
    c = origin.apply_force(cfg, 5.3, above, rng)
    assert close(c.vec, (0.0, 0.0, -5.3))
    # Nothing special about the origin.
    right = dataclasses.replace(origin, vec=(3.4, 0.0, -5.3))
    c = c.apply_force(cfg, 2.0, right, rng)
    assert close(c.vec, (-2.0, 0.0, -5.3))
    # A negative force pulls toward the other node.
    c = origin.apply_force(cfg, -1.0, above, rng)
    assert close(c.vec, (0.0, 0.0, 1.0))
    # Error and adjustment are carried over untouched.
    moved = dataclasses.replace(origin, error=0.3, adjustment=-0.01).apply_force(
        cfg, 1.0, above, rng)
    assert (moved.error, moved.adjustment) == (0.3, -0.01)


def test_apply_force_on_coincident_points_picks_a_random_unit_direction() -> None:
    cfg = VivaldiConfig(dimensionality=3, height_min=0.0)
    origin = Coordinate.origin(cfg)
    c = origin.apply_force(cfg, 1.0, origin, random.Random(1))
    assert origin.distance_to(c) == pytest.approx(1.0)
    assert c.height == origin.height  # magnitude 0: the height takes no share


def test_apply_force_splits_into_height() -> None:
    cfg = VivaldiConfig(dimensionality=3)  # height_min 10 us
    rng = random.Random(0)
    origin = Coordinate.origin(cfg)
    above = Coordinate((0.0, 0.0, 2.9), 1.5, 0.0, 0.0)
    c = origin.apply_force(cfg, 5.3, above, rng)
    assert close(c.vec, (0.0, 0.0, -5.3))
    # (h_self + h_other) * force / |diff| + h_self
    assert c.height == pytest.approx(cfg.height_min + 5.3 * cfg.height_min / 2.9, rel=1e-12)
    # Pulling in shrinks the height, but never below height_min.
    c = origin.apply_force(cfg, -5.3, above, rng)
    assert close(c.vec, (0.0, 0.0, 5.3))
    assert c.height == cfg.height_min
    # Both heights count.
    tall = dataclasses.replace(above, height=0.5)
    c = dataclasses.replace(origin, height=0.1).apply_force(cfg, 1.0, tall, rng)
    assert c.height == pytest.approx(0.1 + 0.6 * 1.0 / 2.9, rel=1e-12)


def test_unit_vector_at() -> None:
    rng = random.Random(0)
    v1, v2 = (1.0, 2.0, 3.0), (0.5, 0.6, 0.7)
    u, mag = unit_vector_at(v1, v2, rng)
    norm = math.sqrt(0.5 ** 2 + 1.4 ** 2 + 2.3 ** 2)
    assert close(u, (0.5 / norm, 1.4 / norm, 2.3 / norm))
    assert math.hypot(*u) == pytest.approx(1.0)
    assert mag == pytest.approx(norm)
    # Against the origin: v1 normalised, magnitude |v1|.
    u, mag = unit_vector_at(v1, (0.0, 0.0, 0.0), rng)
    assert close(u, tuple(x / math.sqrt(14.0) for x in v1))
    assert mag == pytest.approx(math.sqrt(14.0))
    # Points closer than ZERO_THRESHOLD count as coincident.
    u, mag = unit_vector_at(v1, (1.0, 2.0, 3.0 + ZERO_THRESHOLD / 2), rng)
    assert mag == 0.0
    assert math.hypot(*u) == pytest.approx(1.0)


def test_unit_vector_at_coincident_is_random_but_seeded() -> None:
    v = (1.0, 2.0, 3.0)
    u, mag = unit_vector_at(v, v, random.Random(42))
    assert mag == 0.0  # reported distance 0, so no height share
    assert math.hypot(*u) == pytest.approx(1.0)
    assert unit_vector_at(v, v, random.Random(42)) == (u, 0.0)  # deterministic per seed
    draws = {unit_vector_at(v, v, random.Random(s))[0] for s in range(50)}
    assert len(draws) == 50
    for k in range(3):  # every direction is possible: both signs on every axis
        assert {math.copysign(1.0, d[k]) for d in draws} == {1.0, -1.0}


def test_unit_vector_at_falls_back_to_first_axis() -> None:
    class Half(random.Random):
        def random(self) -> float:
            return 0.5  # every random component 0: nothing to normalise

    assert unit_vector_at((2.0, 2.0, 2.0), (2.0, 2.0, 2.0), Half()) == ((1.0, 0.0, 0.0), 0.0)


# --- client ----------------------------------------------------------------------------------


def test_client_starts_at_origin_and_distance_to() -> None:
    c = client(dimensionality=3)
    assert c.coordinate == Coordinate.origin(c.config)
    # Serf TestClient_DistanceTo (with our height_min on both sides).
    other = Coordinate((0.0, 0.0, 12.345), 1.5, 0.0, 0.0)
    assert c.distance_to(other) == pytest.approx(12.345 + 10.0e-6)


def test_client_update_moves_away_when_rtt_is_longer() -> None:
    # Serf TestClient_Update: a node just above us with an RTT twice the distance.
    c = client(dimensionality=3)
    other = Coordinate((0.0, 0.0, 0.001), 1.5, 0.0, 10.0e-6)
    new = c.update("node", other, 0.002)
    assert new is not None and new == c.coordinate
    assert new.vec[2] < 0.0
    assert new.vec[:2] == (0.0, 0.0)
    assert c.stats.updates == 1 and not c.stats.rejected and c.stats.resets == 0
    # ... and toward it when the RTT is shorter than the estimate.
    c = client(dimensionality=3)
    far = Coordinate((0.0, 0.0, 1.0), 1.5, 0.0, 10.0e-6)
    new = c.update("far", far, 0.001)
    assert new is not None and new.vec[2] > 0.0


@pytest.mark.parametrize("rtt", [0.0, -0.0, -0.001, -INF, 10.0001, 11.0, INF, NAN])
def test_client_refuses_rtt_out_of_range(rtt: float) -> None:
    c = client()
    assert c.update("warm", coord(0.01), 0.01) is not None
    before = c.coordinate
    assert c.update("node", coord(0.01), rtt) is None
    assert c.coordinate is before
    assert c.stats.rejected == {"rtt_out_of_range": 1}
    assert c.stats.updates == 1
    assert c.filtered_rtt("node") is None  # never reached the latency filter


def test_client_accepts_rtt_of_exactly_max() -> None:
    c = client()
    assert c.update("node", coord(0.01), 10.0) is not None
    assert c.filtered_rtt("node") == 10.0
    assert c.stats.updates == 1 and not c.stats.rejected
    # max_rtt is configurable.
    c = client(max_rtt=0.5)
    assert c.update("node", coord(0.01), 0.5) is not None
    assert c.update("node", coord(0.01), 0.5000001) is None
    assert c.stats.rejected == {"rtt_out_of_range": 1}


def _with(where: str, value: float) -> Coordinate:
    base = coord(0.01)
    if where.startswith("vec"):
        vec = list(base.vec)
        vec[int(where[3:])] = value
        return dataclasses.replace(base, vec=tuple(vec))
    return dataclasses.replace(base, **{where: value})


@pytest.mark.parametrize(("where", "value"), [
    *[(w, v) for w in ("vec0", "vec7", "error", "adjustment", "height")
      for v in (NAN, INF, -INF)],
    ("error", -0.1), ("height", -1e-6),
])
def test_client_refuses_invalid_peer_coordinate(where: str, value: float) -> None:
    c = client()
    before = c.coordinate
    assert c.update("node", _with(where, value), 0.01) is None
    assert c.coordinate is before
    assert c.stats.rejected == {"invalid_coordinate": 1}
    assert c.stats.updates == 0
    assert c.filtered_rtt("node") is None
    with pytest.raises(ValueError):
        c.set_coordinate(_with(where, value))
    assert c.coordinate is before


@pytest.mark.parametrize("dims", [1, 2, 7, 9, 32])
def test_client_refuses_dimension_mismatch(dims: int) -> None:
    c = client()
    before = c.coordinate
    assert c.update("node", coord(0.01, dims=dims), 0.01) is None
    assert c.coordinate is before
    assert c.stats.rejected == {"dimension_mismatch": 1}
    with pytest.raises(ValueError):
        c.set_coordinate(coord(0.01, dims=dims))


def test_client_counts_one_reason_per_refused_sample() -> None:
    c = client()
    c.update("a", coord(NAN), NAN)
    c.update("b", coord(NAN, dims=3), -1.0)
    c.update("c", coord(0.01), -1.0)
    assert sum(c.stats.rejected.values()) == 3
    assert set(c.stats.rejected) <= set(REJECT_REASONS)


def test_set_coordinate_then_update_continues_from_it() -> None:
    c = client()
    start = coord(0.05, error=0.2)
    c.set_coordinate(start)
    assert c.coordinate == start
    new = c.update("node", coord(0.0), 0.05)
    assert new is not None and new.vec[0] == pytest.approx(0.05, abs=0.01)


def test_latency_filter_is_a_median_of_the_last_three_per_node() -> None:
    c = client()
    peer = coord(0.01)
    c.update("a", peer, 0.010)
    assert c.filtered_rtt("a") == 0.010
    c.update("a", peer, 0.010)
    c.update("a", peer, 0.500)  # a single spike
    assert c.filtered_rtt("a") == 0.010
    c.update("a", peer, 0.012)  # window now [0.010, 0.500, 0.012]
    assert c.filtered_rtt("a") == 0.012
    c.update("a", peer, 0.020)  # [0.500, 0.012, 0.020]
    assert c.filtered_rtt("a") == 0.020
    c.update("a", peer, 0.030)
    c.update("a", peer, 0.030)  # the spike has left the window
    assert c.filtered_rtt("a") == 0.030
    # Filters are per node.
    assert c.filtered_rtt("b") is None
    c.update("b", peer, 0.100)
    assert c.filtered_rtt("b") == 0.100
    assert c.filtered_rtt("a") == 0.030


def test_latency_filter_spike_does_not_reach_the_coordinate() -> None:
    spiky, steady = client(seed=7), client(seed=7)
    peer = coord(0.01)
    for rtt in (0.010, 0.010, 0.900):
        spiky.update("a", peer, rtt)
    for rtt in (0.010, 0.010, 0.010):
        steady.update("a", peer, rtt)
    assert spiky.coordinate == steady.coordinate


def test_forget_resets_the_latency_filter() -> None:
    c = client()
    peer = coord(0.01)
    for rtt in (0.010, 0.010, 0.010):
        c.update("a", peer, rtt)
    c.forget("a")
    assert c.filtered_rtt("a") is None
    c.update("a", peer, 0.200)  # a reused name starts fresh: its first sample is the median
    assert c.filtered_rtt("a") == 0.200
    c.forget("never-seen")  # no-op


def test_latency_filter_size_one_disables_filtering() -> None:
    c = client(latency_filter_size=1)
    for rtt in (0.010, 0.010, 0.500):
        c.update("a", coord(0.01), rtt)
    assert c.filtered_rtt("a") == 0.500


# A peer that claims to sit 2.4e308 s from the origin: each component is finite, so the
# coordinate is valid and accepted, but math.dist overflows to inf and the Vivaldi step yields
# NaN.  A real (public-API) way to make our coordinate invalid, no poking at internals needed.
OVERFLOWING_PEER = coord(1.7e308, 1.7e308)


def test_coordinate_that_becomes_invalid_is_reset_to_origin() -> None:
    c = client()
    assert OVERFLOWING_PEER.is_valid()
    new = c.update("evil", OVERFLOWING_PEER, 0.010)
    assert new == c.coordinate == ORIGIN
    assert c.stats.resets == 1
    assert c.stats.updates == 1


def test_reset_does_not_keep_the_poison_in_the_adjustment_window() -> None:
    # BUG (topology/client.py): the reset restores the coordinate but not the adjustment
    # window, which still holds the NaN sample; every following update recomputes a NaN
    # adjustment and resets again, so one corrupt sample freezes us at the origin for the next
    # adjustment_window_size - 1 good samples (Serf shares this).
    c = client()
    c.update("evil", OVERFLOWING_PEER, 0.010)
    assert c.stats.resets == 1
    good = coord(0.01)
    new = c.update("good", good, 0.010)
    assert c.stats.resets == 1, f"a good sample reset us again ({c.stats.resets} resets)"
    assert new is not None and new != ORIGIN


@pytest.mark.parametrize("route", ["peer", "set_coordinate"])
def test_huge_finite_coordinate_cannot_poison_us(route: str) -> None:
    # BUG (topology/client.py _update_gravity): ``(dist / rho) ** 2`` raises OverflowError once
    # dist > ~2e156 s.  A peer at 1e300 s (valid: finite) pulls us to ~1.9e299 s, gravity raises
    # out of update(), and the coordinate is left at 1.9e299 s -- poisoned, no reset counted.
    c = client()
    huge = coord(1e300)
    peer = coord(0.01)
    if route == "peer":
        sample = (huge, 1.0)
    else:
        try:
            c.set_coordinate(huge)  # e.g. a corrupt saved coordinate
        except ValueError:
            return  # refusing it up front is a fine fix too
        sample = (peer, 0.01)
    try:
        new = c.update("node", *sample)
    except ArithmeticError as exc:
        pytest.fail(f"update raised {exc!r}; coordinate left at {c.coordinate.vec[0]:.3g} s")
    assert new is None or new == c.coordinate
    assert c.coordinate.is_valid()
    # Refused or reset (and counted either way): never left astronomically far away.
    assert c.stats.resets + sum(c.stats.rejected.values()) >= 1
    assert c.distance_to(ORIGIN) < 1e6, c.coordinate


def test_huge_peer_height_cannot_break_the_adjustment_window() -> None:
    # BUG (topology/client.py _update_adjustment): math.fsum raises OverflowError
    # ("intermediate overflow in fsum") once two window samples sum past -1.8e308.  A peer with
    # height 1e308 and error 1e308 (valid: finite, non-negative) gives our side a weight of
    # ~1e-308, so we barely move and gravity is fine, but each sample stores rtt - 1e308 in the
    # window: the 2nd update raises, and so does every update (from any peer) until those
    # samples leave the window -- the exception escapes into the caller's hot path each time.
    c = client()
    evil = coord(error=1e308, height=1e308)
    good = coord(0.01)
    for node, peer, rtt in [("evil", evil, 1.0)] * 3 + [("good", good, 0.01)]:
        try:
            new = c.update(node, peer, rtt)
        except ArithmeticError as exc:
            pytest.fail(f"update({node!r}) raised {exc!r} after {c.stats.updates} updates")
        assert new is None or new == c.coordinate
        assert c.coordinate.is_valid()


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_two_clients_converge_on_a_fixed_rtt(seed: int) -> None:
    a, b = client(seed), client(seed + 100)
    for _ in range(100):
        a.update("b", b.coordinate, 0.010)
        b.update("a", a.coordinate, 0.010)
    assert a.distance_to(b.coordinate) == pytest.approx(0.010, rel=0.01)
    assert b.distance_to(a.coordinate) == pytest.approx(0.010, rel=0.01)
    assert a.coordinate.error < 0.1 and b.coordinate.error < 0.1
    assert a.stats.updates == b.stats.updates == 100
    assert a.stats.resets == b.stats.resets == 0


def test_adjustment_window_zero_disables_adjustment() -> None:
    c = client(adjustment_window_size=0)
    for _ in range(10):
        c.update("a", coord(0.01), 0.030)
    assert c.coordinate.adjustment == 0.0


# --- wire ------------------------------------------------------------------------------------


@pytest.mark.parametrize("dims", [1, 2, 3, 8, 16, MAX_DIMENSIONS])
def test_wire_roundtrip_is_exact(dims: int) -> None:
    rng = random.Random(dims)
    for _ in range(20):
        c = Coordinate(tuple(rng.uniform(-1, 1) for _ in range(dims)), rng.uniform(0, 1.5),
                       rng.uniform(-0.1, 0.1), rng.uniform(0, 0.1))
        data = encode(c)
        assert len(data) == 2 + 8 * (dims + 3)
        assert data[:2] == bytes([VERSION, dims])
        assert decode(data) == c
    # Extremes survive bit for bit: subnormal, -0.0, the largest double, negative adjustment.
    extremes = (5e-324, -0.0, 1.7976931348623157e308, -1.7976931348623157e308)
    edge = Coordinate(tuple(extremes[k % 4] for k in range(dims)), 0.0, -1e300, 5e-324)
    assert encode(decode(encode(edge))) == encode(edge)
    assert decode(encode(edge)) == edge


def test_wire_is_90_bytes_at_8_dimensions() -> None:
    assert len(encode(ORIGIN)) == 90


def _reason(data: bytes) -> str:
    with pytest.raises(CoordinateError) as info:
        decode(data)
    assert info.value.reason in DECODE_REASONS
    assert isinstance(info.value, ValueError)
    return info.value.reason


def _raw(version: int, dims: int, values: list[float]) -> bytes:
    return bytes([version, dims]) + struct.pack(f"<{len(values)}d", *values)


GOOD_VALUES = [0.01] * 8 + [0.5, -0.001, 0.0001]


@pytest.mark.parametrize("data", [b"", b"\x01"])
def test_decode_rejects_too_short(data: bytes) -> None:
    assert _reason(data) == "malformed"


@pytest.mark.parametrize("version", [0, 2, 255])
def test_decode_rejects_unsupported_version(version: int) -> None:
    assert _reason(_raw(version, 8, GOOD_VALUES)) == "unsupported_version"


@pytest.mark.parametrize("dims", [0, MAX_DIMENSIONS + 1, 255])
def test_decode_rejects_bad_dimensionality(dims: int) -> None:
    assert _reason(_raw(VERSION, dims, [0.0] * (dims + 3))) == "malformed"


@pytest.mark.parametrize("delta", [-90, -89, -8, -1, 1, 8, 100])
def test_decode_rejects_wrong_length(delta: int) -> None:
    data = _raw(VERSION, 8, GOOD_VALUES)
    assert decode(data) == Coordinate(tuple(GOOD_VALUES[:8]), 0.5, -0.001, 0.0001)
    data = data[:len(data) + delta] if delta < 0 else data + b"\x00" * delta
    assert _reason(data) == "malformed"


@pytest.mark.parametrize(("index", "value"), [
    *[(i, v) for i in (0, 7, 8, 9, 10) for v in (NAN, INF, -INF)],
    (8, -0.5), (10, -1e-9),  # negative error, negative height
])
def test_decode_rejects_invalid_values(index: int, value: float) -> None:
    values = list(GOOD_VALUES)
    values[index] = value
    assert _reason(_raw(VERSION, 8, values)) == "invalid_coordinate"


@st.composite
def wire_like(draw: st.DrawFn) -> bytes:
    """Mostly well-framed coordinates with arbitrary floats, sometimes cut or padded."""
    dims = draw(st.one_of(st.integers(1, MAX_DIMENSIONS), st.integers(0, 255)))
    values = draw(st.lists(st.floats(), min_size=dims + 3, max_size=dims + 3))
    version = draw(st.sampled_from([VERSION, VERSION, VERSION, 0, 2]))
    data = _raw(version, dims, values)
    cut = draw(st.sampled_from([0, 0, 0, -1, 1, -8]))
    return data[:cut] if cut < 0 else data + b"\x00" * cut


@FAST
@given(st.one_of(st.binary(max_size=300), wire_like()))
def test_decode_fuzz_returns_valid_coordinate_or_coordinate_error(data: bytes) -> None:
    try:
        c = decode(data)
    except CoordinateError as exc:
        assert exc.reason in DECODE_REASONS
        return
    assert c.is_valid()
    assert 1 <= len(c.vec) <= MAX_DIMENSIONS
    assert encode(c) == data  # anything accepted is canonical


# --- the local coordinate can never be poisoned ---------------------------------------------

ANY_FLOAT = st.one_of(
    st.floats(-0.2, 0.2),
    st.floats(),  # includes nan, +-inf, subnormals and huge values
    st.sampled_from([NAN, INF, -INF, 1.7e308, -1.7e308, 1e300, 1e155, 5e-324, 0.0, -0.0]),
)
NON_NEG = st.one_of(st.floats(0.0, 1.5), ANY_FLOAT)


@st.composite
def samples(draw: st.DrawFn) -> tuple[str, Coordinate, float]:
    dims = draw(st.sampled_from([8, 8, 8, 8, 3]))
    vec = tuple(draw(st.lists(ANY_FLOAT, min_size=dims, max_size=dims)))
    peer = Coordinate(vec, draw(NON_NEG), draw(ANY_FLOAT), draw(NON_NEG))
    rtt = draw(st.one_of(st.floats(1e-5, 10.0), ANY_FLOAT))
    return draw(st.sampled_from(["a", "b", "c"])), peer, rtt


@FAST
@given(st.lists(samples(), max_size=30), st.integers(0, 2**32))
def test_no_sample_can_poison_the_local_coordinate(
        feed: list[tuple[str, Coordinate, float]], seed: int) -> None:
    c = client(seed)
    for node, peer, rtt in feed:
        new = c.update(node, peer, rtt)
        assert new is None or new == c.coordinate
        assert c.coordinate.is_valid()
        assert all(map(math.isfinite, c.coordinate.vec))
        assert c.distance_to(ORIGIN) >= 0.0 and math.isfinite(c.distance_to(ORIGIN))
    total = c.stats.updates + sum(c.stats.rejected.values())
    assert total == len(feed)
    assert set(c.stats.rejected) <= set(REJECT_REASONS)


# --- zones -----------------------------------------------------------------------------------


@pytest.mark.parametrize(("a", "b", "same_node", "expected"), [
    (Place("a", "x"), Place("a", "x"), True, Relation.SELF),
    (Place("a", "x"), Place("b", "y"), True, Relation.SELF),  # same node wins over labels
    (Place(), Place(), True, Relation.SELF),
    (Place("a", "x"), Place("a", "x"), False, Relation.SAME_ZONE),
    (Place("a", "x"), Place("b", "x"), False, Relation.SAME_REGION),
    (Place("", "x"), Place("", "x"), False, Relation.SAME_REGION),
    (Place("a", "x"), Place("", "x"), False, Relation.SAME_REGION),
    (Place("a", "x"), Place("b", "y"), False, Relation.CROSS_REGION),
    (Place("a", "x"), Place("a", "y"), False, Relation.CROSS_REGION),  # zone names are per region
    (Place("", "x"), Place("", "y"), False, Relation.CROSS_REGION),
    (Place(), Place(), False, Relation.UNKNOWN),
    (Place(), Place("a", "x"), False, Relation.UNKNOWN),
    (Place("a", ""), Place("b", "x"), False, Relation.UNKNOWN),
    (Place("a", ""), Place("b", ""), False, Relation.UNKNOWN),
    (Place("a", ""), Place("a", ""), False, Relation.SAME_ZONE),
    (Place("a", "x"), Place("a", ""), False, Relation.UNKNOWN),  # b's region is not known
])
def test_relation(a: Place, b: Place, same_node: bool, expected: Relation) -> None:
    assert relation(a, b, same_node) == expected
    assert relation(b, a, same_node) == expected


labels = st.builds(Place, st.sampled_from(["", "a", "b"]), st.sampled_from(["", "x", "y"]))


@given(labels, labels)
def test_relation_is_symmetric(a: Place, b: Place) -> None:
    assert relation(a, b) == relation(b, a)
    assert relation(a, b, same_node=True) == Relation.SELF


def test_zone_priors() -> None:
    p = ZonePriors()
    assert p.typical(Relation.SELF) == 0.0
    assert p.typical(Relation.SAME_ZONE) == 0.0005
    assert p.typical(Relation.SAME_REGION) == 0.002
    assert p.typical(Relation.CROSS_REGION) == 0.060
    assert p.typical(Relation.UNKNOWN) is None
    assert p.plausible(Relation.SAME_ZONE, 0.005) and not p.plausible(Relation.SAME_ZONE, 0.0051)
    assert p.plausible(Relation.SAME_REGION, 0.02)
    assert not p.plausible(Relation.SAME_REGION, 0.021)
    assert p.plausible(Relation.CROSS_REGION, 0.002)
    assert not p.plausible(Relation.CROSS_REGION, 0.0019)
    assert p.plausible(Relation.UNKNOWN, 1e-9) and p.plausible(Relation.UNKNOWN, 9.0)


# --- estimate --------------------------------------------------------------------------------


def test_estimate_self() -> None:
    e = estimate(None, None, Relation.SELF)
    assert (e.rtt, e.error, e.confidence, e.source) == (0.0, 0.0, 1.0, "self")


@pytest.mark.parametrize("rel", [Relation.SAME_REGION, Relation.CROSS_REGION, Relation.UNKNOWN])
def test_estimate_uses_settled_coordinates(rel: Relation) -> None:
    a, b = coord(0.0, error=0.1), coord(0.0, 0.015, error=0.2)  # 15 ms + 2 heights
    e = estimate(a, b, rel)
    assert e.source == "coordinates"
    assert e.rtt == a.distance_to(b) == pytest.approx(0.015 + 20e-6)
    assert e.error == pytest.approx(0.15)
    assert e.confidence == pytest.approx(1.0 - 0.15)
    assert e.consistent and e.relation == rel


def test_estimate_confidence_is_clamped() -> None:
    e = estimate(coord(0.01, error=0.0), coord(error=0.0), Relation.UNKNOWN)
    assert e.confidence == 1.0 and e.error == 0.0
    e = estimate(coord(0.01, error=1.5), coord(error=1.5), Relation.UNKNOWN)
    assert e.confidence == 0.0 and e.source == "coordinates"


@pytest.mark.parametrize("rel", [Relation.SAME_ZONE, Relation.SAME_REGION,
                                 Relation.CROSS_REGION])
def test_estimate_fresh_coordinates_defer_to_zone_prior(rel: Relation) -> None:
    # Two brand-new nodes: both at the origin with error_max, 20 us apart (their heights).
    # BUG (topology/estimate.py) for CROSS_REGION: 20 us is implausible cross-region, so the
    # coordinate estimate is marked inconsistent and returned ("or not consistent") -- 20 us at
    # confidence 0 instead of the 60 ms prior, for every new cross-region pair.
    e = estimate(ORIGIN, ORIGIN, rel)
    assert (e.source, e.rtt) == ("zone", ZonePriors().typical(rel)), e
    assert e.confidence == ZonePriors().confidence
    assert e.consistent


def test_estimate_fresh_coordinates_without_relation_are_low_confidence() -> None:
    a, b = coord(0.004, error=1.5), coord(error=1.5)
    e = estimate(a, b, Relation.UNKNOWN)
    assert e.source == "coordinates" and e.rtt == a.distance_to(b)
    assert e.confidence < ZonePriors().confidence


def test_estimate_contradicting_labels_halves_confidence() -> None:
    a, b = coord(0.0, error=0.1), coord(0.050, error=0.1)  # same zone, but 50 ms apart
    e = estimate(a, b, Relation.SAME_ZONE)
    assert e.source == "coordinates" and e.rtt == pytest.approx(0.050 + 20e-6)
    assert not e.consistent
    assert CONTRADICTION_PENALTY == 0.5
    assert e.confidence == pytest.approx(0.9 * 0.5)
    # The same pair labelled cross-region is fine.
    e = estimate(a, b, Relation.CROSS_REGION)
    assert e.consistent and e.confidence == pytest.approx(0.9)


def test_estimate_without_coordinates() -> None:
    for a, b in [(None, None), (coord(0.01), None), (None, coord()),
                 (coord(0.01), coord(dims=3))]:  # incompatible counts as missing
        e = estimate(a, b, Relation.UNKNOWN)
        assert (e.rtt, e.source, e.confidence) == (None, "none", 0.0)
        assert e.error == INF
        e = estimate(a, b, Relation.SAME_REGION)
        assert (e.rtt, e.source, e.confidence) == (0.002, "zone", 0.2)


def test_estimate_uses_given_priors() -> None:
    priors = ZonePriors(cross_region=0.150, confidence=0.3)
    e = estimate(None, None, Relation.CROSS_REGION, priors)
    assert (e.rtt, e.confidence, e.source) == (0.150, 0.3, "zone")


@given(st.integers(0, 2**32))
@settings(max_examples=100, deadline=None)
def test_rtt_rows_give_every_pairs_estimate(seed: int) -> None:
    """The scheduler's all-pairs form answers exactly what ``estimate`` answers pair by pair:
    settled and unsettled coordinates, missing ones, other dimensions, every zone relation."""
    from topology.estimate import rtt_rows

    rng = random.Random(seed)
    coords: list[Coordinate | None] = []
    places = []
    for _ in range(rng.randint(0, 9)):
        dims = rng.choice([8, 8, 8, 3])
        coords.append(None if rng.random() < 0.2 else Coordinate(
            tuple(rng.uniform(-0.05, 0.05) for _ in range(dims)), rng.choice(
                [0.05, 0.5, 0.75, 1.0, 1.5]), rng.uniform(-0.01, 0.01), rng.uniform(1e-5, 0.01)))
        places.append(Place(rng.choice(["", "a", "b"]), rng.choice(["", "r1", "r2"])))
    rows = rtt_rows(coords, places)
    for i, a in enumerate(coords):
        for j, b in enumerate(coords):
            want = estimate(a, b, relation(places[i], places[j], same_node=i == j)).rtt
            got = rows[i][j]
            assert got == want or (got is not None and want is not None
                                   and got == pytest.approx(want, rel=1e-12)), (i, j)
