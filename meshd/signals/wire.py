"""The wire form of a node's telemetry: the ``sig`` node-state section and subscription pushes.

One msgpack map, rows as arrays (no per-row keys) and floats as float32, so a node with a few
models and GPUs stays well under gossip's 1 KiB broadcast limit.  A larger node's section
travels whole only by push-pull; between those, gossip carries a :class:`Patch`: the rows that
changed since a base seq, in the same row forms.  Times travel as **ages** in
milliseconds at encoding time, never as clock readings: agents' monotonic clocks are
unrelated, and the receiver rebuilds "measured at" from its own clock minus the age.

A section can spend seconds in transit (gossip retransmits it over several rounds, push-pull
hands over a copy encoded up to a refresh interval earlier), and an age frozen at encoding
would understate exactly the figures that are stalest.  So the section also carries the
publisher's wall-clock time of encoding (``w``, unix ms), and the receiver adds the transit
time its own wall clock gives, clamped to ``[0, MAX_TRANSIT]``.  Clock skew then errs on the
safe side as far as it can: a publisher whose clock runs ahead looks fresher by at most its
section's real transit (clamped at 0), one whose clock runs behind looks older by the skew
(at most ``MAX_TRANSIT``).  meshd already needs roughly synchronised clocks for certificate
validity, so NTP-level skew (milliseconds) is the expected case.

Decoding is strict: every field is type- and range-checked, and a section that fails is
rejected whole with a :class:`SignalWireError` naming the field (the caller counts and drops it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import msgpack

from adapters.model import CommStats, GpuState, MigProfile, ReplicaState, replica_key

SECTION = "sig"
"""Node-state section name."""
MAX_REPLICAS = 1024
MAX_GPUS = 64
MAX_COMM = 64
MAX_TEXT = 256
MAX_AGE_MS = 86_400_000
MAX_TRANSIT = 60.0
"""Seconds of transit credited at most (bounds what a lagging publisher clock can add)."""
MAX_WALL_MS = 1 << 53
AGE_GROUPS = ("ready", "queue", "stats")
REPLICA_FIELDS = 18
"""Fields of a replica row without its optional trailing ``http`` column (19 with it)."""


class SignalWireError(ValueError):
    """A telemetry section that cannot be used; the message names the bad field."""


@dataclass(slots=True)
class NodeSignals:
    """Everything one node says about its runtimes, GPUs and collectives."""

    epoch: int = 0
    """Identifies one run of the publisher (a restart starts a new epoch, and its seq at 0)."""
    seq: int = 0
    """The publisher's sequence number in its epoch: newer wins, whichever way it came."""
    replicas: list[ReplicaState] = field(default_factory=list)
    gpus: list[GpuState] = field(default_factory=list)
    comm: list[CommStats] = field(default_factory=list)
    cpu_only: str = ""
    """Why the node has no GPU telemetry ("" when NVML works)."""


def _age(now: float, at: float | None) -> int:
    if at is None or at <= 0:
        return -1
    return max(0, min(MAX_AGE_MS, round((now - at) * 1000)))


def replica_row(r: ReplicaState, now: float) -> list[Any]:
    row = [r.model, r.version, r.endpoint, r.runtime, r.ready, r.queue, r.inflight,
           r.instances, r.max_batch, r.dynamic_batching, r.rate, r.queue_seconds,
           r.compute_seconds, r.spu, r.latency_ewma, r.latency_p95, r.failures,
           [_age(now, r.at.get(g)) for g in AGE_GROUPS]]
    if r.http:
        # Last, and only when there is one: a replica without HTTP costs no byte more, and
        # its row is the one nodes that predate the column send and expect.
        row.append(r.http)
    return row


def gpu_row(g: GpuState, now: float) -> list[Any]:
    return [g.uuid, g.index, g.name, g.memory_total, g.memory_free, g.sm_util, g.mem_util,
            g.temperature_c, g.power_w, g.ecc_uncorrected, g.ecc_corrected, list(g.throttle),
            [[m.uuid, m.profile, m.memory_total, m.memory_free] for m in g.mig], _age(now, g.at)]


def comm_row(c: CommStats, now: float) -> list[Any]:
    return [c.job, c.op, c.seconds, c.bytes, c.algorithm, c.world_size, list(c.peers),
            _age(now, c.at)]


def pack(doc: Any) -> bytes:
    """The wire encoding of a section, a patch or one row (rows are sized one by one)."""
    return bytes(msgpack.packb(doc, use_bin_type=True, use_single_float=True))


