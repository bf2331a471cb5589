"""Every Prometheus metric meshd exports: name, type, labels and meaning, in one table.

The collectors build their families from this table (:func:`family`, :func:`histogram`), so
a metric cannot be exported under a name, type or label set that is not written here, and
``docs/metrics.md`` is generated from it (``python -m meshd.metrics.schema > docs/metrics.md``;
a test fails when the page and the table differ).

Names are ``meshd_<layer>_<what>_<unit>``: ``<layer>`` is one of :data:`LAYERS`; ``<unit>`` is
a base unit (:data:`UNITS`) where the value has one, and otherwise names what is counted
(``_requests``, ``_probes``) or, for 0/1 and enumerated gauges, the condition itself
(``_ready``, ``_up``, ``_state``).  Counters gain ``_total`` in the exposition, histograms
``_bucket``/``_sum``/``_count``.

Labels come from :data:`LABELS` only: the shared schema (``model, revision, runtime, node,
gpu_uuid, tenant, zone``) and a few bounded ones, each with what bounds it.  No label takes a
value that grows without bound (request ids, timestamps, free text).
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Sample
from prometheus_client.utils import floatToGoString

from meshd.score.scorer import REQUEST_BUCKETS, STRATEGY_BUCKETS
from meshd.score.shadow import DIFF_BUCKETS

Kind = Literal["counter", "gauge", "histogram"]

LAYERS = {
    "gossip": "SWIM membership and its transport (gossip/)",
    "topology": "Vivaldi coordinates and RTT estimates (topology/)",
    "security": "identities, certificates, refusals (certs/, meshd/security/plane.py)",
    "raft": "each Raft group on a coordinator (consensus/)",
    "consensus": "writes and log-following as every node does them (meshd/control/plane.py)",
    "policy": "the policy documents in force (policy/)",
    "runtime": "inference runtimes (Triton) this node polls (adapters/)",
    "gpu": "GPUs this node reads through NVML (adapters/)",
    "signal": "telemetry gossiped between nodes (meshd/signals/plane.py)",
    "health": "the node's own health checks and automatic quarantine",
    "score": "the scoring API: admission, ranking, hedging, outcomes (meshd/score/)",
    "router": "the router role's ingress (meshd/router/)",
    "train": "training jobs, leases and collectives (meshd/train/)",
    "models": "model replicas placed across the fleet (meshd/models/)",
}

UNITS = {
    "seconds": "a duration",
    "timestamp_seconds": "a Unix time",
    "bytes": "a size",
    "ratio": "a fraction (0-1) or a relative error",
    "celsius": "a temperature",
    "watts": "a power draw",
}

LABELS = {
    "node": "the node that exports the series (its mesh name)",
    "model": "a model's name, as the runtime serves it",
    "revision": "a model's version (\"\" for any)",
    "runtime": "the runtime kind: triton",
    "gpu_uuid": "an NVML GPU UUID (or MIG instance UUID)",
    "tenant": "a tenant's name (\"\" for the default tenant); bounded by TenantQuota policies "
              "and the tenants that submit jobs",
    "zone": "a zone name from the nodes' --zone",
    "target": "the node a request was sent to (a mesh member)",
    "endpoint": "a runtime's gRPC address as configured with --triton",
    "status": "a member status (alive, suspect, dead, left) or an outcome status (OK, ERROR, "
              "UNAVAILABLE, TIMEOUT, CANCELLED, OVERLOADED)",
    "result": "ok / failed, or a push-pull's completed / served / failed",
    "direction": "sent / received",
    "reason": "a fixed reason code named by the code that counts it",
    "channel": "a security channel: admin, gossip_stream, enrollment, raft, ...",
    "op": "an operation kind from a fixed list (enroll/renew; all_reduce, all_gather, "
          "reduce_scatter, broadcast, all_to_all, other; load, unload, forget, low, refuse)",
    "group": "a Raft group: policy, placements",
    "path": "local / forwarded",
    "outcome": "a fixed outcome code",
    "kind": "a fixed kind code",
    "cause": "ecc / thermal / runtime",
    "action": "quarantine / lift / failed",
    "strategy": "a routing strategy's registered name",
    "why": "a fixed reason code",
    "code": "a gRPC status name, or no_targets / scorer_unavailable; a placement refusal: "
            "too_large, gpu_type, backoff, few_nodes, no_node",
    "active": "the model's active strategy",
    "candidate": "a shadow strategy",
    "via": "how a node's telemetry arrived: gossip / direct / self",
    "process": "a router process: agent, a worker life (bounded at 256), retired",
    "state": "a training job state: queued, placed, running, done, failed, cancelled; a model "
             "replica's: loading, ready, draining",
}
SHARED_LABELS = ("model", "revision", "runtime", "node", "gpu_uuid", "tenant", "zone")


@dataclass(frozen=True, slots=True)
class Spec:
    name: str
    kind: Kind
    help: str
    labels: tuple[str, ...]
    unit: str = ""
    buckets: tuple[float, ...] = ()
    """Histograms only: the upper bounds (seconds, or the metric's unit)."""

    @property
    def layer(self) -> str:
        return self.name.split("_")[1]


def _s(name: str, kind: Kind, help: str, *labels: str, unit: str = "",
       buckets: tuple[float, ...] = ()) -> Spec:
    return Spec(name, kind, help, ("node", *labels), unit, buckets)


RTT_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)
RATIO_BUCKETS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.5, 1.0, 2.0, 5.0)
WRITE_BUCKETS = (0.0005, 0.001, 0.002, 0.003, 0.005, 0.0075, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5,
                 1.0, 2.5, 5.0)
