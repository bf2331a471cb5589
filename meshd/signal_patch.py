"""Which rows a node's gossip patch carries: every row changed materially since a base.

A node with many models has a ``sig`` section larger than one gossip broadcast (1 KiB), so the
whole section spreads only by push-pull, seconds to a minute apart.  Between push-pulls each
publication goes out as a :class:`~meshd.signal_wire.Patch` against a *base* seq.

Each row (a replica, a GPU, the collective timings, the CPU-only note) remembers the seq of its
last *material* change (:mod:`meshd.signal_publish` criteria, against the value last judged
material).  A patch carries the current value of every row changed after its base, so it is
**cumulative**: a receiver holding any copy at or after the base ends up right however many
earlier patches it missed, including a row that went back to an older value.  The base is the
oldest seq for which those rows still fit in ``budget`` bytes, so it only moves on as far as
the node's churn forces it to, and as few receivers as possible are left waiting for
push-pull.  Rows changed only non-materially stay out, as the gossip gate leaves them out; rows
not sent for ``refresh`` seconds fill whatever room is left, oldest first, so their ages stay
bounded by rotation.  Pure: time is an argument.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from adapters.model import CommStats, GpuState, ReplicaState
from meshd.signal_publish import PublishConfig, gpu_reason, replica_reason
from meshd.signal_wire import NodeSignals, Patch, comm_row, gpu_row, pack, patch_doc, replica_row

BUDGET = 700
"""Bytes a patch may take: gossip's broadcast limit (1024) less the node-state delta's other
sections (the coordinate and the Raft summary, about 150 bytes) and framing."""
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


def _comm_key(comm: list[CommStats]) -> list[tuple[str, str, float]]:
    return [(c.job, c.op, c.at) for c in comm]


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
        self.rebases: dict[str, int] = {"start": 0, "moved": 0, "current": 0}

    def publish(self, sig: NodeSignals, now: float, wall: float | None) -> bytes | None:
        """The patch to gossip with the publication of ``sig`` (None: none can bring
        receivers up to ``sig``; they need the whole section)."""
        if self.epoch != sig.epoch:
            self.epoch, self.base, self.rows = sig.epoch, sig.seq, {}
            self._judge(sig)
            self.rebases["start"] += 1
            self.sent_at = dict.fromkeys(self.rows, now)
            return None
        if sig.seq <= self.base:
            return None
        self._judge(sig)
        current = self._current(sig)
        base = self._choose_base(sig.seq, current, now)
        if base > self.base:
            self.rebases["moved" if base < sig.seq else "current"] += 1
            self.base = base
            self.rows = {k: r for k, r in self.rows.items()
                         if not r.gone or r.changed > base}  # older removals: spent
        if base >= sig.seq:
            self.sent_at.update(dict.fromkeys(current, now))
            return None
        due = sorted(k for k, r in self.rows.items() if r.changed > base)
        patch = Patch(sig.epoch, base, sig.seq)
        for key in due:
            self._put(patch, key, current.get(key), self.rows[key])
        self._fill(patch, current, due, now)
        return pack(patch_doc(patch, now, wall))

    # --- the rows -------------------------------------------------------------------------

    def _current(self, sig: NodeSignals) -> dict[str, Any]:
        out: dict[str, Any] = {"r:" + r.key: r for r in sig.replicas}
        out.update({"g:" + g.uuid: g for g in sig.gpus})
        out[COMM] = list(sig.comm)
        out[CPU_ONLY] = sig.cpu_only
        return out

    def _material(self, key: str, old: Any, new: Any) -> bool:
        if key == COMM:
            return bool(_comm_key(old) != _comm_key(new))
        if key == CPU_ONLY:
            return bool(old != new)
        if key.startswith("r:"):
            return replica_reason(old, new, self.cfg) is not None
        return gpu_reason(old, new, self.cfg) is not None

    def _judge(self, sig: NodeSignals) -> None:
        current = self._current(sig)
        for key, value in current.items():
            row = self.rows.get(key)
            if row is None or row.gone or self._material(key, row.judged, value):
                self.rows[key] = _Row(value, sig.seq)
        for key, row in self.rows.items():
            if key not in current and not row.gone:
                row.gone, row.changed = True, sig.seq

    def _cost(self, key: str, value: Any, now: float) -> int:
        if value is None:
            return len(key) + 16  # a removal: the row's identity only
        if key == COMM:
            return len(pack([comm_row(c, now) for c in value]))
        if key == CPU_ONLY:
            return len(value) + 4
        if key.startswith("r:"):
            return len(pack(replica_row(value, now)))
        return len(pack(gpu_row(value, now)))

    def _choose_base(self, seq: int, current: dict[str, Any], now: float) -> int:
        """The oldest base (not before the last) whose changed rows fit in the budget."""
        by_seq: dict[int, int] = {}
        for key, row in self.rows.items():
            if row.changed > self.base:
                by_seq[row.changed] = by_seq.get(row.changed, 0) + self._cost(
                    key, current.get(key), now)
        size = HEADER_ALLOWANCE
        for changed in sorted(by_seq, reverse=True):
            size += by_seq[changed]
            if size > self.budget:
                return changed  # rows changed after it fit; it and older ones do not
        return self.base if self.base < seq else seq

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
