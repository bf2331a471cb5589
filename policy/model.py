"""The policy kinds, their fields, and :func:`validate`.

A policy document is a kubectl-like envelope::

    kind: SloClass          # which schema `spec` follows (see KINDS)
    name: interactive       # the object's name, unique per kind
    version: 7              # optional: the version `meshctl policy get` printed; not validated
    spec:                   #   beyond being a non-negative integer, and not part of the Document
      deadline_ms: 250

Validation is strict — unknown fields, wrong types (``true`` is not 1), NaN/inf, overlong strings
and lists, and duplicates are rejected with a :class:`PolicyError` naming the field — and it
normalizes: every field is present in ``Document.spec`` with its default filled in, so readers of
a spec never need their own defaults. Normalization is idempotent:
``validate(doc.to_dict()) == doc``.

Kinds and their Raft group (``policy`` holds operator intent; ``placements`` is written by the
training scheduler and changes far more often, so it is replicated separately):

NodeFlags (policy; name = node name) — operator flags on one node:
    cordoned (bool, default false): take no new placements or routing targets; running work stays.
    draining (null | {deadline_unix}): finish in-flight work and take nothing new;
        ``deadline_unix`` (seconds since the epoch, > 0) is when remaining work may be cut off.
    quarantined (null | {reason, auto}): suspected bad hardware or software; nothing is
        scheduled or routed to the node. ``reason`` is 1..256 printable characters, shown to
        operators; ``auto`` (bool, default false) marks a quarantine the node's own health
        monitor wrote (see HealthPolicy), which only it lifts by itself.

HealthPolicy (policy; name = a node name, or ``default`` for every node without its own) —
when a node quarantines itself (meshd/control/health.py) and when it lifts that quarantine:
    auto_quarantine (bool, default true): whether the node quarantines itself at all.
    ecc_uncorrected (int >= 1, default 1): uncorrected (volatile) ECC errors on one GPU that
        quarantine it; errors an operator has already seen (by lifting the quarantine) do
        not count again.
    thermal_seconds (number > 0, default 60): a GPU held back by thermal throttling
        (``hw_thermal``, ``sw_thermal``, ``hw_slowdown``) this long without a break.
    failure_ratio (number in (0, 1], default 0.5) and failure_min (int >= 1, default 10): a
        runtime whose inferences over the last failure_seconds failed at least this often and
        at least this many times keeps failing.
    failure_seconds (number > 0, default 30): that window.
    lift_after_seconds (number > 0 | null, default 600): an automatic quarantine is lifted
        after the node has been healthy this long (doubled for each repeat, up to a day);
        null = only an operator lifts it.

TenantQuota (policy; name = tenant) — admission limits for one tenant:
    requests_per_second (number > 0 | null, default null = unlimited): sustained request rate.
    burst (int >= 1 | null, default null = one second of requests_per_second): token-bucket
        depth; ignored while requests_per_second is null.
    concurrency (int >= 1 | null, default null = unlimited): requests in flight at once.
    priority (int 0..9, default 5): higher is more important when capacity is short.
    training_gpus (int >= 0 | null, default null = unlimited): GPUs (CPU slots for CPU jobs)
        the tenant's training jobs may hold at once; more wait queued.

SloClass (policy; name = class) — latency objective a request names:
    deadline_ms (number in (0, 3600000], required): end-to-end deadline in milliseconds.
    hedging (bool, default true): whether a second copy may be sent to another target.
    hedge_after_ms (number > 0 | null, default null = chosen from observed latency): fixed hedge
        delay in milliseconds; must be < deadline_ms.
    shed_priority (int 0..9, default 5): under overload, lower classes are shed first.

ModelPin (policy; name = model or ``model:revision``) — where a model may be served:
    nodes ([node name], default [] = any node): nodes the model is pinned to.
    zones ([string], default [] = any zone): zones it may run in.
    gpu_types ([string], default [] = any): GPU product names, e.g. "A100-SXM4-80GB".
    min_free_vram_mb (int >= 0, default 0): free GPU memory (MiB) a target must have.
    min_replicas (int >= 0, default 0): replicas to keep loaded.
    max_replicas (int >= 1 | null, default null = no cap): replicas demand may add, at most;
        must be >= min_replicas.

RoutingPolicy (policy; name = model, or ``default`` for every model without its own) — how
requests for a model are ranked, admitted and hedged (meshd/score/):
    strategy (name, default "hybrid"): the strategy that ranks targets: ``baseline_rr``,
        ``least_queue``, ``p2c``, ``hybrid``, or one a plugin registers (entry point group
        ``meshd.strategies``); a name no agent knows falls back to ``p2c``, counted.
    shadow (name | null, default null): a candidate strategy run beside the active one; how
        often and by how much their picks differ is exported, its picks are never used.
    max_targets (int 1..64, default 4): targets returned per decision (the first, hedge and
        failover candidates).
    stale_after_ms (number > 0, default 10000): a target whose queue figure is older is left
        out; when every target is that old, decisions fall back to this agent's own
        observations (``degraded``).
    hedge_budget (number in [0, 1], default 0.05): hedges as a share of requests, at most.
    hedge_quantile (number in [0.5, 0.999], default 0.99): hedge after this quantile of the
        target's observed latency, or after 3x the request's prediction if that is sooner.
        Not lower by default: at p95 the ordinary tail alone spends a 5% budget, leaving no
        hedges for the stalls they are for.
    randomization (number in [0, 1], default 0.1): ``hybrid``'s bounded jitter, as a share of
        the best predicted seconds, so many routers do not herd onto one replica.
    zone_penalty_ms (number >= 0, default 2): added to targets outside the router's zone.
    max_concurrency (int >= 1 | null, default null = adaptive only): requests for the model in
        flight from one agent, at most.
    standing_queue_ms (number >= 0, default 100; 0 = off): overload shedding.  When the wait
        a request would see at its first-ranked replica has stayed above this (or above four
        of its service times, if more) for a second, requests that would wait longer are shed
        (``standing_queue``) until the wait has stayed below it for a second: a queue that
        outlasts a second is overload, not a burst, and holding it near the target instead of
        at the clients' deadlines lets the fleet recover at once when the load falls
        (meshd/score/standing.py).

ModelPlacement (policy; name = model or ``model:revision``) — where the placement controller
has put a model (meshd/models).  Written only by its commands (command format 2), never by
``policy apply``; a projection of :class:`meshd.models.record.PlacementRecord`:
    gen (int >= 0): the model's generation (each decision bumps it; decisions are fenced by it).
    replicas ({node: {model, node, gpu, state, load, since, footprint_bytes, reason, failed}}):
        state "loading" | "ready" | "draining"; ``load`` the decision that made it.
    failures ({node: {node, at, reason, count}}): failed loads per node (the back-off).
    low_since (unix s | null), low_peak (int): the scale-down cool-down's bookkeeping.
    refused (string), refused_reason (string): why it cannot be placed ("" = it can).

TrainingPlacement (placements; name = job id) — where a training job runs:
    node (node name, required): the node the job is placed on.
    gpus ([string], default [] = a CPU-only job): GPU UUIDs or indices on that node.
    vram_mb (int >= 0, default 0): GPU memory (MiB) reserved per GPU.
    state ("pending" | "running" | "done" | "failed", default "pending").
    lease (null | {holder, expires_unix}): the trainer daemon holding the job and when its soft
        lease lapses (seconds since the epoch); an expired lease lets the scheduler move the job.
    progress (number 0..1, default 0): fraction done, reported with each lease renewal.
    parts ([{node, gpus, outcome}], default [] = the one part above): a gang's nodes in rank
        order, each with its GPUs and, once its rank has exited, its outcome.

TrainingJob (placements; name = job id) — a submitted job and how it is doing.  Written only
by the scheduler's commands (``meshctl jobs``), never by ``policy apply``:
    job (object, required): the spec as submitted (meshd.train.spec.JOB_SPEC, normalized).
    state ("queued" | "placed" | "running" | "done" | "failed" | "cancelled").
    attempt (int >= 0): leases granted so far; node, gpus, token: the current (or last) one
        (for a gang, rank 0's node and GPUs; parts: every node's, in rank order).
    progress, step, loss, checkpoint, message: what the trainer last reported.
    tried ([node]): nodes whose lease lapsed, skipped by later placements.
    lapses (int >= 0): attempts lost (a lease lapsed, or the job exited to retry); the job
        fails at the fifth.
    ran_on ([node]): the node of each attempt, in order (where its log is).
    cancel (bool): cancellation asked while a trainer holds the job.
    submitted_at, queued_at (last entered the queue), started_at, ended_at (unix s | null).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from policy.errors import PolicyError
from policy.fields import (
    Boolean,
    Choice,
    Field,
    Integer,
    ListOf,
    Number,
    Object,
    Raw,
    Text,
    gpu_id_check,
    join,
    name_check,
    number_text,
    required,
    show,
)

__all__ = [
    "GROUPS", "JOB_STATES", "KIND_FORMAT", "KINDS", "SPECS", "TRAINING_STATES", "Document",
    "PolicyError",
    "copy_plain", "defaults", "schedulable", "validate", "validate_key",
]

GROUPS = ("policy", "placements")
"""The Raft groups documents live in."""

JOB_STATES = ("queued", "placed", "running", "done", "failed", "cancelled")
"""Life cycle of a TrainingJob; the last three are final."""

TRAINING_STATES = ("pending", "running", "done", "failed")
"""Life cycle of a TrainingPlacement."""


def _slo_cross(spec: dict[str, Any], path: str) -> None:
    hedge = spec["hedge_after_ms"]
    if hedge is not None and hedge >= spec["deadline_ms"]:
        raise PolicyError(join(path, "hedge_after_ms"),
                          f"must be < deadline_ms ({number_text(spec['deadline_ms'])}), "
                          f"got {number_text(hedge)}")


def _pin_cross(spec: dict[str, Any], path: str) -> None:
    cap = spec["max_replicas"]
    if cap is not None and cap < spec["min_replicas"]:
        raise PolicyError(join(path, "max_replicas"),
                          f"must be >= min_replicas ({spec['min_replicas']}), got {cap}")


_PART = Object({
    "node": required(name_check(), "the part's node"),
    "gpus": Field(ListOf(Text(1, 128)), [], "its GPUs (or CPU slots)"),
    "outcome": Field(Text(0, 32), "", "set once its rank has exited"),
})
"""One node's part of a gang lease (TrainingPlacement and TrainingJob ``parts``)."""

