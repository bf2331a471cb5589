"""What the store keeps: a document with its write metadata, and one entry of change history.

Both convert to plain dicts (for snapshots, the read replicas' change feed and the admin API)
and back; ``from_dict`` re-validates everything, because that data crossed a wire or a disk.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from policy.errors import PolicyError
from policy.fields import Choice, Integer, Number, Object, Raw, Text, required
from policy.model import Document, copy_plain, validate, validate_key

_STORED = Object({
    "kind": required(Raw()), "name": required(Raw()), "spec": required(Raw()),
    "version": required(Integer(ge=1)),
    "created_version": required(Integer(ge=1)),
    "updated_unix": required(Number(ge=0)),
    "author": required(Text(0, 256)),
})

_CHANGE = Object({
    "version": required(Integer(ge=1)),
    "op": required(Choice(("put", "delete"))),
    "kind": required(Raw()), "name": required(Raw()),
    "doc": required(Raw()),
    "at": required(Number(ge=0)),
    "author": required(Text(0, 256)),
})


@dataclass(frozen=True)
class StoredDoc:
    """A document as stored: ``version`` is the store version of its last write,
    ``created_version`` that of its creation, ``updated_unix`` / ``author`` who wrote it when
    (taken from the command, never from a clock, so every replica agrees)."""

    document: Document
    version: int
    created_version: int
    updated_unix: float
    author: str

    def to_dict(self) -> dict[str, Any]:
        """Plain data: kind, name, spec, version, created_version, updated_unix, author."""
        d = self.document
        return {"kind": d.kind, "name": d.name, "spec": copy_plain(d.spec),
                "version": self.version, "created_version": self.created_version,
                "updated_unix": self.updated_unix, "author": self.author}

    def to_manifest(self) -> dict[str, Any]:
        """``{"kind","name","version","spec"}``: what ``meshctl policy get`` prints, so an
        operator can edit it and apply it back with the version as a precondition."""
        d = self.document
        return {"kind": d.kind, "name": d.name, "version": self.version,
                "spec": copy_plain(d.spec)}

    @classmethod
    def from_dict(cls, data: object, path: str = "doc") -> StoredDoc:
        """Rebuild from :meth:`to_dict` output; raises :class:`PolicyError` naming the field."""
        fields = _STORED(data, path)
        try:
            doc = validate({"kind": fields["kind"], "name": fields["name"],
                            "spec": fields["spec"]})
        except PolicyError as exc:
            raise exc.prefixed(path) from None
        if fields["created_version"] > fields["version"]:
            raise PolicyError(f"{path}.created_version", "must be <= version")
        return cls(doc, fields["version"], fields["created_version"], fields["updated_unix"],
                   fields["author"])


@dataclass(frozen=True)
class Change:
    """One committed mutation, as read replicas and watchers receive it.

    ``op`` is "put" (``doc`` is the new StoredDoc) or "delete" (``doc`` is None); ``version`` is
    the store version the change produced.
    """

    version: int
    op: Literal["put", "delete"]
    kind: str
    name: str
    doc: StoredDoc | None
    at: float
    author: str

    def to_dict(self) -> dict[str, Any]:
        """Plain data with the same keys as the dataclass (``doc`` as ``StoredDoc.to_dict()``)."""
        return {"version": self.version, "op": self.op, "kind": self.kind, "name": self.name,
                "doc": self.doc.to_dict() if self.doc is not None else None,
                "at": self.at, "author": self.author}

    @classmethod
    def from_dict(cls, data: object, path: str = "change") -> Change:
        """Rebuild from :meth:`to_dict` output, checking it is self-consistent."""
        fields = _CHANGE(data, path)
        kind, name, raw_doc = fields["kind"], fields["name"], fields["doc"]
        doc: StoredDoc | None = None
        if fields["op"] == "put":
            doc = StoredDoc.from_dict(raw_doc, f"{path}.doc")
            if doc.document.key != (kind, name):
                raise PolicyError(f"{path}.doc", "kind and name differ from the change's")
            if doc.version != fields["version"]:
                raise PolicyError(f"{path}.doc.version", "must equal the change's version")
        else:
            if raw_doc is not None:
                raise PolicyError(f"{path}.doc", "must be null for a delete")
            try:  # a delete carries no document; check its kind and name on their own
                kind, name = validate_key(kind, name)
            except PolicyError as exc:
                raise exc.prefixed(path) from None
        return cls(fields["version"], fields["op"], kind, name, doc, fields["at"],
                   fields["author"])
