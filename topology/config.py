"""Vivaldi configuration, with Serf's defaults (``coordinate.DefaultConfig``).

Serf's values are tuned on real deployments (Consul, Nomad) and its coordinate tests give us
reference accuracy, so we keep them and document what each one trades.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

MAX_DIMENSIONS = 32
"""The wire format refuses more; 8 is plenty for Internet latencies (Vivaldi paper: 2-D + height
already captures most of the structure)."""


@dataclass(frozen=True, slots=True)
class VivaldiConfig:
    """Tuning of the Vivaldi algorithm.  Every distance is in seconds."""

    dimensionality: int = 8
    """Euclidean dimensions of the coordinate (the height is extra).  More dimensions fit
    more irregular topologies at a small CPU and bandwidth cost; Serf uses 8."""

    error_max: float = 1.5
    """Upper bound and starting value of a node's relative error estimate.  A new node starts
    maximally unsure, so its first samples move it a lot and its coordinate moves others little."""

    ce: float = 0.25
    """Weight of a new sample in the moving average of the error estimate (Vivaldi's c_e).
    Higher reacts faster to change and is noisier."""

    cc: float = 0.25
    """Fraction of the error-weighted force applied per sample (Vivaldi's c_c, the "timestep").
    Higher converges faster but oscillates."""

    adjustment_window_size: int = 20
    """Samples in the rolling window behind the per-node adjustment term, which absorbs the
    part of the RTT a Euclidean embedding cannot (e.g. a slow NIC, triangle-inequality
    violations).  0 disables the adjustment."""

    height_min: float = 10.0e-6
    """Smallest height (the access-link latency above the Euclidean plane), 10 µs, so every
    node keeps a non-zero height that samples can grow."""

    latency_filter_size: int = 3
    """Per-peer moving median over this many RTT samples, which strips one-off spikes (a GC
    pause, a queued packet) before they reach the coordinate."""

    gravity_rho: float = 150.0
    """Gravity toward the origin: force = -(distance / rho)^2.  Keeps the whole coordinate
    system from drifting away over time; 150 s makes it negligible at real RTTs."""

    max_rtt: float = 10.0
    """RTT samples must lie in (0, max_rtt] seconds; anything else is rejected and counted
    (Serf refuses above 10 s as well)."""

    @classmethod
    def serf(cls, **overrides: Any) -> VivaldiConfig:
        """Serf's ``DefaultConfig`` (the class defaults), with ``overrides``."""
        return cls(**overrides).validate()

    def replace(self, **changes: Any) -> VivaldiConfig:
        return dataclasses.replace(self, **changes).validate()

    def validate(self) -> VivaldiConfig:
        if not 1 <= self.dimensionality <= MAX_DIMENSIONS:
            raise ValueError(f"dimensionality must be in [1, {MAX_DIMENSIONS}], "
                             f"got {self.dimensionality}")
        for name in ("error_max", "ce", "cc", "height_min", "gravity_rho", "max_rtt"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)}")
        if self.adjustment_window_size < 0 or self.latency_filter_size < 1:
            raise ValueError("adjustment_window_size must be >= 0 and latency_filter_size >= 1")
        return self