LOAD_BUCKETS = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
COLLECTIVE_BUCKETS = (0.0001, 0.0005, 0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 30.0)

C: Kind = "counter"
G: Kind = "gauge"
H: Kind = "histogram"

METRICS: dict[str, Spec] = {s.name: s for s in (
    # --- gossip ---
    _s("meshd_gossip_members", G, "Members by status as seen here", "status"),
    _s("meshd_gossip_probes", C, "Failure-detection probes by result", "result"),
    _s("meshd_gossip_indirect_probes", C, "Indirect probes requested"),
    _s("meshd_gossip_raised_suspicions", C, "Suspicions raised after failed probes"),
    _s("meshd_gossip_refuted_suspicions", C, "Suspected members that proved alive"),
    _s("meshd_gossip_refutations", C, "Suspicions of this node it refuted"),
    _s("meshd_gossip_name_conflicts", C, "Alive messages claiming a live name"),
    _s("meshd_gossip_packets", C, "UDP packets", "direction"),
    _s("meshd_gossip_packet_bytes", C, "UDP payload bytes", "direction", unit="bytes"),
    _s("meshd_gossip_dropped_packets", C, "Packets and streams dropped, by reason", "reason"),
    _s("meshd_gossip_push_pull_exchanges", C, "Push-pull exchanges by result", "result"),
    _s("meshd_gossip_push_pull_bytes", C, "Push-pull payload bytes", "direction",
       unit="bytes"),
    _s("meshd_gossip_broadcast_queue_messages", G, "Broadcasts waiting to be sent"),
    _s("meshd_gossip_health_score", G, "Lifeguard local health score (0 is healthy)"),
    _s("meshd_gossip_incarnation", G, "This node's incarnation"),
    _s("meshd_gossip_keyring_keys", G, "Gossip encryption keys in this node's keyring"),
    _s("meshd_gossip_probe_rtt_seconds", H, "Round-trip time of direct probes",
       unit="seconds", buckets=RTT_BUCKETS),
    # --- topology ---
    _s("meshd_topology_coordinate_error_ratio", G,
       "This node's Vivaldi error estimate (relative; 1.5 means not yet settled)", unit="ratio"),
    _s("meshd_topology_coordinate_height_seconds", G, "Height of this node's coordinate",
       unit="seconds"),
    _s("meshd_topology_coordinate_adjustment_seconds", G,
       "Adjustment term of this node's coordinate", unit="seconds"),
    _s("meshd_topology_known_coordinates", G, "Members whose coordinate this node knows"),
    _s("meshd_topology_coordinate_updates", C,
       "RTT samples applied to this node's coordinate"),
    _s("meshd_topology_coordinate_resets", C,
       "Times the coordinate became invalid and was reset"),
    _s("meshd_topology_rejected_samples", C,
       "RTT samples and peer coordinates refused, by reason", "reason"),
    _s("meshd_topology_rtt_estimate_error_ratio", H,
       "Relative error of the coordinate RTT estimate against each measured probe RTT",
       unit="ratio", buckets=RATIO_BUCKETS),
    # --- security ---
    _s("meshd_security_refusals", C, "Connections, calls and messages refused, by channel "
       "(admin, gossip_stream, enrollment, ...) and reason", "channel", "reason"),
    _s("meshd_security_renewals", C, "Certificate renewals of this node, by result",
       "result"),
    _s("meshd_security_issued_certificates", C, "Certificates this CA holder issued, by kind",
       "op"),
    _s("meshd_security_certificate_expiry_timestamp_seconds", G,
       "When this node's certificate expires", unit="timestamp_seconds"),
    _s("meshd_security_revoked_identities", G, "Identities this node refuses as revoked"),
    # --- raft / consensus / policy ---
    _s("meshd_policy_version", G, "Version of this node's read copy of each group", "group"),
    _s("meshd_raft_state", G, "Raft role: 0 follower, 1 candidate, 2 leader", "group"),
    _s("meshd_raft_term", G, "Current Raft term", "group"),
    _s("meshd_raft_commit_index", G, "Raft commit index", "group"),
    _s("meshd_raft_last_applied", G, "Last log index applied to the store", "group"),
    _s("meshd_raft_has_quorum", G, "1 when a write could commit now, as far as this node "
       "knows", "group"),
    _s("meshd_raft_voters", G, "Voters in the group's configuration", "group"),
    _s("meshd_raft_reachable_voters", G, "Voters heard from within the quorum window",
       "group"),
    _s("meshd_raft_journal_syncs", C, "Journal msync/fsync calls", "group"),
    _s("meshd_raft_journal_sync_seconds", C, "Time spent making the journal durable", "group",
       unit="seconds"),
    _s("meshd_consensus_forwarded_writes", C, "Writes this node forwarded to a coordinator",
       "group"),
    _s("meshd_consensus_follow_errors", C,
       "Ends of this node's log-following streams, by reason", "reason"),
    _s("meshd_consensus_write_seconds", H,
       "Time from a write entering this node to its commit (path: local or forwarded)",
       "group", "path", "outcome", unit="seconds", buckets=WRITE_BUCKETS),
    # --- runtime / gpu ---
    _s("meshd_runtime_replica_ready", G, "1 when the replica is ready",
       "model", "revision", "runtime"),
    _s("meshd_runtime_queue_requests", G, "Requests waiting in the runtime's queue",
       "model", "revision", "runtime"),
    _s("meshd_runtime_spu_seconds", G, "Seconds of compute per 32 KiB work unit (EWMA)",
       "model", "revision", "runtime", unit="seconds"),
    _s("meshd_runtime_latency_seconds", G, "Mean server-side latency per request (EWMA)",
       "model", "revision", "runtime", unit="seconds"),
    _s("meshd_runtime_queue_age_seconds", G, "Age of the queue figure this node holds",
       "model", "revision", "runtime", unit="seconds"),
    _s("meshd_runtime_polls", C, "Successful runtime polls", "runtime", "endpoint", "kind"),
    _s("meshd_runtime_poll_errors", C, "Failed runtime polls", "runtime", "endpoint",
       "reason"),
    _s("meshd_runtime_up", G, "1 when the runtime answers", "runtime", "endpoint"),
    _s("meshd_gpu_cpu_only", G, "1 when this node has no GPU telemetry (no NVML driver)"),
    _s("meshd_gpu_memory_free_bytes", G, "Free GPU memory", "gpu_uuid", unit="bytes"),
    _s("meshd_gpu_memory_total_bytes", G, "Total GPU memory", "gpu_uuid", unit="bytes"),
    _s("meshd_gpu_sm_utilization_ratio", G, "Fraction of time a kernel ran (0-1)", "gpu_uuid",
       unit="ratio"),
    _s("meshd_gpu_temperature_celsius", G, "GPU temperature", "gpu_uuid", unit="celsius"),
    _s("meshd_gpu_power_watts", G, "GPU power draw", "gpu_uuid", unit="watts"),
    _s("meshd_gpu_ecc_uncorrected_errors", G, "Volatile uncorrected ECC errors", "gpu_uuid"),
    _s("meshd_gpu_throttled", G, "1 when a clock-throttle reason worth acting on is active",
       "gpu_uuid"),
    # --- signal ---
    _s("meshd_signal_publications", C, "Telemetry published through gossip, by why",
       "reason"),
    _s("meshd_signal_rejected_updates", C,
       "Telemetry from peers or runtimes dropped, by reason", "reason"),
    _s("meshd_signal_patches", C,
       "Telemetry patches gossiped by peers, by what became of them", "outcome"),
    _s("meshd_signal_patch_rebases", C, "Times this node's patches moved their base (start: "
       "a new run; moved: the rows changed since it outgrew a patch)", "why"),
    _s("meshd_signal_patch_deferred_rows", C, "Row changes a patch held back to the next "
       "publication, as one publication's changes did not fit"),
    _s("meshd_signal_known_nodes", G, "Nodes whose telemetry this node holds, by path", "via"),
    _s("meshd_signal_staleness_seconds", G,
       "Age of the telemetry this node holds of each node's runtimes (the oldest figure "
       "the scorer would use)", "target", unit="seconds"),
    # --- health ---
    _s("meshd_health_problems", G, "Health problems this node sees in itself, by cause",
       "cause"),
    _s("meshd_health_actions", C, "Automatic quarantines written, lifted, or failed",
       "action"),
    _s("meshd_health_strikes", G, "Automatic quarantines in a row (each doubles the hold)"),
    # --- score ---
    _s("meshd_score_decisions", C, "Requests ranked, by the strategy that ranked them",
       "strategy"),
    _s("meshd_score_shed_requests", C, "Requests shed, by reason", "reason"),
    _s("meshd_score_fallback_decisions", C,
       "Decisions ranked by p2c because the model's strategy was unknown, over its time "
       "budget, or failed", "why"),
    _s("meshd_score_outcomes", C, "Outcomes routers reported, by status", "status"),
    _s("meshd_score_degraded_decisions", C,
       "Decisions made on this agent's own observations (every target's telemetry stale: "
       "partition or gossip down)"),
    _s("meshd_score_offered_hedges", C, "Decisions that offered a hedge delay"),
    _s("meshd_score_sent_hedges", C, "Hedges routers reported sending"),
    _s("meshd_score_unknown_outcomes", C,
       "Outcomes for decisions that had expired or never existed"),
    _s("meshd_score_expired_decisions", C,
       "Decisions released at their deadline because no router reported"),
    _s("meshd_score_open_decisions", G, "Decisions waiting for their outcome"),
    _s("meshd_score_decision_seconds", H, "Time a strategy took to rank one request",
       "strategy", unit="seconds", buckets=STRATEGY_BUCKETS),
    _s("meshd_score_request_seconds", H,
       "Time from a request's decision to its answer, for requests answered (what the "
       "client waited, less the router's parsing)", "model", unit="seconds",
       buckets=REQUEST_BUCKETS),
    _s("meshd_score_attempt_seconds", H,
       "Latency of each answered attempt, by model and the node it went to", "model",
       "target", unit="seconds", buckets=REQUEST_BUCKETS),
    _s("meshd_score_shadow_compared_decisions", C, "Decisions a shadow strategy also ranked",
       "model", "active", "candidate"),
    _s("meshd_score_shadow_differed_decisions", C,
       "Decisions where the shadow's first pick differed", "model", "active", "candidate"),
    _s("meshd_score_shadow_difference_seconds", H,
       "Predicted seconds of the shadow's pick minus the active pick's, where they differed "
       "(negative: the shadow's looked faster)", "model", "active", "candidate",
       unit="seconds", buckets=DIFF_BUCKETS),
    _s("meshd_score_target_concurrency_limit_requests", G,
       "Adaptive concurrency limit of each target (replica)", "model", "revision", "target",
       "endpoint"),
    _s("meshd_score_target_inflight_requests", G,
       "Requests this agent admitted to each target, in flight", "model", "revision",
       "target", "endpoint"),
    _s("meshd_score_hedge_budget_exhausted", C,
       "Hedges not offered because the model's hedge budget was spent", "model"),
    # --- router ---
    _s("meshd_router_process_requests", C,
       "Inference requests received by each process serving the router port (agent, or a "
       "worker process's life)", "process"),
    _s("meshd_router_requests", C, "Inference requests received (queued for a decision)"),
    _s("meshd_router_admitted_requests", C,
       "Requests admitted and sent to their first target (started)"),
    _s("meshd_router_completed_requests", C, "Inference requests answered"),
    _s("meshd_router_invalid_requests", C,
       "Requests rejected as invalid (never sent to a runtime)"),
    _s("meshd_router_cancelled_requests", C, "Requests whose client went away"),
    _s("meshd_router_inflight_requests", G,
       "Requests received and not yet ended (waiting for a decision or for a runtime)"),
    _s("meshd_router_hedged_requests", C, "Requests that sent a hedge"),
    _s("meshd_router_hedge_won_requests", C, "Requests answered by their hedge"),
    _s("meshd_router_hedge_wasted_requests", C,
       "Requests whose hedge did not give the answer (the hedge's work was wasted)"),
    _s("meshd_router_failovers", C, "Attempts sent to the next target after an error"),
    _s("meshd_router_streams", C, "ModelStreamInfer streams opened"),
    _s("meshd_router_failed_requests", C, "Requests that failed, by gRPC status", "code"),
    _s("meshd_router_shed_requests", C, "Requests shed (RESOURCE_EXHAUSTED), by reason",
       "reason"),
    _s("meshd_router_link_messages", C,
       "Messages the agent took from its router worker processes over the score link: score, "
       "reports (outcomes), hedge; malformed frames closed the connection", "kind"),
    # --- train ---
    _s("meshd_train_jobs", G, "Training jobs in the placements group, by state and tenant",
       "state", "tenant"),
    _s("meshd_train_leases", G, "Live GPU leases (placements), each one job's"),
    _s("meshd_train_leased_gpus", G, "GPUs held by live leases, by tenant", "tenant"),
    _s("meshd_train_lost_attempts", G,
       "Attempts lost to lapsed leases, summed over the jobs held"),
    _s("meshd_train_local_ranks", G, "Ranks of training jobs running on this node"),
    _s("meshd_train_collective_seconds", H,
       "Time of each collective the ranks on this node reported", "op", unit="seconds",
       buckets=COLLECTIVE_BUCKETS),
    _s("meshd_train_collective_bytes", C, "Bytes moved by the collectives reported here",
       "op", unit="bytes"),
    # --- models ---
    _s("meshd_models_replicas", G,
       "Model replicas in the placement record (policy group), by state", "model", "state"),
    _s("meshd_models_desired_replicas", G,
       "Replicas the placement controller wants, from pins and demand (this node's view)",
       "model"),
    _s("meshd_models_demand", G,
       "Seconds of work per second the model's ready replicas do, over the fleet", "model"),
    _s("meshd_models_utilisation", G,
       "Demand per ready replica (0 without one): what an autoscaler scales on", "model"),
    _s("meshd_models_refused", G, "1 while the model cannot be placed, by reason code",
       "model", "code"),
    _s("meshd_models_decisions", C, "Placement decisions this node proposed and committed",
       "op"),
    _s("meshd_models_load_seconds", H, "Time this node's Triton took to load a replica",
       "outcome", unit="seconds", buckets=LOAD_BUCKETS),
)}