SPECS: Mapping[str, Object] = {
    "NodeFlags": Object({
        "cordoned": Field(Boolean(), False, "no new placements or routing targets"),
        "draining": Field(Object({
            "deadline_unix": required(Number(gt=0), "when remaining work may be cut off (s)"),
        }, nullable=True), None, "finish in-flight work, take nothing new"),
        "quarantined": Field(Object({
            "reason": required(Text(1, 256), "why, for operators"),
            "auto": Field(Boolean(), False, "written by the node's health monitor"),
        }, nullable=True), None, "nothing is scheduled or routed here"),
    }),
    "HealthPolicy": Object({
        "auto_quarantine": Field(Boolean(), True, "may the node quarantine itself"),
        "ecc_uncorrected": Field(Integer(ge=1), 1, "uncorrected ECC errors on a GPU"),
        "thermal_seconds": Field(Number(gt=0), 60.0, "continuous thermal throttling (s)"),
        "failure_ratio": Field(Number(gt=0, le=1), 0.5, "failed share of inferences"),
        "failure_min": Field(Integer(ge=1), 10, "failed inferences, at least"),
        "failure_seconds": Field(Number(gt=0), 30.0, "window for the failure rule (s)"),
        "lift_after_seconds": Field(Number(gt=0, nullable=True), 600.0,
                                    "healthy this long lifts it; null = operator only"),
    }),
    "TenantQuota": Object({
        "requests_per_second": Field(Number(gt=0, nullable=True), None, "null = unlimited"),
        "burst": Field(Integer(ge=1, nullable=True), None, "token-bucket depth"),
        "concurrency": Field(Integer(ge=1, nullable=True), None, "in flight; null = unlimited"),
        "priority": Field(Integer(ge=0, le=9), 5, "higher is more important"),
        "training_gpus": Field(Integer(ge=0, nullable=True), None,
                               "GPUs/slots its training jobs hold at once; null = unlimited"),
    }),
    "SloClass": Object({
        "deadline_ms": required(Number(gt=0, le=3_600_000), "end-to-end deadline (ms)"),
        "hedging": Field(Boolean(), True, "may a second copy be sent"),
        "hedge_after_ms": Field(Number(gt=0, nullable=True), None, "fixed hedge delay (ms)"),
        "shed_priority": Field(Integer(ge=0, le=9), 5, "lower is shed first"),
    }, cross=_slo_cross),
    "ModelPin": Object({
        "nodes": Field(ListOf(name_check()), [], "pinned nodes; empty = any"),
        "zones": Field(ListOf(Text(1, 64)), [], "allowed zones; empty = any"),
        "gpu_types": Field(ListOf(Text(1, 128)), [], "allowed GPU products; empty = any"),
        "min_free_vram_mb": Field(Integer(ge=0), 0, "free GPU memory a target needs (MiB)"),
        "min_replicas": Field(Integer(ge=0), 0, "replicas to keep loaded"),
        "max_replicas": Field(Integer(ge=0, nullable=True), None,
                              "replicas at most; null = no cap; 0 = not served"),
        "config": Field(Text(0, 65536), "",
                        "Triton model config (JSON) every replica loads with; '' = its own"),
    }, cross=_pin_cross),
    "RoutingPolicy": Object({
        "strategy": Field(name_check(), "hybrid", "strategy that ranks targets"),
        "shadow": Field(name_check(nullable=True), None, "candidate run beside it; null = none"),
        "max_targets": Field(Integer(ge=1, le=64), 4, "targets returned per decision"),
        "stale_after_ms": Field(Number(gt=0, le=3_600_000), 10_000.0,
                                "older queue figures are left out (ms)"),
        "hedge_budget": Field(Number(ge=0, le=1), 0.05, "hedges per request, at most"),
        "hedge_quantile": Field(Number(ge=0.5, le=0.999), 0.99,
                                "hedge after this latency quantile"),
        "randomization": Field(Number(ge=0, le=1), 0.1, "hybrid's bounded jitter"),
        "zone_penalty_ms": Field(Number(ge=0, le=60_000), 2.0, "cost of leaving the zone (ms)"),
        "max_concurrency": Field(Integer(ge=1, nullable=True), None,
                                 "in flight per model from one agent; null = adaptive only"),
        "standing_queue_ms": Field(Number(ge=0, le=3_600_000), 100.0,
                                   "shed once the wait stays above this for 1 s; 0 = off"),
    }),
    "ModelPlacement": Object({
        "gen": Field(Integer(ge=0), 0, "generation: decisions applied so far"),
        "replicas": Field(Raw(nullable=False), {}, "node -> replica (state, GPU, load)"),
        "failures": Field(Raw(nullable=False), {}, "node -> failed loads (the back-off)"),
        "low_since": Field(Number(ge=0, nullable=True), None, "demand low since (unix s)"),
        "low_peak": Field(Integer(ge=0), 0, "replicas demand needed while low"),
        "refused": Field(Text(0, 64), "", "why it cannot be placed: a code; '' = it can"),
        "refused_reason": Field(Text(0, 1024), "", "why, in words"),
    }),
    "TrainingPlacement": Object({
        "node": required(name_check(), "node the job runs on"),
        "gpus": Field(ListOf(gpu_id_check()), [], "GPU UUIDs or indices; empty = CPU job"),
        "vram_mb": Field(Integer(ge=0), 0, "GPU memory reserved per GPU (MiB)"),
        "state": Field(Choice(TRAINING_STATES), "pending", "life-cycle state"),
        "lease": Field(Object({
            "holder": required(Text(1, 256), "trainer daemon holding the job"),
            "expires_unix": required(Number(gt=0), "when the lease lapses (s since epoch)"),
        }, nullable=True), None, "soft lease; expired = the job may move"),
        "progress": Field(Number(ge=0, le=1), 0.0, "fraction done"),
        "parts": Field(ListOf(_PART, max_len=256, unique=False), [],
                       "a gang's nodes in rank order; [] = the one part above"),
    }),
    "TrainingJob": Object({
        "job": required(Raw(nullable=False), "the spec as submitted"),
        "state": Field(Choice(JOB_STATES), "queued", "life-cycle state"),
        "attempt": Field(Integer(ge=0), 0, "leases granted so far"),
        "node": Field(Text(0, 256), "", "node of the current or last lease"),
        "gpus": Field(ListOf(Text(1, 128)), [], "its GPUs (or CPU slots)"),
        "token": Field(Integer(ge=0), 0, "its fencing token"),
        "parts": Field(ListOf(_PART, max_len=256, unique=False), [],
                       "every node of the current or last lease, in rank order"),
        "progress": Field(Number(ge=0, le=1), 0.0, "fraction done"),
        "step": Field(Integer(ge=0), 0, "training step last reported"),
        "loss": Field(Number(nullable=True), None, "loss last reported"),
        "checkpoint": Field(Text(0, 1024), "", "latest checkpoint the trainer reported"),
        "message": Field(Text(0, 1024), "", "last event, in words"),
        "tried": Field(ListOf(Text(1, 256), unique=False), [], "nodes whose lease lapsed"),
        "lapses": Field(Integer(ge=0), 0, "attempts lost (lapsed, or retry); MAX_ATTEMPTS "
                                          "fails it"),
        "ran_on": Field(ListOf(Text(1, 256), unique=False), [],
                        "the node of each attempt, in order (the last MAX_LIST)"),
        "cancel": Field(Boolean(), False, "cancellation asked while held"),
        "submitted_at": Field(Number(ge=0, nullable=True), None, "unix seconds"),
        "queued_at": Field(Number(ge=0, nullable=True), None,
                           "when it last entered the queue (unix s)"),
        "started_at": Field(Number(ge=0, nullable=True), None, "first progress (unix s)"),
        "ended_at": Field(Number(ge=0, nullable=True), None, "final state (unix s)"),
    }),
}
"""Each kind's spec schema (field checkers, defaults and one-line docs)."""

