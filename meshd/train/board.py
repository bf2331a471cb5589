"""The placements group's state machine: training jobs, their soft leases, where they run.

:class:`PlacementStore` is a :class:`policy.store.PolicyStore` (so every node's read copy,
the Follow stream and snapshots work unchanged) that also holds a :class:`LeaseTable` and
takes the scheduler's commands.  The lease table is the authority on who may run what; the
store's documents are its readable projection:

* ``TrainingJob/<id>``: the spec as submitted and the job's state, attempt, node, progress;
* ``TrainingPlacement/<id>``: the live lease (node, GPUs, holder, expiry), deleted when the
  lease ends.

Commands (besides the store's put/patch/delete/read, which refuse these two kinds):

``{"op": "submit", "job": {spec}, "at", "author"}``
    queues a job; a resubmit of the same spec is the same job (idempotent), another spec under
    the same id is a ``conflict``.
``{"op": "cancel", "job", "at", "author"}``
    ends a queued job at once; a held one is flagged, its trainer stops it and releases.
``acquire``/``renew``/``release``/``expire``
    the :class:`LeaseTable` commands, which also move the job through its states:
    queued -> placed (acquire) -> running (first renewal) -> done/failed/cancelled (release),
    and back to queued when a lease lapses (expire) or a trainer hands a job back (release
    with ``moved``/``preempted``), until ``MAX_ATTEMPTS`` attempts are lost (a lease lapsed,
    or the job exited asking to ``retry``).

Like the store, ``apply`` is a pure function of (state, command): time is the ``at`` a
coordinator stamped on the command (:data:`STAMPED_OPS`).
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from meshd.train.leases import Lease, LeaseTable
from meshd.train.spec import parse_job
from policy.errors import PolicyError
from policy.fields import MAX_LIST, Integer, Number, Text
from policy.model import Document, copy_plain, validate
from policy.store import Change, PolicyStore, StoredDoc, command_of_version

JOB_KINDS = ("TrainingJob", "TrainingPlacement")
"""Kinds only these commands write."""
LEASE_OPS = ("acquire", "renew", "release", "expire")
JOB_OPS = ("submit", "cancel", *LEASE_OPS)
STAMPED_OPS = frozenset(JOB_OPS)
"""Commands whose ``at`` the proposing coordinator overwrites with its own clock: lease
safety rests on coordinators' clocks, never on a trainer's or a client's."""
FINAL = ("done", "failed", "cancelled")
MAX_ATTEMPTS = 5
"""Attempts a job may lose (a lease lapsed: a trainer died, was cut off, never started; or it
exited asking to ``retry``) before it fails."""
_REQUEUE = ("moved", "preempted")
_AT = Number(ge=0)
_NAME = Text(1, 256)
_TEXT = Text(0, 1024)
_LOSS = Number()
_PROGRESS = Number(ge=0, le=1)
_STEP = Integer(ge=0)