def encode(sig: NodeSignals, now: float, wall: float | None = None) -> bytes:
    """``now`` is the monotonic clock the ``at`` times use; ``wall`` is ``time.time()``."""
    doc: dict[str, Any] = {"e": sig.epoch, "s": sig.seq,
                           "r": [replica_row(r, now) for r in sig.replicas],
                           "g": [gpu_row(g, now) for g in sig.gpus],
                           "c": [comm_row(c, now) for c in sig.comm]}
    if sig.cpu_only:
        doc["x"] = sig.cpu_only
    if wall is not None:
        doc["w"] = round(wall * 1000)
    return pack(doc)


@dataclass(slots=True)
class Patch:
    """The rows of a node's signals that changed since a base ``seq`` it published earlier.

    A patch is *cumulative*: it carries the current value of every row that changed materially
    at any point since ``base`` (see :mod:`meshd.signals.patch`), so it brings any copy of the
    same epoch whose seq is in ``[base, seq)`` up to ``seq``, however many patches that copy
    missed.  ``comm`` and ``cpu_only`` are None when unchanged since the base.
    """

    epoch: int
    base: int
    seq: int
    replicas: list[ReplicaState] = field(default_factory=list)
    removed: list[tuple[str, str, str]] = field(default_factory=list)
    """Replicas gone since the base, as ``(model, version, endpoint)``."""
    gpus: list[GpuState] = field(default_factory=list)
    removed_gpus: list[str] = field(default_factory=list)
    comm: list[CommStats] | None = None
    cpu_only: str | None = None

    def applies_to(self, sig: NodeSignals) -> bool:
        """Whether ``sig`` is a copy this patch can bring up to date."""
        return sig.epoch == self.epoch and self.base <= sig.seq < self.seq

    def apply(self, sig: NodeSignals) -> NodeSignals:
        """``sig`` with this patch's rows put in (rows keep their places; new ones go last)."""
        reps = {r.key: r for r in sig.replicas}
        for model, version, endpoint in self.removed:
            reps.pop(replica_key(endpoint, model, version), None)
        for r in self.replicas:
            reps[r.key] = r
        gpus = {g.uuid: g for g in sig.gpus}
        for uuid in self.removed_gpus:
            gpus.pop(uuid, None)
        for g in self.gpus:
            gpus[g.uuid] = g
        return NodeSignals(
            epoch=sig.epoch, seq=self.seq, replicas=list(reps.values()), gpus=list(gpus.values()),
            comm=list(sig.comm if self.comm is None else self.comm),
            cpu_only=sig.cpu_only if self.cpu_only is None else self.cpu_only)


def encode_patch(patch: Patch, now: float, wall: float | None = None) -> bytes:
    return pack(patch_doc(patch, now, wall))


def patch_doc(patch: Patch, now: float, wall: float | None = None) -> dict[str, Any]:
    doc: dict[str, Any] = {"e": patch.epoch, "b": patch.base, "s": patch.seq}
    if patch.replicas:
        doc["r"] = [replica_row(r, now) for r in patch.replicas]
    if patch.removed:
        doc["rd"] = [list(k) for k in patch.removed]
    if patch.gpus:
        doc["g"] = [gpu_row(g, now) for g in patch.gpus]
    if patch.removed_gpus:
        doc["gd"] = list(patch.removed_gpus)
    if patch.comm is not None:
        doc["c"] = [comm_row(c, now) for c in patch.comm]
    if patch.cpu_only is not None:
        doc["x"] = patch.cpu_only
    if wall is not None:
        doc["w"] = round(wall * 1000)
    return doc


# --- decoding -------------------------------------------------------------------------------


def _text(v: Any, where: str, empty: bool = True) -> str:
    if not isinstance(v, str) or len(v) > MAX_TEXT or (not empty and not v):
        raise SignalWireError(f"{where}: expected a string of 1-{MAX_TEXT} characters")
    return v


def _int(v: Any, where: str, lo: int = 0, hi: int = 2**63 - 1, none: bool = False) -> Any:
    if v is None and none:
        return None
    if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
        raise SignalWireError(f"{where}: expected an integer in [{lo}, {hi}]")
    return v


def _num(v: Any, where: str, hi: float = math.inf) -> float | None:
    if v is None:
        return None
    if isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) \
            or not 0 <= v <= hi:
        raise SignalWireError(f"{where}: expected a finite number in [0, {hi}] or nil")
    return float(v)


def _bool(v: Any, where: str) -> bool:
    if not isinstance(v, bool):
        raise SignalWireError(f"{where}: expected a boolean")
    return v


