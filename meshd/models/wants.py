"""Requests for models with no replica, gossiped to the placement controller (scale from zero).

A router that gets a request for a pinned model with no ready replica holds it and notes the
model here; each node publishes its recent wants as the ``want`` node-state section, and the
controller (on the policy group's leader, wherever that is) reads every node's: a model
wanted within the last ``HOLD`` seconds gets a replica even when its pin asks for none
(:attr:`meshd.models.fleet.Model.requested_at`).

Pure: time is an argument.  The section is a msgpack map of model -> age in milliseconds at
encoding (ages, never clock readings: agents' clocks are unrelated); decoding is strict, and
a section that fails is dropped whole (the caller counts it).
"""

from __future__ import annotations

import msgpack

SECTION = "want"
HOLD = 60.0
"""Seconds a want is published and counted (:attr:`PlacementConfig.request_hold_s`)."""
MAX_MODELS = 64
"""Models one node publishes at most (the most recent)."""
MAX_NAME = 256


class WantsError(ValueError):
    """A ``want`` section that cannot be used; the message says why."""


class Wants:
    """This node's wants and what the other nodes published."""

    def __init__(self, hold: float = HOLD) -> None:
        self.hold = hold
        self._mine: dict[str, float] = {}
        self._theirs: dict[str, dict[str, float]] = {}
        """node -> model -> when it was wanted (this node's clock)."""

    def note(self, model: str, now: float) -> None:
        """A request for ``model`` found no replica at ``now``."""
        if model and len(model) <= MAX_NAME:
            self._mine[model] = now
            if len(self._mine) > MAX_MODELS:
                oldest = min(self._mine, key=self._mine.__getitem__)
                del self._mine[oldest]

    def section(self, now: float) -> bytes:
        """What this node publishes: its wants younger than ``hold``, as ages."""
        self._mine = {m: t for m, t in self._mine.items() if now - t < self.hold}
        return msgpack.packb({m: max(0, round((now - t) * 1000))
                              for m, t in sorted(self._mine.items())})

    def learn(self, node: str, data: bytes, now: float) -> None:
        """``node``'s section, read at ``now``; WantsError (nothing kept) if malformed."""
        try:
            raw = msgpack.unpackb(data, raw=False, strict_map_key=True)
        except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as exc:
            raise WantsError(f"not msgpack: {exc}") from None
        if not isinstance(raw, dict) or len(raw) > MAX_MODELS:
            raise WantsError(f"must be a map of at most {MAX_MODELS} models")
        wants = {}
        for model, age in raw.items():
            if not isinstance(model, str) or not 0 < len(model) <= MAX_NAME:
                raise WantsError("a model name must be 1..256 characters")
            if not isinstance(age, int) or isinstance(age, bool) or not 0 <= age <= 86_400_000:
                raise WantsError(f"{model}: the age must be 0..86400000 ms")
            wants[model] = now - age / 1000
        self._theirs[node] = wants

    def forget(self, node: str) -> None:
        self._theirs.pop(node, None)

    def latest(self, model: str, now: float) -> float | None:
        """When ``model`` was last wanted anywhere (this node's clock), within ``hold``."""
        times = [t for w in (self._mine, *self._theirs.values())
                 if (t := w.get(model)) is not None and now - t < self.hold]
        return max(times) if times else None