KINDS: Mapping[str, str] = {
    "NodeFlags": "policy",
    "TenantQuota": "policy",
    "SloClass": "policy",
    "ModelPin": "policy",
    "HealthPolicy": "policy",
    "RoutingPolicy": "policy",
    "ModelPlacement": "policy",
    "TrainingPlacement": "placements",
    "TrainingJob": "placements",
}
"""Kind -> the Raft group that replicates it."""

KIND_FORMAT: Mapping[str, int] = {"ModelPlacement": 2}
"""Kinds written only by commands of a newer format (see :data:`policy.store.COMMAND_VERSION`):
a store holding none of them leaves them out of its snapshot, so a build that predates them
can still load it."""

_ENVELOPE = ("kind", "name", "spec", "version")
_KIND = Choice(tuple(KINDS))  # for its description only
_NAME = name_check()
_VERSION = Integer(ge=0)


@dataclass(frozen=True)
class Document:
    """A validated, normalized policy document.

    ``spec`` holds every field of the kind with defaults filled in, as plain JSON data; treat it
    as read-only (``to_dict()`` returns a copy). ``version`` is the optional envelope version
    the input carried (for optimistic concurrency in ``meshctl``); it is not part of the
    document's identity or equality.
    """

    kind: str
    name: str
    spec: dict[str, Any]
    version: int | None = field(default=None, compare=False)

    @property
    def key(self) -> tuple[str, str]:
        """``(kind, name)``: the document's identity in a store."""
        return (self.kind, self.name)

    def to_dict(self) -> dict[str, Any]:
        """``{"kind", "name", "spec"}`` as fresh plain data."""
        return {"kind": self.kind, "name": self.name, "spec": copy_plain(self.spec)}


