"""Members' node state, decoded once and handed to each layer that reads a section of it.

Gossip carries every member's node-state blob, and the deltas past it, opaquely; its STATE
and DELTA events bring them here (:class:`gossip.events.MemberEvent`).  Each layer that
reads node state registers a :class:`Reader`: the coordinate plane its ``coord`` section,
the signal plane its ``sig`` section and that section's patches, the security and control
planes every publication (they look for several sections, and for their absence).  A
layer never asks gossip for the blob, and gossip never knows the layers: a datagram's path
reads straight down, from the transport through gossip to here and on to the layers.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from gossip.events import EventKind, MemberEvent
from meshd.signals import nodestate

log = logging.getLogger("meshd.agent")


@dataclass(frozen=True)
class Reader:
    """One layer's interest in members' node state."""

    learn: Callable[[str, dict[str, bytes]], None]
    """Called with a member's name and its sections."""
    section: str | None = None
    """Only when this section is present and new (None: every publication, whatever
    changed, so the layer also sees a section go away)."""
    patch: Callable[[str, bytes], None] | None = None
    """Takes the patches of :attr:`section` that deltas carry in place of the section."""
    forget: Callable[[str], None] | None = None
    """A member left or was reaped."""


class NodeStateReaders:
    """Routes gossip's node-state events to the :class:`Reader` of each layer."""

    def __init__(self, readers: Sequence[Reader],
                 malformed: Callable[[], None] = lambda: None) -> None:
        self.readers = tuple(readers)
        self.malformed = malformed
        """Counts a blob or delta that does not decode (it is dropped)."""

    def event(self, ev: MemberEvent) -> None:
        name = ev.member.name
        if ev.kind == EventKind.STATE:
            self._state(name, ev.state, ev.delta)
        elif ev.kind == EventKind.DELTA:
            self._delta(name, ev.delta, self._decode(name, ev.state))
        elif ev.kind in (EventKind.LEFT, EventKind.REAP):
            for reader in self.readers:
                if reader.forget is not None:
                    reader.forget(name)

    def _state(self, name: str, blob: bytes | None, delta: bytes | None) -> None:
        """A new node state: the layers take their sections, then any delta that arrived
        before the blob and applies over it."""
        sections = self._decode(name, blob)
        if sections is None:
            return
        self._hand(name, sections)
        if delta is not None:
            self._delta(name, delta, sections)

    def _delta(self, name: str, raw: bytes | None, sections: dict[str, bytes] | None) -> None:
        """A delta over the state held (``sections``): whole sections replace those, patches
        go to the section's reader."""
        if raw is None:
            return
        try:
            whole, patches = nodestate.decode_delta(raw)
        except nodestate.NodeStateError as exc:
            log.debug("bad node state delta", extra={"event": "bad_node_state",
                                                     "member": name, "detail": str(exc)})
            self.malformed()
            return
        self._hand(name, {**(sections or {}), **whole}, changed=set(whole))
        for reader in self.readers:
            if reader.patch is not None and reader.section is not None:
                patch = patches.get(reader.section)
                if patch is not None:
                    reader.patch(name, patch)

    def _decode(self, name: str, blob: bytes | None) -> dict[str, bytes] | None:
        if blob is None:
            return None
        try:
            return nodestate.decode(blob)
        except nodestate.NodeStateError as exc:
            log.debug("bad node state", extra={"event": "bad_node_state", "member": name,
                                               "detail": str(exc)})
            self.malformed()
            return None

    def _hand(self, name: str, sections: dict[str, bytes],
              changed: set[str] | None = None) -> None:
        """Each layer its sections; ``changed`` (a delta's) spares the layers that read one
        section a re-read of an older copy."""
        for reader in self.readers:
            if reader.section is None:
                reader.learn(name, sections)
            elif reader.section in sections and (changed is None or reader.section in changed):
                reader.learn(name, sections)
