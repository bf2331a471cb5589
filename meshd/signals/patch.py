"""Which rows a node's gossip patch carries: every row changed materially since a base.

A node with many models has a ``sig`` section larger than one gossip broadcast (1 KiB), so the
whole section spreads only by push-pull, seconds to a minute apart.  Between push-pulls each
publication goes out as a :class:`~meshd.signals.wire.Patch` against a *base* seq.

Each row (a replica, a GPU, the collective timings, the CPU-only note) remembers the seq of its
last *material* change (:mod:`meshd.signals.publish` criteria, against the value last judged
material). A patch carries the current value of every row changed after its base, so it is
**cumulative**: a receiver holding any copy at or after the base ends up right however many
earlier patches it missed, including a row that went back to an older value. The base is the
oldest seq for which those rows still fit in ``budget`` bytes, so it only moves on as far as
the node's churn forces it to. Every patch is superseded by the next within a few gossip
rounds, so some receivers miss some; a base newer than ``BASE_HOLD`` would leave those waiting
for push-pull. So when the changed rows do not fit against an old enough base, this
publication's changes that do not fit wait for the next one (readiness and removals first, then
the longest waiting), for up to ``MAX_WAIT``: a burst of changes is spread over a few
publications rather than lost, to receivers that missed a patch, for a push-pull interval.
Churn beyond what one broadcast per publication carries moves the base every time. Rows changed
only non-materially stay out, as the gossip gate leaves them out; rows not sent for ``refresh``
seconds fill whatever room is left, oldest first, so their ages stay bounded by rotation. Pure:
time is an argument.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Any

from adapters.model import GpuState, ReplicaState
from meshd.signals.publish import PublishConfig, comm_changed, gpu_reason, replica_reason
from meshd.signals.wire import NodeSignals, Patch, comm_row, gpu_row, pack, patch_doc, replica_row

BUDGET = 700
"""Bytes a patch may take: gossip's broadcast limit (1024) less the node-state delta's other
sections (the coordinate and the Raft summary, about 150 bytes) and framing."""
BASE_HOLD = 2.0
"""Seconds a publication must be old before the base may move past it while changes can wait
instead: a receiver that missed a patch or two (each is superseded by the next within a few
gossip rounds) still holds one the next patch applies to."""
MAX_WAIT = 1.0
"""Seconds a held-back change waits at most: then the base moves on (stranding, until
push-pull, receivers that missed a patch since) rather than delaying changes further."""
HEADER_ALLOWANCE = 48
"""Bytes allowed for the patch's header (epoch, base, seq, wall clock, map keys)."""
COMM, CPU_ONLY = "comm", "cpu_only"
"""Keys of the two whole-value rows; replicas are ``r:<key>`` and GPUs ``g:<uuid>``."""


@dataclass(slots=True)
class _Row:
    judged: Any
    """The value the last material change was judged on."""
    changed: int
    """Seq of the last material change (or of the removal)."""
    gone: bool = False


