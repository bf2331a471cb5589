"""RTT estimates between any two nodes, with how far to trust them.

A coordinate carries its node's own running estimate of its relative error, so the error of a
pair's estimate is about the mean of the two.  Until coordinates have settled (a new node starts
at ``error_max``), the zone labels give a coarse answer instead; once they have, the labels are
used as a sanity check that lowers confidence when the coordinates contradict them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from topology.coordinate import Coordinate
from topology.zones import Place, Relation, ZonePriors, relation

MIN_COORDINATE_CONFIDENCE = 0.25
"""Below this (a pair error above 0.75), labels answer instead of coordinates when they can."""

CONTRADICTION_PENALTY = 0.5
"""Confidence is multiplied by this when a coordinate estimate contradicts the zone labels."""


@dataclass(frozen=True, slots=True)
class Estimate:
    rtt: float | None
    """Estimated round-trip time in seconds; None when nothing is known."""
    error: float
    """Expected relative error of ``rtt`` (0.1: within about 10%)."""
    confidence: float
    """0..1: 1 - error for settled coordinates, lower when labels disagree or answer alone."""
    source: str
    """"coordinates", "zone", "self" or "none"."""
    relation: Relation
    consistent: bool = True
    """False when the coordinates contradict the zone labels."""


def estimate(a: Coordinate | None, b: Coordinate | None, rel: Relation,
             priors: ZonePriors | None = None) -> Estimate:
    """Estimate the RTT between two nodes from their coordinates (if known) and relation."""
    priors = priors or ZonePriors()
    if rel == Relation.SELF:
        return Estimate(0.0, 0.0, 1.0, "self", rel)
    coord_est: Estimate | None = None
    if a is not None and b is not None and a.is_compatible_with(b):
        rtt = a.distance_to(b)
        error = (a.error + b.error) / 2.0
        confidence = min(1.0, max(0.0, 1.0 - error))
        settled = confidence >= MIN_COORDINATE_CONFIDENCE
        consistent = priors.plausible(rel, rtt)
        if not consistent:
            confidence *= CONTRADICTION_PENALTY
        coord_est = Estimate(rtt, error, confidence, "coordinates", rel, consistent)
        if settled:
            # Settled coordinates are measurements; labels can only lower our confidence.
            return coord_est
    typical = priors.typical(rel)
    if typical is not None and (coord_est is None or coord_est.confidence < priors.confidence):
        return Estimate(typical, 1.0, priors.confidence, "zone", rel)
    if coord_est is not None:
        return coord_est
    return Estimate(None, float("inf"), 0.0, "none", rel)


def rtt_rows(coords: Sequence[Coordinate | None], places: Sequence[Place],
             priors: ZonePriors | None = None) -> list[list[float | None]]:
    """Every pair's :func:`estimate` RTT at once: ``rows[i][j]`` between nodes ``i`` and
    ``j``.  The same numbers, without building an :class:`Estimate` per pair: the training
    scheduler's gang search needs all pairs of tens of nodes within its few milliseconds."""
    priors = priors or ZonePriors()
    n = len(coords)
    rows: list[list[float | None]] = [[0.0] * n for _ in range(n)]
    for i in range(n):
        a, row = coords[i], rows[i]
        for j in range(i + 1, n):
            b = coords[j]
            rtt: float | None
            if a is not None and b is not None and a.is_compatible_with(b) and min(
                    1.0, max(0.0, 1.0 - (a.error + b.error) / 2.0)) >= MIN_COORDINATE_CONFIDENCE:
                rtt = a.distance_to(b)  # settled: what estimate() answers, labels aside
            else:
                rtt = estimate(a, b, relation(places[i], places[j]), priors).rtt
            row[j] = rows[j][i] = rtt
    return rows
