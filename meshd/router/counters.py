"""The router's request counters, and their sum over the worker processes sharing its port.

Every router process counts its own requests (the hot path increments integers).  Worker
processes report theirs to the agent every second (``ReportRouterCounters``); the agent's
metrics show the sum.  A worker that restarts starts again from zero under a new life name,
so the sum keeps every earlier life's last report and stays monotonic, as Prometheus
counters must.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field, fields

from proto.mesh.v1 import score_pb2

MAX_LIVES = 256
"""Worker lives kept by name; older ones are folded into one retired total."""
_SCALARS = ("requests", "admitted", "completed", "invalid", "cancelled", "hedged", "hedge_won",
            "failovers", "streams")


@dataclass(slots=True)
class RouterCounters:
    requests: int = 0
    """Received: every one ends as exactly one of completed, failed, shed, invalid or
    cancelled, so the difference is what is in flight."""
    admitted: int = 0
    completed: int = 0
    failed: dict[str, int] = field(default_factory=dict)
    shed: dict[str, int] = field(default_factory=dict)
    invalid: int = 0
    cancelled: int = 0
    hedged: int = 0
    hedge_won: int = 0
    failovers: int = 0
    streams: int = 0
    refused: dict[str, int] = field(default_factory=dict)
    """TLS handshakes the router's ports refused, by ``channel:reason`` (``router``,
    ``router_http``): shown in ``meshd_security_refusals_total``, not as requests."""

    def add(self, other: RouterCounters) -> None:
        for name in _SCALARS:
            setattr(self, name, getattr(self, name) + getattr(other, name))
        for mine, theirs in ((self.failed, other.failed), (self.shed, other.shed),
                             (self.refused, other.refused)):
            for key, n in dict.copy(theirs).items():
                mine[key] = mine.get(key, 0) + n

    def refuse(self, channel: str, reason: str, detail: str = "") -> None:
        """Count a refused TLS handshake (``detail`` is for the caller's log)."""
        key = f"{channel}:{reason}"
        self.refused[key] = self.refused.get(key, 0) + 1

    def inflight(self) -> int:
        """Received and not yet ended."""
        ended = self.completed + self.invalid + self.cancelled
        ended += sum(dict.copy(self.failed).values()) + sum(dict.copy(self.shed).values())
        return max(0, self.requests - ended)

    def counts(self) -> list[int]:
        """Every count held, scalar and keyed."""
        return [*(getattr(self, name) for name in _SCALARS), *dict.copy(self.failed).values(),
                *dict.copy(self.shed).values(), *dict.copy(self.refused).values()]

    def to_pb(self, worker: str) -> score_pb2.RouterCounters:
        return score_pb2.RouterCounters(worker=worker, failed=dict.copy(self.failed),
                                        shed=dict.copy(self.shed),
                                        refused=dict.copy(self.refused),
                                        **{name: getattr(self, name) for name in _SCALARS})

    @classmethod
    def from_pb(cls, msg: score_pb2.RouterCounters) -> RouterCounters:
        return cls(failed=dict(msg.failed), shed=dict(msg.shed), refused=dict(msg.refused),
                   **{name: getattr(msg, name) for name in _SCALARS})


assert {f.name for f in fields(RouterCounters)} == {*_SCALARS, "failed", "shed", "refused"}


class WorkerCounters:
    """The latest report of each worker life, and the sum of lives past the bound."""

    def __init__(self) -> None:
        self.lives: dict[str, RouterCounters] = {}
        self.retired = RouterCounters()
        self.reports: Counter[str] = Counter()

    def update(self, worker: str, counters: RouterCounters) -> None:
        self.lives.pop(worker, None)  # re-inserted last: the dict is oldest-first
        self.lives[worker] = counters
        self.reports[worker] += 1
        while len(self.lives) > MAX_LIVES:
            oldest = next(iter(self.lives))
            self.retired.add(self.lives.pop(oldest))
            del self.reports[oldest]

    def report(self, worker: str, msg: score_pb2.RouterCounters) -> None:
        """A worker's report through the score API (checked there)."""
        self.update(worker, RouterCounters.from_pb(msg))

    def processes(self, local: RouterCounters | None = None) -> dict[str, RouterCounters]:
        """Counters by process: ``agent`` (``local``), each worker life, and ``retired``
        (lives past the bound) once there are any."""
        out = {"agent": local} if local is not None else {}
        out.update(dict.copy(self.lives))
        if self.retired.requests or self.retired.streams or self.retired.refused:
            # else it is all zeros
            out["retired"] = self.retired
        return out

    def total(self, local: RouterCounters | None = None) -> RouterCounters:
        out = RouterCounters()
        for counters in self.processes(local).values():
            out.add(counters)
        return out