class PlacementStore(PolicyStore):
    """Documents plus the lease table; see the module docstring for the commands."""

    def __init__(self, kinds: Collection[str] | None = None, history: int = 10_000) -> None:
        super().__init__(kinds, history)
        self.leases = LeaseTable()

    # --- commands ---------------------------------------------------------------------------

    def apply(self, command: object) -> dict[str, Any]:
        try:
            command = command_of_version(command)
        except PolicyError as exc:
            return {"ok": False, "error": "invalid", "field": exc.field, "message": exc.message}
        if not isinstance(command, dict):
            return super().apply(command)
        op = command.get("op")
        kind = _kind_of(command)
        if op in ("put", "patch", "delete") and kind in JOB_KINDS:
            return {"ok": False, "error": "invalid", "field": "kind",
                    "message": f"{kind} documents are written by the training scheduler "
                               "(meshctl jobs), not by policy commands"}
        if op not in JOB_OPS:
            return super().apply(command)
        try:
            at = _AT(command.get("at"), "at")
            author = str(command.get("author", ""))[:256]
            if op == "submit":
                return self._submit(command, at, author)
            if op == "cancel":
                return self._cancel(command, at, author)
            return self._lease(command, at, author)
        except PolicyError as exc:
            return {"ok": False, "error": "invalid", "field": exc.field, "message": exc.message}
        except Exception as exc:  # noqa: BLE001 - a bug must not split the replicas
            return {"ok": False, "error": "internal", "message": f"{type(exc).__name__}: {exc}"}

    def _submit(self, cmd: dict[str, Any], at: float, author: str) -> dict[str, Any]:
        try:
            spec = parse_job(cmd.get("job"))
        except PolicyError as exc:
            raise exc.prefixed("job") from None
        current = self.get("TrainingJob", spec.id)
        if current is not None:
            if current.document.spec["job"] == spec.doc:
                return {"ok": True, "version": current.version, "created": False,
                        "job": spec.id}
            return {"ok": False, "error": "conflict", "current": current.version,
                    "field": "job.id", "message": f"job {spec.id!r} exists with another spec; "
                                                  "submit it under a new id"}
        version = self._put_job(spec.id, {"job": copy_plain(spec.doc), "state": "queued",
                                          "submitted_at": at, "queued_at": at,
                                          "message": "queued"}, at, author)
        return {"ok": True, "version": version, "created": True, "job": spec.id}

    def _cancel(self, cmd: dict[str, Any], at: float, author: str) -> dict[str, Any]:
        job = self._job(cmd)
        spec = job.document.spec
        if spec["state"] in FINAL:
            return {"ok": False, "error": "finished", "field": "job",
                    "message": f"job {job.document.name!r} is already {spec['state']}"}
        if spec["state"] == "queued":
            changes = {"state": "cancelled", "ended_at": at, "message": f"cancelled by {author}"}
        else:
            changes = {"cancel": True, "message": f"cancel asked by {author}; waiting for "
                                                  f"{spec['node']} to stop it"}
        return {"ok": True, "version": self._update(job, changes, at, author)}

    def _lease(self, cmd: dict[str, Any], at: float, author: str) -> dict[str, Any]:
        op = cmd["op"]
        job = self._job(cmd)
        spec = job.document.spec
        if op == "acquire" and (spec["state"] in FINAL or spec["cancel"]):
            return {"ok": False, "error": "finished", "field": "job",
                    "message": f"job {job.document.name!r} is {spec['state']}"
                               + (" (cancel asked)" if spec["cancel"] else "")}
        report = _report(cmd)  # checked before the table changes: an error changes nothing
        message = _TEXT(cmd.get("message", ""), "message")
        before = self.leases.leases.get(job.document.name)
        result = self.leases.apply(cmd)
        if not result.get("ok"):
            return result
        name = job.document.name
        lease = self.leases.leases.get(name)
        now = self.leases.now
        rank0 = cmd.get("node") in (None, spec["node"])  # renew/release: rank 0 speaks
        if op == "acquire":
            assert lease is not None
            changes: dict[str, Any] = {}
            if before is not None and before.token != lease.token:  # reaped by this grant
                changes = _lapse(spec, [p.node for p in before.parts if not p.outcome])
            where = ", ".join(p.node for p in lease.parts)
            changes.update({
                "state": "placed", "attempt": spec["attempt"] + 1, "node": lease.node,
                "gpus": list(lease.gpus), "token": lease.token,
                "parts": _parts(lease), "ran_on": [*spec["ran_on"], lease.node][-MAX_LIST:],
                "message": f"placed on {where} (attempt {spec['attempt'] + 1})"})
            self._put_placement(name, lease, "pending", at, author)
        elif op == "renew":
            assert lease is not None
            changes = {"state": "running", "progress": lease.progress, "step": lease.step}
            if spec["started_at"] is None:
                changes["started_at"] = now
                changes["message"] = f"running on {lease.node}"
            if rank0:  # rank 0 speaks for the job
                changes.update(report)
            self._put_placement(name, lease, "running", at, author)
            result = {**result, "cancel": spec["cancel"]}
        elif op == "release" and not result["final"]:  # one rank of a gang ended
            assert lease is not None
            changes = {"parts": _parts(lease), "message": message
                       or f"the rank on {cmd['node']} ended: {result['outcome']}"}
            if rank0:
                changes.update({k: v for k, v in report.items() if k != "message"})
            self._put_placement(name, lease, "running", at, author)
        elif op == "release":
            outcome = result["outcome"]
            if spec["cancel"] and outcome != "done":
                outcome = "cancelled"
            changes = {**(report if rank0 else {}),
                       "message": message or f"{outcome} on {spec['node']}"}
            if outcome == "retry":  # the job asked to run elsewhere: an attempt lost
                changes.update(_lapse(spec, []))
                if changes["state"] == "failed":
                    changes["message"] = f"{changes['message']}; {changes['lapses']} " \
                                         "attempts lost; giving up"
            else:
                changes["state"] = "queued" if outcome in _REQUEUE else outcome
            if changes["state"] in FINAL:
                changes["ended_at"] = now
                if outcome == "done":
                    changes["progress"] = 1.0
            else:
                changes["queued_at"] = now
            self._delete_placement(name, at, author)
        else:  # expire
            on = ", ".join(result["lapsed"])
            changes = _lapse(spec, result["lapsed"])
            if spec["cancel"] or result["outcome"] in FINAL:
                state = "cancelled" if spec["cancel"] else result["outcome"]
                changes.update({"state": state, "message": f"{state}; the lease on {on} "
                                                           "lapsed"})
            elif changes["state"] == "failed":
                changes["message"] = f"{changes['lapses']} attempts lost (the last lapsed on " \
                                     f"{on}); giving up"
            else:
                changes["message"] = f"the lease on {on} lapsed; re-queued to resume from " \
                                     "its last checkpoint"
            if changes["state"] in FINAL:
                changes["ended_at"] = now
            else:
                changes["queued_at"] = now
            self._delete_placement(name, at, author)
        version = self._update(self.get("TrainingJob", name) or job, changes, at, author)
        return {**result, "version": version}

    # --- documents --------------------------------------------------------------------------

    def _job(self, cmd: dict[str, Any]) -> StoredDoc:
        name = _NAME(cmd.get("job"), "job")
        job = self.get("TrainingJob", name)
        if job is None:
            raise PolicyError("job", f"no job {name!r}")
        return job

    def _put_job(self, name: str, spec: dict[str, Any], at: float, author: str) -> int:
        return self._store(validate({"kind": "TrainingJob", "name": name, "spec": spec}),
                           at, author)

    def _update(self, job: StoredDoc, changes: dict[str, Any], at: float, author: str) -> int:
        return self._put_job(job.document.name, {**job.document.spec, **changes}, at, author)

    def _put_placement(self, name: str, lease: Lease, state: str, at: float,
                       author: str) -> None:
        self._store(validate({"kind": "TrainingPlacement", "name": name, "spec": {
            "node": lease.node, "gpus": list(lease.gpus), "parts": _parts(lease),
            "state": state, "progress": lease.progress,
            "lease": {"holder": lease.holder, "expires_unix": max(lease.expires_at, 1e-3)}}}),
            at, author)

    def _delete_placement(self, name: str, at: float, author: str) -> None:
        if self.get("TrainingPlacement", name) is not None:
            self._commit(Change(self.version + 1, "delete", "TrainingPlacement", name, None,
                                at, author))

    def _store(self, doc: Document, at: float, author: str) -> int:
        return int(self._write(doc, {"if_version": None, "at": at, "author": author})["version"])

    # --- snapshots --------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        return {**super().snapshot(), "leases": self.leases.snapshot()}

    def load(self, data: object) -> None:
        leases = data.get("leases") if isinstance(data, dict) else None
        table = LeaseTable.restore(leases) if isinstance(leases, dict) else LeaseTable()
        super().load(data)
        self.leases = table


