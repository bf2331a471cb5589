"""Prometheus metrics of scoring and routing, read from the scorer's and router's counters
at scrape time (the hot path only increments integers).

Scrapes run in the exporter's thread while the event loop updates the counters, so every
dict is copied with ``dict.copy`` (one C call, atomic under the GIL) before it is walked.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from meshd.metrics.agent import by, one
from meshd.metrics.schema import HistogramFamily, family, histogram_family
from meshd.router.counters import RouterCounters
from meshd.score.scorer import Scorer, Timing


def _timings(name: str, timings: dict[tuple[str, ...], Timing]) -> HistogramFamily:
    """``timings`` (label values -> counts kept in the table's buckets) as ``name``."""
    h = histogram_family(name)
    for key, t in sorted(timings.items()):
        h.add(key, t.buckets, t.total)
    return h


class RoutingCollector(Collector):
    def __init__(self, node: str, scorer: Scorer,
                 router: Callable[[], dict[str, RouterCounters] | None] = lambda: None,
                 link: Callable[[], dict[str, int] | None] = lambda: None) -> None:
        """``router``: the router's counters by process (the agent's, and its workers'), or
        None where no router runs; ``link``: the score link's message counts (None where no
        worker process routes)."""
        self.node = node
        self.scorer = scorer
        self.router = router
        self.link = link

    def refusals(self) -> dict[tuple[str, str], int]:
        """TLS handshakes the router's ports refused, by (channel, reason), summed over its
        processes: ``meshd_security_refusals_total`` shows them with the agent's own."""
        out: dict[tuple[str, str], int] = {}
        for counters in (self.router() or {}).values():
            for key, n in dict.copy(counters.refused).items():
                channel, _, reason = key.partition(":")
                out[(channel, reason)] = out.get((channel, reason), 0) + n
        return out

    def collect(self) -> Iterator[Metric]:
        node, c = self.node, self.scorer.counters

        def copy(values: dict[str, int]) -> list[tuple[str, int]]:
            return sorted(dict.copy(values).items())

        yield by("meshd_score_decisions", node, copy(c.decisions))
        yield by("meshd_score_shed_requests", node, copy(c.shed))
        yield by("meshd_score_fallback_decisions", node, copy(c.fallbacks))
        yield by("meshd_score_outcomes", node, copy(c.outcomes))
        yield by("meshd_score_hedge_budget_exhausted", node, copy(c.hedge_budget_exhausted))
        yield one("meshd_score_degraded_decisions", node, c.degraded)
        yield one("meshd_score_offered_hedges", node, c.hedges_offered)
        yield one("meshd_score_sent_hedges", node, c.hedges_sent)
        yield one("meshd_score_unknown_outcomes", node, c.unknown_outcomes)
        yield one("meshd_score_expired_decisions", node, self.scorer.decisions.expired)
        yield one("meshd_score_open_decisions", node, len(self.scorer.decisions))
        yield _timings("meshd_score_decision_seconds",
                       {(node, name): t for name, t in dict.copy(c.timing).items()})
        yield _timings("meshd_score_request_seconds",
                       {(node, model): t for model, t in dict.copy(c.requests).items()})
        yield _timings("meshd_score_attempt_seconds",
                       {(node, *key): t for key, t in dict.copy(c.attempts).items()})
        shadow = dict.copy(c.shadow)
        compared = family("meshd_score_shadow_compared_decisions")
        differed = family("meshd_score_shadow_differed_decisions")
        difference = histogram_family("meshd_score_shadow_difference_seconds")
        for (model, cand), s in sorted(shadow.items()):
            values = [node, model, s.active, cand]
            compared.add_metric(values, s.compared)
            differed.add_metric(values, s.differed)
            difference.add(values, s.buckets, s.diff_sum)
        yield compared
        yield differed
        yield difference
        limit = family("meshd_score_target_concurrency_limit_requests")
        inflight = family("meshd_score_target_inflight_requests")
        by_key = self.scorer.table.by_key
        for key, st in sorted(dict.copy(self.scorer.table.stats).items()):
            target = by_key.get(key)
            if target is None:
                continue  # a replica that left the mesh: its stats wait to be reused
            labels = [node, target.model, target.version, target.node, target.endpoint]
            limit.add_metric(labels, st.limit.limit)
            inflight.add_metric(labels, st.limit.inflight)
        yield limit
        yield inflight
        processes = self.router()
        if processes is None:
            return
        r = RouterCounters()
        per_process = family("meshd_router_process_requests")
        for name, counters in sorted(processes.items()):
            r.add(counters)
            per_process.add_metric([node, name], counters.requests)
        yield per_process
        for name, value in (
            ("meshd_router_requests", r.requests),
            ("meshd_router_admitted_requests", r.admitted),
            ("meshd_router_completed_requests", r.completed),
            ("meshd_router_invalid_requests", r.invalid),
            ("meshd_router_cancelled_requests", r.cancelled),
            ("meshd_router_inflight_requests", r.inflight()),
            ("meshd_router_hedged_requests", r.hedged),
            ("meshd_router_hedge_won_requests", r.hedge_won),
            ("meshd_router_hedge_wasted_requests", max(0, r.hedged - r.hedge_won)),
            ("meshd_router_failovers", r.failovers),
            ("meshd_router_streams", r.streams),
        ):
            yield one(name, node, value)
        yield by("meshd_router_failed_requests", node, copy(r.failed))
        yield by("meshd_router_shed_requests", node, copy(r.shed))
        link = self.link()
        if link is not None:
            yield by("meshd_router_link_messages", node, copy(link))
