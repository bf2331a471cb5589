"""The node-state blob each agent publishes through gossip: named sections, one per layer.

Gossip carries the blob opaquely (``Swim.publish_state``); this module gives it a shape so that
topology (the coordinate) and, later, the signal plane (telemetry) can share it without
knowing about each other.  The wire form is a msgpack map ``{section name: bytes}``; a section
a node does not understand is ignored, so newer agents can add sections.
"""

from __future__ import annotations

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


class Publisher:
    """Holds this node's sections and republishes the blob when one of them changes."""

    def __init__(self) -> None:
        self.sections: dict[str, bytes] = {}
        self._dirty = False

    def set(self, name: str, data: bytes) -> None:
        if self.sections.get(name) != data:
            self.sections[name] = data
            self._dirty = True

    def take(self) -> bytes | None:
        """The blob to publish if anything changed since the last call, else None."""
        if not self._dirty:
            return None
        self._dirty = False
        return encode(self.sections)
