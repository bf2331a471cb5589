"""A Vivaldi network coordinate: a point in Euclidean space plus a height and an adjustment.

The estimated RTT between two nodes is the Euclidean distance between their vectors plus both
heights (the access links every packet crosses) plus both adjustments (what the embedding
cannot express).  A port of Serf's ``coordinate.Coordinate``; vectors are tuples, and every
operation returns a new coordinate, so a coordinate handed out can never change under a reader.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass

from topology.config import VivaldiConfig

ZERO_THRESHOLD = 1.0e-6
"""Below this, two vectors count as the same point (Serf's ``zeroThreshold``)."""


@dataclass(frozen=True, slots=True)
class Coordinate:
    vec: tuple[float, ...]
    error: float
    """The node's own estimate of its relative error (0 perfect, ``error_max`` clueless)."""
    adjustment: float
    """Seconds added to every distance from this node (may be negative)."""
    height: float
    """Seconds of access-link latency above the Euclidean space (>= ``height_min``)."""

    @classmethod
    def origin(cls, config: VivaldiConfig) -> Coordinate:
        """Where a new node starts: at the origin, maximally unsure."""
        return cls((0.0,) * config.dimensionality, config.error_max, 0.0, config.height_min)

    def is_valid(self) -> bool:
        """Every component finite, error and height non-negative.

        Serf checks only finiteness; a negative error or height from a peer would flip the
        sign of the forces it applies to us, so we refuse those too.
        """
        return (all(map(math.isfinite, self.vec)) and math.isfinite(self.adjustment)
                and math.isfinite(self.error) and self.error >= 0.0
                and math.isfinite(self.height) and self.height >= 0.0)

    def is_compatible_with(self, other: Coordinate) -> bool:
        return len(self.vec) == len(other.vec)

    def raw_distance_to(self, other: Coordinate) -> float:
        """Distance without the adjustment terms, in seconds."""
        return math.dist(self.vec, other.vec) + self.height + other.height

    def distance_to(self, other: Coordinate) -> float:
        """Estimated RTT to ``other`` in seconds.

        The adjustments are only applied when they leave the estimate positive (Serf does the
        same): a large negative adjustment must not produce a negative RTT.
        """
        dist = math.dist(self.vec, other.vec) + self.height + other.height
        adjusted = dist + self.adjustment + other.adjustment
        return adjusted if adjusted > 0.0 else dist

    def apply_force(self, config: VivaldiConfig, force: float, other: Coordinate,
                    rng: random.Random) -> Coordinate:
        """Move ``force`` seconds away from ``other`` (toward it when negative).

        The height takes its share of the force in proportion to the heights' part of the
        distance, so nodes behind slow access links rise instead of pushing everyone away.
        """
        unit, mag = unit_vector_at(self.vec, other.vec, rng)
        vec = tuple(a + u * force for a, u in zip(self.vec, unit, strict=True))
        height = self.height
        if mag > ZERO_THRESHOLD:
            height = max((height + other.height) * force / mag + height, config.height_min)
        return Coordinate(vec, self.error, self.adjustment, height)


def unit_vector_at(vec1: tuple[float, ...], vec2: tuple[float, ...],
                   rng: random.Random) -> tuple[tuple[float, ...], float]:
    """The unit vector pointing from ``vec2`` to ``vec1`` and the distance between them.

    When the points coincide (every node starts at the origin) a random direction is picked,
    with a reported distance of 0, so that co-located nodes can push each other apart.
    """
    diff = [a - b for a, b in zip(vec1, vec2, strict=True)]
    mag = math.hypot(*diff)
    if mag > ZERO_THRESHOLD:
        return tuple(d / mag for d in diff), mag
    diff = [rng.random() - 0.5 for _ in diff]
    mag = math.hypot(*diff)
    if mag > ZERO_THRESHOLD:
        return tuple(d / mag for d in diff), 0.0
    return (1.0,) + (0.0,) * (len(diff) - 1), 0.0
