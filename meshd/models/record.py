"""The replicated placement record: which model replicas are where, and in what state.

A pure state machine for a Raft group: :meth:`PlacementRecord.apply` takes a plain,
JSON-serialisable command and is a function of (state, command) alone (time is the ``at``
the proposing coordinator stamped).  Two kinds of command reach it:

* **decisions** of the placement controller (:mod:`meshd.models.plan`), each fenced by the
  model's *generation*: ``base`` is the generation it was planned against and ``id`` is
  ``"<model>#<base>"``.  A decision applies only when ``base`` equals the model's current
  generation, and bumps it.  So a decision applied twice (a retried proposal, a new leader
  re-proposing what its predecessor already committed) is recognised by its id and changes
  nothing, and a decision planned against an older state (a deposed leader's) is refused as
  ``stale``: two leaders can never both add a replica.
* **reports** from a node's Triton adapter (``op: report``): a load finished (``ready``) or
  failed (``failed``, with the reason), or a drained replica was unloaded (``unloaded``).
  A report names the load decision that made the replica, so a late report about an older
  replica on the same node is ignored; reports are idempotent and leave the generation
  alone (they do not conflict with decisions: every decision checks the replica it needs).

A replica's life: ``loading`` -> ``ready`` (reported) -> ``draining`` (an unload decision:
routers stop sending, the node waits for in-flight requests) -> gone (reported
``unloaded``).  A failed load leaves the replica table and is remembered as a
:class:`Failure` on that node (the planner backs off from it; the next successful load there
clears it).

Commands, all with ``at`` (seconds, stamped by the coordinator):

``{"op": "load", "id", "model", "base", "node", "gpu", "footprint_bytes", "reason"}``
    a new replica, ``loading``; ``gpu`` "" = a CPU slot.  Refused if the model already has
    a replica on that node (in any state).
``{"op": "unload", "id", "model", "base", "node", "reason", "failed"}``
    drain then unload a loading or ready replica; ``failed`` (bool) counts it as a failed
    load once unloaded (a load that never finished).
``{"op": "forget", "id", "model", "base", "node", "reason"}``
    drop a replica whose node has left the fleet (nobody is left to unload it).
``{"op": "low", "id", "model", "base", "since", "peak"}``
    demand has been low since ``since`` (null = not low), and ``peak`` replicas were the
    most it needed meanwhile: the scale-down cool-down survives a change of leader.
``{"op": "refuse", "id", "model", "base", "code", "reason"}``
    the model cannot be placed (``code`` "" clears it); shown to operators.
``{"op": "report", "model", "node", "load", "status", "reason"[, "footprint_bytes"]}``
    a node's outcome, ``status`` one of ``ready``, ``failed``, ``unloaded``; a ``ready``
    one may carry the GPU memory the load took (NVML before and after), which then sizes
    the model's next placements (``measured``).

``apply`` answers ``{"ok": True, "changed": bool, ...}`` or ``{"ok": False, "error":
"invalid" | "stale" | "conflict", "message"}``, and never raises.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any

LOADING, READY, DRAINING = "loading", "ready", "draining"
STATES = (LOADING, READY, DRAINING)
DECISION_OPS = ("load", "unload", "forget", "low", "refuse")
STATUSES = ("ready", "failed", "unloaded")
RECENT = 64
"""Decision ids each model remembers, to tell a repeat (no-op) from a stale decision."""
MAX_TEXT = 1024


@dataclass(frozen=True, slots=True)
class Replica:
    """One model loaded (or loading, or draining) on one node."""

    model: str
    node: str
    gpu: str
    """GPU id the footprint was reserved on; "" = a CPU slot."""
    state: str
    load: str
    """Id of the load decision that made it (reports name it)."""
    since: float
    """When it entered ``state``."""
    footprint_bytes: int = 0
    """Memory reserved for it at placement (0 = unknown)."""
    reason: str = ""
    """Why it was placed, or why it is draining."""
    failed: bool = False
    """Draining because its load never finished: a failure once unloaded."""
    measured: bool = False
    """``footprint_bytes`` is what its load took (NVML before and after), not a reservation."""


@dataclass(frozen=True, slots=True)
class Failure:
    """The last failed load of a model on one node."""

    node: str
    at: float
    reason: str
    count: int = 1
    """Failed loads there in a row (the back-off doubles with each)."""


@dataclass(frozen=True, slots=True)
class ModelState:
    """Everything the record holds about one model."""

    model: str
    gen: int = 0
    """Decisions applied so far: the fence every decision names as ``base``."""
    replicas: Mapping[str, Replica] = field(default_factory=dict)
    """By node."""
    failures: Mapping[str, Failure] = field(default_factory=dict)
    """By node."""
    low_since: float | None = None
    low_peak: int = 0
    refused: str = ""
    """Refusal code ("" = none) and its reason for operators."""
    refused_reason: str = ""
    recent: tuple[tuple[str, str], ...] = ()
    """(id, fingerprint) of the last :data:`RECENT` decisions."""


class Invalid(ValueError):
    """A command that is malformed (same answer on every replica)."""


def decision_id(model: str, base: int) -> str:
    """The id of the decision planned against generation ``base`` of ``model``."""
    return f"{model}#{base}"


def report_command(model: str, node: str, load: str, status: str, at: float,
                   reason: str = "", footprint_bytes: int = 0) -> dict[str, Any]:
    """What a node's Triton adapter proposes after acting on a replica: ``ready`` (loaded;
    with the GPU memory the load took, when NVML measured it), ``failed`` (with Triton's
    error as ``reason``) or ``unloaded`` (drained and gone)."""
    if status not in STATUSES:
        raise ValueError(f"status must be one of {STATUSES}, got {status!r}")
    cmd = {"op": "report", "model": model, "node": node, "load": load, "status": status,
           "reason": reason[:MAX_TEXT], "at": at}
    if footprint_bytes > 0:
        cmd["footprint_bytes"] = footprint_bytes
    return cmd


class PlacementRecord:
    """The placement record; see the module docstring for its commands."""

    def __init__(self, models: Mapping[str, ModelState] | None = None) -> None:
        self._models: dict[str, ModelState] = dict(models or {})

    # --- reads ------------------------------------------------------------------------------

    @property
    def models(self) -> Mapping[str, ModelState]:
        """Every model the record knows, by key (read-only)."""
        return self._models

    def get(self, model: str) -> ModelState:
        """The model's state (an empty one, generation 0, if the record never saw it)."""
        return self._models.get(model) or ModelState(model)

    def replicas(self) -> Iterator[Replica]:
        """Every replica, model by model."""
        for state in self._models.values():
            yield from state.replicas.values()

    def on_node(self, node: str) -> list[Replica]:
        """The replicas a node's adapter must enact: load ``loading`` ones, drain and unload
        ``draining`` ones, keep ``ready`` ones loaded."""
        return sorted((r for r in self.replicas() if r.node == node), key=lambda r: r.model)

    def footprint(self, model: str) -> int | None:
        """The GPU memory a replica of ``model`` takes, as its loads measured it (the largest),
        or None when no load has been measured."""
        sizes = [r.footprint_bytes for r in self.get(model).replicas.values() if r.measured]
        return max(sizes) if sizes else None

    def routable(self, model: str) -> list[str]:
        """Nodes whose replica of ``model`` routers may send to: ready, not draining."""
        return sorted(n for n, r in self.get(model).replicas.items() if r.state == READY)

    # --- commands ---------------------------------------------------------------------------

    def apply(self, command: object) -> dict[str, Any]:
        """Apply one command; see the module docstring.  Never raises: a bug answers
        ``internal`` on every replica alike rather than splitting them."""
        try:
            if not isinstance(command, Mapping):
                raise Invalid("a command must be an object")
            op = command.get("op")
            if op == "report":
                return self._report(command)
            if op in DECISION_OPS:
                return self._decision(str(op), command)
            raise Invalid(f"unknown op {op!r}")
        except Invalid as exc:
            return {"ok": False, "error": "invalid", "message": str(exc)}
        except Exception as exc:  # noqa: BLE001 - deterministic answer, no split replicas
            return {"ok": False, "error": "internal", "message": f"{type(exc).__name__}: {exc}"}

    def _decision(self, op: str, cmd: Mapping[str, Any]) -> dict[str, Any]:
        model = _text(cmd, "model", 1)
        base = _int(cmd, "base")
        did = _text(cmd, "id", 1)
        at = _number(cmd, "at")
        if did != decision_id(model, base):
            raise Invalid(f"id must be {decision_id(model, base)!r}, got {did!r}")
        state = self.get(model)
        fingerprint = _fingerprint(cmd)
        if base < state.gen:
            for seen, fp in state.recent:
                if seen == did:
                    if fp == fingerprint:
                        return {"ok": True, "changed": False, "duplicate": True, "id": did}
                    break
            return {"ok": False, "error": "stale", "id": did,
                    "message": f"{did} was planned against generation {base}; {model} is "
                               f"at {state.gen}"}
        if base > state.gen:
            return {"ok": False, "error": "stale", "id": did,
                    "message": f"{did} is ahead of {model}'s generation {state.gen}"}
        replicas = dict(state.replicas)
        changes: dict[str, Any] = {}
        if op == "load":
            node = _text(cmd, "node", 1)
            if node in replicas:
                return _conflict(did, f"{model} already has a {replicas[node].state} replica "
                                      f"on {node}")
            replicas[node] = Replica(model, node, _text(cmd, "gpu", 0), LOADING, did, at,
                                     _int(cmd, "footprint_bytes"), _text(cmd, "reason", 0))
        elif op == "unload":
            node = _text(cmd, "node", 1)
            rep = replicas.get(node)
            if rep is None or rep.state == DRAINING:
                return _conflict(did, f"{model} has no loading or ready replica on {node}")
            failed = cmd.get("failed", False)
            if not isinstance(failed, bool):
                raise Invalid("failed must be true or false")
            replicas[node] = replace(rep, state=DRAINING, since=at,
                                     reason=_text(cmd, "reason", 0), failed=failed)
        elif op == "forget":
            node = _text(cmd, "node", 1)
            if replicas.pop(node, None) is None:
                return _conflict(did, f"{model} has no replica on {node}")
        elif op == "low":
            since = cmd.get("since")
            if since is not None:
                since = _number(cmd, "since")
            changes = {"low_since": since, "low_peak": _int(cmd, "peak")}
        else:  # refuse
            changes = {"refused": _text(cmd, "code", 0), "refused_reason": _text(cmd, "reason", 0)}
        recent = (*state.recent[-(RECENT - 1):], (did, fingerprint))
        self._models[model] = replace(state, gen=state.gen + 1, replicas=replicas,
                                      recent=recent, **changes)
        return {"ok": True, "changed": True, "id": did, "gen": state.gen + 1}

    def _report(self, cmd: Mapping[str, Any]) -> dict[str, Any]:
        model, node = _text(cmd, "model", 1), _text(cmd, "node", 1)
        load, status = _text(cmd, "load", 1), _text(cmd, "status", 1)
        at, reason = _number(cmd, "at"), _text(cmd, "reason", 0)
        if status not in STATUSES:
            raise Invalid(f"status must be one of {', '.join(STATUSES)}, got {status!r}")
        state = self._models.get(model)
        rep = state.replicas.get(node) if state else None
        if state is None or rep is None or rep.load != load:
            return {"ok": True, "changed": False, "ignored": f"no replica of {model} on {node} "
                                                              f"from {load}"}
        replicas, failures = dict(state.replicas), dict(state.failures)
        measured = cmd.get("footprint_bytes", 0)
        if not isinstance(measured, int) or isinstance(measured, bool) or not \
                0 <= measured <= 1 << 50:
            raise Invalid("footprint_bytes must be an integer of bytes, 0..2**50")
        if status == "ready":
            if rep.state != LOADING:
                return {"ok": True, "changed": False}
            replicas[node] = replace(rep, state=READY, since=at)
            if measured:
                replicas[node] = replace(replicas[node], footprint_bytes=measured,
                                         measured=True)
            failures.pop(node, None)  # a good load there ends the back-off
        else:
            del replicas[node]
            if status == "failed" or rep.failed:
                prior = failures.get(node)
                failures[node] = Failure(node, at, reason or rep.reason or "load failed",
                                         prior.count + 1 if prior else 1)
        self._models[model] = replace(state, replicas=replicas, failures=failures)
        return {"ok": True, "changed": True}

    # --- snapshots --------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """The whole record as plain JSON data (for Raft snapshots and read copies)."""
        return {"models": {k: _state_dict(s) for k, s in sorted(self._models.items())}}

    def snapshot_of(self, model: str) -> dict[str, Any]:
        """One model's state as plain data, without the recent decision ids (the spec of its
        ``ModelPlacement`` document: :mod:`meshd.models.store`)."""
        out = _state_dict(self.get(model))
        del out["recent"]
        return out

    @classmethod
    def restore(cls, data: Mapping[str, Any]) -> PlacementRecord:
        """The record a :meth:`snapshot` was taken of."""
        models = {}
        for key, s in data.get("models", {}).items():
            models[key] = ModelState(
                model=key, gen=int(s["gen"]),
                replicas={n: Replica(**r) for n, r in s["replicas"].items()},
                failures={n: Failure(**f) for n, f in s["failures"].items()},
                low_since=s["low_since"], low_peak=int(s["low_peak"]), refused=s["refused"],
                refused_reason=s["refused_reason"],
                recent=tuple((str(i), str(f)) for i, f in s["recent"]))
        return cls(models)