class PatchTracker:
    """Remembers each row's last material change; builds each publication's patch."""

    def __init__(self, cfg: PublishConfig | None = None, budget: int = BUDGET) -> None:
        self.cfg = cfg or PublishConfig()
        self.budget = budget
        self.epoch: int | None = None
        self.base = 0
        """Only grows: a receiver at or after it can always apply the next patch."""
        self.rows: dict[str, _Row] = {}
        self.sent_at: dict[str, float] = {}
        """When each row last went out (in a patch, or whole at a rebase)."""
        self.last = 0
        """Seq of the last publication."""
        self.rebases: dict[str, int] = {"start": 0, "moved": 0}
        self.deferred = 0
        """Row changes held back a publication so that the base could stay."""
        self._published: deque[tuple[int, float]] = deque()  # (seq, time) after the base
        self.waiting: dict[str, float] = {}
        """Rows whose change is held back, with when they first waited."""
        self._costs: dict[str, int] = {}  # this publication's row sizes, each packed once

    def publish(self, sig: NodeSignals, now: float, wall: float | None) -> bytes | None:
        """The patch to gossip with the publication of ``sig`` (None at a new run's first
        publication: receivers need the whole section)."""
        current = self._current(sig)
        self._costs = {}
        if self.epoch != sig.epoch:
            self.epoch, self.base, self.last, self.rows = sig.epoch, sig.seq, sig.seq, {}
            self._judge(current, sig.seq)
            self.rebases["start"] += 1
            self.sent_at = dict.fromkeys(self.rows, now)
            return None
        if sig.seq <= self.base:
            return None
        before = self._judge(current, sig.seq)
        base = self._choose_base(current, now)
        held = self._held(now)
        if base > held and not any(now - t >= MAX_WAIT for t in self.waiting.values()):
            # Moving the base that far would strand receivers that missed a recent patch:
            # hold back this publication's changes instead, as far as that lets it stay.
            base = max(self._choose_base(current, now, skip=sig.seq), held)
            self._defer(before, current, base, now)
        elif base > self.last:
            # Not even this publication's changes fit: against the last one, and what does
            # not fit waits for the next.
            base = max(self.base, self.last)
            self._defer(before, current, base, now)
        if base > self.base:
            self.rebases["moved"] += 1
            self.base = base
            self.rows = {k: r for k, r in self.rows.items()
                         if not r.gone or r.changed > base}  # older removals: spent
            while self._published and self._published[0][0] <= base:
                self._published.popleft()
        self.last = sig.seq
        self._published.append((sig.seq, now))
        due = sorted(k for k, r in self.rows.items() if r.changed > base)
        for key in due:
            self.waiting.pop(key, None)
        patch = Patch(sig.epoch, base, sig.seq)
        for key in due:
            self._put(patch, key, current.get(key), self.rows[key])
        self._fill(patch, current, due, now)
        return pack(patch_doc(patch, now, wall))

    def _held(self, now: float) -> int:
        """The newest base the hold allows: the last publication at least ``BASE_HOLD`` old."""
        newest = self.base
        for seq, at in self._published:
            if now - at < BASE_HOLD:
                break
            newest = seq
        return newest

    def _defer(self, before: dict[str, _Row | None], current: dict[str, Any], base: int,
               now: float) -> None:
        """Keep the changes of this publication that fit next to those already due against
        ``base`` (readiness and removals first, then the longest waiting); put the rows of the
        others back as they were, to be judged (and so sent) again next time."""
        size = HEADER_ALLOWANCE + sum(self._cost(k, current.get(k), now)
                                      for k, r in self.rows.items()
                                      if r.changed > base and k not in before)

        def order(key: str) -> tuple[bool, float, str]:
            row, value, old = self.rows[key], current.get(key), before[key]
            urgent = row.gone or isinstance(value, ReplicaState) and (
                old is None or old.judged.ready != value.ready)
            return (not urgent, self.waiting.get(key, now), key)

        for key in sorted(before, key=order):
            size += self._cost(key, current.get(key), now)
            if size > self.budget:
                old = before[key]
                if old is None:
                    del self.rows[key]
                else:
                    self.rows[key] = old
                self.waiting.setdefault(key, now)
                self.deferred += 1

    # --- the rows -------------------------------------------------------------------------

    def _current(self, sig: NodeSignals) -> dict[str, Any]:
        out: dict[str, Any] = {"r:" + r.key: r for r in sig.replicas}
        out.update({"g:" + g.uuid: g for g in sig.gpus})
        out[COMM] = list(sig.comm)
        out[CPU_ONLY] = sig.cpu_only
        return out

    def _material(self, key: str, old: Any, new: Any) -> bool:
        if key == COMM:
            return comm_changed(old, new)
        if key == CPU_ONLY:
            return bool(old != new)
        if key.startswith("r:"):
            return replica_reason(old, new, self.cfg) is not None
        return gpu_reason(old, new, self.cfg) is not None

    def _judge(self, current: dict[str, Any], seq: int) -> dict[str, _Row | None]:
        """Mark the rows changed materially at ``seq``; returns them as they were before."""
        before: dict[str, _Row | None] = {}
        for key, value in current.items():
            row = self.rows.get(key)
            if row is None or row.gone or self._material(key, row.judged, value):
                before[key] = row
                self.rows[key] = _Row(value, seq)
        for key, row in list(self.rows.items()):
            if key not in current and not row.gone:
                before[key] = row
                self.rows[key] = _Row(row.judged, seq, gone=True)
        return before

    def _cost(self, key: str, value: Any, now: float) -> int:
        """Bytes ``key``'s row takes in a patch (None: its removal)."""
        cost = self._costs.get(key)
        if cost is None:
            cost = self._costs[key] = self._size(key, value, now)
        return cost

    def _size(self, key: str, value: Any, now: float) -> int:
        if value is None:
            return len(key) + 16  # a removal: the row's identity only
        if key == COMM:
            return len(pack([comm_row(c, now) for c in value]))
        if key == CPU_ONLY:
            return len(value) + 4
        if key.startswith("r:"):
            return len(pack(replica_row(value, now)))
        return len(pack(gpu_row(value, now)))

    def _choose_base(self, current: dict[str, Any], now: float, skip: int = -1) -> int:
        """The oldest base (not before the last) whose changed rows fit in the budget, not
        counting those changed at ``skip``."""
        by_seq: dict[int, int] = {}
        for key, row in self.rows.items():
            if row.changed > self.base and row.changed != skip:
                by_seq[row.changed] = by_seq.get(row.changed, 0) + self._cost(
                    key, current.get(key), now)
        size = HEADER_ALLOWANCE
        for changed in sorted(by_seq, reverse=True):
            size += by_seq[changed]
            if size > self.budget:
                return changed  # rows changed after it fit; it and older ones do not
        return self.base

    def _put(self, patch: Patch, key: str, value: Any, row: _Row | None) -> None:
        """Put ``key``'s current ``value`` in (None: the row is gone; ``row`` says which)."""
        if key == COMM:
            patch.comm = list(value)
        elif key == CPU_ONLY:
            patch.cpu_only = value
        elif key.startswith("r:"):
            if value is None:
                assert row is not None
                patch.removed.append((row.judged.model, row.judged.version, row.judged.endpoint))
            else:
                patch.replicas.append(value)
        elif value is None:
            patch.removed_gpus.append(key[2:])
        else:
            patch.gpus.append(value)

    def _fill(self, patch: Patch, current: dict[str, Any], due: list[str], now: float) -> None:
        """Send rows not sent for ``refresh`` seconds, oldest first, in the room left."""
        for key in due:
            self.sent_at[key] = now
        size = len(pack(patch_doc(patch, now))) + HEADER_ALLOWANCE
        taken = set(due)
        stale = sorted((self.sent_at.get(k, float("-inf")), k) for k, v in current.items()
                       if k not in taken and isinstance(v, ReplicaState | GpuState))
        for sent, key in stale:
            if now - sent < self.cfg.refresh:
                break
            cost = self._cost(key, current[key], now)
            if size + cost > self.budget:
                continue
            size += cost
            self.sent_at[key] = now
            self._put(patch, key, current[key], None)
