"""The Grafana dashboards of a meshd fleet, written as data: ``python deploy/grafana/dashboards.py``
writes ``deploy/grafana/dashboards/*.json`` (Grafana's dashboard JSON model, schema 39).

Each panel is a title, a unit and its PromQL queries; tests/test_prometheus.py evaluates every
query against a real Prometheus scraping a live mesh, and fails when one does not parse or
returns nothing.  Metric names: docs/metrics.md.  Import the files in Grafana (or provision the
folder) and pick the Prometheus data source that scrapes the agents.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

OUT = Path(__file__).resolve().parent / "dashboards"
RATE = "$__rate_interval"
NODE = 'node=~"$node"'

Query = tuple[str, str]
"""(PromQL, legend)."""


def panel(title: str, unit: str, *queries: Query, kind: str = "timeseries",
          description: str = "") -> dict[str, Any]:
    return {"type": kind, "title": title, "description": description,
            "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
            "targets": [{"refId": chr(ord("A") + i), "expr": expr, "legendFormat": legend,
                         "datasource": {"type": "prometheus", "uid": "${datasource}"}}
                        for i, (expr, legend) in enumerate(queries)]}


def variable(name: str, query: str) -> dict[str, Any]:
    return {"name": name, "type": "query", "includeAll": True, "multi": True,
            "allValue": ".+", "current": {"text": "All", "value": "$__all"},
            "datasource": {"type": "prometheus", "uid": "${datasource}"},
            "query": {"query": query, "refId": f"{name}-var"}, "refresh": 2}


def dashboard(uid: str, title: str, panels: list[dict[str, Any]],
              variables: list[dict[str, Any]]) -> dict[str, Any]:
    laid = []
    for i, p in enumerate(panels):  # two columns, 8 rows high
        laid.append({"id": i + 1, "gridPos": {"h": 8, "w": 12, "x": 12 * (i % 2),
                                              "y": 8 * (i // 2)}, **p})
    source = {"name": "datasource", "type": "datasource", "query": "prometheus",
              "current": {}, "label": "Prometheus"}
    return {"uid": uid, "title": title, "tags": ["meshd"], "schemaVersion": 39, "version": 1,
            "editable": True, "refresh": "30s", "time": {"from": "now-1h", "to": "now"},
            "timezone": "", "panels": laid, "templating": {"list": [source, *variables]},
            "annotations": {"list": []}}


def p99(metric: str, by: str, selector: str = "", q: str = "0.99") -> str:
    return (f"histogram_quantile({q}, sum by (le, {by}) "
            f"(rate({metric}_bucket{{{selector}}}[{RATE}])))")


def rate(metric: str, by: str = "", selector: str = NODE) -> str:
    agg = f"sum by ({by}) " if by else "sum "
    return f"{agg}(rate({metric}{{{selector}}}[{RATE}]))"


NODE_VAR = variable("node", "label_values(meshd_gossip_members, node)")
MODEL_VAR = variable("model", "label_values(meshd_runtime_replica_ready, model)")

MESH = dashboard("meshd-mesh", "meshd / mesh health", [
    panel("Members by status (largest view)", "short",
          ("max by (status) (meshd_gossip_members)", "{{status}}")),
    panel("Alive members as each node sees them", "short",
          (f'meshd_gossip_members{{status="alive", {NODE}}}', "{{node}}")),
    panel("Suspicions raised / refuted", "ops",
          (rate("meshd_gossip_raised_suspicions_total", "node"), "raised {{node}}"),
          (rate("meshd_gossip_refuted_suspicions_total", "node"), "refuted {{node}}")),
    panel("Lifeguard health score (0 healthy)", "short",
          (f"meshd_gossip_health_score{{{NODE}}}", "{{node}}")),
    panel("Probe RTT", "s",
          (p99("meshd_gossip_probe_rtt_seconds", "node", NODE, "0.5"), "p50 {{node}}"),
          (p99("meshd_gossip_probe_rtt_seconds", "node", NODE), "p99 {{node}}")),
    panel("Vivaldi: estimate error vs measured RTT (p90)", "percentunit",
          (p99("meshd_topology_rtt_estimate_error_ratio", "node", NODE, "0.9"), "{{node}}"),
          (f"meshd_topology_coordinate_error_ratio{{{NODE}}}", "self-error {{node}}")),
    panel("Gossip bandwidth", "Bps",
          (rate("meshd_gossip_packet_bytes_total", "node, direction"),
           "{{direction}} {{node}}"),
          (rate("meshd_gossip_push_pull_bytes_total", "node, direction"),
           "push-pull {{direction}} {{node}}")),
    panel("Packets dropped, by reason", "pps",
          (rate("meshd_gossip_dropped_packets_total", "reason"), "{{reason}}")),
    panel("Broadcast queue", "short",
          (f"meshd_gossip_broadcast_queue_messages{{{NODE}}}", "{{node}}")),
    panel("Certificate time left", "s",
          (f"min by (node) (meshd_security_certificate_expiry_timestamp_seconds{{{NODE}}})"
           " - time()", "{{node}}")),
    panel("Refused connections and calls", "ops",
          (rate("meshd_security_refusals_total", "channel, reason"), "{{channel}} {{reason}}"),
          (f"{rate('meshd_security_refusals_total')} or vector(0)", "all (0: none refused)")),
    panel("Signal staleness (oldest runtime figure held)", "s",
          (f"max by (target) (meshd_signal_staleness_seconds{{{NODE}}})", "{{target}}")),
], [NODE_VAR])

MODEL = 'model=~"$model"'
INFERENCE = dashboard("meshd-inference", "meshd / inference", [
    panel("Request rate by model (answered)", "reqps",
          (rate("meshd_score_request_seconds_count", "model", MODEL), "{{model}}")),
    panel("Router lifecycle", "reqps",
          (rate("meshd_router_requests_total"), "received"),
          (rate("meshd_router_admitted_requests_total"), "admitted"),
          (rate("meshd_router_completed_requests_total"), "completed"),
          (rate("meshd_router_shed_requests_total"), "shed"),
          (rate("meshd_router_failed_requests_total"), "failed"),
          (rate("meshd_router_cancelled_requests_total"), "cancelled")),
    panel("Latency by model", "s",
          (p99("meshd_score_request_seconds", "model", MODEL, "0.5"), "p50 {{model}}"),
          (p99("meshd_score_request_seconds", "model", MODEL, "0.95"), "p95 {{model}}"),
          (p99("meshd_score_request_seconds", "model", MODEL), "p99 {{model}}")),
    panel("Latency p99 by model and target", "s",
          (p99("meshd_score_attempt_seconds", "model, target", MODEL),
           "{{model}} @ {{target}}")),
    panel("Runtime queue", "short",
          (f"sum by (model, node) (meshd_runtime_queue_requests{{{MODEL}}})",
           "{{model}} @ {{node}}")),
    panel("In flight", "short",
          (f"sum(meshd_router_inflight_requests{{{NODE}}})", "router"),
          (f"sum by (target) (meshd_score_target_inflight_requests{{{MODEL}}})",
           "admitted to {{target}}")),
    panel("Shed, by reason", "reqps",
          (rate("meshd_score_shed_requests_total", "reason"), "{{reason}}")),
    panel("Hedges: sent, won, wasted", "reqps",
          (rate("meshd_router_hedged_requests_total"), "hedged"),
          (rate("meshd_router_hedge_won_requests_total"), "won"),
          (rate("meshd_router_hedge_wasted_requests_total"), "wasted"),
          (rate("meshd_score_hedge_budget_exhausted_total", "model"),
           "held back by budget {{model}}")),
    panel("Hedge effectiveness (won / sent)", "percentunit",
          (f"{rate('meshd_router_hedge_won_requests_total')} / "
           f"clamp_min({rate('meshd_router_hedged_requests_total')}, 1e-9)", "won share")),
    panel("Decisions by strategy", "ops",
          (rate("meshd_score_decisions_total", "strategy"), "{{strategy}}"),
          (rate("meshd_score_fallback_decisions_total", "why"), "fallback {{why}}")),
    panel("Decision time p99 by strategy", "s",
          (p99("meshd_score_decision_seconds", "strategy", NODE), "{{strategy}}")),
    panel("Adaptive concurrency limit by target", "short",
          (f"max by (model, target) "
           f"(meshd_score_target_concurrency_limit_requests{{{MODEL}}})",
           "{{model}} @ {{target}}")),
    panel("Failovers and failures", "reqps",
          (rate("meshd_router_failovers_total"), "failovers"),
          (rate("meshd_router_failed_requests_total", "code"), "failed {{code}}")),
    panel("Replicas ready", "short",
          (f"sum by (model) (meshd_runtime_replica_ready{{{MODEL}}})", "{{model}}"),
          ("sum by (node) (meshd_runtime_up)", "runtimes up @ {{node}}")),
], [NODE_VAR, MODEL_VAR])

GPU = 'node=~"$node"'
GPUS = dashboard("meshd-gpus", "meshd / GPUs", [
    panel("SM utilization", "percentunit",
          (f"meshd_gpu_sm_utilization_ratio{{{GPU}}}", "{{node}} {{gpu_uuid}}")),
    panel("Memory used", "bytes",
          (f"meshd_gpu_memory_total_bytes{{{GPU}}} - meshd_gpu_memory_free_bytes{{{GPU}}}",
           "{{node}} {{gpu_uuid}}")),
    panel("Temperature", "celsius",
          (f"meshd_gpu_temperature_celsius{{{GPU}}}", "{{node}} {{gpu_uuid}}")),
    panel("Power", "watt",
          (f"meshd_gpu_power_watts{{{GPU}}}", "{{node}} {{gpu_uuid}}")),
    panel("Uncorrected ECC errors", "short",
          (f"meshd_gpu_ecc_uncorrected_errors{{{GPU}}}", "{{node}} {{gpu_uuid}}")),
    panel("Throttled", "short",
          (f"meshd_gpu_throttled{{{GPU}}}", "{{node}} {{gpu_uuid}}")),
    panel("Nodes without GPU telemetry (CPU-only)", "short",
          ("sum(meshd_gpu_cpu_only)", "cpu-only nodes")),
    panel("Health problems and automatic quarantines", "short",
          (f"sum by (cause) (meshd_health_problems{{{GPU}}})", "{{cause}}"),
          (f"sum by (action) (meshd_health_actions_total{{{GPU}}})", "{{action}}")),
], [NODE_VAR])

RAFT = dashboard("meshd-raft", "meshd / Raft and policy", [
    panel("Has quorum (by group, best view)", "short",
          ("max by (group) (meshd_raft_has_quorum)", "{{group}}")),
    panel("Leaders (should be 1 per group)", "short",
          ('count by (group) (meshd_raft_state == 2)', "{{group}}")),
    panel("Term", "short", ("max by (group) (meshd_raft_term)", "{{group}}")),
    panel("Commit rate", "ops",
          (f"max by (group) (rate(meshd_raft_commit_index[{RATE}]))", "{{group}}")),
    panel("Reachable voters / voters", "short",
          ("min by (group) (meshd_raft_reachable_voters)", "reachable {{group}}"),
          ("max by (group) (meshd_raft_voters)", "voters {{group}}")),
    panel("Write latency p99", "s",
          (p99("meshd_consensus_write_seconds", "group, path"), "{{group}} {{path}}")),
    panel("Journal sync time share", "percentunit",
          (rate("meshd_raft_journal_sync_seconds_total", "node, group"),
           "{{node}} {{group}}")),
    panel("Policy version per node (copies converge)", "short",
          (f"meshd_policy_version{{{NODE}}}", "{{node}} {{group}}")),
    panel("Forwarded writes and follow errors", "ops",
          (rate("meshd_consensus_forwarded_writes_total", "group"), "forwarded {{group}}"),
          (rate("meshd_consensus_follow_errors_total", "reason"), "follow error {{reason}}")),
], [NODE_VAR])

TRAINING = dashboard("meshd-training", "meshd / training", [
    panel("Jobs by state", "short",
          ("max by (state) (meshd_train_jobs)", "{{state}}")),
    panel("Jobs by tenant (queued and running)", "short",
          ('max by (tenant, state) (meshd_train_jobs{state=~"queued|running"})',
           "{{tenant}} {{state}}")),
    panel("Leases and leased GPUs", "short",
          ("max(meshd_train_leases)", "leases"),
          ("max by (tenant) (meshd_train_leased_gpus)", "GPUs {{tenant}}")),
    panel("Attempts lost to lapsed leases", "short",
          ("max(meshd_train_lost_attempts)", "lost attempts")),
    panel("Ranks running per node", "short",
          (f"meshd_train_local_ranks{{{NODE}}}", "{{node}}")),
    panel("Collective time p50 / p99 by op", "s",
          (p99("meshd_train_collective_seconds", "op", NODE, "0.5"), "p50 {{op}}"),
          (p99("meshd_train_collective_seconds", "op", NODE), "p99 {{op}}")),
    panel("Collective throughput", "Bps",
          (rate("meshd_train_collective_bytes_total", "node, op"), "{{op}} {{node}}")),
], [NODE_VAR])

# Model placement (docs/models.md): every node follows the policy group and exports the same
# per-model figures, so the record's panels take one view, max by (model), never a sum over
# nodes ($node picks whose view).  Decisions and loads are counted once, where they happened.
PLACED = 'node=~"$node", model=~"$model"'


def table(title: str, expr: str, description: str = "") -> dict[str, Any]:
    """An instant query shown as rows of labels (the value and time columns hidden)."""
    p = panel(title, "short", (expr, ""), kind="table", description=description)
    p["targets"][0].update({"instant": True, "range": False, "format": "table"})
    p["transformations"] = [{"id": "organize",
                             "options": {"excludeByName": {"Time": True, "Value": True}}}]
    return p


MODELS = dashboard("meshd-models", "meshd / models", [
    panel("Desired vs ready replicas by model", "short",
          (f"max by (model) (meshd_models_desired_replicas{{{PLACED}}})", "desired {{model}}"),
          (f'max by (model) (meshd_models_replicas{{state="ready", {PLACED}}})',
           "ready {{model}}"),
          description="Desired: pins and demand, as the controller plans it. Ready: replicas "
                      "the placement record holds as ready."),
    panel("Replicas by state", "short",
          (f"sum by (state) (max by (model, state) (meshd_models_replicas{{{PLACED}}}))",
           "{{state}} (all models)"),
          (f"max by (model, state) (meshd_models_replicas{{{PLACED}}})",
           "{{model}} {{state}}")),
    panel("Utilisation by model (demand per ready replica)", "percentunit",
          (f"max by (model) (meshd_models_utilisation{{{PLACED}}})", "{{model}}"),
          description="What autoscalers scale on; the controller adds replicas above its target "
                      "utilisation (--model-target-utilisation, 0.7 by default)."),
    panel("Demand by model (seconds of work per second)", "short",
          (f"max by (model) (meshd_models_demand{{{PLACED}}})", "{{model}}")),
    table("Models refused, by reason code",
          f"max by (model, code) (meshd_models_refused{{{PLACED}}})",
          description="Models the planner cannot place now, with the reason code "
                      "(meshctl models get MODEL explains it). Empty when every model is placed."),
    panel("Placement decisions by op", "ops",
          (rate("meshd_models_decisions_total", "op"), "{{op}}"),
          description="Counted once, on the node that proposed and committed them (the policy "
                      "leader), so summed over nodes."),
    panel("Replica load time p50 / p99 by outcome", "s",
          (p99("meshd_models_load_seconds", "outcome", NODE, "0.5"), "p50 {{outcome}}"),
          (p99("meshd_models_load_seconds", "outcome", NODE), "p99 {{outcome}}")),
    panel("Replica loads by outcome", "ops",
          (rate("meshd_models_load_seconds_count", "outcome"), "{{outcome}}")),
], [NODE_VAR, variable("model", "label_values(meshd_models_desired_replicas, model)")])

DASHBOARDS = {"mesh": MESH, "inference": INFERENCE, "gpus": GPUS, "raft": RAFT,
              "training": TRAINING, "models": MODELS}


def render(board: dict[str, Any]) -> str:
    return json.dumps(board, indent=2, sort_keys=True) + "\n"


def main() -> int:
    OUT.mkdir(exist_ok=True)
    for name, board in DASHBOARDS.items():
        (OUT / f"{name}.json").write_text(render(board))
    return 0


if __name__ == "__main__":
    sys.exit(main())
