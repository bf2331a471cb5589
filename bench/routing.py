"""Routing on real Triton replicas of uneven speed, one of them pausing on a schedule: the
meshd router (one, and three sharing the replicas) against what users run today - client-side
round robin and least-request, and NGINX ``least_conn`` - under open-loop load.

    ./dev bench routing [--quick] [--repeats 5] [--duration 30] [--sections ...]
    .venv/bin/python bench/routing.py ...

**The replicas.** Four ``meshd.dev.triton.TritonServer`` processes serving the ``delay``
model of ``tests/triton_models`` (one instance, no batching: requests queue in Triton), with
service times of 1x, 1x, 2x and 5x ``--service-ms`` (default 5 ms).  Replica ``--stalling``
(1, a 1x one) pauses for ``--stall-ms`` (250 ms) at scheduled moments, about every
``--stall-every`` seconds (4 s; each gap drawn from ``--seed``, the same schedule for every
case and repeat): a request in service or starting during a pause is held until it ends, and
the queue behind it waits too.  Every run sees the same pauses at the same offsets, so a p99
that rests on the stalls compares like with like (per-request coin flips gave one run 3
stalls and the next 9).  Each run reports how many pauses fell in its measured window.

**Capacity** is measured: each replica's saturated throughput (closed loop, straight to it),
summed; loads are shares of that sum, and each replica's share of the capacity is printed
next to its share of the traffic.

**Load.** Open loop: Poisson arrivals (seeded per repeat: every case of a repeat sees the same
arrivals) from this process (``grpc.aio``, one prebuilt ``ModelInferRequest`` sent as raw
bytes, so the generator costs the same on every path).  Latency counts from the scheduled
arrival (no coordinated omission).  Each run has ``--warmup`` s of load, then ``--duration``
measured seconds, long enough that p99 rests on >= 100 samples beyond it (the table says how
many); requests have a ``--timeout`` deadline.  Before each run the bench waits until no
replica has a request queued.

**The cases** (each run ``--repeats`` times, interleaved A B C A B C ...; ratios are taken
per repeat, between cases of the same repeat, and a bar passes only when the median ratio
meets it *and* every repeat beats the baseline):

* ``router/<strategy>`` (hedging on, the policy's default) and ``router/<strategy>/no-hedge``
  (``hedge_budget`` 0): through a meshd router (a child process: ``meshd.router.server``
  over a ``Scorer`` with a ``RoutingPolicy`` naming the strategy).  Its view of the replicas
  comes from the real signal plane: one ``SignalPlane`` per replica node polling Triton
  (queue gauge every 100 ms, statistics every 1 s), fed to the router's fused view.
  Strategies other than ``hybrid`` run ``--other-repeats`` times (they are checked for
  failures, not held to the ratio bars), and so does client-side round robin;
* ``client/round_robin``, ``client/least_request`` (Envoy's default: two random replicas,
  the one with fewer of this client's requests outstanding wins): no router;
* ``nginx/least_conn``: Debian's nginx, started by the bench, ``least_conn`` over the four
  replicas with ``grpc_pass`` (what Triton deployments put in front of their servers).

**Sections** (``--sections``):

* ``steady``: 80% load, one front door: hybrid, hybrid without hedging, the other
  strategies, both client-side balancers, NGINX.  Bar 1, and hedging at 80% (bar 3).
* ``many``: 80% load, three front doors sharing the replicas, each sent a random third of the
  arrivals: three meshd routers (each its own process, signal planes and view), three
  independent client-side least-request balancers, three NGINX instances.  Bar 1 again, on
  the p99 over all requests (the worst door's is printed beside it), and each replica's
  share of the traffic against its share of the capacity (herding).
* ``hedging``: 50% load: hybrid with and without hedging.  Bar 2.
* ``overload``: no pauses; ``--overload-pre`` s at 80%, 10 s at 150%, then
  ``--overload-post`` s at 80%: the router, NGINX and client-side least-request, each run
  twice per repeat - with the overload, and its twin at 80% throughout with the same
  arrivals before and after.  Recovery is the time from the end of the overload until the
  p99 of all requests arriving from then on is within 1.2x the twin's p99 of the same
  arrivals, with no failed request (bar <= 5 s for the router); the JSON keeps a 0.5-s
  timeline of each run.

**What no router can beat** (context for bar 3): :func:`clairvoyant` simulates a router that
knows every replica's remaining work and every pause ahead of time, at the measured service
times and the same arrivals and pauses; its p99.9 is how low any routing could bring the tail.

Prints the tables and writes ``bench/results/routing.{json,md}`` (``--out``).  The machine is
shared (2 cores): load averages and the CPU other processes used are recorded per run.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import dataclasses
import json
import math
import os
import platform
import random
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from bench import nginx as nginx_mod  # noqa: E402
from bench.child import Child, log  # noqa: E402
from bench.table import (  # noqa: E402
    Others,
    distribution,
    format_table,
    git_state,
    loadavg,
    machine_info,
    proc_cpu_s,
    quantile,
    verdict,
)

MODEL = "delay"
MODEL_BASE_MS = 2.0
"""The ``delay`` model's own ``base_delay_ms``; behaviours add to it."""
SPEEDS = (1, 1, 2, 5)
STALLING = 1
"""Index of the replica that pauses (``--stalling``): a 1x one by default, so a pause takes
about a third of the capacity away."""
METHOD = "/inference.GRPCInferenceService/ModelInfer"
STRATEGIES = ("hybrid", "p2c", "least_queue", "baseline_rr")
SECTIONS = ("steady", "many", "hedging", "overload")
STEADY_LOAD = 0.8
HEDGE_LOAD = 0.5
OVERLOAD = 1.5
OVERLOAD_S = 10.0
DOORS = 3
"""Front doors in the ``many`` section."""
P99_VS_LR_BAR = 0.7
P99_VS_NGINX_BAR = 0.8
P50_OVER_NGINX_MS = 1.0
P999_CUT_BAR = 3.0
EXTRA_BAR = 0.05
CLAIRVOYANT_BAR = 1.5
RECOVERY_BAR_S = 5.0
RECOVERY_WITHIN = 1.2
WINDOW_STEP = 0.5
"""Recovery's resolution (s)."""
RECOVERY_REST = 5.0
"""The least of the run that must be left after a recovery for its p99 to count (s)."""


# --- the router (a child process) ---------------------------------------------------------------


def child_main(spec: dict[str, Any]) -> int:
    return asyncio.run(_router_child(spec))


