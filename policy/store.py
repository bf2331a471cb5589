"""The replicated policy state machine: pure, deterministic, and never raising on a command.

consensus/ feeds every committed Raft log entry to :meth:`PolicyStore.apply` on every replica,
so ``apply`` must be a function of (state, command) alone: no clock, no randomness, no I/O, and
no exception that would leave one replica half-way — a bad command becomes an error *result*,
identical everywhere. Commands and results are plain dicts (msgpack-able):

``{"op": "put", "doc": {...}, "if_version": n|None, "author": str, "at": unix_seconds}``
``{"op": "patch", "kind", "name", "spec": {...}, "if_version", "author", "at"}`` (RFC 7386)
``{"op": "delete", "kind", "name", "if_version", "author", "at"}``
``{"op": "read", "kind", "name"}`` (a linearizable read through the log; changes nothing)
``{"op": "noop"}``

``if_version``: None = unconditional, 0 = the document must not exist, n = its version must be
n. Every successful put, patch or delete adds 1 to the store version (even one that leaves the
spec as it was) and that number becomes the document's version.

Errors: ``invalid`` (with ``field``), ``conflict`` (with ``current``), ``not_found``,
``wrong_group`` (the kind belongs to another Raft group), ``internal`` (a bug; state unchanged).

Read replicas do not run commands; they :meth:`follow` the :class:`Change` feed of a leader
(``changes_since``) or :meth:`load` a :meth:`snapshot` when the feed no longer reaches back.
"""

from __future__ import annotations

import builtins
from collections import deque
from collections.abc import Collection
from itertools import islice
from typing import Any

from policy.errors import PolicyError
from policy.fields import Choice, Integer, Number, Object, Raw, Text, required, show
from policy.fields import Field as F
from policy.merge import merge_patch
from policy.model import KIND_FORMAT, KINDS, Document, defaults, validate, validate_key
from policy.records import Change, StoredDoc

__all__ = ["Change", "GapError", "PolicyStore", "StoredDoc", "SNAPSHOT_FORMAT"]

SNAPSHOT_FORMAT = 1
"""Bumped whenever the snapshot layout changes incompatibly."""
COMMAND_VERSION = 2
"""The newest command format this build applies.  A command of format 1 carries no ``v``
field, so the builds before formats existed apply it too; a newer format carries ``"v": N``
and is proposed only once every voter of the group understands it
(:class:`consensus.group.RaftGroup` enforces that), since a replica that cannot apply a
committed command would split from the others.

Format 2: the model placement controller's commands (:mod:`meshd.models.store`), which
write ``ModelPlacement`` documents (:data:`policy.model.KIND_FORMAT`)."""

_WRITE = {  # fields every mutating command shares
    "if_version": F(Integer(ge=0, nullable=True), None, "precondition on the doc's version"),
    "author": F(Text(0, 256), "", "who asked (principal), recorded with the change"),
    "at": F(Number(ge=0), 0.0, "when the leader accepted it (unix seconds)"),
}
_OP = {"op": required(Raw())}
_COMMANDS: dict[str, Object] = {
    "put": Object({**_OP, "doc": required(Raw()), **_WRITE}),
    "patch": Object({**_OP, "kind": required(Raw()), "name": required(Raw()),
                     "spec": required(Raw()), **_WRITE}),
    "delete": Object({**_OP, "kind": required(Raw()), "name": required(Raw()), **_WRITE}),
    "read": Object({**_OP, "kind": required(Raw()), "name": required(Raw())}),
    "noop": Object(_OP),
}
_OP_CHECK = Choice(tuple(_COMMANDS))


def command_version(command: object) -> int:
    """The format of a command (1 without a ``v`` field); PolicyError when ``v`` is not a
    positive integer."""
    if not isinstance(command, dict) or "v" not in command:
        return 1
    v = command["v"]
    if type(v) is not int or v < 1:  # noqa: E721 - bool is not a version
        raise PolicyError("v", f"must be a command format >= 1, got {show(v)}")
    return v


