"""Automatic quarantine: a node judges its own health from its own telemetry.

A node takes itself out of service when its hardware or runtime goes bad: uncorrected ECC
errors on a GPU, a GPU held back by thermal throttling without a break, or a runtime whose
inferences keep failing.  It puts itself back after a healthy period, as the ``HealthPolicy``
says.  The node judges itself because it has first-hand, fresh figures and acts with nobody
watching; the quarantine is written through Raft like an operator's, so every router and the
scheduler see the same flag.

Who owns a quarantine:

- One the monitor wrote has ``auto: true``; the monitor lifts only those, and only after
  ``lift_after_seconds`` of health, doubled for each repeat (a replica that fails again as
  soon as traffic returns stays out longer each time, as Envoy's outlier ejection does).
- One an operator wrote (``auto: false``) is never touched.
- When an operator lifts an automatic quarantine while the problem is still there, that
  counts as "seen, accept it": ECC errors counted so far are acknowledged (the agent
  persists them), and the thermal and failure clocks start over.  Otherwise the node would
  quarantine itself again one tick later.

A runtime that is down (not answering) is not a health problem here: its replicas are
already not-ready and receive nothing.  This is about runtimes that answer, and fail.

Pure: time and telemetry are arguments, actions are returned; the agent's shell
(:mod:`meshd.control.quarantine`) writes them.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from meshd.signals.wire import NodeSignals

THERMAL_REASONS = frozenset({"hw_thermal", "sw_thermal", "hw_slowdown"})
"""Throttle reasons that mean the GPU is too hot (or the board says it is)."""
MAX_HOLD = 86_400.0
"""The longest an automatic quarantine is held after the node is healthy again (s)."""
STRIKE_MEMORY = 4
"""Repeats are forgotten once the node has stayed in service this many hold times."""
MAX_REASON = 256
AUTO_PREFIX = "auto: "


@dataclass(frozen=True, slots=True)
class HealthRules:
    """A ``HealthPolicy`` spec (see ``policy/model.py`` for what each field means)."""

    auto_quarantine: bool = True
    ecc_uncorrected: int = 1
    thermal_seconds: float = 60.0
    failure_ratio: float = 0.5
    failure_min: int = 10
    failure_seconds: float = 30.0
    lift_after_seconds: float | None = 600.0

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> HealthRules:
        return cls(**{f.name: spec[f.name] for f in fields(cls) if f.name in spec})


@dataclass(frozen=True, slots=True)
class Problem:
    cause: str
    """``ecc``, ``thermal`` or ``runtime``."""
    subject: str
    """The GPU's UUID or the runtime's endpoint."""
    text: str


@dataclass(frozen=True, slots=True)
class Quarantine:
    reason: str
    problems: tuple[Problem, ...]


@dataclass(frozen=True, slots=True)
class Lift:
    reason: str


Action = Quarantine | Lift


@dataclass(slots=True)
class _Outcomes:
    """One runtime's recent inference outcomes, one row per statistics sample."""

    rows: deque[tuple[float, int, float]] = field(default_factory=deque)
    """(measured at, failed, succeeded)."""
    last: dict[str, float] = field(default_factory=dict)
    """Replica key -> ``at["stats"]`` of its last sample taken (to count each sample once)."""


