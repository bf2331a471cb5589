"""The signal plane on one agent: its adapters' telemetry -> its own versioned node signals ->
gossip (gated) and subscribers (every change); remote signals -> the fused view.

Own state is a fresh snapshot (copies, never the adapters' live objects) taken whenever an
adapter reports a change.  Each snapshot gets the next ``seq`` of this run's ``epoch`` and is
pushed to every subscriber at once; the gossip section is only replaced when
:class:`~meshd.signals.publish.PublishGate` says the change is material (or due for a refresh),
and each such publication comes with a patch against an earlier one
(:class:`~meshd.signals.patch.PatchTracker`) that gossip broadcasts when the whole section is
too large to.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import logging
import random
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

import grpc

from adapters.gpu import GpuAdapter
from adapters.model import CommStats, GpuState, ReplicaState
from adapters.triton import TritonAdapter, TritonEndpoint
from gossip.protocol import Swim
from meshd.security.peers import PeerChannels
from meshd.security.plane import Security
from meshd.signals.fused import FusedState
from meshd.signals.patch import PatchTracker
from meshd.signals.publish import PublishConfig, PublishGate
from meshd.signals.wire import SECTION, NodeSignals, SignalWireError, decode, decode_patch, encode
from proto.mesh.v1 import state_pb2, state_pb2_grpc

log = logging.getLogger("meshd.signals")

MAX_COMM_KEPT = 16
"""Most recent collective timings kept (and published) per node."""
SUBSCRIBE_RETRY = 1.0
EXTERNAL_TTL = 30.0
"""An external runtime's replica not reported for this long is dropped."""
HEARTBEAT = 1.0
"""A fresh snapshot at least this often even when nothing changed (every queue poll when
Triton adapters run), so the measurement times subscribers (and the gossip refresh) receive
say when a figure was last *measured*, not when it last changed: a queue polled every 100 ms
and steady at 0 is fresh, not old."""


