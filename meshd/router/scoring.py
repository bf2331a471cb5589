"""What the router asks of a scorer, wherever the scorer lives.

The router in the agent's own process calls the :class:`~meshd.score.scorer.Scorer` directly
(:class:`LocalScoring`).  Router worker processes sharing the port ask the agent over its
score API (:class:`meshd.router.remote_scoring.RemoteScoring`).  One interface lets the same
:class:`~meshd.router.gateway.Gateway` serve either way; the calls are coroutines because
the remote ones are, and an in-process coroutine costs about a microsecond.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import Protocol

from meshd.router.dispatch import Outcome
from meshd.score.scorer import (
    Choice,
    RepositoryRefused,
    Scored,
    Scorer,
    ScoreRequest,
    Status,
)

log = logging.getLogger("meshd.router")


class ScoringUnavailable(Exception):
    """The scorer cannot be reached (the agent is gone or restarting)."""


class Scoring(Protocol):
    async def score(self, req: ScoreRequest) -> Scored:
        """Ranked targets, verdict and hedge delay (ScoreError names a bad field)."""

    def report(self, decision_id: int, replica: str, latency: float, status: Status, *,
               hedge: bool = False, last: bool = False) -> None:
        """How one attempt ended.  Never waits: the router does not hold a reply for it."""

    def report_all(self, outcomes: Sequence[Outcome]) -> None:
        """:meth:`report` of each outcome, in order (one that fails is logged, the rest go)."""

    async def hedge_target(self, decision_id: int, replica: str) -> Choice | None:
        """Where the hedge of a request waiting at ``replica`` should go now, or None."""

    async def weights(self, model: str, version: str) -> list[tuple[Choice, float]]:
        """The model's routable targets and their shares."""

    async def models(self) -> dict[tuple[str, str], bool]:
        """Every (model, version) in the mesh, and whether a routable replica is ready."""

    async def want(self, model: str, version: str) -> bool:
        """A request for ``model`` found no ready replica: tell the placement controller;
        True when meshd places the model (a replica may come: hold the request)."""

    async def repository(self, model: str, load: bool, certificate_pem: bytes, bearer: str,
                         peer: str, config: str = "") -> str:
        """Repository control through the router: at least one replica of ``model``
        (``load``) or none, for the caller with that credential; who it was written for, or
        :class:`~meshd.score.scorer.RepositoryRefused` (the agent's refusal)."""

    async def close(self) -> None: ...


class LocalScoring:
    """The agent's own scorer, in this process."""

    def __init__(self, scorer: Scorer, clock: Callable[[], float]) -> None:
        self.scorer = scorer
        self.clock = clock

    async def score(self, req: ScoreRequest) -> Scored:
        return self.score_now(req, self.clock())

    def score_now(self, req: ScoreRequest, now: float) -> Scored:
        """:meth:`score` without the coroutine, for a gateway that knows its scorer is here
        (a coroutine per request costs the hot path a few microseconds in place)."""
        return self.scorer.score(req, now)

    def report(self, decision_id: int, replica: str, latency: float, status: Status, *,
               hedge: bool = False, last: bool = False) -> None:
        self.scorer.report(decision_id, replica, latency, status, self.clock(), hedge=hedge,
                           last=last)

    def report_all(self, outcomes: Sequence[Outcome]) -> None:
        report, now = self.scorer.report, self.clock()
        for did, replica, latency, status, hedge, last in outcomes:
            try:
                report(did, replica, latency, status, now, hedge=hedge, last=last)
            except Exception:  # noqa: BLE001 - one bad report must not strand the others
                log.exception("report failed", extra={"event": "report_failed"})

    async def hedge_target(self, decision_id: int, replica: str) -> Choice | None:
        return self.scorer.hedge_target(decision_id, replica, self.clock())

    async def weights(self, model: str, version: str) -> list[tuple[Choice, float]]:
        return self.scorer.weights(model, version, self.clock())[0]

    async def models(self) -> dict[tuple[str, str], bool]:
        return self.scorer.models(self.clock())

    async def want(self, model: str, version: str) -> bool:
        return self.scorer.wanted(model, version)

    async def repository(self, model: str, load: bool, certificate_pem: bytes, bearer: str,
                         peer: str, config: str = "") -> str:
        if self.scorer.repository is None:
            raise RepositoryRefused("UNIMPLEMENTED",
                                    "repository control through the mesh is model placement "
                                    "(meshd/models), which this agent does not serve")
        return await self.scorer.repository(model, load, certificate_pem, bearer, peer, config)

    async def close(self) -> None:
        pass
