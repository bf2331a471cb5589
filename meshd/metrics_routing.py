"""Prometheus metrics of scoring and routing, read from the scorer's and router's counters
at scrape time (the hot path only increments integers).

Scrapes run in the exporter's thread while the event loop updates the counters, so every
dict is copied with ``dict.copy`` (one C call, atomic under the GIL) before it is walked.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector

from meshd.router.counters import RouterCounters
from meshd.score.scorer import STRATEGY_BUCKETS, Scorer
from meshd.score.shadow import DIFF_BUCKETS


def _histogram(name: str, doc: str, labels: list[str], bounds: tuple[float, ...],
               series: list[tuple[list[str], list[int], float]]) -> HistogramMetricFamily:
    """``series``: (label values, per-bucket counts (last = above every bound), sum)."""
    h = HistogramMetricFamily(name, doc, labels=labels)
    for values, counts, total in series:
        cum, running = [], 0
        for bound, n in zip((*bounds, float("inf")), counts, strict=True):
            running += n
            cum.append((repr(bound) if bound != float("inf") else "+Inf", running))
        h.add_metric(values, cum, total)
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

    def collect(self) -> Iterator[Metric]:
        node, c = self.node, self.scorer.counters

        def by(name: str, doc: str, label: str, values: dict[str, int]) -> CounterMetricFamily:
            fam = CounterMetricFamily(name, doc, labels=["node", label])
            for key, n in sorted(dict.copy(values).items()):
                fam.add_metric([node, key], n)
            return fam

        def one(name: str, doc: str, value: float, kind: type = CounterMetricFamily) -> Metric:
            fam = kind(name, doc, labels=["node"])
            fam.add_metric([node], value)
            return fam  # type: ignore[no-any-return]

        yield by("meshd_score_decisions", "Requests ranked, by the strategy that ranked them",
                 "strategy", c.decisions)
        yield by("meshd_score_shed", "Requests shed, by reason", "reason", c.shed)
        yield by("meshd_score_strategy_fallbacks",
                 "Decisions ranked by p2c because the model's strategy was unknown, over its "
                 "time budget, or failed", "why", c.fallbacks)
        yield by("meshd_score_outcomes", "Outcomes routers reported, by status", "status",
                 c.outcomes)
        yield one("meshd_score_degraded_decisions",
                  "Decisions made on this agent's own observations (every target's telemetry "
                  "stale: partition or gossip down)", c.degraded)
        yield one("meshd_score_hedges_offered", "Decisions that offered a hedge delay",
                  c.hedges_offered)
        yield one("meshd_score_hedges_sent", "Hedges routers reported sending", c.hedges_sent)
        yield one("meshd_score_unknown_outcomes",
                  "Outcomes for decisions that had expired or never existed",
                  c.unknown_outcomes)
        yield one("meshd_score_expired_decisions",
                  "Decisions released at their deadline because no router reported",
                  self.scorer.decisions.expired)
        yield one("meshd_score_open_decisions", "Decisions waiting for their outcome",
                  len(self.scorer.decisions), GaugeMetricFamily)
        timing = dict.copy(c.timing)
        yield _histogram("meshd_score_decision_seconds",
                         "Time a strategy took to rank one request", ["node", "strategy"],
                         STRATEGY_BUCKETS,
                         [([node, name], list(t.buckets), t.total)
                          for name, t in sorted(timing.items())])
        shadow = dict.copy(c.shadow)
        labels = ["node", "model", "active", "candidate"]
        compared = CounterMetricFamily("meshd_score_shadow_compared",
                                       "Decisions a shadow strategy also ranked", labels=labels)
        differed = CounterMetricFamily("meshd_score_shadow_differed",
                                       "Decisions where the shadow's first pick differed",
                                       labels=labels)
        series = []
        for (model, cand), s in sorted(shadow.items()):
            values = [node, model, s.active, cand]
            compared.add_metric(values, s.compared)
            differed.add_metric(values, s.differed)
            series.append((values, list(s.buckets), s.diff_sum))
        yield compared
        yield differed
        yield _histogram("meshd_score_shadow_difference_seconds",
                         "Predicted seconds of the shadow's pick minus the active pick's, "
                         "where they differed (negative: the shadow's looked faster)", labels,
                         DIFF_BUCKETS, series)
        limit = GaugeMetricFamily("meshd_score_target_concurrency_limit",
                                  "Adaptive concurrency limit of each target (replica)",
                                  labels=["node", "replica"])
        inflight = GaugeMetricFamily("meshd_score_target_inflight",
                                     "Requests this agent admitted to each target, in flight",
                                     labels=["node", "replica"])
        for key, st in sorted(dict.copy(self.scorer.table.stats).items()):
            limit.add_metric([node, key], st.limit.limit)
            inflight.add_metric([node, key], st.limit.inflight)
        yield limit
        yield inflight
        processes = self.router()
        if processes is None:
            return
        r = RouterCounters()
        per_process = CounterMetricFamily(
            "meshd_router_process_requests",
            "Inference requests received by each process serving the router port (agent, "
            "or a worker process's life)", labels=["node", "process"])
        for name, counters in sorted(processes.items()):
            r.add(counters)
            per_process.add_metric([node, name], counters.requests)
        yield per_process
        for name, doc, value in (
            ("meshd_router_requests", "Inference requests received", r.requests),
            ("meshd_router_completed", "Inference requests answered", r.completed),
            ("meshd_router_invalid", "Requests rejected as invalid (never sent to a runtime)",
             r.invalid),
            ("meshd_router_hedged", "Requests that sent a hedge", r.hedged),
            ("meshd_router_hedge_won", "Requests answered by their hedge", r.hedge_won),
            ("meshd_router_failovers", "Attempts sent to the next target after an error",
             r.failovers),
            ("meshd_router_streams", "ModelStreamInfer streams opened", r.streams),
        ):
            yield one(name, doc, value)
        yield by("meshd_router_failed", "Requests that failed, by gRPC status", "code",
                 r.failed)
        yield by("meshd_router_shed", "Requests shed (RESOURCE_EXHAUSTED), by reason",
                 "reason", r.shed)
        link = self.link()
        if link is not None:
            yield by("meshd_router_link_messages",
                     "Messages the agent took from its router worker processes over the score "
                     "link: score, reports (outcomes), hedge; malformed frames closed the "
                     "connection", "kind", link)
