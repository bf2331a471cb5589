"""Routing on real Triton replicas of uneven speed, one of them stalling now and then: the
router's strategies (hedging on and off) against client-side balancing, under open-loop load.

    ./dev bench routing [--quick] [--repeats 3] [--duration 20] [--loads 0.5,0.8] ...
    .venv/bin/python bench/routing.py ...

Bars (from the issue), at 80% load, on the medians of the repeats:

* ``hybrid`` (hedging on, its default) p99 <= 0.7x client-side least-request's p99;
* hedging cuts ``hybrid``'s p99.9 by >= 3x (off / on) for <= 5% extra upstream requests;
* zero failed requests through the router (a shed request counts as failed here).

**The replicas.** Four ``meshd.devtriton.TritonServer`` processes serving the ``delay``
model of ``tests/triton_models`` (one instance, no batching: requests queue in Triton), with
service times of 1x, 1x, 2x and 5x ``--service-ms`` (default 5 ms).  Replica ``--stalling``
(1, a 1x one, by default) also takes ``--stall-ms`` (250 ms) longer on a random
``--stall-rate`` (0.2%) of its requests, and the requests queued behind it wait too: the
tail hedging is for.

**What no router can beat.** While a 1x replica stalls at 80% load, the others have less
capacity than the load: a queue builds whatever the routing, and drains afterwards at the
load's spare capacity, hedged or not.  So the bench also simulates a clairvoyant router
(:func:`clairvoyant`: exact knowledge of every replica's remaining work, stalls moved at
once and for free) at the measured service times, and prints the cut it would show against
the measured no-hedge p99.9, beside the hedging bar.

**Capacity** is measured, not assumed: each replica's saturated throughput (closed loop,
``--capacity-concurrency`` requests outstanding, straight to it), summed.  The loads are
shares of that sum.

**Load.** Open loop: Poisson arrivals at the load's rate from this process (``grpc.aio``,
one prebuilt ``ModelInferRequest`` sent as raw bytes, so the generator's cost is the same on
every path).  A request's latency counts from its scheduled arrival, so a generator that
falls behind is charged, not hidden (coordinated omission); its lag is recorded.  Each
run has ``--warmup`` seconds of load first (not measured) and then ``--duration`` measured
seconds; requests have a ``--timeout`` deadline.

**The cases**, each run ``--repeats`` times, their order rotated between repeats; before
each run the bench waits until no replica has a request queued (a round-robin case leaves
the 5x replica minutes of work that would otherwise land on the next case):

* ``router/<strategy>/hedge`` and ``router/<strategy>/no-hedge``: through the meshd router
  (a child process: ``meshd.router.server.serve`` over a ``Scorer``, a fresh one per run,
  with a ``RoutingPolicy`` naming the strategy, and ``hedge_budget`` 0 for no-hedge).  Its
  view of the replicas comes from the real signal plane: one ``SignalPlane`` per replica
  node, whose Triton adapter polls the server (queue gauge every 100 ms, statistics every
  1 s), handed to the router's fused view as gossip would (without gossip's delay);
* ``client/round_robin`` and ``client/least_request``: no router; this process picks the
  replica - in turn, or Envoy's default least-request (two random replicas, the one with
  fewer of this client's requests outstanding wins).

Prints one table and writes ``bench/results/routing.{json,md}``.  The machine is shared (2
cores): load averages and the CPU other processes used are recorded per run.
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from bench.child import Child, log  # noqa: E402
from bench.table import (  # noqa: E402
    Others,
    distribution,
    format_table,
    git_state,
    loadavg,
    machine_info,
    print_table,
    proc_cpu_s,
    verdict,
)

MODEL = "delay"
MODEL_BASE_MS = 2.0
"""The ``delay`` model's own ``base_delay_ms``; behaviours add to it."""
SPEEDS = (1, 1, 2, 5)
STALLING = 1
"""Index of the replica that stalls (``--stalling``): a 1x one by default, so a stall takes
about a third of the capacity away."""
CLAIRVOYANT_RUNS = 40
METHOD = "/inference.GRPCInferenceService/ModelInfer"
STRATEGIES = ("baseline_rr", "least_queue", "p2c", "hybrid")
CLIENT_SIDE = ("round_robin", "least_request")
BAR_LOAD = 0.8
P99_RATIO_BAR = 0.7
P999_CUT_BAR = 3.0
EXTRA_BAR = 0.05