def validate(raw: object) -> Document:
    """Check a raw envelope and return its normalized :class:`Document`.

    Raises :class:`PolicyError` — and nothing else, whatever ``raw`` is.
    """
    if not isinstance(raw, dict):
        raise PolicyError("document", "must be an object with kind, name and spec, got "
                          + show(raw))
    for key in raw:  # unknown keys first: "apiVersion: unknown field" beats a confusing later error
        if not isinstance(key, str):
            raise PolicyError(join("", key), "field names must be strings")
        if key not in _ENVELOPE:
            raise PolicyError(join("", key), "unknown field; expected one of "
                              + ", ".join(_ENVELOPE))
    if "kind" not in raw:
        raise PolicyError("kind", f"required ({_KIND.what})")
    if "name" not in raw:
        raise PolicyError("name", f"required ({_NAME.what})")
    kind, name = validate_key(raw["kind"], raw["name"])
    version = _VERSION(raw["version"], "version") if raw.get("version") is not None else None
    spec = raw.get("spec")
    spec = SPECS[kind]({} if spec is None else spec, "spec")  # `spec:` alone in YAML is null
    return Document(kind, name, spec, version)


def validate_key(kind: object, name: object) -> tuple[str, str]:
    """Check a ``(kind, name)`` pair on its own (deletes and reads carry no document)."""
    if not isinstance(kind, str) or kind not in KINDS:
        raise PolicyError("kind", f"unknown kind {show(kind)}; expected one of "
                          + ", ".join(KINDS))
    return str.__str__(kind), _NAME(name, "name")


def defaults(kind: str) -> dict[str, Any]:
    """The spec of ``kind`` with every optional field at its default.

    Raises PolicyError for kinds with required fields (SloClass, TrainingPlacement).
    """
    validate_key(kind, "x")
    result: dict[str, Any] = SPECS[kind]({}, "spec")
    return result


def schedulable(flags_spec: Mapping[str, Any]) -> bool:
    """Whether a node with these NodeFlags may receive new work: no flag set."""
    return not (flags_spec.get("cordoned") or flags_spec.get("draining") is not None
                or flags_spec.get("quarantined") is not None)


def copy_plain(value: Any) -> Any:
    """Copy normalized plain data (dicts and lists of scalars; shallow depth by construction)."""
    if isinstance(value, dict):
        return {k: copy_plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [copy_plain(v) for v in value]
    return value
