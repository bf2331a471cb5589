"""Zone and region facts: what the operator's labels say about the distance between two nodes.

Labels are cheap, known before the first probe, and right about the coarse structure (a
cross-region hop is tens of milliseconds, a same-zone hop well under one).  Coordinates are
learned and right about the fine structure.  ``estimate`` combines the two.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Relation(StrEnum):
    SELF = "self"
    SAME_ZONE = "same-zone"
    SAME_REGION = "same-region"
    CROSS_REGION = "cross-region"
    UNKNOWN = "unknown"
    """At least one side is unlabelled (or the labels say nothing about the pair)."""


@dataclass(frozen=True, slots=True)
class Place:
    zone: str = ""
    region: str = ""


def relation(a: Place, b: Place, same_node: bool = False) -> Relation:
    """How two labelled places relate.  Zones are only compared inside one region: "a" in
    region x and "a" in region y are different zones, and "a" in x vs "a" with no region
    is not known to be the same zone."""
    if same_node:
        return Relation.SELF
    if a.region and b.region and a.region != b.region:
        return Relation.CROSS_REGION
    if a.zone and a.zone == b.zone and a.region == b.region:
        return Relation.SAME_ZONE
    if a.region and a.region == b.region:
        return Relation.SAME_REGION
    return Relation.UNKNOWN


@dataclass(frozen=True, slots=True)
class ZonePriors:
    """Typical RTTs and plausible ranges per relation, in seconds.

    The defaults are public-cloud orders of magnitude: inside one availability zone a few
    hundred microseconds, across zones of one region 1-2 ms, across regions 10-300 ms.  They
    answer before any coordinate has settled and flag coordinates that contradict the labels
    (a mislabelled node, or a path that crosses a region it should not).
    """

    same_zone: float = 0.0005
    same_region: float = 0.002
    cross_region: float = 0.060
    same_zone_max: float = 0.005
    """A same-zone estimate above this contradicts the labels."""
    same_region_max: float = 0.020
    cross_region_min: float = 0.002
    """A cross-region estimate below this contradicts the labels."""
    confidence: float = 0.2
    """Confidence reported for an answer from labels alone."""

    def typical(self, rel: Relation) -> float | None:
        return {Relation.SELF: 0.0, Relation.SAME_ZONE: self.same_zone,
                Relation.SAME_REGION: self.same_region,
                Relation.CROSS_REGION: self.cross_region}.get(rel)

    def plausible(self, rel: Relation, rtt: float) -> bool:
        """Whether an RTT is consistent with what the labels say about the pair."""
        if rel == Relation.SAME_ZONE:
            return rtt <= self.same_zone_max
        if rel == Relation.SAME_REGION:
            return rtt <= self.same_region_max
        if rel == Relation.CROSS_REGION:
            return rtt >= self.cross_region_min
        return True
