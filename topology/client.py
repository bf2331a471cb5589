"""The Vivaldi client: turns (peer coordinate, measured RTT) samples into our own coordinate.

A port of Serf's ``coordinate.Client`` (the algorithm Consul and Nomad run), sans I/O: the
caller feeds samples from wherever it measures RTTs (gossip probe acks) and reads the result.
Each update runs three steps, as in Serf:

1. Vivaldi proper: move toward/away from the peer by the error-weighted difference between
   the measured RTT (after a per-peer median filter) and the current estimate;
2. the adjustment term: a rolling mean of what the Euclidean part still gets wrong;
3. gravity: a weak pull toward the origin so the whole system does not drift.

Bad samples are refused and counted rather than raised into the caller's hot path, and a
coordinate that ever becomes non-finite is reset to the origin, so one corrupt peer can at
worst cost us convergence time, never poison the coordinate we hand out.
"""

from __future__ import annotations

import random
from collections import Counter
from dataclasses import dataclass, field

from topology.config import VivaldiConfig
from topology.coordinate import ZERO_THRESHOLD, Coordinate

REJECT_REASONS = ("rtt_out_of_range", "invalid_coordinate", "dimension_mismatch")


@dataclass(slots=True)
class ClientStats:
    updates: int = 0
    """Samples applied to the coordinate."""
    resets: int = 0
    """Times the coordinate became invalid and was reset to the origin."""
    rejected: Counter[str] = field(default_factory=Counter)
    """Samples refused, by reason (one of ``REJECT_REASONS``)."""


class VivaldiClient:
    def __init__(self, config: VivaldiConfig | None = None, *,
                 rng: random.Random | None = None) -> None:
        self.config = config or VivaldiConfig()
        self.config.validate()
        self.rng = rng or random.Random()
        self.stats = ClientStats()
        self._origin = Coordinate.origin(self.config)
        self._coord = self._origin
        self._adjustment_index = 0
        self._adjustment_samples = [0.0] * self.config.adjustment_window_size
        self._latency: dict[str, list[float]] = {}

    @property
    def coordinate(self) -> Coordinate:
        """Our current coordinate (immutable; safe to hand out)."""
        return self._coord

    def set_coordinate(self, coord: Coordinate) -> None:
        """Start from a known coordinate (e.g. one saved before a restart)."""
        if not self._check(coord):
            raise ValueError("coordinate is invalid or has the wrong dimensionality")
        self._coord = coord

    def distance_to(self, other: Coordinate) -> float:
        """Estimated RTT from us to ``other``, in seconds."""
        return self._coord.distance_to(other)

    def forget(self, node: str) -> None:
        """Drop the latency filter of a node that left, so a reused name starts fresh."""
        self._latency.pop(node, None)

    def filtered_rtt(self, node: str) -> float | None:
        """The current median of the recent RTT samples to ``node``, if any."""
        samples = self._latency.get(node)
        return _median(samples) if samples else None

    def update(self, node: str, other: Coordinate, rtt: float) -> Coordinate | None:
        """Apply one RTT sample (seconds) to ``node`` whose coordinate is ``other``.

        Returns the new coordinate, or None when the sample was refused (see ``stats``).
        """
        if not self._check(other):
            return None
        if not 0.0 < rtt <= self.config.max_rtt:  # also refuses NaN
            self.stats.rejected["rtt_out_of_range"] += 1
            return None
        rtt = self._latency_filter(node, rtt)
        self._update_vivaldi(other, rtt)
        self._update_adjustment(other, rtt)
        self._update_gravity()
        if not self._coord.is_valid():
            # Serf resets only the coordinate; we also empty the adjustment window, or the
            # sample that broke the coordinate would break it again on the next 19 updates.
            self.stats.resets += 1
            self._coord = self._origin
            self._adjustment_samples = [0.0] * self.config.adjustment_window_size
            self._adjustment_index = 0
        self.stats.updates += 1
        return self._coord

    def _check(self, other: Coordinate) -> bool:
        if not self._coord.is_compatible_with(other):
            self.stats.rejected["dimension_mismatch"] += 1
            return False
        if not other.is_valid():
            self.stats.rejected["invalid_coordinate"] += 1
            return False
        return True

    def _latency_filter(self, node: str, rtt: float) -> float:
        samples = self._latency.get(node)
        if samples is None:
            samples = self._latency[node] = []
        samples.append(rtt)
        if len(samples) > self.config.latency_filter_size:
            del samples[0]
        return _median(samples)

    def _update_vivaldi(self, other: Coordinate, rtt: float) -> None:
        cfg, coord = self.config, self._coord
        dist = coord.distance_to(other)
        rtt = max(rtt, ZERO_THRESHOLD)
        wrongness = abs(dist - rtt) / rtt
        total_error = max(coord.error + other.error, ZERO_THRESHOLD)
        weight = coord.error / total_error
        error = min(cfg.ce * weight * wrongness + coord.error * (1.0 - cfg.ce * weight),
                    cfg.error_max)
        force = cfg.cc * weight * (rtt - dist)
        moved = coord.apply_force(cfg, force, other, self.rng)
        self._coord = Coordinate(moved.vec, error, moved.adjustment, moved.height)

    def _update_adjustment(self, other: Coordinate, rtt: float) -> None:
        window = self.config.adjustment_window_size
        if window == 0:
            return
        self._adjustment_samples[self._adjustment_index] = rtt - self._coord.raw_distance_to(other)
        self._adjustment_index = (self._adjustment_index + 1) % window
        c = self._coord
        # Plain sum: overflow yields inf (then a reset), where fsum would raise.
        adjustment = sum(self._adjustment_samples) / (2.0 * window)
        self._coord = Coordinate(c.vec, c.error, adjustment, c.height)

    def _update_gravity(self) -> None:
        cfg = self.config
        dist = self._origin.distance_to(self._coord)
        ratio = dist / cfg.gravity_rho
        force = -(ratio * ratio)  # not ** 2: that raises OverflowError on a huge distance
        self._coord = self._coord.apply_force(cfg, force, self._origin, self.rng)


def _median(samples: list[float]) -> float:
    """Serf's filter median: the upper middle of an even count."""
    return sorted(samples)[len(samples) // 2]