async def _router_child(spec: dict[str, Any]) -> int:
    """Keep a fused view of ``spec['replicas']`` fed by one signal plane per replica node;
    answer ``start POLICY`` (a fresh scorer and router; prints its address), ``finish``
    (stops it; prints its counters), ``cpu`` and ``stop`` on stdin, one JSON line each."""
    from adapters.triton import TritonEndpoint
    from meshd import collector
    from meshd.router import server as router_server
    from meshd.router.scoring import LocalScoring
    from meshd.score.scorer import Scorer
    from meshd.signals.fused import FusedState
    from meshd.signals.plane import SignalPlane
    from policy.model import validate as validate_policy

    loop = asyncio.get_running_loop()
    fused = FusedState("router")
    planes = {rep["node"]: SignalPlane(rep["node"], triton=[TritonEndpoint.parse(
        f"{rep['grpc']},metrics={rep['metrics']}")], gpu=False) for rep in spec["replicas"]}

    async def relay(node: str, plane: SignalPlane) -> None:
        queue = plane.subscribe()
        while True:
            fused.update(node, await queue.get(), "gossip", loop.time())

    for plane in planes.values():
        await plane.start()
    relays = [loop.create_task(relay(n, p)) for n, p in planes.items()]
    collector.settle()  # as the agent does once it has started
    print(json.dumps({"pid": os.getpid()}), flush=True)

    case: dict[str, Any] = {}

    async def start(policy: dict[str, Any]) -> dict[str, Any]:
        trace = policy.pop("trace", None)
        doc = validate_policy({"kind": "RoutingPolicy", "name": MODEL, "spec": policy}).spec
        scorer = Scorer(fused, policy=lambda k, n: doc if (k, n) == ("RoutingPolicy", MODEL)
                        else None)
        server, router, addr = await router_server.serve(
            LocalScoring(scorer, loop.time), loop.time, ("127.0.0.1", 0), dev=True,
            identity=lambda: None)
        attempts: list[tuple[str, float, str, bool, float]] = []
        report = scorer.report

        def recorded(decision_id: int, replica: str, latency: float, status: Any,
                     now: float, **kw: Any) -> bool:
            attempts.append((replica, latency, status.name, kw.get("hedge", False), now))
            return report(decision_id, replica, latency, status, now, **kw)

        scorer.report = recorded  # type: ignore[method-assign]
        case.update(server=server, router=router, scorer=scorer, attempts=attempts,
                    trace=trace)
        return {"addr": addr}

    async def finish() -> dict[str, Any]:
        router, scorer = case["router"], case["scorer"]
        await case["server"].stop(1)
        await router.close()
        s = scorer.counters
        by_target: dict[str, dict[str, Any]] = {}
        for replica, latency, status, hedge, _ in case["attempts"]:
            if not replica:
                continue
            t = by_target.setdefault(replica.split("/")[0], {"ok": [], "hedge_ok": [],
                                                             "status": Counter()})
            t["status"][status + ("/hedge" if hedge else "")] += 1
            if status == "OK":
                t["hedge_ok" if hedge else "ok"].append(latency * 1e3)
        attempts = {k: {"status": dict(v["status"]), "ok_ms": distribution(v["ok"]),
                        "hedge_ok_ms": distribution(v["hedge_ok"])}
                    for k, v in sorted(by_target.items())}
        if case.get("trace"):  # (ended, replica, latency, status, hedge), monotonic clock
            with open(case["trace"], "w", encoding="utf-8") as f:
                json.dump([(a[4], a[0].split("/")[0], a[1], a[2], a[3])
                           for a in case["attempts"]], f)
        return {"router": dataclasses.asdict(router.counters), "attempts": attempts,
                "scorer": {"shed": dict(s.shed), "fallbacks": dict(s.fallbacks),
                           "decisions": dict(s.decisions), "degraded": s.degraded,
                           "hedges_offered": s.hedges_offered, "hedges_sent": s.hedges_sent}}

    done = asyncio.Event()

    def commands() -> None:
        for line in sys.stdin:
            cmd, _, arg = line.strip().partition(" ")
            try:
                if cmd == "start":
                    out = asyncio.run_coroutine_threadsafe(start(json.loads(arg)), loop).result()
                elif cmd == "finish":
                    out = asyncio.run_coroutine_threadsafe(finish(), loop).result()
                elif cmd == "stop":
                    print(json.dumps({"ok": True}), flush=True)
                    break
                else:
                    out = {"error": f"unknown command {cmd!r}"}
            except Exception as exc:  # noqa: BLE001 - the parent reports it
                out = {"error": f"{type(exc).__name__}: {exc}"}
            print(json.dumps(out, default=str), flush=True)
        loop.call_soon_threadsafe(done.set)

    threading.Thread(target=commands, daemon=True).start()
    await done.wait()
    for task in relays:
        task.cancel()
    for plane in planes.values():
        await plane.close()
    return 0


# --- the schedule of pauses, and the clairvoyant router ------------------------------------


def pause_schedule(seed: int, start: float, end: float, every: float,
                   length: float) -> list[tuple[float, float]]:
    """Pauses (``(start, end)`` offsets in a run, s) between ``start`` and ``end``: gaps of
    ``every`` times a uniform draw in [0.5, 1.5), from ``seed``; the same for every run."""
    rng = random.Random(seed)
    out = []
    t = start + every * rng.uniform(0.25, 1.0)
    while t + length <= end:
        out.append((t, t + length))
        t += length + every * rng.uniform(0.5, 1.5)
    return out


def arrivals(seed: int, phases: Sequence[tuple[float, float]]) -> list[float]:
    """Poisson arrival offsets (s) for ``phases`` of ``(seconds, rate)``, from ``seed``.  Each
    phase draws from its own generator, so two runs whose phases differ in one place (the
    overload and its twin without) see the same arrivals everywhere else."""
    out: list[float] = []
    t0 = 0.0
    for k, (seconds, rate) in enumerate(phases):
        rng = random.Random(seed if k == 0 else seed * 101 + k)
        t = t0 + rng.expovariate(rate)
        while t < t0 + seconds:
            out.append(t)
            t += rng.expovariate(rate)
        t0 += seconds
    return out


def frozen_end(start: float, service: float, pauses: Sequence[tuple[float, float]]) -> float:
    """When a service that starts at ``start`` ends on a replica frozen during ``pauses`` (the
    ``delay`` model's rule: a service that meets a pause is held for the rest of it)."""
    end = start + service
    for a, b in pauses:
        if a < end and b > start:
            end += b - max(a, start)
    return end


def clairvoyant(service_s: Sequence[float], stalling: int,
                pauses: Sequence[tuple[float, float]], times: Sequence[float]) -> list[float]:
    """Latencies (ms, queue + service only) under a router no real one can match.

    It knows every replica's exact remaining work and every pause ahead of time, and sends
    each request (arriving at ``times``) to the replica that will finish it first.  Replicas
    are FIFO single servers with the deterministic ``service_s``, as the ``delay`` model is;
    replica ``stalling`` freezes during ``pauses`` (a service that meets a pause is held for
    the rest of it).  Its tail under pauses is how low any routing, hedged or not, could
    bring the tail: while a 1x replica is frozen at 80% load the others have less capacity
    than the load, and the queue that builds drains only at the spare capacity.
    """
    n = len(service_s)
    free = [0.0] * n

    def finish(i: int, t: float) -> float:
        return frozen_end(max(t, free[i]), service_s[i], pauses if i == stalling else ())

    lat = []
    for t in times:
        ends = [finish(i, t) for i in range(n)]
        best = min(range(n), key=ends.__getitem__)
        free[best] = ends[best]
        lat.append((ends[best] - t) * 1e3)
    return lat


