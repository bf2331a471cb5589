"""Membership events the protocol core reports to its owner (logs, metrics, later layers)."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from gossip.state import Member


class EventKind(enum.Enum):
    JOIN = "join"
    """A member appeared, or came back after being dead or left."""
    UPDATE = "update"
    """A member's metadata changed."""
    SUSPECT = "suspect"
    """A member is suspected of having failed."""
    ALIVE = "alive"
    """A suspected member proved it is alive."""
    FAILED = "failed"
    """A member was declared dead."""
    LEFT = "left"
    """A member left gracefully."""
    REFUTE = "refute"
    """We were suspected or declared dead and refuted it with a new incarnation."""
    CONFLICT = "conflict"
    """Another address claims a live member's name; the claim was ignored."""
    OTHER_MESH = "other_mesh"
    """A node of another mesh (its metadata names another mesh id) was refused."""
    STATE = "state"
    """A member published a new version of its node state (the event carries it)."""
    DELTA = "delta"
    """A member published a delta past the node state we hold (the event carries both)."""
    REAP = "reap"
    """A dead or left member was forgotten after ``reap_time``."""


@dataclass(frozen=True, slots=True)
class MemberEvent:
    kind: EventKind
    member: Member
    at: float
    detail: str = ""
    state: bytes | None = None
    """STATE and DELTA: the member's node-state blob as gossip now holds it (for a DELTA,
    the base the delta applies over; None while push-pull has not brought one)."""
    delta: bytes | None = None
    """STATE and DELTA: the newest delta past that blob (for a STATE, one that arrived
    before the blob and still applies over it; else None)."""
