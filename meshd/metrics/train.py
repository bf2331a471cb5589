"""Prometheus metrics of training: jobs and leases as this node's copy of the placements group
holds them, the ranks running here, and the collectives they reported.

Every node follows the placements group, so every node can answer for the whole mesh; a
dashboard takes one node's figures (``max by (state)``), not their sum.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from adapters.model import CommStats
from meshd.metrics.schema import counter, family, histogram
from meshd.train.links import STEPS
from meshd.train.service import TrainService
from policy.model import JOB_STATES

OPS = frozenset(STEPS)


class TrainCollector(Collector):
    def __init__(self, node: str, train: TrainService) -> None:
        self.node = node
        self.train = train

    def collect(self) -> Iterator[Metric]:
        n, train = self.node, self.train
        jobs = family("meshd_train_jobs")
        leases = family("meshd_train_leases")
        gpus = family("meshd_train_leased_gpus")
        lost = family("meshd_train_lost_attempts")
        if "placements" in train.control.views:
            counts: dict[tuple[str, str], int] = {}
            tenant_of: dict[str, str] = {}
            lapses = 0
            for job in train.jobs():
                tenant = str(job.get("job", {}).get("tenant", "default"))
                tenant_of[job["name"]] = tenant
                key = (str(job.get("state", "")), tenant)
                counts[key] = counts.get(key, 0) + 1
                lapses += int(job.get("lapses", 0))
            for tenant in set(tenant_of.values()) or {"default"}:
                for state in JOB_STATES:
                    jobs.add_metric([n, state, tenant], counts.pop((state, tenant), 0))
            for (state, tenant), count in counts.items():  # a state this build does not know
                jobs.add_metric([n, state, tenant], count)
            held: dict[str, int] = {}
            placements = train.placements()
            for name, spec in placements.items():
                tenant = tenant_of.get(name, "default")
                held[tenant] = held.get(tenant, 0) + sum(
                    len(part.get("gpus", [])) for part in spec.get("parts", []))
            leases.add_metric([n], len(placements))
            for tenant, count in held.items():
                gpus.add_metric([n, tenant], count)
            lost.add_metric([n], lapses)
        yield from (jobs, leases, gpus, lost)
        ranks = family("meshd_train_local_ranks")
        ranks.add_metric([n], sum(not run.finished for run in list(train.runs.values())))
        yield ranks


class CollectiveMetrics:
    """Collectives the ranks on this node reported, observed as they arrive."""

    def __init__(self, node: str, registry: CollectorRegistry) -> None:
        self.node = node
        self.seconds = histogram("meshd_train_collective_seconds", registry)
        self.bytes = counter("meshd_train_collective_bytes", registry)

    def observe(self, stats: CommStats) -> None:
        op = stats.op if stats.op in OPS else "other"
        self.seconds.labels(self.node, op).observe(stats.seconds)
        self.bytes.labels(self.node, op).inc(max(0, stats.bytes))