def _lapse(spec: dict[str, Any], nodes: list[str]) -> dict[str, Any]:
    """Changes for an attempt lost (a lease lapsed on ``nodes``, or the job asked to retry):
    counted in ``lapses``, the nodes added to ``tried``; ``failed`` at ``MAX_ATTEMPTS``."""
    lapses = spec["lapses"] + 1
    return {"lapses": lapses, "tried": [*spec["tried"], *nodes][-MAX_LIST:],
            "state": "failed" if lapses >= MAX_ATTEMPTS else "queued"}


def _parts(lease: Lease) -> list[dict[str, Any]]:
    return [{"node": p.node, "gpus": list(p.gpus), "outcome": p.outcome} for p in lease.parts]


def _report(cmd: dict[str, Any]) -> dict[str, Any]:
    """The trainer's progress report a renew or release carries (what it holds)."""
    out: dict[str, Any] = {}
    if "progress" in cmd:
        out["progress"] = _PROGRESS(cmd["progress"], "progress")
    if "step" in cmd:
        out["step"] = _STEP(cmd["step"], "step")
    if "loss" in cmd:
        out["loss"] = _LOSS(cmd["loss"], "loss") if cmd["loss"] is not None else None
    for key in ("checkpoint", "message"):
        if key in cmd:
            out[key] = _TEXT(cmd[key], key)
    return out


def _kind_of(command: dict[str, Any]) -> object:
    doc = command.get("doc")
    return doc.get("kind") if isinstance(doc, dict) else command.get("kind")
