"""Sequence affinity: every request of a stateful sequence reaches the replica that took its
START.

Triton keeps a sequence's state (``sequence_id`` with ``sequence_start`` ... ``sequence_end``)
in one server's sequence batcher.  A request in the middle of a sequence that reaches another
replica fails there ("must specify the START flag on the first request of the sequence"), and
one routed to a replica that happens to hold an older sequence of that id would silently
corrupt it.  So the router must know where each sequence lives, from any of its worker
processes and from any router node, without asking anyone per request.

The rule is rendezvous (highest random weight) hashing: each replica gets the score
``hash(sequence, replica)`` and the sequence goes to the highest-scoring one.  Every router
that sees the same replicas picks the same one, with no message between them; a replica that
joins or leaves moves only the sequences whose winner it is.  A START goes to the first
replica in that order that may take new work (not draining, not cordoned), and the choice is
recorded; later requests go where the record says, even to a replica that has since started
draining (it finishes what it holds).  A router with no record (another node took the START,
or the record expired) walks the same order: a replica that does not hold the sequence refuses
the request without touching any state, so the next is tried, and the first that accepts is
recorded.  When the replica that holds a sequence is gone, or no replica in the order accepts,
the sequence is lost: the client is told so by name, never silently restarted elsewhere.

Pure: no clock of its own (``now`` is passed), no I/O.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")

IDLE = 600.0
"""Seconds a sequence's record is kept after its last request (Triton ends a sequence after its
model's ``max_sequence_idle_microseconds``, 1 s by default; a record kept longer costs only
memory, one dropped early only a walk)."""
CAPACITY = 200_000
"""Records kept at most; the least recently used go first (each costs a walk, not an error)."""
NOT_HELD = "must specify the START flag"
"""What Triton answers (INVALID_ARGUMENT) to a request in the middle of a sequence it does not
hold: the request was refused before any state changed, so the next replica may be tried."""


def sequence_key(model: str, version: str, sequence_id: int | str) -> str:
    """The key of one sequence: Triton tells integer and string ids apart (5 is not "5").
    Model names and versions hold no ``/`` (they are directory names)."""
    kind = "i" if isinstance(sequence_id, int) else "s"
    return f"{model}/{version}/{kind}:{sequence_id}"


def _weight(key: str, replica: str) -> int:
    digest = hashlib.blake2b(f"{key}\0{replica}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")


def rendezvous(key: str, items: Sequence[T], name: Callable[[T], str]) -> list[T]:
    """``items`` in the order a sequence ``key`` tries them: highest ``hash(key, name)`` first.
    The same on every router that sees the same names, whatever their order."""
    return sorted(items, key=lambda item: (_weight(key, name(item)), name(item)), reverse=True)


@dataclass(slots=True)
class Record:
    replica: str
    """The replica's key (``ReplicaState.key``)."""
    node: str
    endpoint: str
    seen: float


class SequenceTable:
    """Where each sequence this router knows of lives: sequence key -> :class:`Record`."""

    def __init__(self, idle: float = IDLE, capacity: int = CAPACITY) -> None:
        self.idle = idle
        self.capacity = capacity
        self.records: OrderedDict[str, Record] = OrderedDict()
        """Sequence key -> record, least recently used first."""
        self.evicted = 0

    def __len__(self) -> int:
        return len(self.records)

    def get(self, key: str, now: float) -> Record | None:
        """The sequence's record, or None (never seen here, ended, or idle too long)."""
        rec = self.records.get(key)
        if rec is None:
            return None
        if now - rec.seen > self.idle:
            del self.records[key]
            return None
        rec.seen = now
        self.records.move_to_end(key)
        return rec

    def put(self, key: str, replica: str, node: str, endpoint: str, now: float) -> None:
        self.records[key] = Record(replica, node, endpoint, now)
        self.records.move_to_end(key)
        while len(self.records) > self.capacity:
            self.records.popitem(last=False)
            self.evicted += 1

    def end(self, key: str) -> None:
        """The sequence ended (its END was answered, or it was lost)."""
        self.records.pop(key, None)

    def sweep(self, now: float) -> None:
        """Drop records idle longer than ``idle`` (oldest first: the dict is in use order)."""
        records = self.records
        while records:
            key, rec = next(iter(records.items()))
            if now - rec.seen <= self.idle:
                return
            del records[key]
