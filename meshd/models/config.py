"""The placement controller's settings, one frozen value handed to every plan."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class PlacementConfig:
    """How eagerly the controller adds and removes replicas.

    ``target_utilisation``: the share of its time a replica should be busy; a model whose
    demand is ``d`` seconds of work per second wants ``ceil(d / target_utilisation)``.

    ``hysteresis``: a band around that target, so demand hovering at a boundary does not
    flap a replica in and out: a replica is added once the others would be busier than
    ``target * (1 + hysteresis)``, and one is removed only once the rest would be busy less
    than ``target * (1 - hysteresis)``.

    ``cool_down_s``: demand must stay below the band this long before replicas go (scale-up
    is immediate: an overloaded model sheds requests now, an idle replica costs only memory).

    ``request_hold_s``: a request for a model with no replica keeps one wanted this long
    (scale from zero), after which the cool-down applies as usual.

    ``backoff_s``: after a failed load a node is not tried again for the model for this long,
    doubled with each failure in a row up to ``max_backoff_s``.

    ``load_timeout_s``: a load that has not reported by then is drained and counted as failed.
    """

    target_utilisation: float = 0.7
    hysteresis: float = 0.1
    cool_down_s: float = 120.0
    request_hold_s: float = 60.0
    backoff_s: float = 60.0
    max_backoff_s: float = 3600.0
    load_timeout_s: float = 600.0

    def __post_init__(self) -> None:
        if not 0 < self.target_utilisation <= 1:
            raise ValueError("target_utilisation must be in (0, 1]")
        if not 0 <= self.hysteresis < 1:
            raise ValueError("hysteresis must be in [0, 1)")
        for name in ("cool_down_s", "request_hold_s", "backoff_s", "max_backoff_s",
                     "load_timeout_s"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0")

    def backoff(self, failures: int) -> float:
        """Seconds a node is skipped after ``failures`` failed loads of a model in a row."""
        return min(self.max_backoff_s, self.backoff_s * 2.0 ** max(0, failures - 1))