# --- the router (a child process) ---------------------------------------------------------------


def child_main(spec: dict[str, Any]) -> int:
    return asyncio.run(_router_child(spec))


async def _router_child(spec: dict[str, Any]) -> int:
    """Keep a fused view of ``spec['replicas']`` fed by one signal plane per replica node;
    answer ``start POLICY`` (a fresh scorer and router; prints its address), ``finish``
    (stops it; prints its counters), ``cpu`` and ``stop`` on stdin, one JSON line each."""
    from adapters.triton import TritonEndpoint
    from meshd.fused import FusedState
    from meshd.router import server as router_server
    from meshd.router.scoring import LocalScoring
    from meshd.score.scorer import Scorer
    from meshd.signals import SignalPlane
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


# --- load ---------------------------------------------------------------------------------------


def clairvoyant(service_s: list[float], stalling: int, stall_s: float, stall_rate: float,
                rate: float, duration: float, seed: int) -> dict[str, float]:
    """Latency quantiles (ms, queue + service only) under a router no real one can match.

    It knows every replica's exact remaining work (stalls included, from the instant they
    start) and sends each request to the replica that will finish it first; a request whose
    service stalls is moved at once and for free to the best other replica (an instant hedge
    that costs nothing and leaves no orphan), while the stalled replica stays blocked for
    the stall.  Replicas are FIFO single servers with the deterministic ``service_s``, as
    the ``delay`` model is.  Its p99.9 under stalls is how low hedging could bring the tail,
    so it tells whether a cut is out of reach for any router (queues built while a stall
    takes capacity away must drain at the load's spare capacity, hedged or not).
    """
    rng = random.Random(seed)
    n = len(service_s)
    free = [0.0] * n
    others = [i for i in range(n) if i != stalling]
    lat: list[float] = []
    t = 0.0
    while True:
        t += rng.expovariate(rate)
        if t >= duration:
            break
        best = min(range(n), key=lambda i: max(t, free[i]) + service_s[i])
        if best == stalling and rng.random() < stall_rate:
            free[best] = max(t, free[best]) + service_s[best] + stall_s
            best = min(others, key=lambda i: max(t, free[i]) + service_s[i])
        free[best] = max(t, free[best]) + service_s[best]
        lat.append((free[best] - t) * 1e3)
    return distribution(lat)


def clairvoyant_p999(capacity: list[float], args: argparse.Namespace,
                     rate: float) -> dict[str, float]:
    """The median over ``CLAIRVOYANT_RUNS`` simulated runs of the bench's length of
    :func:`clairvoyant`'s p99.9, with and without stalls, at the measured service times
    (1 / saturated throughput; the stalling replica's is its speed times the fastest other
    replica's per-speed time, as its own measured throughput includes stalls)."""
    service = [1.0 / c if c > 0 else math.inf for c in capacity]
    per_x = min(s / x for i, (s, x) in enumerate(zip(service, SPEEDS, strict=True))
                if i != args.stalling)
    service[args.stalling] = per_x * SPEEDS[args.stalling]
    out = {}
    for label, stall_rate in (("stalls", args.stall_rate), ("no_stalls", 0.0)):
        p = [clairvoyant(service, args.stalling, args.stall_ms / 1e3, stall_rate, rate,
                         args.duration, seed)["p999"] for seed in range(CLAIRVOYANT_RUNS)]
        out[label] = statistics.median(p)
    return out


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


class Paths:
    """Where a request goes: the router, or a replica this process picks."""

    def __init__(self, router: str | None, replicas: list[str], how: str,
                 rng: random.Random) -> None:
        import grpc

        self.grpc = grpc
        self.how = how
        self.rng = rng
        addrs = [router] if router else replicas
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
        a, b = self.rng.sample(range(n), 2)  # least_request: Envoy's default, P2C
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