def least_conn(service_s: Sequence[float], stalling: int,
               pauses: Sequence[tuple[float, float]], times: Sequence[float],
               rng: random.Random) -> list[float]:
    """Latencies (ms, queue + service only) under NGINX's ``least_conn`` with exact counts:
    each request to the replica with the fewest requests outstanding (ties at random).  The
    simulated twin of the NGINX case, for the p50 it reaches without any router cost."""
    n = len(service_s)
    free = [0.0] * n
    ends: list[list[float]] = [[] for _ in range(n)]
    lat = []
    for t in times:
        for i in range(n):
            if ends[i] and ends[i][0] <= t:
                ends[i] = [e for e in ends[i] if e > t]
        fewest = min(len(e) for e in ends)
        best = rng.choice([i for i in range(n) if len(ends[i]) == fewest])
        end = frozen_end(max(t, free[best]), service_s[best],
                         pauses if best == stalling else ())
        free[best] = end
        ends[best].append(end)
        lat.append((end - t) * 1e3)
    return lat


def detecting(service_s: Sequence[float], stalling: int,
              pauses: Sequence[tuple[float, float]], times: Sequence[float], detect_s: float,
              hedge: bool, weight: float = 1.0) -> list[float]:
    """Latencies (ms, queue + service only) under the best router that cannot see a pause
    coming: it knows every replica's exact queue, but learns of a pause only ``detect_s``
    after it begins (a real one must wait for silence: ``STALL_GAPS`` service times), and
    sends nothing to the paused replica from then until it answers again.  With ``hedge``,
    every request stuck there at that moment is copied, at once, to the replica that will
    finish the copy first; the request takes whichever answer comes first, and the stuck
    original still runs after the pause (as Triton runs a request whose client gave up).

    It ranks by queue + ``weight`` x service (1: each request's own earliest finish;
    ``hybrid`` uses ``SERVICE_WEIGHT``).  It is what bar 3 is read against: the requests
    already queued at a replica when it pauses, and those sent before the pause could be
    noticed, wait out the pause unless hedged, and a hedge during the pause is work added
    where the load already exceeds what the other replicas can do.
    """
    n = len(service_s)
    free = [0.0] * n
    believed = 0.0
    """When the stalling replica would be free if it had not paused (the router's view)."""
    stuck: list[tuple[int, float]] = []
    """(request, finish) of requests at the stalling replica not yet served."""
    lat = [0.0] * len(times)
    seen_at = sorted(a + detect_s for a, _ in pauses)
    """When the router notices each pause."""
    ends_of_pauses = sorted(b for _, b in pauses)
    k = m = 0

    def finish(i: int, t: float) -> float:
        return frozen_end(max(t, free[i]), service_s[i], pauses if i == stalling else ())

    for j, t in enumerate(times):
        while k < len(seen_at) and seen_at[k] <= t:
            seen = seen_at[k]
            k += 1
            if not hedge:
                continue
            for req, end in stuck:
                if end <= seen:
                    continue
                ends = {i: finish(i, seen) for i in range(n) if i != stalling}
                best = min(ends, key=ends.__getitem__)
                free[best] = ends[best]
                lat[req] = min(lat[req], (ends[best] - times[req]) * 1e3)
        paused = any(a + detect_s <= t < b for a, b in pauses)
        while m < len(ends_of_pauses) and t >= ends_of_pauses[m]:
            believed = max(believed, free[stalling])  # it answers again: its true queue
            m += 1
        ends = {}
        for i in range(n):
            if i == stalling:
                if paused:
                    continue
                ends[i] = max(t, believed) + weight * service_s[i]
            else:
                ends[i] = max(t, free[i]) + weight * service_s[i]
        best = min(ends, key=ends.__getitem__)
        end = finish(best, t)
        free[best] = end
        if best == stalling:
            believed = max(t, believed) + service_s[best]
            stuck = [(r, e) for r, e in stuck if e > t]
            stuck.append((j, end))
        lat[j] = (end - t) * 1e3
    return lat


def request_bytes() -> bytes:
    """One ``delay`` request (64 FP32 values), serialized once."""
    import numpy as np
    from tritonclient.grpc import service_pb2

    payload = np.zeros(64, np.float32)
    req = service_pb2.ModelInferRequest(model_name=MODEL)
    tensor = req.inputs.add()
    tensor.name, tensor.datatype = "PAYLOAD", "FP32"
    tensor.shape.extend(payload.shape)
    req.raw_input_contents.append(payload.tobytes())
    return req.SerializeToString()


# --- front doors and load ------------------------------------------------------------------------


class Door:
    """Where one share of the requests goes: a router or NGINX (one address), or the replicas
    themselves, picked by this door in turn or by Envoy's least-request (two random replicas,
    the one with fewer of *this door's* requests outstanding wins)."""

    def __init__(self, addrs: list[str], how: str, rng: random.Random) -> None:
        import grpc

        self.grpc = grpc
        self.how = how
        self.rng = rng
        self.channels = [grpc.aio.insecure_channel(a) for a in addrs]
        self.calls = [ch.unary_unary(METHOD) for ch in self.channels]
        self.outstanding = [0] * len(addrs)
        self._next = 0

    def pick(self) -> int:
        n = len(self.calls)
        if n == 1:
            return 0
        if self.how == "round_robin":
            self._next = (self._next + 1) % n
            return self._next
        a, b = self.rng.sample(range(n), 2)
        return b if self.outstanding[b] < self.outstanding[a] else a

    async def send(self, raw: bytes, timeout: float) -> str:
        i = self.pick()
        self.outstanding[i] += 1
        try:
            await self.calls[i](raw, timeout=timeout)
            return "OK"
        except self.grpc.aio.AioRpcError as exc:
            return str(exc.code().name)
        finally:
            self.outstanding[i] -= 1

    async def close(self) -> None:
        for ch in self.channels:
            await ch.close()


async def open_loop(doors: list[Door], raw: bytes, times: list[float], t0: float,
                    timeout: float, rng: random.Random,
                    trace: Path | None = None) -> list[tuple[float, float, str, int, float]]:
    """Send one request at each of ``times`` (offsets from ``t0`` on the loop's clock, which is
    ``time.monotonic()``) through a door drawn at random; every request's ``(arrival offset,
    latency s, outcome, door, generator lag s)``."""
    loop = asyncio.get_running_loop()
    records: list[tuple[float, float, str, int, float]] = []
    tasks: set[asyncio.Task[None]] = set()

    async def one(at: float, door: int) -> None:
        lag = loop.time() - (t0 + at)
        code = await doors[door].send(raw, timeout)
        records.append((at, loop.time() - t0 - at, code, door, lag))

    n = len(doors)
    i = 0
    while i < len(times):
        now = loop.time() - t0
        if times[i] > now:
            await asyncio.sleep(times[i] - now)
            now = loop.time() - t0
        while i < len(times) and times[i] <= now:
            task = loop.create_task(one(times[i], rng.randrange(n) if n > 1 else 0))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            i += 1
    while tasks:
        await asyncio.gather(*list(tasks))
    records.sort()
    if trace is not None:
        trace.write_text(json.dumps([r[:4] for r in records]))
    return records


