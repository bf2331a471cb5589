"""The node-state blob each agent publishes through gossip: named sections, one per layer.

Gossip carries the blob opaquely (``Swim.publish_state``); this module gives it a shape so that
topology (the coordinate) and, later, the signal plane (telemetry) can share it without
knowing about each other.  The wire form is a msgpack map ``{section name: bytes}``; a section
a node does not understand is ignored, so newer agents can add sections.

A blob too large for one gossip broadcast spreads whole only by push-pull.  Each publication
then also offers gossip a *delta*: ``[{name: section}, {name: patch}]``, the sections changed
since a base publication, each whole or, for a section whose owner can say what changed in
it (the telemetry), as that owner's patch.  Deltas are cumulative since their base (a
receiver that missed one is put right by the next) and the base moves on when they outgrow
the broadcast limit.
"""

from __future__ import annotations

from collections.abc import Collection

import msgpack

COORDINATE = "coord"
"""Vivaldi coordinate, ``topology.wire`` form."""

MAX_SECTIONS = 32


class NodeStateError(ValueError):
    """A node-state blob that is not a map of section name to bytes."""


def encode(sections: dict[str, bytes]) -> bytes:
    return bytes(msgpack.packb(dict(sorted(sections.items())), use_bin_type=True))


def decode(blob: bytes) -> dict[str, bytes]:
    try:
        doc = msgpack.unpackb(blob, raw=False, strict_map_key=True, max_map_len=MAX_SECTIONS)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise NodeStateError(f"not msgpack: {exc}") from None
    if not isinstance(doc, dict):
        raise NodeStateError(f"expected a map of sections, got {type(doc).__name__}")
    for key, value in doc.items():
        if not isinstance(key, str) or not isinstance(value, bytes):
            raise NodeStateError("sections must map names (str) to bytes")
    return doc


def decode_delta(raw: bytes) -> tuple[dict[str, bytes], dict[str, bytes]]:
    """The whole sections and the patches of a delta; raises :class:`NodeStateError`."""
    try:
        doc = msgpack.unpackb(raw, raw=False, strict_map_key=True, max_map_len=MAX_SECTIONS,
                              max_array_len=2)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise NodeStateError(f"not msgpack: {exc}") from None
    if not isinstance(doc, list) or len(doc) != 2 or not all(isinstance(d, dict) for d in doc):
        raise NodeStateError("expected [sections, patches]")
    for part in doc:
        for key, value in part.items():
            if not isinstance(key, str) or not isinstance(value, bytes):
                raise NodeStateError("sections and patches must map names (str) to bytes")
    return doc[0], doc[1]


def encode_delta(sections: dict[str, bytes], patches: dict[str, bytes]) -> bytes:
    return bytes(msgpack.packb([dict(sorted(sections.items())), dict(sorted(patches.items()))],
                               use_bin_type=True))


class Publisher:
    """Holds this node's sections; hands out the blob (and its delta) when one changed."""

    def __init__(self, delta_limit: int = 1024) -> None:
        self.sections: dict[str, bytes] = {}
        self.delta_limit = delta_limit
        """Bytes a delta may take (gossip's broadcast limit less message framing)."""
        self._patches: dict[str, bytes | None] = {}
        self._since: set[str] = set()  # sections changed since the delta's base
        self._now: set[str] = set()  # ... and since the last take
        self.rebases = 0

    def set(self, name: str, data: bytes, patch: bytes | None = None) -> None:
        """Set a section; ``patch`` says how it changed since its owner's own base (sent in
        place of the section when it is given)."""
        if self.sections.get(name) != data:
            self.sections[name] = data
            self._patches[name] = patch
            self._now.add(name)

    def take(self) -> tuple[bytes, bytes | None] | None:
        """``(blob, delta)`` if anything changed since the last call, else None.  The delta
        is None when not even this call's changes fit in :attr:`delta_limit`."""
        if not self._now:
            return None
        changed, self._now = self._now, set()
        self._since |= changed
        delta = self._delta(self._since)
        if delta is None:
            # Start over from this call's changes, less whole sections too big for any delta
            # (they travel by push-pull; a patched one is back in when its owner patches again).
            self.rebases += 1
            self._since = {n for n in changed if self._patches.get(n) is not None
                           or len(self.sections[n]) <= self.delta_limit // 2}
            delta = self._delta(self._since)
        return encode(self.sections), delta

    def _delta(self, names: Collection[str]) -> bytes | None:
        if not names:
            return None
        whole = {n: self.sections[n] for n in names if self._patches.get(n) is None}
        patched = {n: p for n in names if (p := self._patches.get(n)) is not None}
        raw = encode_delta(whole, patched)
        return raw if len(raw) <= self.delta_limit else None