def _state_dict(s: ModelState) -> dict[str, Any]:
    return {"gen": s.gen,
            "replicas": {n: _fields(r) for n, r in sorted(s.replicas.items())},
            "failures": {n: _fields(f) for n, f in sorted(s.failures.items())},
            "low_since": s.low_since, "low_peak": s.low_peak, "refused": s.refused,
            "refused_reason": s.refused_reason, "recent": [list(x) for x in s.recent]}


def _fields(obj: Replica | Failure) -> dict[str, Any]:
    return {f.name: getattr(obj, f.name) for f in fields(obj)}


def _fingerprint(cmd: Mapping[str, Any]) -> str:
    """What a decision does, without its time and its words: a repeat has the same one."""
    return json.dumps({k: v for k, v in cmd.items() if k not in ("at", "reason")},
                      sort_keys=True, default=str)


def _conflict(did: str, message: str) -> dict[str, Any]:
    return {"ok": False, "error": "conflict", "id": did, "message": message}


def _text(cmd: Mapping[str, Any], key: str, min_len: int) -> str:
    value = cmd.get(key, "")
    if not isinstance(value, str) or len(value) < min_len:
        raise Invalid(f"{key} must be a string of at least {min_len} characters")
    return value[:MAX_TEXT]


def _int(cmd: Mapping[str, Any], key: str) -> int:
    value = cmd.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise Invalid(f"{key} must be an integer >= 0")
    return value


def _number(cmd: Mapping[str, Any], key: str) -> float:
    value = cmd.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not value >= 0 \
            or value == float("inf"):
        raise Invalid(f"{key} must be a finite number >= 0")
    return float(value)
