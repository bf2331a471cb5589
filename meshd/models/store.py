"""The policy group's state machine: policy documents plus the model placement record.

The placement controller runs on the policy group's leader (its inputs, the ``ModelPin``
policies, live there) and writes its decisions to the same group, so a new leader continues
from the committed record and never repeats a decision (:mod:`meshd.models.record` fences
them).  :class:`ModelStore` is a :class:`policy.store.PolicyStore` that also holds a
:class:`~meshd.models.record.PlacementRecord`; every change to a model's record is projected
into a ``ModelPlacement/<model>`` document, so every node's read copy of the group (the
``Follow`` stream, the disk cache) carries the record: each node's Triton adapter reads what
it must load or unload there, routers read which replicas are draining, and any node can
rebuild the record (:func:`record_of`) to explain a model's placement.

Commands (besides the store's own; ``put``/``patch``/``delete`` refuse ``ModelPlacement``):
the record's decisions (``load``, ``unload``, ``forget``, ``low``, ``refuse``) and node
reports (``report``), each of command format 2 (``"v": 2``: proposed only once every
coordinator applies it) with ``at`` stamped by the proposing coordinator and ``author``.
"""

from __future__ import annotations

from collections.abc import Collection, Iterable
from typing import Any

from meshd.models.record import DECISION_OPS, PlacementRecord
from policy.errors import PolicyError
from policy.model import validate
from policy.records import StoredDoc
from policy.store import Change, PolicyStore, command_of_version

KIND = "ModelPlacement"
FORMAT = 2
"""The command format of the record's commands (:data:`policy.store.COMMAND_VERSION`)."""
OPS = (*DECISION_OPS, "report")
STAMPED_OPS = frozenset(OPS)
"""Commands whose ``at`` the proposing coordinator overwrites with its own clock."""


def command(cmd: dict[str, Any]) -> dict[str, Any]:
    """``cmd`` (a decision or a report) in the format the store takes."""
    return {**cmd, "v": FORMAT}


class ModelStore(PolicyStore):
    """Policy documents plus the placement record; see the module docstring."""

    def __init__(self, kinds: Collection[str] | None = None, history: int = 10_000) -> None:
        super().__init__(kinds, history)
        self.record = PlacementRecord()

    def apply(self, command: object) -> dict[str, Any]:
        try:
            plain = command_of_version(command)
        except PolicyError as exc:
            return {"ok": False, "error": "invalid", "field": exc.field, "message": exc.message}
        if not isinstance(plain, dict):
            return super().apply(command)
        op = plain.get("op")
        if op in ("put", "patch", "delete") and _kind_of(plain) == KIND:
            return {"ok": False, "error": "invalid", "field": "kind",
                    "message": f"{KIND} documents are written by the placement controller "
                               "(meshctl models), not by policy commands"}
        if op not in OPS:
            return super().apply(command)
        if KIND not in self.kinds:
            return {"ok": False, "error": "wrong_group", "group": "policy",
                    "message": f"{KIND} belongs to the 'policy' group"}
        result = self.record.apply(plain)
        if result.get("changed"):
            model = str(plain["model"])
            self._project(model, float(plain["at"]), str(plain.get("author", ""))[:256])
            result["version"] = self.version
        return result

    def _project(self, model: str, at: float, author: str) -> None:
        state = self.record.models.get(model)
        current = self.get(KIND, model)
        if state is None or (not state.replicas and not state.failures and not state.refused
                             and state.low_since is None and state.gen == 0):
            if current is not None:
                self._commit(Change(self.version + 1, "delete", KIND, model, None, at, author))
            return
        doc = validate({"kind": KIND, "name": model, "spec": self.record.snapshot_of(model)})
        version = self.version + 1
        stored = StoredDoc(doc, version, current.created_version if current else version, at,
                           author)
        self._commit(Change(version, "put", KIND, model, stored, at, author))

    # --- snapshots --------------------------------------------------------------------------

    def load(self, data: object) -> None:
        """A snapshot is the documents alone (any build's, and any node's read copy, can load
        it): the record is rebuilt from its ``ModelPlacement`` documents.  What that leaves
        out, the recent decision ids, only tells a repeated decision (``duplicate``) from a
        stale one: either way it changes nothing, the generation fences both."""
        super().load(data)
        self.record = record_of(self.list(KIND))


def record_of(docs: Iterable[StoredDoc]) -> PlacementRecord:
    """The record as ``ModelPlacement`` documents show it (any node's read copy): every
    model's replicas, failures, cool-down and refusal (not the recent decision ids, which
    only the coordinators' copy needs)."""
    return PlacementRecord.restore({"models": {
        d.document.name: {**d.document.spec, "recent": []}
        for d in docs if d.document.kind == KIND}})


def _kind_of(command: dict[str, Any]) -> object:
    doc = command.get("doc")
    return doc.get("kind") if isinstance(doc, dict) else command.get("kind")