def outcome(records: list[tuple[float, float, str, int, float]], start: float, end: float,
            doors: int) -> dict[str, Any]:
    """Latency (ms, OK requests), outcomes and lag of the requests that arrived in
    ``[start, end)``, overall and per door."""
    window = [r for r in records if start <= r[0] < end]
    ok = [r[1] * 1e3 for r in window if r[2] == "OK"]
    out: dict[str, Any] = {
        "arrivals": len(window), "ok": len(ok), "failed": len(window) - len(ok),
        "outcomes": dict(Counter(r[2] for r in window)),
        "throughput": len(ok) / max(1e-9, end - start), "latency_ms": distribution(ok),
        "lag_ms": distribution([r[4] * 1e3 for r in window]),
        "beyond_p99": len(ok) // 100}
    if doors > 1:
        out["doors_p99_ms"] = [distribution([r[1] * 1e3 for r in window
                                             if r[3] == d and r[2] == "OK"]).get("p99", 0.0)
                               for d in range(doors)]
    return out


def recovery(records: list[tuple[float, float, str, int, float]],
             twin: list[tuple[float, float, str, int, float]], over_end: float,
             end: float) -> float:
    """Seconds from ``over_end`` until the p99 of every request that arrives from then to
    the run's ``end`` is within ``RECOVERY_WITHIN`` x the p99 of the same arrivals in
    ``twin`` (the run without the overload), none of them failing (in steps of
    ``WINDOW_STEP``); ``inf`` when that never holds with ``RECOVERY_REST`` s or more of the
    run left.

    The p99 of everything after a point, against the same arrivals unharmed: at 80% load a
    3-s window's p99 swings by half between a calm stretch and a Poisson burst, and the p99
    before the overload is of other arrivals (one run's recovery read 15.5 s from a burst
    14 s after the overload, another's "never" from a calm stretch before it, their queues
    long drained).  Paired, the comparison measures the recovery, not the arrivals."""

    def tail(rs: list[tuple[float, float, str, int, float]],
             t: float) -> tuple[list[float], int]:
        after = [r for r in rs if r[0] >= t]
        return sorted(r[1] * 1e3 for r in after if r[2] == "OK"), len(after)

    t = over_end
    while t <= end - RECOVERY_REST + 1e-9:
        lat, n = tail(records, t)
        base, _ = tail(twin, t)
        if lat and base and len(lat) == n and \
                quantile(lat, 0.99) <= RECOVERY_WITHIN * quantile(base, 0.99):
            return t - over_end
        t += WINDOW_STEP
    return math.inf


def timeline(records: list[tuple[float, float, str, int, float]], start: float,
             end: float, step: float = 0.5) -> list[tuple[float, int, int, float, float]]:
    """``(bin start, arrivals, failed, p50 ms, p99 ms)`` per ``step`` s bin, by arrival."""
    out = []
    t = start
    while t < end:
        window = [r for r in records if t <= r[0] < t + step]
        lat = sorted(r[1] * 1e3 for r in window if r[2] == "OK")
        out.append((round(t, 2), len(window), sum(r[2] != "OK" for r in window),
                    round(quantile(lat, 0.5), 1) if lat else math.nan,
                    round(quantile(lat, 0.99), 1) if lat else math.nan))
        t += step
    return out


async def closed_loop(addr: str, raw: bytes, concurrency: int, warmup: float,
                      duration: float) -> float:
    """Requests per second one replica completes with ``concurrency`` always outstanding."""
    import grpc

    async with grpc.aio.insecure_channel(addr) as ch:
        call = ch.unary_unary(METHOD)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        start, end = t0 + warmup, t0 + warmup + duration
        done = [0]

        async def worker() -> None:
            while loop.time() < end:
                await call(raw, timeout=30)
                if loop.time() >= start:
                    done[0] += 1

        await asyncio.gather(*(worker() for _ in range(concurrency)))
        return done[0] / (loop.time() - start)


# --- the run ------------------------------------------------------------------------------------


def served(server: Any) -> int:
    """Inferences ``server`` has completed for the model (Triton's statistics)."""
    import tritonclient.grpc as tc

    client = tc.InferenceServerClient(server.grpc_url)
    try:
        stats = client.get_inference_statistics(MODEL)
        return sum(s.inference_stats.success.count + s.inference_stats.fail.count
                   for s in stats.model_stats)
    finally:
        client.close()


def pending(server: Any) -> int:
    """Requests queued in ``server`` now (Triton's pending-request gauge)."""
    import urllib.request

    from adapters.triton_stats import parse_pending

    with urllib.request.urlopen(server.metrics_url, timeout=5) as resp:
        text = resp.read().decode()
    return sum(parse_pending(text).pending.values())


def drain(servers: list[Any], timeout: float = 180.0) -> float:
    """Wait until no replica has requests queued; the seconds it took.  A case that overloads
    a replica leaves it a queue that outlives the case's deadlines - Triton runs requests
    whose clients gave up - and the next case must not inherit it."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if all(pending(s) == 0 for s in servers):
            break
        time.sleep(0.2)
    time.sleep(0.1)  # the executing request, if any
    return time.monotonic() - t0


@dataclasses.dataclass
class Fleet:
    """What the cases run against, started once."""

    servers: list[Any]
    routers: list[Child]
    nginx: list[Any]
    """One NGINX per door (``least_conn`` over every replica)."""
    capacity: list[float]
    raw: bytes

    @property
    def total(self) -> float:
        return sum(self.capacity)


def run_case(case: str, doors: int, phases: list[tuple[float, float]], measure: tuple[float, float],
             pauses: list[tuple[float, float]], seed: int, fleet: Fleet,
             args: argparse.Namespace, label: str) -> dict[str, Any]:
    """One run of ``case`` through ``doors`` front doors: load in ``phases`` (arrivals from
    ``seed``), the stalling replica paused at ``pauses`` (run offsets); the requests that
    arrived in the ``measure`` window (offsets) are the result (``records`` keeps them all)."""
    kind, *rest = case.split("/")
    trace = args.trace and args.trace / f"{label}-{case.replace('/', '-')}-{seed}"
    addrs: list[list[str]] = []
    routers = fleet.routers[:doors]
    if kind == "router":
        policy: dict[str, Any] = {"strategy": rest[0]}
        if rest[1:] == ["no-hedge"]:
            policy["hedge_budget"] = 0.0
        for i, router in enumerate(routers):
            p = dict(policy)
            if trace:
                p["trace"] = f"{trace}.router{i}.json"
            out = router.cmd("start " + json.dumps(p))
            if "error" in out:
                raise RuntimeError(f"router start: {out['error']}")
            addrs.append([out["addr"]])
    elif kind == "nginx":
        addrs = [[n.grpc_addr] for n in fleet.nginx[:doors]]
    else:
        addrs = [[s.grpc_url for s in fleet.servers]] * doors
    drained = drain(fleet.servers)
    before = [served(s) for s in fleet.servers]
    times = arrivals(seed, phases)
    pick_rng = random.Random(seed * 7919 + 1)
    others = Others(lambda: sum(proc_cpu_s(p) or 0.0 for p in pids(fleet)))
    stalling = fleet.servers[args.stalling]
    t0 = time.monotonic() + 0.3
    delay_ms = args.service_ms * SPEEDS[args.stalling] - MODEL_BASE_MS
    stalling.set_behaviour(MODEL, delay_ms=delay_ms,
                           pauses=[(t0 + a, t0 + b) for a, b in pauses])

    async def go() -> list[tuple[float, float, str, int, float]]:
        ds = [Door(a, rest[0] if kind == "client" else "", pick_rng) for a in addrs]
        try:
            return await open_loop(ds, fleet.raw, times, t0, args.timeout, pick_rng,
                                   trace and Path(f"{trace}.client.json"))
        finally:
            for d in ds:
                await d.close()

    records = asyncio.run(go())
    stalling.set_behaviour(MODEL, delay_ms=delay_ms)
    result = outcome(records, *measure, doors)
    result["records"] = records
    result["machine"] = others.done()
    result["drained_s"] = drained
    result["pauses_measured"] = sum(1 for a, _ in pauses if measure[0] <= a < measure[1])
    after = [served(s) for s in fleet.servers]
    result["replica_requests"] = [b - a for a, b in zip(before, after, strict=True)]
    if kind == "router":
        totals: Counter[str] = Counter()
        shed: Counter[str] = Counter()
        for router in routers:
            c = router.cmd("finish")
            r = c["router"]
            for k in ("requests", "hedged", "hedge_won", "failovers"):
                totals[k] += r[k]
            shed.update(r["shed"])
        n = max(1, totals["requests"])
        result["hedge_rate"] = totals["hedged"] / n
        result["hedge_won_rate"] = totals["hedge_won"] / n
        result["extra_rate"] = (totals["hedged"] + totals["failovers"]) / n
        result["shed"] = sum(shed.values())
        result["shed_reasons"] = {k: v for k, v in shed.items() if v}
    return result


def pids(fleet: Fleet) -> list[int]:
    out = [os.getpid(), *(r.pid for r in fleet.routers)]
    for n in fleet.nginx:
        out += n.pids()
    for s in fleet.servers:
        out += [p for p in [s.pid, *s.child_pids()] if p]
    return out


def measure_capacity(fleet: Fleet, args: argparse.Namespace) -> None:
    for i, server in enumerate(fleet.servers):
        rps = asyncio.run(closed_loop(server.grpc_url, fleet.raw, args.capacity_concurrency,
                                      1.0, args.capacity_duration))
        fleet.capacity.append(rps)
        log(f"replica {i} ({SPEEDS[i]}x): {rps:.0f} req/s saturated")


def service_times(capacity: list[float]) -> list[float]:
    """1 / saturated throughput per replica, for the simulated routers."""
    return [1.0 / c if c > 0 else math.inf for c in capacity]


def section_cases(section: str, args: argparse.Namespace) -> tuple[list[str], dict[str, int]]:
    """The section's cases in run order, and how many repeats each gets."""
    others = [s for s in args.strategies if s != "hybrid"]
    if section == "steady":
        main = ["router/hybrid", "router/hybrid/no-hedge", "client/least_request"] + (
            ["nginx/least_conn"] if args.nginx else [])
        # Round robin buries the 5x replica (minutes of queue to drain after each run): once
        # is enough to show it, like the strategies held to no bar but zero failures.
        extra = [f"router/{s}" for s in others] + ["client/round_robin"]
    elif section == "many":
        main = ["router/hybrid", "client/least_request"] + (
            ["nginx/least_conn"] if args.nginx else [])
        extra = []
    elif section == "hedging":
        main, extra = ["router/hybrid", "router/hybrid/no-hedge"], []
    else:
        main = ["router/hybrid", "client/least_request"] + (
            ["nginx/least_conn"] if args.nginx else [])
        extra = []
    repeats = {c: args.repeats for c in main} | {c: args.other_repeats for c in extra}
    if section == "overload":
        repeats = dict.fromkeys(main, args.overload_repeats)
    return main + extra, repeats


def run_section(section: str, fleet: Fleet, args: argparse.Namespace) -> dict[str, Any]:
    total = fleet.total
    doors = DOORS if section == "many" else 1
    warm, dur = args.warmup, args.duration
    if section == "overload":
        pre, post = args.overload_pre, args.overload_post
        phases = [(pre, STEADY_LOAD * total), (OVERLOAD_S, OVERLOAD * total),
                  (post, STEADY_LOAD * total)]
        window = (warm, pre + OVERLOAD_S + post)
        pauses: list[tuple[float, float]] = []
    else:
        load = HEDGE_LOAD if section == "hedging" else STEADY_LOAD
        phases = [(warm + dur, load * total)]
        window = (warm, warm + dur)
        pauses = pause_schedule(args.seed, 0.5, warm + dur, args.stall_every,
                                args.stall_ms / 1e3)
    names, repeats = section_cases(section, args)
    runs: dict[str, list[dict[str, Any]]] = {}
    for rep in range(max(repeats.values())):
        todo = [c for c in names if repeats[c] > rep]
        order = todo[rep % len(todo):] + todo[:rep % len(todo)]
        seed = args.seed * 1000 + rep
        for case in order:
            twin: list[tuple[float, float, str, int, float]] = []
            if section == "overload":  # the same arrivals, at 80% throughout
                calm = [phases[0], (OVERLOAD_S, STEADY_LOAD * total), phases[2]]
                t = run_case(case, doors, calm, window, pauses, seed, fleet, args, section)
                twin = t.pop("records")
            r = run_case(case, doors, phases, window, pauses, seed, fleet, args, section)
            records = r.pop("records")
            if section == "overload":
                over_end = args.overload_pre + OVERLOAD_S
                end = over_end + args.overload_post
                r["steady_p99_ms"] = outcome(twin, over_end, end, doors)["latency_ms"].get(
                    "p99", math.nan)
                r["twin"] = {k: t[k] for k in ("latency_ms", "failed", "arrivals")}
                r["recovery_s"] = recovery(records, twin, over_end, end)
                r["overload"] = outcome(records, args.overload_pre, over_end, doors)
                r["timeline"] = timeline(records, warm, over_end + args.overload_post)
                r["after"] = outcome(records, over_end, over_end + args.overload_post, doors)
            runs.setdefault(case, []).append(r)
            lat = r["latency_ms"]
            log(f"{section} repeat {rep + 1} {case}: p50 {lat.get('p50', 0):.1f} p99 "
                f"{lat.get('p99', 0):.1f} p99.9 {lat.get('p999', 0):.1f} ms, failed "
                f"{r['failed']}/{r['arrivals']} {r['outcomes']}, shed {r.get('shed', 0)}, "
                f"hedges {r.get('hedge_rate', 0):.1%}, to replicas {r['replica_requests']}"
                + (f", recovery {r['recovery_s']:.2f} s (p99 after it without the "
                   f"overload {r['steady_p99_ms']:.1f} ms)" if section == "overload" else "")
                + f", other CPU {r['machine']['other_cores'] or 0:.2f} cores")
    out: dict[str, Any] = {"doors": doors, "phases": phases, "window": window,
                           "pauses": pauses, "runs": runs}
    if section != "overload":
        out.update(simulated(fleet.capacity, args, phases, window, pauses))
    return out


def simulated(capacity: list[float], args: argparse.Namespace,
              phases: list[tuple[float, float]],
              window: tuple[float, float],
              pauses: list[tuple[float, float]]) -> dict[str, dict[str, float]]:
    """The yardsticks at the measured service times, with each repeat's arrivals and the
    pauses: the clairvoyant router, and the best router that sees a pause only after
    ``STALL_GAPS`` 1x service times of silence, without and with hedging (medians over the
    repeats of their p99 and p99.9)."""
    from meshd.score.strategies import SERVICE_WEIGHT
    from meshd.score.target import STALL_GAPS

    service = service_times(capacity)
    detect = STALL_GAPS * min(service)
    runs: dict[str, list[dict[str, float]]] = {}
    for rep in range(args.repeats):
        times = arrivals(args.seed * 1000 + rep, phases)
        for name, lat in (("clairvoyant", clairvoyant(service, args.stalling, pauses, times)),
                          ("blind", detecting(service, args.stalling, pauses, times, detect,
                                              False)),
                          ("blind_hedged", detecting(service, args.stalling, pauses, times,
                                                     detect, True)),
                          ("hybrid_rule", detecting(service, args.stalling, pauses, times,
                                                    detect, True, SERVICE_WEIGHT)),
                          ("least_conn", least_conn(service, args.stalling, pauses, times,
                                                    random.Random(rep)))):
            runs.setdefault(name, []).append(distribution(
                [x for t, x in zip(times, lat, strict=True) if window[0] <= t < window[1]]))
    return {name: {"p50": statistics.median(d["p50"] for d in ds),
                   "p99": statistics.median(d["p99"] for d in ds),
                   "p999": statistics.median(d["p999"] for d in ds),
                   "p99_runs": [d["p99"] for d in ds], "p999_runs": [d["p999"] for d in ds]}
            for name, ds in runs.items()}


# --- the verdict ----------------------------------------------------------------------------------


def spread(values: list[float], fmt: str = "{:.1f}") -> str:
    """``median (min-max)``."""
    if not values:
        return "-"
    if len(values) == 1:
        return fmt.format(values[0])
    return (f"{fmt.format(statistics.median(values))} ({fmt.format(min(values))}-"
            f"{fmt.format(max(values))})")


def q(runs: list[dict[str, Any]], key: str) -> list[float]:
    return [r["latency_ms"].get(key, math.nan) for r in runs]


def shares(runs: list[dict[str, Any]]) -> list[float]:
    """Each replica's median share of the upstream requests over the runs."""
    n = len(runs[0]["replica_requests"])
    return [statistics.median(r["replica_requests"][i] / (sum(r["replica_requests"]) or 1)
                              for r in runs) for i in range(n)]


def paired(a: list[dict[str, Any]], b: list[dict[str, Any]],
           f: Callable[[dict[str, Any], dict[str, Any]], float]) -> list[float]:
    """``f`` of the runs of two cases with the same repeat index."""
    return [f(x, y) for x, y in zip(a, b, strict=False)]


def ratio_bar(name: str, vals: list[float], bar: float, beats: Callable[[float], bool],
              higher: bool = False) -> list[str]:
    """A row: the median over paired repeats must meet ``bar`` and every repeat ``beats``."""
    if not vals:
        return [name, "not run", "", "-"]
    med = statistics.median(vals)
    ok = (med >= bar if higher else med <= bar) and all(beats(v) for v in vals)
    return [name, f"{spread(vals, '{:.2f}')}; every repeat beats the baseline: "
            f"{'yes' if all(beats(v) for v in vals) else 'no'}",
            f"{'>=' if higher else '<='} {bar:g}", verdict(ok)]


def build(results: dict[str, Any], capacity: list[float]) -> tuple[list[list[str]],
                                                                   list[list[str]]]:
    from meshd.score.target import STALL_GAPS

    cap_share = [c / (sum(capacity) or 1) for c in capacity]
    rows: list[list[str]] = []
    bars: list[list[str]] = []
    failed_router = shed_router = arrivals_router = 0
    for section, sec in results.items():
        runs = sec["runs"]
        for case, rs in runs.items():
            herd = max(s / c for s, c in zip(shares(rs), cap_share, strict=True) if c)
            rows.append([
                section + (f" x{sec['doors']}" if sec["doors"] > 1 else ""), case,
                str(len(rs)), spread(q(rs, "p50")), spread(q(rs, "p99")),
                spread(q(rs, "p999")),
                f"{sum(r['failed'] for r in rs)}/{sum(r['arrivals'] for r in rs)}",
                str(sum(r.get("shed", 0) for r in rs)) if case.startswith("router") else "-",
                spread([r["hedge_rate"] * 100 for r in rs], "{:.1f}%")
                if "hedge_rate" in rs[0] else "-",
                str(min(r["beyond_p99"] for r in rs)),
                " ".join(f"{x:.0%}" for x in shares(rs)) + f" ({herd:.2f})",
                spread([r["recovery_s"] for r in rs], "{:.1f} s")
                if "recovery_s" in rs[0] else str(rs[0]["pauses_measured"])])
            if case.startswith("router/") and section != "overload":
                failed_router += sum(r["failed"] for r in rs)
                shed_router += sum(r.get("shed", 0) for r in rs)
                arrivals_router += sum(r["arrivals"] for r in rs)
        for key, label in (("clairvoyant", "simulated: clairvoyant router"),
                           ("blind", "simulated: best router blind to pauses, no hedge"),
                           ("blind_hedged", "simulated: the same, hedging at detection"),
                           ("hybrid_rule", "simulated: the same, hedging, ranking as hybrid "
                                           "(half the service)"),
                           ("least_conn", "simulated: least_conn, exact counts")):
            if key in sec:
                c = sec[key]
                rows.append([section, f"{label} (queue + service only)", "-",
                             f"{c['p50']:.1f}" if "p50" in c else "-", f"{c['p99']:.1f}",
                             f"{c['p999']:.1f}", "-", "-", "-", "-", "-", "-"])
        hyb = runs.get("router/hybrid", [])
        where = f"{STEADY_LOAD:.0%}, {'three doors' if sec['doors'] > 1 else 'one door'}"
        if section in ("steady", "many"):
            for base, bar in (("client/least_request", P99_VS_LR_BAR),
                              ("nginx/least_conn", P99_VS_NGINX_BAR)):
                if base in runs:
                    bars.append(ratio_bar(
                        f"{where}: hybrid p99 / {base} p99",
                        paired(hyb, runs[base], lambda a, b: a["latency_ms"]["p99"]
                               / b["latency_ms"]["p99"]), bar, lambda v: v < 1.0))
            if "nginx/least_conn" in runs:
                diffs = paired(hyb, runs["nginx/least_conn"],
                               lambda a, b: a["latency_ms"]["p50"] - b["latency_ms"]["p50"])
                bars.append(ratio_bar(f"{where}: hybrid p50 - NGINX p50 (ms)", diffs,
                                      P50_OVER_NGINX_MS, lambda v: v <= P50_OVER_NGINX_MS))
        if section == "steady" and "router/hybrid/no-hedge" in runs:
            off = runs["router/hybrid/no-hedge"]
            bars.append(ratio_bar(f"{where}: hybrid p99 with hedging / without",
                                  paired(hyb, off, lambda a, b: a["latency_ms"]["p99"]
                                         / b["latency_ms"]["p99"]), 1.0, lambda v: v <= 1.0))
            best = sec["clairvoyant"]["p999"]
            bars.append(ratio_bar(f"{where}: hybrid p99.9 / the clairvoyant router's "
                                  f"({best:.1f} ms)", [r["latency_ms"]["p999"] / best
                                                      for r in hyb], CLAIRVOYANT_BAR,
                                  lambda v: True))
            if "blind" in sec:
                b, h = sec["blind"], sec["blind_hedged"]
                bars.append([f"  context, simulated: a router that knows every queue but "
                             f"sees a pause only after {STALL_GAPS:g} service times of "
                             f"silence: p99 hedged / not",
                             spread([x / y for x, y in zip(h["p99_runs"], b["p99_runs"],
                                                           strict=True)], "{:.2f}"),
                             "", "-"])
                bars.append(["  context, simulated: its p99.9 / the clairvoyant's, not "
                             "hedged and hedged",
                             f"{b['p999'] / best:.2f} and {h['p999'] / best:.2f}", "", "-"])
        if section == "hedging" and "router/hybrid/no-hedge" in runs:
            off = runs["router/hybrid/no-hedge"]
            bars.append(ratio_bar(f"{HEDGE_LOAD:.0%}: hedging's p99.9 cut (without / with)",
                                  paired(off, hyb, lambda a, b: a["latency_ms"]["p999"]
                                         / b["latency_ms"]["p999"]), P999_CUT_BAR,
                                  lambda v: v > 1.0, higher=True))
            extra = [r["extra_rate"] for r in hyb]
            bars.append([f"{HEDGE_LOAD:.0%}: hybrid's extra upstream requests (hedges + "
                         f"failovers)", spread([e * 100 for e in extra], "{:.2f}%"),
                         f"<= {EXTRA_BAR:.0%}",
                         verdict(statistics.median(extra) <= EXTRA_BAR)])
        if section == "overload":
            rec = [r["recovery_s"] for r in hyb]
            bars.append([f"recovery after {OVERLOAD_S:g} s at {OVERLOAD:.0%}: router back "
                         f"within {RECOVERY_WITHIN}x its p99", spread(rec, "{:.1f} s"),
                         f"<= {RECOVERY_BAR_S:g} s", verdict(
                             bool(rec) and max(rec) <= RECOVERY_BAR_S)])
            for base in ("nginx/least_conn", "client/least_request"):
                if base in runs:
                    bars.append([f"  beside: {base}'s recovery",
                                 spread([r["recovery_s"] for r in runs[base]], "{:.1f} s"),
                                 "", "-"])
    bars.append(["failed requests through the router, every strategy (below 100% load)",
                 f"{failed_router} of {arrivals_router}", "0", verdict(failed_router == 0)])
    bars.append(["shed requests below 100% load", f"{shed_router}", "0",
                 verdict(shed_router == 0)])
    return rows, bars


HEAD = ["section", "case", "runs", "p50 ms", "p99 ms", "p99.9 ms", "failed", "shed",
        "hedged", "beyond p99", "to replicas (busiest / its capacity share)",
        "pauses / recovery"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke sizes (says so in the output)")
    ap.add_argument("--sections", default=",".join(SECTIONS))
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--other-repeats", type=int, default=1,
                    help="repeats of the strategies other than hybrid")
    ap.add_argument("--overload-repeats", type=int, default=3)
    ap.add_argument("--duration", type=float, default=30.0, help="measured seconds per run")
    ap.add_argument("--warmup", type=float, default=3.0, help="unmeasured seconds per run")
    ap.add_argument("--overload-pre", type=float, default=10.0)
    ap.add_argument("--overload-post", type=float, default=20.0)
    ap.add_argument("--strategies", default=",".join(STRATEGIES))
    ap.add_argument("--no-nginx", dest="nginx", action="store_false")
    ap.add_argument("--service-ms", type=float, default=5.0, help="the 1x service time")
    ap.add_argument("--stall-ms", type=float, default=250.0)
    ap.add_argument("--stall-every", type=float, default=4.0)
    ap.add_argument("--stalling", type=int, default=STALLING, choices=range(len(SPEEDS)),
                    help=f"index of the replica that pauses (speeds {SPEEDS})")
    ap.add_argument("--timeout", type=float, default=5.0, help="each request's deadline, s")
    ap.add_argument("--capacity-concurrency", type=int, default=4)
    ap.add_argument("--capacity-duration", type=float, default=4.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--keep", action="store_true", help="keep the work dir (logs)")
    ap.add_argument("--trace", type=Path, help="write every request's timeline here (a "
                    "directory): the client's arrivals and the routers' attempts, per run")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "routing.json")
    ap.add_argument("--rebuild", type=Path, nargs="+", help="print and write the tables "
                    "again from these runs' JSON (a later file's sections replace an "
                    "earlier one's), recomputing the simulated yardsticks (no run)")
    ap.add_argument("--router-child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.router_child:
        return child_main(json.loads(args.router_child))
    if args.rebuild:
        return rebuild(args)
    if args.quick:
        args.repeats, args.other_repeats, args.overload_repeats = 1, 1, 1
        args.duration, args.warmup, args.capacity_duration = 5.0, 1.5, 2.0
        args.overload_pre, args.overload_post = 4.0, 8.0
        if args.out == ap.get_default("out"):
            args.out = args.out.with_name("routing-quick.json")
    args.sections = [s for s in args.sections.split(",") if s]
    args.strategies = [s for s in args.strategies.split(",") if s]
    if unknown := set(args.sections) - set(SECTIONS):
        ap.error(f"unknown sections {sorted(unknown)}; known: {SECTIONS}")
    if args.nginx and not nginx_mod.installed():
        log("nginx not installed (apt-get install nginx-light): its cases are skipped")
        args.nginx = False
    if args.trace:
        args.trace.mkdir(parents=True, exist_ok=True)
    if args.service_ms * min(SPEEDS) < MODEL_BASE_MS:
        ap.error(f"--service-ms must be >= {MODEL_BASE_MS} (the model's own base delay)")

    from meshd.dev.triton import DEFAULT_REPO, TritonServer

    started = time.perf_counter()
    args.git_at_start = git_state()  # the code the run ran, whatever is committed meanwhile
    workdir = Path(tempfile.mkdtemp(prefix="meshd-bench-routing-"))
    log(f"routing{' (quick)' if args.quick else ''}: work dir {workdir}; load average "
        f"{loadavg()}")
    servers = [TritonServer(DEFAULT_REPO, workdir / f"triton{i}", models=[MODEL],
                            name=f"triton{i}") for i in range(len(SPEEDS))]
    routers: list[Child] = []
    nginxes: list[Any] = []
    results: dict[str, Any] = {}
    failed: list[str] = []
    fleet: Fleet | None = None
    try:
        for i, server in enumerate(servers):
            server.start(timeout=180)
            server.set_behaviour(MODEL, delay_ms=args.service_ms * SPEEDS[i] - MODEL_BASE_MS)
        log("replicas: " + ", ".join(f"{s.grpc_url} ({x}x)" for s, x in zip(
            servers, SPEEDS, strict=True)))
        spec = {"replicas": [{"node": f"node-{i}", "grpc": s.grpc_url,
                              "metrics": s.metrics_url} for i, s in enumerate(servers)]}
        n_routers = DOORS if "many" in args.sections else 1
        routers = [Child(__file__, "router", spec, workdir / f"router{i}.log")
                   for i in range(n_routers)]
        if args.nginx:
            nginxes = [nginx_mod.Nginx(workdir, grpc=[s.grpc_url for s in servers],
                                       balance="least_conn", name=f"nginx{i}")
                       for i in range(n_routers)]
        fleet = Fleet(servers, routers, nginxes, [], request_bytes())
        time.sleep(2.0)  # the adapters' first statistics poll
        measure_capacity(fleet, args)
        for section in args.sections:
            try:
                results[section] = run_section(section, fleet, args)
            except Exception as exc:  # noqa: BLE001 - reported
                failed.append(f"{section}: {type(exc).__name__}: {exc}")
                log(f"{section} FAILED: {exc}")
    finally:
        for router in routers:
            router.stop()
        for n in nginxes:
            n.stop()
        for server in servers:
            server.stop()
        if args.keep or failed:
            print(f"work dir kept: {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    wall = time.perf_counter() - started
    return write_report(args, results, fleet.capacity if fleet else [], failed, wall)


def rebuild(args: argparse.Namespace) -> int:
    """The tables again from runs' JSON (``--rebuild A.json [B.json ...]``; a section of a
    later file replaces the same section of an earlier one), with the simulated yardsticks
    recomputed from each run's capacity, arrivals and pauses (for a run that predates one)."""
    docs = [json.loads(p.read_text()) for p in args.rebuild]
    first = docs[0]
    for key in ("repeats", "seed", "stalling", "duration", "warmup", "service_ms",
                "stall_ms", "stall_every", "overload_pre", "overload_post", "quick"):
        if key in first["setup"]:
            setattr(args, key, first["setup"][key])
    results: dict[str, Any] = {}
    sources = []
    for path, doc in zip(args.rebuild, docs, strict=True):
        for name, sec in doc["results"].items():
            results[name] = sec
            if sec.get("pauses"):
                sec.update(simulated(doc["capacity"], args, [tuple(p) for p in sec["phases"]],
                                     tuple(sec["window"]), [tuple(p) for p in sec["pauses"]]))
        sources.append(f"{', '.join(doc['results'])} from {path.name} (commit "
                       f"{doc['git']['commit'][:12]}, {doc['when']}, capacity "
                       f"{sum(doc['capacity']):.0f} req/s)")
    return write_report(args, results, first["capacity"],
                        [f for d in docs for f in d.get("failed", [])],
                        sum(d.get("wall_s", 0.0) for d in docs), first,
                        sources if len(docs) > 1 else None)


def write_report(args: argparse.Namespace, results: dict[str, Any], capacity: list[float],
                 failed: list[str], wall: float, previous: dict[str, Any] | None = None,
                 sources: list[str] | None = None) -> int:
    """Print the tables and write ``args.out`` (JSON) and its ``.md``; 1 if a bar failed."""
    rows, bars = build(results, capacity) if results else ([], [])
    for f in failed:
        bars.append([f"section {f.split(':', 1)[0]}", f.split(":", 1)[1].strip()[:160], "",
                     "FAIL"])
    cap_share = [c / (sum(capacity) or 1) for c in capacity]
    title = (f"Routing: 4 Triton replicas ({', '.join(f'{x}x' for x in SPEEDS)} of "
             f"{args.service_ms:g} ms; replica {args.stalling} pauses {args.stall_ms:g} ms "
             f"about every {args.stall_every:g} s on a fixed schedule), open-loop Poisson "
             f"load{': QUICK sizes' if args.quick else ''}")
    notes = [
        f"capacity (saturated, summed): {sum(capacity):.0f} req/s = "
        + " + ".join(f"{c:.0f}" for c in capacity) + "; capacity shares "
        + " ".join(f"{s:.0%}" for s in cap_share),
        f"each cell: median over the runs (min-max); {args.duration:g} s measured after "
        f"{args.warmup:g} s warm-up; overload: {args.overload_pre:g} s at "
        f"{STEADY_LOAD:.0%}, {OVERLOAD_S:g} s at {OVERLOAD:.0%}, {args.overload_post:g} s at "
        f"{STEADY_LOAD:.0%}, all measured (its p99 includes the overload); 'beyond p99' is "
        f"the fewest samples past p99 in a run; 'to replicas' is each replica's share of the "
        f"upstream requests (Triton's statistics, warm-up and hedges included), with the "
        f"busiest one's share over its capacity share in brackets; 'pauses' counts the "
        f"stalling replica's pauses in the measured window",
        "ratios are per repeat (cases of the same repeat saw the same arrivals and pauses); "
        "a bar passes when the median meets it and every repeat beats the baseline",
    ]
    if sources:
        notes.append("sections of more than one run: " + "; ".join(sources))
    print(f"\n{title} ({os.cpu_count()} CPUs, Python {platform.python_version()})\n")
    print(format_table(HEAD, rows))
    print()
    print(format_table(["bar", "measured", "target", "verdict"], bars))
    for note in notes:
        print(f"\n* {note}")
    print(f"\nwall time {wall:.0f} s")
    report = {
        "benchmark": "routing", "quick": args.quick, "argv": sys.argv,
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **machine_info(),
        "loadavg_end": loadavg(), "git": getattr(args, "git_at_start", None) or git_state(),
        "wall_s": wall,
        "nginx": nginx_mod.version() if args.nginx else None,
        "setup": {k: v for k, v in vars(args).items()
                  if k not in ("out", "router_child", "git_at_start")},
        "capacity": capacity,
        "table": [dict(zip(HEAD, r, strict=True)) for r in rows],
        "bars": [dict(zip(["bar", "measured", "target", "verdict"], b, strict=True))
                 for b in bars],
        "notes": notes, "failed": failed, "results": results,
    }
    if previous is not None:  # rebuilt: the run's own provenance stays
        for key in ("when", "git", "argv", "loadavg_end", "nginx", "setup"):
            report[key] = previous.get(key)
        report["rebuilt"] = {"when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                             "git": git_state()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(report, indent=1, default=str) + "\n")
    os.replace(tmp, args.out)
    md = args.out.with_suffix(".md")
    md.write_text(f"# {title}\n\n{format_table(HEAD, rows)}\n\n"
                  f"{format_table(['bar', 'measured', 'target', 'verdict'], bars)}\n\n"
                  + "".join(f"* {n}\n" for n in notes)
                  + f"\ncommit {report['git']['commit'][:12]}, {report['when']}, wall "
                  f"{wall:.0f} s"
                  + (f"; tables rebuilt at commit {report['rebuilt']['git']['commit'][:12]} "
                     f"(`--rebuild`)" if "rebuilt" in report else "") + "\n")
    for p in (args.out, md):
        print(f"wrote {p.relative_to(ROOT) if p.is_relative_to(ROOT) else p}")
    return 1 if any(b[3] == "FAIL" for b in bars) else 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
