"""How many replicas a model should have: its pin's floor and cap, and what demand needs.

    desired = clamp(max(min_replicas, ceil(demand / target_utilisation)), ..., max_replicas)

with a hysteresis band (see :class:`~meshd.models.config.PlacementConfig`): up promptly,
down only after demand has stayed low for the cool-down.  The cool-down's start and the
most replicas demand needed during it are kept in the placement record (``low``
decisions), so a new leader finishes the same cool-down instead of starting another, and
scales down to what the busiest moment of the window needed, not to the last reading.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from meshd.models.config import PlacementConfig
from meshd.models.fleet import Model


@dataclass(frozen=True, slots=True)
class Size:
    """A model's desired replica count, the cool-down to record, and why, in words."""

    desired: int
    low_since: float | None
    """Start of the current low-demand window (None = demand is not low)."""
    low_peak: int
    """The most replicas demand needed since ``low_since`` (0 when not low)."""
    why: str
    floor: int = 0
    """Replicas wanted whatever the demand (min_replicas, or 1 when asked from zero): placed
    before any model's demand-driven ones."""


def replicas_for(demand: float, per_replica: float) -> int:
    """Replicas that keep each at most ``per_replica`` busy (0 for no demand)."""
    if demand <= 0:
        return 0
    return max(1, math.ceil(demand / per_replica - 1e-9))


def size(model: Model, current: int, now: float, config: PlacementConfig,
         low_since: float | None = None, low_peak: int = 0) -> Size:
    """The desired count for ``model`` with ``current`` replicas counted (loading or ready
    on live nodes); ``low_since``/``low_peak`` as the record holds them."""
    pin = model.pin
    cap = pin.max_replicas if pin.max_replicas is not None else math.inf
    target, band = config.target_utilisation, config.hysteresis
    demand = max(0.0, model.demand)
    asked = model.requested_at is not None and now - model.requested_at <= config.request_hold_s
    floor = max(pin.min_replicas, 1 if asked else 0)
    need = replicas_for(demand, target)
    up = int(min(max(floor, replicas_for(demand, min(1.0, target * (1 + band)))), cap))
    if up > current:
        return Size(up, None, 0, _basis(model, up, floor, asked, need), floor)
    if current > cap:
        return Size(int(cap), None, 0, f"max_replicas {int(cap)} caps it (has {current})", floor)
    keep = int(min(max(floor, replicas_for(demand, target * (1 - band))), cap))
    if keep >= current:
        return Size(current, None, 0, _basis(model, current, floor, asked, need), floor)
    since = now if low_since is None else low_since
    peak = keep if low_since is None else max(low_peak, keep)
    waited = now - since
    if waited >= config.cool_down_s:
        return Size(peak, None, 0, f"demand {demand:.2f} s/s has been low for {waited:.0f} s: "
                                   f"down from {current} to {peak}", floor)
    return Size(current, since, peak,
                f"demand {demand:.2f} s/s is low: down from {current} to {peak} in "
                f"{config.cool_down_s - waited:.0f} s unless it rises", floor)


def _basis(model: Model, n: int, floor: int, asked: bool, need: int) -> str:
    """What sets a count of ``n``, in words (``need``: replicas demand needs at target)."""
    pin = model.pin
    if pin.max_replicas is not None and n == pin.max_replicas and need > n:
        return f"max_replicas {n} caps demand {model.demand:.2f} s/s (needs {need})"
    if n <= floor and pin.min_replicas >= n and pin.min_replicas > 0:
        return f"min_replicas {pin.min_replicas}"
    if n <= floor and asked:
        return "requested while none was loaded"
    if model.demand > 0:
        return f"demand {model.demand:.2f} s/s needs {n} at target utilisation"
    return "no demand and no min_replicas" if n == 0 else f"keeps {n}"