async def open_loop(paths: Paths, raw: bytes, rate: float, warmup: float, duration: float,
                    timeout: float, rng: random.Random,
                    trace: Path | None = None) -> dict[str, Any]:
    """Poisson arrivals at ``rate`` for ``warmup + duration`` seconds; the measured window's
    latencies (from each scheduled arrival), outcomes and the generator's lag (and, with
    ``trace``, every request's (arrival, latency, outcome) written there)."""
    loop = asyncio.get_running_loop()
    records: list[tuple[float, float, str, float]] = []
    tasks: set[asyncio.Task[None]] = set()

    async def one(at: float) -> None:
        lag = loop.time() - at
        code = await paths.send(raw, timeout)
        records.append((at, loop.time() - at, code, lag))

    t0 = loop.time() + 0.05
    measure_from, end = t0 + warmup, t0 + warmup + duration
    at = t0
    while at < end:
        now = loop.time()
        if at > now:
            await asyncio.sleep(at - now)
            now = loop.time()
        while at <= now and at < end:
            task = loop.create_task(one(at))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
            at += rng.expovariate(rate)
    while tasks:
        await asyncio.gather(*list(tasks))
    window = [r for r in records if r[0] >= measure_from]
    if trace is not None:
        trace.write_text(json.dumps([r[:3] for r in sorted(window)]))
    ok = sorted(r[1] * 1e3 for r in window if r[2] == "OK")
    outcomes = Counter(r[2] for r in window)
    lat = distribution(ok)
    return {"arrivals": len(window), "ok": len(ok), "outcomes": dict(outcomes),
            "failed": len(window) - len(ok), "throughput": len(ok) / duration,
            "latency_ms": lat, "lag_ms": distribution([r[3] * 1e3 for r in window])}


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


def drain(servers: list[Any], timeout: float = 120.0) -> float:
    """Wait until no replica has requests queued; the seconds it took.  A case that overloads
    a replica (round robin on the 5x one) leaves it a queue that outlives the case's
    deadlines - Triton runs requests whose clients gave up - and the next case must not
    inherit it."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if all(pending(s) == 0 for s in servers):
            break
        time.sleep(0.2)
    time.sleep(0.1)  # the executing request, if any
    return time.monotonic() - t0


def cases(args: argparse.Namespace) -> list[str]:
    out = [f"router/{s}/{h}" for s in args.strategies for h in ("hedge", "no-hedge")]
    return out + [f"client/{c}" for c in args.clients]


def run_case(case: str, rate: float, args: argparse.Namespace, router: Child,
             servers: list[Any], raw: bytes, seed: int) -> dict[str, Any]:
    kind, *rest = case.split("/")
    trace_name = f"{rate:.0f}-{case.replace('/', '-')}-{seed}"

    addr = None
    if kind == "router":
        strategy, hedging = rest
        policy: dict[str, Any] = {"strategy": strategy}
        if hedging == "no-hedge":
            policy["hedge_budget"] = 0.0
        if args.trace:
            policy["trace"] = str(args.trace / f"{trace_name}.router.json")
        out = router.cmd("start " + json.dumps(policy))
        if "error" in out:
            raise RuntimeError(f"router start: {out['error']}")
        addr = out["addr"]
    drained = drain(servers)
    before = [served(s) for s in servers]
    rng = random.Random(seed)
    others = Others(lambda: sum(proc_cpu_s(p) or 0.0 for p in pids(router, servers)))

    async def go() -> dict[str, Any]:
        paths = Paths(addr, [s.grpc_url for s in servers],
                      rest[0] if kind == "client" else "", rng)
        try:
            return await open_loop(paths, raw, rate, args.warmup, args.duration,
                                   args.timeout, rng, args.trace and
                                   args.trace / f"{trace_name}.client.json")
        finally:
            await paths.close()

    result = asyncio.run(go())
    result["machine"] = others.done()
    result["drained_s"] = drained
    after = [served(s) for s in servers]
    result["replica_requests"] = [b - a for a, b in zip(before, after, strict=True)]
    if kind == "router":
        counters = router.cmd("finish")
        result["counters"] = counters
        c = counters["router"]
        requests = max(1, c["requests"])
        result["hedge_rate"] = c["hedged"] / requests
        result["hedge_won_rate"] = c["hedge_won"] / requests
        result["extra_rate"] = (c["hedged"] + c["failovers"]) / requests
        result["shed"] = sum(c["shed"].values())
    return result


def pids(router: Child, servers: list[Any]) -> list[int]:
    out = [os.getpid(), router.pid]
    for s in servers:
        out += [p for p in [s.pid, *s.child_pids()] if p]
    return out


def measure(args: argparse.Namespace, servers: list[Any], router: Child) -> dict[str, Any]:
    raw = request_bytes()
    capacity = []
    for i, server in enumerate(servers):
        rps = asyncio.run(closed_loop(server.grpc_url, raw, args.capacity_concurrency, 1.0,
                                      args.capacity_duration))
        capacity.append(rps)
        log(f"replica {i} ({SPEEDS[i]}x): {rps:.0f} req/s saturated")
    total = sum(capacity)
    bound = {f"{load:g}": clairvoyant_p999(capacity, args, load * total) for load in args.loads}
    log("clairvoyant router's p99.9 (stalls / none): " + ", ".join(
        f"{float(k):.0%} {v['stalls']:.1f} / {v['no_stalls']:.1f} ms" for k, v in bound.items()))
    runs: dict[str, dict[str, list[dict[str, Any]]]] = {}
    names = cases(args)
    seed = args.seed
    for rep in range(args.repeats):
        for load in args.loads:
            rate = load * total
            order = names[rep % len(names):] + names[:rep % len(names)]
            for case in order:
                seed += 1
                r = run_case(case, rate, args, router, servers, raw, seed)
                runs.setdefault(f"{load:g}", {}).setdefault(case, []).append(r)
                lat = r["latency_ms"]
                log(f"repeat {rep + 1}/{args.repeats} load {load:.0%} ({rate:.0f}/s) {case}: "
                    f"p50 {lat.get('p50', 0):.1f} p99 {lat.get('p99', 0):.1f} "
                    f"p99.9 {lat.get('p999', 0):.1f} ms, failed {r['failed']}, "
                    f"hedges {r.get('hedge_rate', 0):.1%}, to replicas "
                    f"{r['replica_requests']}, other CPU "
                    f"{r['machine']['other_cores'] or 0:.2f} cores")
    return {"capacity": capacity, "capacity_total": total, "clairvoyant_p999": bound,
            "runs": runs}


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the repeats of one case."""

    def med(get: Callable[[dict[str, Any]], float]) -> float:
        return statistics.median(get(r) for r in runs)

    out: dict[str, Any] = {
        q: med(lambda r, q=q: r["latency_ms"].get(q, float("nan")))  # type: ignore[misc]
        for q in ("p50", "p99", "p999")}
    out["throughput"] = med(lambda r: r["throughput"])
    out["failed_total"] = sum(r["failed"] for r in runs)
    out["arrivals_total"] = sum(r["arrivals"] for r in runs)
    out["outcomes"] = dict(sum((Counter(r["outcomes"]) for r in runs), Counter()))
    out["lag_p99"] = med(lambda r: r["lag_ms"].get("p99", 0.0))
    out["other_cores"] = med(lambda r: r["machine"]["other_cores"] or 0.0)
    total = [sum(r["replica_requests"]) or 1 for r in runs]
    out["replica_share"] = [statistics.median(r["replica_requests"][i] / t
                                              for r, t in zip(runs, total, strict=True))
                            for i in range(len(SPEEDS))]
    if "hedge_rate" in runs[0]:
        out["hedge_rate"] = med(lambda r: r["hedge_rate"])
        out["hedge_won_rate"] = med(lambda r: r["hedge_won_rate"])
        out["extra_rate"] = med(lambda r: r["extra_rate"])
        out["shed_total"] = sum(r["shed"] for r in runs)
    return out