def _rows(doc: dict[str, Any], key: str, width: int, limit: int, what: str,
          optional: int = 0) -> list[list[Any]]:
    """The rows under ``key``, each of ``width`` fields plus up to ``optional`` trailing
    ones (columns added later, sent only when they hold something)."""
    rows = doc.get(key, [])
    if not isinstance(rows, list) or len(rows) > limit:
        raise SignalWireError(f"{what}: expected a list of at most {limit} rows")
    for i, row in enumerate(rows):
        if not isinstance(row, list) or not width <= len(row) <= width + optional:
            fields = f"{width}-{width + optional}" if optional else f"{width}"
            raise SignalWireError(f"{what}[{i}]: expected a row of {fields} fields")
    return rows


def _replica_rows(doc: dict[str, Any]) -> list[list[Any]]:
    return _rows(doc, "r", REPLICA_FIELDS, MAX_REPLICAS, "r", optional=1)


def _at(age: Any, where: str, received: float) -> float:
    a = _int(age, where, -1, MAX_AGE_MS)
    return 0.0 if a < 0 else received - a / 1000.0


def transit(doc: dict[str, Any], wall: float | None) -> float:
    """Seconds the section spent between encoding and now, as the two wall clocks tell."""
    sent = _int(doc.get("w"), "w", 0, MAX_WALL_MS, none=True)
    if sent is None or wall is None:
        return 0.0
    return min(MAX_TRANSIT, max(0.0, wall - sent / 1000.0))


def _replica(r: list[Any], w: str, received: float) -> ReplicaState:
    ages = r[17]
    if not isinstance(ages, list) or len(ages) != len(AGE_GROUPS):
        raise SignalWireError(f"{w}.ages: expected {len(AGE_GROUPS)} ages")
    rep = ReplicaState(
        model=_text(r[0], f"{w}.model", empty=False), version=_text(r[1], f"{w}.version"),
        endpoint=_text(r[2], f"{w}.endpoint", empty=False),
        runtime=_text(r[3], f"{w}.runtime", empty=False), ready=_bool(r[4], f"{w}.ready"),
        queue=_int(r[5], f"{w}.queue", 0, 2**31, none=True),
        inflight=_int(r[6], f"{w}.inflight", 0, 2**31, none=True),
        instances=_int(r[7], f"{w}.instances", 1, 1 << 16),
        max_batch=_int(r[8], f"{w}.max_batch", 0, 1 << 24),
        dynamic_batching=_bool(r[9], f"{w}.dynamic_batching"),
        rate=_num(r[10], f"{w}.rate"), queue_seconds=_num(r[11], f"{w}.queue_seconds"),
        compute_seconds=_num(r[12], f"{w}.compute_seconds"), spu=_num(r[13], f"{w}.spu"),
        latency_ewma=_num(r[14], f"{w}.latency_ewma"),
        latency_p95=_num(r[15], f"{w}.latency_p95"),
        failures=_int(r[16], f"{w}.failures", 0, 2**31),
        http=_text(r[18], f"{w}.http") if len(r) > REPLICA_FIELDS else "")
    for group, age in zip(AGE_GROUPS, ages, strict=True):
        at = _at(age, f"{w}.ages.{group}", received)
        if at:
            rep.at[group] = at
    return rep


def _gpu(g: list[Any], w: str, received: float) -> GpuState:
    throttle, mig = g[11], g[12]
    if not isinstance(throttle, list) or len(throttle) > 16:
        raise SignalWireError(f"{w}.throttle: expected a list of names")
    if not isinstance(mig, list) or len(mig) > 64 or not all(
            isinstance(m, list) and len(m) == 4 for m in mig):
        raise SignalWireError(f"{w}.mig: expected rows of 4 fields")
    total = _int(g[3], f"{w}.memory_total")
    return GpuState(
        uuid=_text(g[0], f"{w}.uuid", empty=False), index=_int(g[1], f"{w}.index", 0, 1024),
        name=_text(g[2], f"{w}.name"), memory_total=total,
        memory_free=_int(g[4], f"{w}.memory_free", 0, total),
        sm_util=_num(g[5], f"{w}.sm_util", 100), mem_util=_num(g[6], f"{w}.mem_util", 100),
        temperature_c=_num(g[7], f"{w}.temperature_c", 1000),
        power_w=_num(g[8], f"{w}.power_w", 1e5),
        ecc_uncorrected=_int(g[9], f"{w}.ecc_uncorrected", none=True),
        ecc_corrected=_int(g[10], f"{w}.ecc_corrected", none=True),
        throttle=tuple(_text(t, f"{w}.throttle", empty=False) for t in throttle),
        mig=tuple(MigProfile(_text(m[0], f"{w}.mig.uuid", empty=False),
                             _text(m[1], f"{w}.mig.profile"),
                             _int(m[2], f"{w}.mig.memory_total"),
                             _int(m[3], f"{w}.mig.memory_free")) for m in mig),
        at=_at(g[13], f"{w}.age", received))