class Family(Metric):
    """A counter or gauge family of the table, filled at scrape time: rows of label values
    and a value.  :func:`meshd.metrics.exposition.render` writes the rows as they are; ``samples``
    builds ``prometheus_client`` samples from them on demand (``generate_latest``, tests).
    A large node has thousands of rows, and a ``Sample`` per row was a third of a scrape."""

    def __init__(self, spec: Spec) -> None:  # noqa: D107 - Metric.__init__ would add samples
        self.name = spec.name
        self.documentation = spec.help
        self.type = spec.kind
        self.unit = ""
        self.labels = spec.labels
        self.sample_name = spec.name + ("_total" if spec.kind == "counter" else "")
        self.rows: list[tuple[tuple[str, ...], float]] = []

    def add_metric(self, labels: Sequence[str], value: float) -> None:
        self.rows.append((tuple(labels), value))

    @property
    def samples(self) -> list[Sample]:
        return [Sample(self.sample_name, dict(zip(self.labels, values, strict=True)), value,
                       None) for values, value in self.rows]

    @samples.setter
    def samples(self, value: list[Sample]) -> None:
        raise AttributeError("a table family's samples are its rows (add_metric)")


class HistogramFamily(Metric):
    """A histogram family of the table from counts kept elsewhere: rows of label values,
    per-bucket counts (the last above every bound) and the sum."""

    def __init__(self, spec: Spec) -> None:
        self.name = spec.name
        self.documentation = spec.help
        self.type = "histogram"
        self.unit = ""
        self.labels = spec.labels
        self.le = [floatToGoString(b) for b in spec.buckets] + ["+Inf"]
        """The buckets' ``le`` labels, the last above every bound."""
        self.rows: list[tuple[tuple[str, ...], list[int], float]] = []

    def add(self, labels: Sequence[str], counts: Sequence[int], total: float) -> None:
        self.rows.append((tuple(labels), list(counts), total))

    def cumulative(self, counts: list[int]) -> list[tuple[str, int]]:
        """(``le``, count at or under it) of one row's per-bucket counts."""
        out, running = [], 0
        for le, n in zip(self.le, counts, strict=True):
            running += n
            out.append((le, running))
        return out

    @property
    def samples(self) -> list[Sample]:
        out = []
        for values, counts, total in self.rows:
            labels = dict(zip(self.labels, values, strict=True))
            cum = self.cumulative(counts)
            out += [Sample(self.name + "_bucket", {**labels, "le": le}, n, None)
                    for le, n in cum]
            out.append(Sample(self.name + "_count", labels, cum[-1][1], None))
            out.append(Sample(self.name + "_sum", labels, total, None))
        return out

    @samples.setter
    def samples(self, value: list[Sample]) -> None:
        raise AttributeError("a table histogram's samples are its rows (add)")


