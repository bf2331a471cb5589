"""Prometheus metrics of model placement: the record as this node's copy of the policy group
holds it, what the controller wants (pins and demand, planned from this node's view), and
what this node's controller and Triton did.

Every node follows the policy group and sees the fleet's telemetry, so every node can answer
for the whole mesh; a dashboard takes one node's figures (``max by (model)``), not their sum.
``meshd_models_desired_replicas`` and ``meshd_models_utilisation`` are the signals an
autoscaler scales Triton deployments on (deploy/k8s).
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from meshd.metrics.schema import counter, family, histogram
from meshd.models.record import STATES
from meshd.models.service import ModelService


class ModelsCollector(Collector):
    def __init__(self, node: str, models: ModelService) -> None:
        self.node = node
        self.models = models

    def collect(self) -> Iterator[Metric]:
        n = self.node
        replicas = family("meshd_models_replicas")
        desired = family("meshd_models_desired_replicas")
        demand = family("meshd_models_demand")
        util = family("meshd_models_utilisation")
        refused = family("meshd_models_refused")
        p = self.models.current_plan()
        work = self.models.demand()
        record = self.models.record()
        for key, mp in sorted(p.models.items()):
            counts = dict.fromkeys(STATES, 0)
            for rep in record.get(key).replicas.values():
                counts[rep.state] = counts.get(rep.state, 0) + 1
            for state, count in counts.items():
                replicas.add_metric([n, key, state], count)
            desired.add_metric([n, key], mp.desired)
            name = key.partition(":")[0]
            demand.add_metric([n, key], work.get(name, 0.0))
            util.add_metric([n, key], work.get(name, 0.0) / mp.ready if mp.ready else 0.0)
            if mp.refused:
                refused.add_metric([n, key, mp.refused], 1)
        yield from (replicas, desired, demand, util, refused)


class ModelMetrics:
    """What this node's controller and Triton did, observed as it happens."""

    def __init__(self, node: str, registry: CollectorRegistry) -> None:
        self.node = node
        self.decisions = counter("meshd_models_decisions", registry)
        self.loads = histogram("meshd_models_load_seconds", registry)

    def decided(self, op: str) -> None:
        self.decisions.labels(self.node, op).inc()

    def loaded(self, seconds: float, ok: bool) -> None:
        self.loads.labels(self.node, "ok" if ok else "failed").observe(seconds)