def _comm(c: list[Any], w: str, received: float) -> CommStats:
    peers = c[6]
    if not isinstance(peers, list) or len(peers) > 4096:
        raise SignalWireError(f"{w}.peers: expected a list of node names")
    return CommStats(
        job=_text(c[0], f"{w}.job", empty=False), op=_text(c[1], f"{w}.op", empty=False),
        seconds=_num(c[2], f"{w}.seconds") or 0.0, bytes=_int(c[3], f"{w}.bytes"),
        algorithm=_text(c[4], f"{w}.algorithm"),
        world_size=_int(c[5], f"{w}.world_size", 0, 1 << 20),
        peers=tuple(_text(p, f"{w}.peers", empty=False) for p in peers),
        at=_at(c[7], f"{w}.age", received))


def _doc(raw: bytes) -> dict[str, Any]:
    try:
        doc = msgpack.unpackb(raw, raw=False, strict_map_key=True, max_array_len=1 << 16,
                              max_map_len=64, max_str_len=1 << 12, max_bin_len=0)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise SignalWireError(f"not msgpack: {exc}") from None
    if not isinstance(doc, dict):
        raise SignalWireError("expected a map")
    return doc


def decode(raw: bytes, received: float, wall: float | None = None) -> NodeSignals:
    """Parse a section; ``received`` is the local monotonic time it arrived (ages -> times)
    and ``wall`` the local ``time.time()`` then (adds the transit time to every age)."""
    doc = _doc(raw)
    received -= transit(doc, wall)
    sig = NodeSignals(epoch=_int(doc.get("e"), "e", 0, 2**32), seq=_int(doc.get("s"), "s"))
    sig.cpu_only = _text(doc.get("x", ""), "x")
    sig.replicas = [_replica(r, f"r[{i}]", received)
                    for i, r in enumerate(_replica_rows(doc))]
    sig.gpus = [_gpu(g, f"g[{i}]", received)
                for i, g in enumerate(_rows(doc, "g", 14, MAX_GPUS, "g"))]
    sig.comm = [_comm(c, f"c[{i}]", received)
                for i, c in enumerate(_rows(doc, "c", 8, MAX_COMM, "c"))]
    return sig


def decode_patch(raw: bytes, received: float, wall: float | None = None) -> Patch:
    """Parse a patch, as strictly as :func:`decode` parses a section."""
    doc = _doc(raw)
    received -= transit(doc, wall)
    seq = _int(doc.get("s"), "s")
    patch = Patch(epoch=_int(doc.get("e"), "e", 0, 2**32), base=_int(doc.get("b"), "b", 0, seq),
                  seq=seq)
    if patch.base >= seq:
        raise SignalWireError("b: the base must come before the patch's seq")
    patch.replicas = [_replica(r, f"r[{i}]", received)
                      for i, r in enumerate(_replica_rows(doc))]
    patch.removed = [(_text(k[0], f"rd[{i}].model", empty=False), _text(k[1], f"rd[{i}].version"),
                      _text(k[2], f"rd[{i}].endpoint", empty=False))
                     for i, k in enumerate(_rows(doc, "rd", 3, MAX_REPLICAS, "rd"))]
    patch.gpus = [_gpu(g, f"g[{i}]", received)
                  for i, g in enumerate(_rows(doc, "g", 14, MAX_GPUS, "g"))]
    gone = doc.get("gd", [])
    if not isinstance(gone, list) or len(gone) > MAX_GPUS:
        raise SignalWireError(f"gd: expected a list of at most {MAX_GPUS} GPU uuids")
    patch.removed_gpus = [_text(u, f"gd[{i}]", empty=False) for i, u in enumerate(gone)]
    if "c" in doc:
        patch.comm = [_comm(c, f"c[{i}]", received)
                      for i, c in enumerate(_rows(doc, "c", 8, MAX_COMM, "c"))]
    if "x" in doc:
        patch.cpu_only = _text(doc["x"], "x")
    return patch