def family(name: str) -> Family:
    """An empty counter or gauge family for ``name``, as the table says."""
    spec = METRICS[name]
    assert spec.kind != "histogram", name
    return Family(spec)


def histogram_family(name: str) -> HistogramFamily:
    """An empty histogram family (for counts kept elsewhere, read at scrape time, in the
    table's buckets)."""
    spec = METRICS[name]
    assert spec.kind == "histogram", name
    return HistogramFamily(spec)


def counter(name: str, registry: CollectorRegistry) -> Counter:
    """A live ``prometheus_client`` counter for ``name`` in ``registry``."""
    spec = METRICS[name]
    assert spec.kind == "counter", name
    return Counter(name, spec.help, list(spec.labels), registry=registry)


def histogram(name: str, registry: CollectorRegistry) -> Histogram:
    """A live ``prometheus_client`` histogram for ``name`` in ``registry``."""
    spec = METRICS[name]
    assert spec.kind == "histogram", name
    return Histogram(name, spec.help, list(spec.labels), buckets=spec.buckets,
                     registry=registry)


def reference() -> str:
    """The Markdown reference page (``docs/metrics.md``)."""
    out = ["# Metrics reference", "",
           "Generated from `meshd/metrics/schema.py` by "
           "`python -m meshd.metrics.schema > docs/metrics.md`; do not edit by hand.", "",
           "Every agent serves these on `--metrics` (`/metrics`, default port 9464). Names are "
           "`meshd_<layer>_<what>_<unit>`; counters end in `_total` in the exposition, "
           "histograms add `_bucket`, `_sum` and `_count`.", "",
           "## Layers", "", "| layer | what |", "|---|---|"]
    out += [f"| `{k}` | {v} |" for k, v in LAYERS.items()]
    out += ["", "## Units", "", "| unit | meaning |", "|---|---|"]
    out += [f"| `{k}` | {v} |" for k, v in UNITS.items()]
    out += ["", "Where a value has no unit, the name ends in what it counts (`_requests`, "
            "`_probes`) or the condition it states (`_ready`, `_up`, `_state`).", "",
            "## Labels", "",
            "The shared schema is `" + ", ".join(SHARED_LABELS) + "`, used wherever it "
            "applies. Every label a metric may carry, and what bounds its values:", "",
            "| label | values |", "|---|---|"]
    out += [f"| `{k}` | {v} |" for k, v in LABELS.items()]
    for layer in LAYERS:
        specs = [s for s in METRICS.values() if s.layer == layer]
        out += ["", f"## {layer}", "", "| metric | type | labels | meaning |",
                "|---|---|---|---|"]
        for s in specs:
            shown = f"{s.name}_total" if s.kind == "counter" else s.name
            out.append(f"| `{shown}` | {s.kind} | {', '.join(s.labels)} | "
                       f"{s.help.replace('|', '/')} |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    sys.stdout.write(reference())