def command_of_version(command: object) -> object:
    """``command`` without its ``v`` field, once its format is one this build applies;
    PolicyError naming the format otherwise (the same answer on every replica of a build)."""
    v = command_version(command)
    if v > COMMAND_VERSION:
        raise PolicyError("v", f"command format {v} is newer than this coordinator's "
                               f"({COMMAND_VERSION}): upgrade it")
    if isinstance(command, dict) and "v" in command:
        return {k: val for k, val in command.items() if k != "v"}
    return command

_SNAPSHOT = Object({
    "format": required(Integer(ge=0)),
    "version": required(Integer(ge=0)),
    "kinds": required(Raw()),
    "history_limit": required(Integer(ge=0)),
    "docs": required(Raw()),
    "history": required(Raw()),
    "leases": F(Raw(), None, "the placements group's lease table (meshd.train.board)"),
})


class GapError(Exception):
    """A followed change skips versions: the replica missed some and must load a snapshot."""


class PolicyStore:
    """Documents keyed by (kind, name), a store version, and a bounded change history.

    ``kinds`` restricts the kinds this Raft group accepts (None = all of :data:`KINDS`);
    ``history`` bounds how many changes :meth:`changes_since` can replay.
    """

    def __init__(self, kinds: Collection[str] | None = None, history: int = 10_000) -> None:
        chosen = frozenset(KINDS if kinds is None else kinds)
        unknown = sorted(chosen - KINDS.keys())
        if unknown:
            raise ValueError(f"unknown kinds {unknown}; expected some of {list(KINDS)}")
        if history < 0:
            raise ValueError("history must be >= 0")
        self.kinds = chosen
        self.history_limit = history
        self._version = 0
        self._docs: dict[tuple[str, str], StoredDoc] = {}
        self._history: deque[Change] = deque(maxlen=history)

    @property
    def version(self) -> int:
        """Store version: 0 when new, +1 for every successful put, patch or delete."""
        return self._version

    # --- commands -------------------------------------------------------------------------

    def apply(self, command: object) -> dict[str, Any]:
        """Run one committed command and return its result; never raises."""
        try:
            command = command_of_version(command)
            return self._apply(command)
        except PolicyError as exc:
            return {"ok": False, "error": "invalid", "message": str(exc), "field": exc.field}
        except Exception as exc:  # a bug: report it identically on every replica, state intact
            return {"ok": False, "error": "internal", "message": f"{type(exc).__name__}: {exc}"}

    def _apply(self, command: object) -> dict[str, Any]:
        if not isinstance(command, dict):
            raise PolicyError("command", f"must be an object, got {show(command)}")
        op = _OP_CHECK(command.get("op"), "op")
        cmd = _COMMANDS[op](command, "")
        if op == "noop":
            return {"ok": True, "version": self._version}
        if op == "put":
            raw = cmd["doc"]
            if isinstance(raw, dict) and (wrong := self._wrong_group(raw.get("kind"))):
                return wrong
            try:
                doc = validate(raw)
            except PolicyError as exc:
                raise exc.prefixed("doc") from None
            return self._write(doc, cmd)
        kind, name = validate_key(cmd["kind"], cmd["name"])
        if wrong := self._wrong_group(kind):
            return wrong
        current = self._docs.get((kind, name))
        if op == "read":
            return {"ok": True, "doc": current.to_dict() if current else None,
                    "version": self._version}
        if op == "patch":
            if not isinstance(cmd["spec"], dict):
                raise PolicyError("spec", f"must be an object, got {show(cmd['spec'])}")
            base = current.document.spec if current else {}
            merged = merge_patch(base, cmd["spec"])
            doc = validate({"kind": kind, "name": name, "spec": merged})
            return self._write(doc, cmd)
        # delete
        if current is None:
            return {"ok": False, "error": "not_found", "message": f"{kind} {name} does not exist"}
        if conflict := self._conflict(kind, name, cmd["if_version"]):
            return conflict
        self._commit(Change(self._version + 1, "delete", kind, name, None, cmd["at"],
                            cmd["author"]))
        return {"ok": True, "version": self._version}

    def _write(self, doc: Document, cmd: dict[str, Any]) -> dict[str, Any]:
        if conflict := self._conflict(doc.kind, doc.name, cmd["if_version"]):
            return conflict
        current = self._docs.get(doc.key)
        version = self._version + 1
        doc = Document(doc.kind, doc.name, doc.spec)  # drop the input's envelope version
        stored = StoredDoc(doc, version, current.created_version if current else version,
                           cmd["at"], cmd["author"])
        self._commit(Change(version, "put", doc.kind, doc.name, stored, cmd["at"], cmd["author"]))
        return {"ok": True, "version": version, "created": current is None}

    def _conflict(self, kind: str, name: str, if_version: int | None) -> dict[str, Any] | None:
        current = self._docs.get((kind, name))
        have = current.version if current else 0
        if if_version is None or if_version == have:
            return None
        want = "not to exist" if if_version == 0 else f"to be at version {if_version}"
        now = "does not exist" if have == 0 else f"is at version {have}"
        return {"ok": False, "error": "conflict", "current": have,
                "message": f"{kind} {name} was expected {want} but {now}"}

    def _wrong_group(self, kind: object) -> dict[str, Any] | None:
        if not isinstance(kind, str) or kind not in KINDS or kind in self.kinds:
            return None  # unknown kinds are reported by validation
        return {"ok": False, "error": "wrong_group", "group": KINDS[kind],
                "message": f"{kind} belongs to the {KINDS[kind]!r} group; this one accepts "
                           + ", ".join(sorted(self.kinds))}

    def _commit(self, change: Change) -> None:
        """The only place state changes (``apply`` and ``follow`` both end here)."""
        key = (change.kind, change.name)
        if change.doc is None:
            self._docs.pop(key, None)
        else:
            self._docs[key] = change.doc
        self._version = change.version
        self._history.append(change)

    # --- queries ----------------------------------------------------------------------------

    def get(self, kind: str, name: str) -> StoredDoc | None:
        """The stored document, or None. Its spec is shared with the store: do not modify it."""
        return self._docs.get((kind, name))

    def list(self, kind: str | None = None) -> builtins.list[StoredDoc]:
        """All documents (of ``kind``, if given), sorted by kind then name."""
        return [self._docs[key] for key in sorted(self._docs)
                if kind is None or key[0] == kind]

    def node_flags(self, name: str) -> dict[str, Any]:
        """The NodeFlags spec of node ``name`` (a copy), all defaults if it has no document."""
        if "NodeFlags" not in self.kinds:
            raise ValueError("this store does not hold NodeFlags")
        stored = self._docs.get(("NodeFlags", name))
        return stored.document.to_dict()["spec"] if stored else defaults("NodeFlags")

    def changes_since(self, version: int) -> builtins.list[Change] | None:
        """Changes with a version above ``version``, oldest first.

        None when the bounded history no longer reaches back to ``version + 1``: the caller
        must load a :meth:`snapshot` instead.
        """
        if version < 0:
            raise ValueError("version must be >= 0")
        if version >= self._version:
            return []
        if not self._history or self._history[0].version > version + 1:
            return None
        start = version + 1 - self._history[0].version  # history versions are contiguous
        return builtins.list(islice(self._history, start, None))

    # --- replication ------------------------------------------------------------------------

    def follow(self, change: Change) -> None:
        """Apply a leader's change on a read replica.

        Changes at or below our version are duplicates and ignored; a change beyond the next
        version raises :class:`GapError`; one of a kind this store does not hold raises
        :class:`PolicyError`.
        """
        if change.version <= self._version:
            return
        if change.version != self._version + 1:
            raise GapError(f"change {change.version} follows {self._version}; "
                           f"{change.version - self._version - 1} missing")
        if change.kind not in self.kinds:
            raise PolicyError("change.kind", f"{change.kind} is not held by this store")
        self._commit(change)

    def snapshot(self) -> dict[str, Any]:
        """The whole state, history included, as plain data."""
        used = {kind for kind, _ in self._docs} | {c.kind for c in self._history}
        kinds = {k for k in self.kinds if KIND_FORMAT.get(k, 1) == 1 or k in used}
        return {"format": SNAPSHOT_FORMAT, "version": self._version,
                "kinds": sorted(kinds), "history_limit": self.history_limit,
                "docs": [doc.to_dict() for doc in self.list()],
                "history": [change.to_dict() for change in self._history]}

    @classmethod
    def restore(cls, data: object) -> PolicyStore:
        """A store rebuilt from :meth:`snapshot` output (its kinds and history limit included).

        Raises :class:`PolicyError` naming the corrupt part (``snapshot.docs[3].spec.x``).
        """
        fields = _SNAPSHOT(data, "snapshot")
        kinds = fields["kinds"]
        if not isinstance(kinds, list) or not all(isinstance(k, str) and k in KINDS
                                                  for k in kinds):
            raise PolicyError("snapshot.kinds", "must be a list of kinds: " + ", ".join(KINDS))
        # A snapshot leaves out newer kinds it holds none of (so older builds can load it);
        # this store must still take those of its groups.
        groups = {KINDS[k] for k in kinds}
        store = cls({*kinds, *(k for k in KIND_FORMAT if KINDS[k] in groups)},
                    fields["history_limit"])
        store.load(data)
        return store

    def load(self, data: object) -> None:
        """Replace the whole state with a snapshot's (keeping this store's kinds and limit).

        Nothing changes if the snapshot is rejected with :class:`PolicyError`.
        """
        fields = _SNAPSHOT(data, "snapshot")
        if fields["format"] != SNAPSHOT_FORMAT:
            raise PolicyError("snapshot.format", f"must be {SNAPSHOT_FORMAT}, "
                              f"got {fields['format']}")
        version = fields["version"]
        docs: dict[tuple[str, str], StoredDoc] = {}
        for i, raw in enumerate(_list(fields["docs"], "snapshot.docs")):
            where = f"snapshot.docs[{i}]"
            doc = StoredDoc.from_dict(raw, where)
            if doc.document.key in docs:
                raise PolicyError(where, "duplicate document")
            if doc.document.kind not in self.kinds:
                raise PolicyError(f"{where}.kind", f"{doc.document.kind} is not held here")
            if doc.version > version:
                raise PolicyError(f"{where}.version", "is above the snapshot's version")
            docs[doc.document.key] = doc
        history: deque[Change] = deque(maxlen=self.history_limit)
        latest: dict[tuple[str, str], Change] = {}
        for i, raw in enumerate(_list(fields["history"], "snapshot.history")):
            where = f"snapshot.history[{i}]"
            change = Change.from_dict(raw, where)
            expected = version - len(fields["history"]) + i + 1  # contiguous, ending at version
            if change.version != expected:
                raise PolicyError(f"{where}.version", f"must be {expected}, got {change.version}")
            history.append(change)
            latest[(change.kind, change.name)] = change
        # The history must end where the documents are: a replica following it from any point
        # has to arrive at exactly these documents.
        oldest = version - len(fields["history"])
        for key, doc in docs.items():
            if doc.version > oldest and key not in latest:
                raise PolicyError("snapshot.history", f"has no change for {key[0]} {key[1]} "
                                                      f"at version {doc.version}")
        for key, change in latest.items():
            if docs.get(key) != change.doc:
                raise PolicyError("snapshot.history", f"disagrees with docs about {key[0]} "
                                                      f"{key[1]}")
        self._version, self._docs, self._history = version, docs, history


def _list(value: object, path: str) -> builtins.list[Any]:
    if not isinstance(value, list):
        raise PolicyError(path, f"must be a list, got {show(value)}")
    return value