class SignalPlane:
    def __init__(self, node: str, *, triton: list[TritonEndpoint] | None = None,
                 gpu: bool = True, queue_interval: float = 0.1, stats_interval: float = 1.0,
                 gpu_interval: float = 1.0, publish: PublishConfig | None = None,
                 flags_of: Callable[[str], list[str]] = lambda n: [],
                 clock: Callable[[], float] = time.monotonic,
                 wall: Callable[[], float] = time.time) -> None:
        self.node = node
        self.clock = clock
        self.wall = wall
        self.epoch = random.getrandbits(32)
        self.seq = 0
        self.fused = FusedState(node, flags_of)
        self.gate = PublishGate(publish)
        self.patches = PatchTracker(self.gate.cfg)
        self.heartbeat = min(queue_interval, HEARTBEAT) if triton else HEARTBEAT
        self.triton = [TritonAdapter(ep, queue_interval=queue_interval,
                                     stats_interval=stats_interval, on_update=self._poke,
                                     clock=clock) for ep in (triton or [])]
        self.gpu = GpuAdapter(interval=gpu_interval, on_update=lambda _: self._poke()) \
            if gpu else None
        self.external: dict[str, ReplicaState] = {}
        self.external_gpus: dict[str, GpuState] = {}
        self.comm: list[CommStats] = []
        self.changed: Callable[[], None] = lambda: None
        """Ask the agent to republish its node state (set by the agent)."""
        self.on_comm: Callable[[CommStats], None] = lambda stats: None
        """Told of each collective timing reported here (the agent's metrics)."""
        self.rejected: Counter[str] = Counter()
        """Remote sections and pushes dropped, by reason."""
        self.patch_outcomes: Counter[str] = Counter()
        """Gossiped patches from peers: ``applied``, ``no_base`` (we hold no copy at or after
        its base: push-pull will bring one), ``stale`` (ours is as new) or ``malformed``."""
        self.current = NodeSignals(epoch=self.epoch)
        self._section: bytes | None = None
        self._patch: bytes | None = None
        self._pushed: tuple[NodeSignals, bytes] | None = None
        self._subscribers: set[asyncio.Queue[NodeSignals]] = set()
        self._poked = asyncio.Event()
        self._tasks: list[asyncio.Task[Any]] = []
        self._streams: dict[str, asyncio.Task[None]] = {}
        self._peers: PeerChannels | None = None

    # --- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        for adapter in self.triton:
            await adapter.start()
        if self.gpu is not None:
            await self.gpu.start()
        self.refresh(True)  # our own entry and first publication exist from the start
        self._tasks.append(asyncio.get_running_loop().create_task(self._loop()))

    async def close(self) -> None:
        for task in [*self._tasks, *self._streams.values()]:
            task.cancel()
        for task in [*self._tasks, *self._streams.values()]:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for adapter in self.triton:
            await adapter.close()
        if self.gpu is not None:
            await self.gpu.close()
        if self._peers is not None:
            await self._peers.close()

    def _poke(self) -> None:
        self._poked.set()

    # --- own state ----------------------------------------------------------------------

    def snapshot(self, now: float) -> NodeSignals:
        """A copy of this node's telemetry now, with the next sequence number."""
        self.external = {k: r for k, r in self.external.items()
                         if now - r.at.get("queue", r.at.get("ready", now)) < EXTERNAL_TTL}
        replicas = [r.copy() for a in self.triton for r in a.replicas.values()]
        replicas += [r.copy() for r in self.external.values()]
        gpus = [copy.copy(g) for g in self.gpu.gpus.values()] if self.gpu is not None else []
        gpus += [copy.copy(g) for g in self.external_gpus.values()]
        cpu_only = ""
        if self.gpu is None:
            cpu_only = "GPU adapter disabled"
        elif self.gpu.cpu_only:
            cpu_only = self.gpu.reason or "NVML unavailable"
        self.seq += 1
        return NodeSignals(epoch=self.epoch, seq=self.seq, replicas=replicas, gpus=gpus,
                           comm=list(self.comm), cpu_only=cpu_only if not gpus else "")

    async def _loop(self) -> None:
        last = self.clock()
        while True:
            now = self.clock()
            wait = last + self.heartbeat - now
            due = self.gate.next_due()
            if due is not None:
                wait = min(wait, due - now)  # a held or repeated publication is due first
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._poked.wait(), max(0.0, wait))
            now = self.clock()
            changed = self._poked.is_set() or now - last >= self.heartbeat
            self._poked.clear()
            if changed:
                last = now
            try:
                self.refresh(changed)
            except Exception:  # noqa: BLE001 - one bad round must not stop the plane
                log.exception("signal plane round failed")

    def refresh(self, changed: bool = True) -> None:
        now = self.clock()
        if changed:
            self.current = self.snapshot(now)
            self.fused.update(self.node, self.current, "local", now)
            for queue in self._subscribers:
                if queue.full():
                    queue.get_nowait()  # a slow subscriber gets the newest, not a backlog
                queue.put_nowait(self.current)
        if self.gate.offer(self.current, now, changed) is not None:
            wall = self.wall()
            self._section = encode(self.current, now, wall)
            self._patch = self.patches.publish(self.current, now, wall)
            self.changed()

    def section(self) -> bytes | None:
        """The gossip section, as last approved by the gate."""
        return self._section

    def patch(self) -> bytes | None:
        """The patch that brings a copy of an earlier section up to :meth:`section` (None:
        receivers need the whole section)."""
        return self._patch

    def report_replica(self, rep: ReplicaState, remove: bool = False) -> None:
        if remove:
            self.external.pop(rep.key, None)
        else:
            self.external[rep.key] = rep
        self._poke()

    def report_gpu(self, gpu: GpuState, remove: bool = False) -> None:
        if remove:
            self.external_gpus.pop(gpu.uuid, None)
        else:
            self.external_gpus[gpu.uuid] = gpu
        self._poke()

    def report_comm(self, stats: CommStats) -> None:
        self.comm = [*self.comm, stats][-MAX_COMM_KEPT:]
        self.on_comm(stats)
        self._poke()

    # --- subscribers of our state -------------------------------------------------------

    def subscribe(self) -> asyncio.Queue[NodeSignals]:
        queue: asyncio.Queue[NodeSignals] = asyncio.Queue(maxsize=1)
        queue.put_nowait(self.current)
        self._subscribers.add(queue)
        return queue

    def unsubscribe(self, queue: asyncio.Queue[NodeSignals]) -> None:
        self._subscribers.discard(queue)

    def push_bytes(self, sig: NodeSignals) -> bytes:
        """``sig`` as a subscription push, encoded once however many subscribers there are
        (a receiver credits the time since encoding from the wall clocks: see
        :mod:`meshd.signals.wire`)."""
        if self._pushed is None or self._pushed[0] is not sig:
            self._pushed = (sig, encode(sig, self.clock(), self.wall()))
        return self._pushed[1]

    # --- remote state -------------------------------------------------------------------

    def learn(self, member: str, sections: dict[str, bytes]) -> None:
        """A member's node state arrived through gossip."""
        raw = sections.get(SECTION)
        if raw is None or member == self.node:
            return
        now = self.clock()
        try:
            sig = decode(raw, now, self.wall())
        except SignalWireError as exc:
            self.rejected["gossip_malformed"] += 1
            log.debug("bad signals section", extra={"event": "bad_signals", "member": member,
                                                    "detail": str(exc)})
            return
        self.fused.update(member, sig, "gossip", now)

    def learn_patch(self, member: str, raw: bytes) -> None:
        """A member's patch arrived through gossip: apply it over the copy we hold."""
        if member == self.node:
            return
        now = self.clock()
        try:
            patch = decode_patch(raw, now, self.wall())
        except SignalWireError as exc:
            self.patch_outcomes["malformed"] += 1
            log.debug("bad signals patch", extra={"event": "bad_signals", "member": member,
                                                  "detail": str(exc)})
            return
        entry = self.fused.nodes.get(member)
        if entry is not None and patch.applies_to(entry.signals):
            self.fused.update(member, patch.apply(entry.signals), "gossip", now)
            self.patch_outcomes["applied"] += 1
        elif entry is not None and entry.signals.epoch == patch.epoch \
                and entry.signals.seq >= patch.seq:
            self.patch_outcomes["stale"] += 1
        else:
            self.patch_outcomes["no_base"] += 1

    def forget(self, member: str) -> None:
        self.fused.forget(member)
        task = self._streams.pop(member, None)
        if task is not None:
            task.cancel()

    def follow(self, swim: Swim, security: Security, wanted: Callable[[str], bool]) -> None:
        """Keep a Subscribe stream open to every live member ``wanted`` says, and only those."""
        live = {m.name: m for m in swim.members() if m.live and m.name != self.node}
        for name in [n for n in self._streams if n not in live or not wanted(n)]:
            self._streams.pop(name).cancel()
        for name, m in live.items():
            if name in self._streams or not wanted(name) or "admin" not in m.meta.ports_dict:
                continue
            target = f"{m.addr[0]}:{m.meta.ports_dict['admin']}"
            self._streams[name] = asyncio.get_running_loop().create_task(
                self._stream(name, target, security))

    async def _stream(self, name: str, target: str, security: Security) -> None:
        if self._peers is None:
            self._peers = PeerChannels(lambda: security.identity)
        while True:
            channel = self._peers.get(name, target)
            try:
                stub = state_pb2_grpc.StatePlaneStub(channel)
                async for push in stub.Subscribe(state_pb2.SubscribeRequest()):
                    now = self.clock()
                    if push.node != name:
                        self.rejected["stream_wrong_node"] += 1
                        continue
                    try:
                        sig = decode(push.signals, now, self.wall())
                    except SignalWireError:
                        self.rejected["stream_malformed"] += 1
                        continue
                    self.fused.update(name, sig, "stream", now)
            except grpc.aio.AioRpcError as exc:
                self.rejected[f"stream_{exc.code().name.lower()}"] += 1
            await asyncio.sleep(SUBSCRIBE_RETRY)