class HealthMonitor:
    def __init__(self, ecc_acknowledged: Mapping[str, int] | None = None) -> None:
        self.ecc_acknowledged: dict[str, int] = dict(ecc_acknowledged or {})
        """GPU UUID -> uncorrected ECC errors an operator has seen (persisted by the shell)."""
        self.thermal_since: dict[str, float] = {}
        self.outcomes: dict[str, _Outcomes] = {}
        self.healthy_since: float | None = None
        self.strikes = 0
        self.current: list[Problem] = []
        self._auto = False
        self._auto_ended: float | None = None

    # --- what is wrong now ----------------------------------------------------------------

    def problems(self, now: float, sig: NodeSignals, rules: HealthRules) -> list[Problem]:
        out: list[Problem] = []
        present = set()
        for g in sig.gpus:
            present.add(g.uuid)
            if g.ecc_uncorrected is not None:
                seen = self.ecc_acknowledged.get(g.uuid, 0)
                if g.ecc_uncorrected < seen:  # the driver reloaded: volatile counters restart
                    self.ecc_acknowledged.pop(g.uuid, None)
                    seen = 0
                new = g.ecc_uncorrected - seen
                if new >= rules.ecc_uncorrected:
                    out.append(Problem("ecc", g.uuid, f"{new} uncorrected ECC error"
                                       f"{'s' if new > 1 else ''} on GPU {g.index} ({g.uuid})"))
            hot = sorted(THERMAL_REASONS.intersection(g.throttle))
            if not hot:
                self.thermal_since.pop(g.uuid, None)
                continue
            since = self.thermal_since.setdefault(g.uuid, now)
            if now - since >= rules.thermal_seconds:
                out.append(Problem("thermal", g.uuid, f"GPU {g.index} ({g.uuid}) thermal "
                                   f"throttling ({', '.join(hot)}) for {now - since:.0f}s"))
        for uuid in [u for u in self.thermal_since if u not in present]:
            del self.thermal_since[uuid]  # no reading is not a continuous throttle
        out += self._failing_runtimes(now, sig, rules)
        return out

    def _failing_runtimes(self, now: float, sig: NodeSignals,
                          rules: HealthRules) -> list[Problem]:
        for rep in sig.replicas:
            at = rep.at.get("stats")
            if at is None:
                continue
            window = self.outcomes.setdefault(rep.endpoint, _Outcomes())
            prev = window.last.get(rep.key)
            window.last[rep.key] = at
            if prev is None or at <= prev:
                continue  # first sample (no interval to scale the rate by) or seen already
            window.rows.append((at, rep.failures, (rep.rate or 0.0) * (at - prev)))
        out = []
        for endpoint, window in sorted(self.outcomes.items()):
            while window.rows and window.rows[0][0] < now - rules.failure_seconds:
                window.rows.popleft()
            failed = sum(r[1] for r in window.rows)
            total = failed + sum(r[2] for r in window.rows)
            if failed >= rules.failure_min and failed >= rules.failure_ratio * total:
                out.append(Problem("runtime", endpoint, f"runtime {endpoint}: {failed} of "
                                   f"{total:.0f} inferences failed in the last "
                                   f"{rules.failure_seconds:.0f}s"))
        return out

    # --- what to do about it ---------------------------------------------------------------

    def step(self, now: float, sig: NodeSignals, rules: HealthRules,
             quarantined: Mapping[str, Any] | None) -> Action | None:
        """One look at the node: ``quarantined`` is its NodeFlags ``quarantined`` field now.

        Returns the write to make, or None.  Until the flags show a write, the same action
        comes back on the next step, so a write that failed is simply retried.
        """
        auto = quarantined is not None and bool(quarantined.get("auto"))
        if self._auto and quarantined is None:
            self._acknowledge(now, sig)  # ours is gone: lifted by us, or seen by an operator
            self._auto_ended = now
        if auto and not self._auto:
            fresh = self._auto_ended is None or \
                now - self._auto_ended > STRIKE_MEMORY * self.hold(rules)
            self.strikes = 1 if fresh else self.strikes + 1
        self._auto = auto
        self.current = self.problems(now, sig, rules)
        if self.current:
            self.healthy_since = None
        elif self.healthy_since is None:
            self.healthy_since = now
        if quarantined is None:
            if self.current and rules.auto_quarantine:
                return Quarantine(reason_text(self.current), tuple(self.current))
            return None
        if not auto or self.current or rules.lift_after_seconds is None:
            return None
        hold = self.hold(rules)
        assert self.healthy_since is not None
        if now - self.healthy_since >= hold:
            return Lift(f"healthy for {hold:.0f}s")
        return None

    def hold(self, rules: HealthRules) -> float:
        """How long the node must be healthy before its automatic quarantine is lifted."""
        base = rules.lift_after_seconds or MAX_HOLD
        return min(MAX_HOLD, base * 2 ** max(0, self.strikes - 1))

    def _acknowledge(self, now: float, sig: NodeSignals) -> None:
        for g in sig.gpus:
            if g.ecc_uncorrected is not None:
                self.ecc_acknowledged[g.uuid] = g.ecc_uncorrected
        self.thermal_since = {u: now for u in self.thermal_since}
        for window in self.outcomes.values():
            window.rows.clear()


def reason_text(problems: list[Problem]) -> str:
    """The quarantine's reason for operators: every problem, cut to the field's limit."""
    text = AUTO_PREFIX + "; ".join(p.text for p in problems)
    return text if len(text) <= MAX_REASON else text[:MAX_REASON - 3] + "..."
