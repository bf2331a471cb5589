"""What a node knows about each member: status, incarnation, address and metadata.

Records are immutable and replaced on every change, so a snapshot handed to a caller never
changes under it, and a simulator can share one record among thousands of protocol cores.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import msgpack

Addr = tuple[str, int]
"""A UDP/TCP endpoint: host (IPv4 or IPv6 literal, or name) and port."""

ROLES = ("router", "gpu", "trainer", "coordinator", "edge")
"""Roles a node may advertise; meshd validates against this list, gossip carries any."""


class Status(enum.IntEnum):
    """A member's liveness as seen by one node (SWIM states plus a graceful ``left``)."""

    ALIVE = 0
    SUSPECT = 1
    DEAD = 2
    LEFT = 3

    @property
    def label(self) -> str:
        return self.name.lower()

    @classmethod
    def parse(cls, text: str) -> Status:
        try:
            return cls[text.upper()]
        except KeyError:
            raise ValueError(
                f"unknown status {text!r}; expected alive, suspect, dead or left") from None


class MetaError(ValueError):
    """Node metadata that is malformed or too large."""


MESH_TAG = "mesh"
"""The tag naming the mesh a node belongs to (its certificate's mesh id): a member of another
mesh is refused.  A tag rather than a field, so builds that predate it read the metadata."""


@dataclass(frozen=True, slots=True)
class NodeMeta:
    """Metadata announced with a node's ``alive``; a change spreads as a new incarnation."""

    roles: tuple[str, ...] = ()
    zone: str = ""
    region: str = ""
    ports: tuple[tuple[str, int], ...] = ()
    tags: tuple[tuple[str, str], ...] = ()

    @classmethod
    def build(cls, roles: list[str] | tuple[str, ...] = (), zone: str = "", region: str = "",
              ports: dict[str, int] | None = None, tags: dict[str, str] | None = None) -> NodeMeta:
        return cls(tuple(sorted(set(roles))), zone, region,
                   tuple(sorted((ports or {}).items())), tuple(sorted((tags or {}).items())))

    @property
    def ports_dict(self) -> dict[str, int]:
        return dict(self.ports)

    @property
    def tags_dict(self) -> dict[str, str]:
        return dict(self.tags)

    @property
    def mesh(self) -> str:
        """The mesh this node says it belongs to ("" when it does not say)."""
        for key, value in self.tags:
            if key == MESH_TAG:
                return value
        return ""

    def encode(self) -> bytes:
        return msgpack.packb([list(self.roles), self.zone, self.region,
                              [list(p) for p in self.ports], [list(t) for t in self.tags]])

    @classmethod
    def decode(cls, raw: bytes) -> NodeMeta:
        """Parse and validate; raises :class:`MetaError` naming what is wrong."""
        try:
            obj = msgpack.unpackb(raw, raw=False, strict_map_key=True, max_array_len=256)
        except Exception as exc:  # msgpack raises many types on garbage
            raise MetaError(f"meta is not valid msgpack: {type(exc).__name__}") from None
        if not (isinstance(obj, list) and len(obj) == 5):
            raise MetaError("meta must be a 5-element array")
        roles, zone, region, ports, tags = obj
        if not (isinstance(roles, list) and all(_short_str(r, 32) for r in roles)):
            raise MetaError("meta roles must be short strings")
        if not (_short_str(zone, 64, empty=True) and _short_str(region, 64, empty=True)):
            raise MetaError("meta zone/region must be strings of at most 64 characters")
        if not (isinstance(ports, list) and all(
                isinstance(p, list) and len(p) == 2 and _short_str(p[0], 32)
                and isinstance(p[1], int) and 0 <= p[1] <= 65535 for p in ports)):
            raise MetaError("meta ports must be [name, 0..65535] pairs")
        if not (isinstance(tags, list) and all(
                isinstance(t, list) and len(t) == 2 and _short_str(t[0], 64)
                and _short_str(t[1], 256, empty=True) for t in tags)):
            raise MetaError("meta tags must be [key, value] string pairs")
        return cls(tuple(roles), zone, region, tuple((p[0], p[1]) for p in ports),
                   tuple((t[0], t[1]) for t in tags))


def _short_str(value: object, limit: int, empty: bool = False) -> bool:
    return isinstance(value, str) and (empty or value != "") and len(value) <= limit


@dataclass(frozen=True, slots=True)
class Member:
    """One member as this node sees it."""

    name: str
    addr: Addr
    incarnation: int
    status: Status
    meta: NodeMeta = field(default_factory=NodeMeta)
    meta_raw: bytes = b""
    status_since: float = 0.0
    """Protocol time (the ``now`` passed to the core) of the last status change."""

    @property
    def live(self) -> bool:
        return self.status <= Status.SUSPECT