def replica_labels(stalling: int) -> str:
    """``1x, 1x*, 2x, 5x``: the speeds, the stalling replica starred."""
    return ", ".join(f"{x}x" + ("*" if i == stalling else "") for i, x in enumerate(SPEEDS))


def head(stalling: int) -> list[str]:
    return ["load", "case", "p50 ms", "p99 ms", "p99.9 ms", "req/s", "failed", "hedged",
            f"to replicas ({replica_labels(stalling).replace(' ', '')})"]


def build(results: dict[str, Any]) -> tuple[list[list[str]], list[list[str]],
                                              dict[str, Any]]:
    m = results["measure"]
    summary = {load: {case: summarize(rs) for case, rs in by_case.items()}
               for load, by_case in m["runs"].items()}
    rows = []
    for load, by_case in summary.items():
        for case, s in by_case.items():
            rows.append([f"{float(load):.0%}", case, f"{s['p50']:.1f}", f"{s['p99']:.1f}",
                         f"{s['p999']:.1f}", f"{s['throughput']:.0f}",
                         f"{s['failed_total']}/{s['arrivals_total']}",
                         f"{s['hedge_rate']:.1%}" if "hedge_rate" in s else "-",
                         " ".join(f"{x:.0%}" for x in s["replica_share"])])
    bars: list[list[str]] = []
    at = summary.get(f"{BAR_LOAD:g}", {})
    hyb, hyb_off, lr = (at.get(k) for k in ("router/hybrid/hedge", "router/hybrid/no-hedge",
                                            "client/least_request"))
    if hyb and lr:
        ratio = hyb["p99"] / lr["p99"]
        bars.append([f"hybrid p99 / client least-request p99 at {BAR_LOAD:.0%}",
                     f"{hyb['p99']:.1f} / {lr['p99']:.1f} ms = {ratio:.2f}",
                     f"<= {P99_RATIO_BAR}", verdict(ratio <= P99_RATIO_BAR)])
    if hyb and hyb_off:
        cut = hyb_off["p999"] / hyb["p999"]
        bars.append([f"hedging's p99.9 cut (hybrid off / on) at {BAR_LOAD:.0%}",
                     f"{hyb_off['p999']:.1f} / {hyb['p999']:.1f} ms = {cut:.2f}x",
                     f">= {P999_CUT_BAR}x", verdict(cut >= P999_CUT_BAR)])
        best = m.get("clairvoyant_p999", {}).get(f"{BAR_LOAD:g}")
        if best:
            bars.append([f"context: the cut a clairvoyant router would show (hybrid off / its "
                         f"p99.9 with stalls, queue + service only) at {BAR_LOAD:.0%}",
                         f"{hyb_off['p999']:.1f} / {best['stalls']:.1f} ms = "
                         f"{hyb_off['p999'] / best['stalls']:.2f}x", "", "-"])
        bars.append([f"hybrid's extra upstream requests (hedges + failovers) at "
                     f"{BAR_LOAD:.0%}", f"{hyb['extra_rate']:.2%}", f"<= {EXTRA_BAR:.0%}",
                     verdict(hyb["extra_rate"] <= EXTRA_BAR)])
    router_failed = sum(s["failed_total"] for by_case in summary.values()
                        for case, s in by_case.items() if case.startswith("router/"))
    router_arrivals = sum(s["arrivals_total"] for by_case in summary.values()
                          for case, s in by_case.items() if case.startswith("router/"))
    bars.append(["failed requests through the router (every case and load, shed included)",
                 f"{router_failed} of {router_arrivals}", "0", verdict(router_failed == 0)])
    return rows, bars, summary


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="smoke sizes (says so in the output)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--duration", type=float, default=20.0, help="measured seconds per run")
    ap.add_argument("--warmup", type=float, default=3.0, help="unmeasured seconds per run")
    ap.add_argument("--loads", default="0.5,0.8", help="shares of the measured capacity")
    ap.add_argument("--strategies", default=",".join(STRATEGIES))
    ap.add_argument("--clients", default=",".join(CLIENT_SIDE),
                    help="client-side cases (none: '')")
    ap.add_argument("--service-ms", type=float, default=5.0, help="the 1x service time")
    ap.add_argument("--stall-ms", type=float, default=250.0)
    ap.add_argument("--stall-rate", type=float, default=0.002)
    ap.add_argument("--stalling", type=int, default=STALLING, choices=range(len(SPEEDS)),
                    help=f"index of the replica that stalls (speeds {SPEEDS})")
    ap.add_argument("--timeout", type=float, default=5.0, help="each request's deadline, s")
    ap.add_argument("--capacity-concurrency", type=int, default=4)
    ap.add_argument("--capacity-duration", type=float, default=4.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--keep", action="store_true", help="keep the work dir (logs)")
    ap.add_argument("--trace", type=Path, help="write every request's timeline here (a "
                    "directory): the client's arrivals and the router's attempts, per run")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "routing.json")
    ap.add_argument("--router-child", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.router_child:
        return child_main(json.loads(args.router_child))
    if args.quick:
        args.repeats, args.duration, args.warmup, args.capacity_duration = 1, 4.0, 1.5, 2.0
        if args.out == ap.get_default("out"):
            args.out = args.out.with_name("routing-quick.json")
    args.loads = [float(x) for x in args.loads.split(",") if x]
    args.strategies = [s for s in args.strategies.split(",") if s]
    args.clients = [c for c in args.clients.split(",") if c]
    if args.trace:
        args.trace.mkdir(parents=True, exist_ok=True)
    if args.service_ms * min(SPEEDS) < MODEL_BASE_MS:
        ap.error(f"--service-ms must be >= {MODEL_BASE_MS} (the model's own base delay)")

    from meshd.devtriton import DEFAULT_REPO, TritonServer

    started = time.perf_counter()
    workdir = Path(tempfile.mkdtemp(prefix="meshd-bench-routing-"))
    log(f"routing{' (quick)' if args.quick else ''}: work dir {workdir}; load average "
        f"{loadavg()}")
    servers = [TritonServer(DEFAULT_REPO, workdir / f"triton{i}", models=[MODEL],
                            name=f"triton{i}") for i in range(len(SPEEDS))]
    router: Child | None = None
    results: dict[str, Any] = {}
    failed: list[str] = []
    try:
        for i, server in enumerate(servers):
            server.start(timeout=180)
            stall = (dict(spike_ms=args.stall_ms, spike_rate=args.stall_rate)
                     if i == args.stalling else {})
            server.set_behaviour(MODEL, delay_ms=args.service_ms * SPEEDS[i] - MODEL_BASE_MS,
                                 **stall)
        log("replicas: " + ", ".join(f"{s.grpc_url} ({x}x)" for s, x in zip(
            servers, SPEEDS, strict=True)))
        router = Child(__file__, "router", {"replicas": [
            {"node": f"node-{i}", "grpc": s.grpc_url, "metrics": s.metrics_url}
            for i, s in enumerate(servers)]}, workdir / "router.log")
        time.sleep(2.0)  # the adapters' first statistics poll
        try:
            results["measure"] = measure(args, servers, router)
        except Exception as exc:  # noqa: BLE001 - reported
            failed.append(f"measure: {type(exc).__name__}: {exc}")
            log(f"measure FAILED: {exc}")
    finally:
        if router is not None:
            router.stop()
        for server in servers:
            server.stop()
        if args.keep or failed:
            print(f"work dir kept: {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    wall = time.perf_counter() - started

    rows: list[list[str]] = []
    bars: list[list[str]] = []
    summary: dict[str, Any] = {}
    if "measure" in results:
        rows, bars, summary = build(results)
    for f in failed:
        bars.append([f"section {f.split(':', 1)[0]}", f.split(":", 1)[1].strip()[:160], "",
                     "FAIL"])
    m = results.get("measure", {})
    columns = head(args.stalling)
    title = (f"Routing: 4 Triton replicas ({replica_labels(args.stalling)} of "
             f"{args.service_ms:g} ms; "
             f"* stalls {args.stall_ms:g} ms on {args.stall_rate:.1%}), open-loop Poisson "
             f"load{': QUICK sizes' if args.quick else ''}")
    notes = [
        f"capacity (saturated, summed): {m.get('capacity_total', 0):.0f} req/s = "
        + " + ".join(f"{c:.0f}" for c in m.get("capacity", [])),
        f"medians of {args.repeats} repeat(s) of {args.duration:g} s (after {args.warmup:g} s "
        f"warm-up); 'failed' sums the repeats; 'to replicas' is the share of upstream "
        f"requests (Triton's statistics, warm-up and hedges included)",
    ]
    print(f"\n{title} ({os.cpu_count()} CPUs, Python {platform.python_version()})\n")
    print_table(columns, rows)
    print()
    print_table(["bar", "measured", "target", "verdict"], bars)
    for note in notes:
        print(f"\n* {note}")
    print(f"\nwall time {wall:.0f} s")
    report = {
        "benchmark": "routing", "quick": args.quick, "argv": sys.argv,
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **machine_info(),
        "loadavg_end": loadavg(), "git": git_state(), "wall_s": wall,
        "setup": {k: v for k, v in vars(args).items() if k not in ("out", "router_child")},
        "table": [dict(zip(columns, r, strict=True)) for r in rows],
        "bars": [dict(zip(["bar", "measured", "target", "verdict"], b, strict=True))
                 for b in bars],
        "summary": summary, "notes": notes, "failed": failed, "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(report, indent=1, default=str) + "\n")
    os.replace(tmp, args.out)
    md = args.out.with_suffix(".md")
    md.write_text(f"# {title}\n\n{format_table(columns, rows)}\n\n"
                  f"{format_table(['bar', 'measured', 'target', 'verdict'], bars)}\n\n"
                  + "".join(f"* {n}\n" for n in notes)
                  + f"\ncommit {report['git']['commit'][:12]}, {report['when']}, wall "
                  f"{wall:.0f} s\n")
    for p in (args.out, md):
        print(f"wrote {p.relative_to(ROOT) if p.is_relative_to(ROOT) else p}")
    return 1 if any(b[3] == "FAIL" for b in bars) else 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        sys.exit(main())
