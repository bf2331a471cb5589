"""The scorer's cost per decision: in-process, and through the Score gRPC service.

    ./dev bench score [--quick] [--calls 50000] [--repeats 3] [--grpc-calls 2000] ...
    .venv/bin/python bench/score.py ...

Bars (from the issue): in-process ``ScoreTargets`` for 64 targets p99 <= 100 us; gRPC
``ScoreTargets`` p50 <= 1.5 ms.

Sections (``--only`` keys):

* ``inproc`` - a :class:`meshd.score.scorer.Scorer` over a real ``FusedState`` listing 64
  ready replicas of one model on 64 nodes (queue 0-8, spu 2-20 ms, 1 or 2 instances, one GPU
  each with 1-70 GiB free, two zones, RTT 0.2-2 ms), for each built-in strategy (set by a
  ``RoutingPolicy`` document, as ``tests/test_score.py``'s ``Mesh.put`` does).  Each call is
  ``scorer.score(ScoreRequest("m", payload_bytes=1024), now)`` timed with
  ``perf_counter_ns``; its outcome is reported (``scorer.report``, OK, a latency near the
  prediction) right after, outside the timed region, so its admission slots are released.
  *score + report* is the same loop's time from before the score to after the report.  GC
  stays enabled, settled as in production (``meshd.collector.settle``, called by the agent
  and router workers once started: startup's objects frozen, the young generation collected
  every 20,000 allocations); each run's collections are recorded.  Two telemetry regimes:
  *steady* (the fused view does not change: the target table is rebuilt only every
  ``table_refresh``, 0.5 s) and *telemetry
  N/s* (``--churn``, default 128: one node's telemetry replaced every 1/N s outside the timed
  region, i.e. each of the 64 nodes twice a second, the publication gate's maximum; every
  change moves the fused generation, so the next score rebuilds the model's 64 targets, and
  that call pays for it).  ``--repeats`` runs of ``--calls`` per (strategy, regime), each on
  a fresh mesh and scorer after a warm-up, interleaved; the table gives the median over runs
  of each quantile (and the range of the p99s).  A calibration row times a fixed pure-Python
  workload (about 60 us) in the same loop: its p99/p50 is what the machine's jitter alone
  does to a constant cost.

* ``grpc`` - ``meshd.score.service.serve`` in a child process (its own GIL) over the same
  64-replica mesh (default strategy ``hybrid``; telemetry refreshed at ``--churn``/s so no
  figure goes stale), listening on loopback TCP and on a Unix socket.  Clients in this
  process: ``grpc.aio`` and sync ``grpc``, each calling ``ScoreTargets`` sequentially
  (concurrency 1) and timing each call; after each, ``ReportOutcome`` (untimed) releases the
  decision.  Rounds interleave the four (transport, client) pairs so they share the
  machine's noise.  Then concurrency 8 (``grpc.aio``, 8 workers each calling ScoreTargets
  then ReportOutcome): throughput in decisions per second (each decision = 2 RPCs) and
  ScoreTargets latency under that load.  The server's CPU (``/proc/<pid>/stat``) per
  decision (ScoreTargets + ReportOutcome) is recorded too.

The machine is shared (2 cores, other sessions' jobs): load averages and the CPU others used
during each section are recorded.  Prints one table and writes ``bench/results/score.json``
and ``score.md``.  ``--quick`` is a smoke check (small sizes) and says so.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import platform
import random
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
# Run as a script, this file's folder comes first on sys.path and a bench module could shadow
# a package of the project: put the project root first instead.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from bench.child import Child  # noqa: E402
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

SECTIONS = ("inproc", "grpc")
STRATEGIES = ("baseline_rr", "least_queue", "p2c", "hybrid")
MODEL = "m"
TARGETS = 64
PAYLOAD = 1024
INPROC_P99_BAR_US = 100.0
JITTER_ITERATIONS = 1200
"""Loop iterations of the calibration workload (about 60 us on this machine's CPUs)."""
GRPC_P50_BAR_MS = 1.5
HEAD = ("measurement", "p50", "p99", "p99.9", "notes", "bar", "result")


# --- helpers ------------------------------------------------------------------------------------


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _median_of(runs: list[dict[str, float]], key: str) -> float:
    return statistics.median(r[key] for r in runs)


def _us(x: float) -> str:
    return f"{x:.1f} us" if x < 1000 else f"{x / 1000:.2f} ms"


def _self_cpu() -> float:
    t = os.times()
    return t.user + t.system


# --- the mesh -----------------------------------------------------------------------------------


class BenchMesh:
    """A real FusedState with ``n`` nodes, one ready replica of ``m`` each, and policy
    documents, handed to a Scorer as the agent would (cf. ``tests/test_score.py``'s Mesh)."""

    def __init__(self, n: int, seed: int, now: float) -> None:
        from meshd.signals.fused import FusedState

        self.n = n
        self.rng = random.Random(seed)
        self.fused = FusedState("router")
        self.docs: dict[tuple[str, str], dict[str, Any]] = {}
        self.version = 0
        self.seq = 0
        self.rtt = {self.name(i): self.rng.uniform(0.0002, 0.002) for i in range(n)}
        self.zones = {self.name(i): "z1" if i % 2 else "z2" for i in range(n)}
        self.static = [(self.rng.uniform(0.002, 0.02), self.rng.choice((1, 2)),
                        self.rng.randint(1, 70)) for _ in range(n)]
        for i in range(n):
            self.node(i, now)

    @staticmethod
    def name(i: int) -> str:
        return f"n{i:02d}"

    def node(self, i: int, now: float) -> None:
        """Node ``i``'s telemetry, freshly measured: as gossip or a stream delivers it."""
        from adapters.model import GpuState, ReplicaState
        from meshd.signals.wire import NodeSignals

        spu, instances, free_gib = self.static[i]
        self.seq += 1
        rep = ReplicaState(model=MODEL, version="1", endpoint=f"10.1.{i}.1:8001", ready=True,
                           queue=self.rng.randint(0, 8), instances=instances, spu=spu,
                           at={"ready": now, "queue": now, "stats": now})
        gpu = GpuState(f"GPU-{i:04d}", 0, "A100", 80 << 30, free_gib << 30)
        self.fused.update(self.name(i), NodeSignals(1, self.seq, [rep], [gpu]), "gossip", now)

    def put(self, kind: str, name: str, spec: dict[str, Any]) -> None:
        from policy.model import validate

        self.docs[(kind, name)] = validate({"kind": kind, "name": name, "spec": spec}).spec
        self.version += 1

    def scorer(self, seed: int) -> Any:
        from meshd.score.scorer import Scorer

        return Scorer(self.fused, zone="z1", policy=lambda k, n: self.docs.get((k, n)),
                      policy_version=lambda: self.version, rtt_of=self.rtt.get,
                      zone_of=lambda n: self.zones.get(n, ""), rng=random.Random(seed))


# --- in-process ---------------------------------------------------------------------------------


def inproc_run(strategy: str, calls: int, churn: float, seed: int,
               warmup: int) -> dict[str, Any]:
    """One run: ``calls`` timed scores (after ``warmup`` untimed ones) on a fresh mesh."""
    from meshd.score.scorer import ScoreRequest, Status

    mono = time.monotonic
    pc = time.perf_counter_ns
    mesh = BenchMesh(TARGETS, seed, mono())
    mesh.put("RoutingPolicy", MODEL, {"strategy": strategy})
    scorer = mesh.scorer(seed)
    from meshd import collector

    collector.settle()  # as the agent's process is once started
    table = scorer.table
    req = ScoreRequest(MODEL, payload_bytes=PAYLOAD)
    lat_rng = random.Random(seed + 1)
    jitter = [lat_rng.uniform(0.8, 1.3) for _ in range(1024)]
    score_ns: list[int] = []
    both_ns: list[int] = []
    shed: Counter[str] = Counter()
    next_node = 0
    period = 1.0 / churn if churn > 0 else 0.0
    next_update = mono() + period
    gc0 = [s["collections"] for s in gc.get_stats()]
    updates = 0
    builds0 = 0
    for k in range(warmup + calls):
        if k == warmup:
            builds0 = table.builds
            score_ns.clear()
            both_ns.clear()
            gc0 = [s["collections"] for s in gc.get_stats()]
        now = mono()
        if period and now >= next_update:  # telemetry arrives (outside the timed region)
            mesh.node(next_node, now)
            next_node = (next_node + 1) % TARGETS
            next_update += period
            if next_update < now:  # fell behind (a slow stretch): do not burst
                next_update = now + period
            updates += 1
        t0 = pc()
        scored = scorer.score(req, now)
        t1 = pc()
        if scored.verdict.admit:
            first = scored.targets[0]
            scorer.report(scored.decision_id, first.replica,
                          first.predicted * jitter[k & 1023], Status.OK, now)
        else:
            shed[scored.verdict.reason] += 1
        t2 = pc()
        score_ns.append(t1 - t0)
        both_ns.append(t2 - t0)
    gc1 = [s["collections"] for s in gc.get_stats()]
    c = scorer.counters
    return {"strategy": strategy, "churn_per_s": churn, "calls": calls,
            "score_us": distribution([x / 1000 for x in score_ns]),
            "score_report_us": distribution([x / 1000 for x in both_ns]),
            "shed": dict(shed), "fallbacks": dict(c.fallbacks),
            "decisions_by_strategy": dict(c.decisions),
            "table_builds": table.builds - builds0, "telemetry_updates": updates,
            "gc_collections": [b - a for a, b in zip(gc0, gc1, strict=True)]}


def _fixed_work(n: int) -> float:
    acc = 0.0
    for i in range(n):
        acc += i * 0.5
    return acc


def jitter_run(calls: int, iterations: int) -> dict[str, Any]:
    """The same timing loop around a fixed pure-Python workload: how much this machine's
    jitter (other processes, the VM) alone spreads a constant cost's quantiles."""
    pc = time.perf_counter_ns
    vals = []
    for _ in range(calls):
        t0 = pc()
        _fixed_work(iterations)
        vals.append((pc() - t0) / 1000)
    return {"iterations": iterations, "us": distribution(vals)}


def timer_overhead_ns(n: int = 200_000) -> float:
    pc = time.perf_counter_ns
    vals = []
    for _ in range(n):
        t0 = pc()
        t1 = pc()
        vals.append(t1 - t0)
    return float(statistics.median(vals))


def inproc_bench(args: argparse.Namespace) -> dict[str, Any]:
    churns = [0.0, args.churn] if args.churn > 0 else [0.0]
    runs: list[dict[str, Any]] = []
    watch = Others(_self_cpu)
    overhead = timer_overhead_ns()
    jitter: list[dict[str, Any]] = []
    for rep in range(args.repeats):
        jitter.append(jitter_run(args.calls, JITTER_ITERATIONS))
        for strategy in STRATEGIES:
            for churn in churns:
                r = inproc_run(strategy, args.calls, churn, args.seed + rep, args.warmup)
                r["repeat"] = rep
                runs.append(r)
                _log(f"inproc {strategy} churn {churn:g}/s run {rep + 1}: score p50 "
                     f"{r['score_us']['p50']:.1f} p99 {r['score_us']['p99']:.1f} p99.9 "
                     f"{r['score_us']['p999']:.1f} us")
    return {"runs": runs, "timer_overhead_ns": overhead, "cpu": watch.done(),
            "churns": churns, "jitter": jitter}


# --- gRPC: the server child ---------------------------------------------------------------------


def server_child(spec: dict[str, Any]) -> int:
    """Serve the score service on loopback TCP and ``spec['uds']``; print the addresses, serve
    until stdin closes or says ``stop``."""
    return asyncio.run(_server_main(spec))


async def _server_main(spec: dict[str, Any]) -> int:
    from meshd.score import service as score_api

    loop = asyncio.get_running_loop()
    mesh = BenchMesh(int(spec["targets"]), int(spec["seed"]), loop.time())
    if spec.get("strategy"):
        mesh.put("RoutingPolicy", MODEL, {"strategy": spec["strategy"]})
    scorer = mesh.scorer(int(spec["seed"]))
    churn = float(spec["churn"])
    period = 1.0 / churn if churn > 0 else 0.5

    async def telemetry() -> None:
        i = 0
        while True:
            await asyncio.sleep(period)
            if churn > 0:
                mesh.node(i, loop.time())
                i = (i + 1) % mesh.n
            else:  # keep every figure fresh, all at once
                for j in range(mesh.n):
                    mesh.node(j, loop.time())

    feeder = asyncio.ensure_future(telemetry())
    tcp, tcp_addr = await score_api.serve(scorer, loop.time, ("127.0.0.1", 0), lambda: None)
    uds, uds_addr = await score_api.serve(scorer, loop.time, spec["uds"], lambda: None)
    print(json.dumps({"tcp": tcp_addr, "uds": uds_addr, "pid": os.getpid()}), flush=True)
    stop = asyncio.Event()

    def read_stdin() -> None:
        for line in sys.stdin:
            if line.strip() == "stop":
                break
        loop.call_soon_threadsafe(stop.set)

    threading.Thread(target=read_stdin, daemon=True).start()
    await stop.wait()
    feeder.cancel()
    await tcp.stop(0.5)
    await uds.stop(0.5)
    c = scorer.counters
    print(json.dumps({"shed": dict(c.shed), "fallbacks": dict(c.fallbacks),
                      "decisions": dict(c.decisions), "unknown_outcomes": c.unknown_outcomes,
                      "table_builds": scorer.table.builds}), flush=True)
    return 0


# --- gRPC: the clients --------------------------------------------------------------------------


def _requests() -> tuple[Any, Callable[[int, str, float], Any]]:
    from proto.mesh.v1 import score_pb2

    req = score_pb2.ScoreRequest(model=MODEL, payload_bytes=PAYLOAD, idempotent=True)

    def outcome(did: int, replica: str, latency: float) -> Any:
        return score_pb2.OutcomeReport(decision_id=did, replica=replica,
                                       latency_seconds=latency, status=score_pb2.OUTCOME_OK,
                                       last=True)
    return req, outcome


def sync_round(stub: Any, calls: int) -> tuple[list[float], Counter[str]]:
    req, outcome = _requests()
    pc = time.perf_counter_ns
    lat: list[float] = []
    shed: Counter[str] = Counter()
    for _ in range(calls):
        t0 = pc()
        reply = stub.ScoreTargets(req, timeout=10)
        t1 = pc()
        lat.append((t1 - t0) / 1000)
        if reply.verdict.admit:
            first = reply.targets[0]
            stub.ReportOutcome(outcome(reply.decision_id, first.replica,
                                       first.predicted_seconds), timeout=10)
        else:
            shed[reply.verdict.reason] += 1
    return lat, shed


async def aio_round(stub: Any, calls: int, concurrency: int
                    ) -> tuple[list[float], Counter[str], float]:
    """``calls`` decisions over ``concurrency`` workers; latencies (us), sheds, wall seconds."""
    req, outcome = _requests()
    pc = time.perf_counter_ns
    lat: list[float] = []
    shed: Counter[str] = Counter()
    left = [calls]

    async def worker() -> None:
        while left[0] > 0:
            left[0] -= 1
            t0 = pc()
            reply = await stub.ScoreTargets(req, timeout=10)
            t1 = pc()
            lat.append((t1 - t0) / 1000)
            if reply.verdict.admit:
                first = reply.targets[0]
                await stub.ReportOutcome(outcome(reply.decision_id, first.replica,
                                                 first.predicted_seconds), timeout=10)
            else:
                shed[reply.verdict.reason] += 1

    t0 = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(concurrency)))
    return lat, shed, time.perf_counter() - t0


class AioClients:
    """grpc.aio channels to both addresses, on a loop in a thread of their own."""

    def __init__(self, addrs: dict[str, str]) -> None:
        import grpc

        from proto.mesh.v1 import score_pb2_grpc

        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

        async def make() -> dict[str, tuple[Any, Any]]:
            out = {}
            for name, addr in addrs.items():
                ch = grpc.aio.insecure_channel(addr)
                out[name] = (ch, score_pb2_grpc.ScoreStub(ch))
            return out
        self.chans = self.call(make())

    def call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(600)

    def round(self, name: str, calls: int, concurrency: int
              ) -> tuple[list[float], Counter[str], float]:
        return self.call(aio_round(self.chans[name][1], calls, concurrency))  # type: ignore[no-any-return]

    def close(self) -> None:
        async def close_all() -> None:
            for ch, _ in self.chans.values():
                await ch.close()
        with contextlib.suppress(Exception):
            self.call(close_all())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


def grpc_bench(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    import grpc

    from proto.mesh.v1 import score_pb2_grpc

    uds = workdir / "score.sock"
    child = Child(__file__, "server", {"targets": TARGETS, "seed": args.seed, "uds": str(uds),
                                       "churn": args.churn, "strategy": ""},
                  workdir / "server.log")
    aio: AioClients | None = None
    sync_chans: dict[str, Any] = {}
    try:
        addrs = child.info
        pid = int(addrs["pid"])
        targets = {"tcp": addrs["tcp"], "uds": addrs["uds"]}
        _log(f"score server (pid {pid}) on {targets['tcp']} and {targets['uds']}")
        aio = AioClients(targets)
        sync_chans = {k: grpc.insecure_channel(v) for k, v in targets.items()}
        stubs = {k: score_pb2_grpc.ScoreStub(ch) for k, ch in sync_chans.items()}
        # warm up every path
        for name in targets:
            sync_round(stubs[name], args.grpc_warmup)
            aio.round(name, args.grpc_warmup, 1)
            aio.round(name, args.grpc_warmup, 8)

        def server_cpu() -> float:
            return proc_cpu_s(pid) or 0.0

        combos = [(t, c) for c in ("aio", "sync") for t in ("tcp", "uds")]
        c1: dict[str, dict[str, Any]] = {
            f"{t}/{c}": {"lat": [], "rounds": [], "shed": Counter(), "server_cpu_s": 0.0,
                         "calls": 0} for t, c in combos}
        watch = Others(lambda: _self_cpu() + server_cpu())
        for rnd in range(args.grpc_rounds):
            order = combos[rnd % len(combos):] + combos[:rnd % len(combos)]
            for t, c in order:
                key = f"{t}/{c}"
                cpu0 = server_cpu()
                if c == "sync":
                    lat, shed = sync_round(stubs[t], args.grpc_calls)
                else:
                    lat, shed, _ = aio.round(t, args.grpc_calls, 1)
                e = c1[key]
                e["server_cpu_s"] += server_cpu() - cpu0
                e["calls"] += len(lat)
                e["lat"].extend(lat)
                e["rounds"].append(distribution(lat))
                e["shed"].update(shed)
            _log(f"grpc c=1 round {rnd + 1}/{args.grpc_rounds}: " + ", ".join(
                f"{k} p50 {v['rounds'][-1]['p50']:.0f} us" for k, v in c1.items()))
        cpu_c1 = watch.done()
        c8: dict[str, dict[str, Any]] = {
            t: {"lat": [], "rounds": [], "shed": Counter(), "server_cpu_s": 0.0, "calls": 0,
                "wall_s": 0.0, "throughput": []} for t in ("tcp", "uds")}
        watch = Others(lambda: _self_cpu() + server_cpu())
        for rnd in range(args.grpc_rounds):
            for t in (("tcp", "uds") if rnd % 2 == 0 else ("uds", "tcp")):
                cpu0 = server_cpu()
                lat, shed, wall = aio.round(t, args.grpc_calls_c8, 8)
                e = c8[t]
                e["server_cpu_s"] += server_cpu() - cpu0
                e["calls"] += len(lat)
                e["wall_s"] += wall
                e["throughput"].append(len(lat) / wall)
                e["lat"].extend(lat)
                e["rounds"].append(distribution(lat))
                e["shed"].update(shed)
            _log(f"grpc c=8 round {rnd + 1}/{args.grpc_rounds}: " + ", ".join(
                f"{k} {v['throughput'][-1]:.0f}/s" for k, v in c8.items()))
        cpu_c8 = watch.done()
    finally:
        for ch in sync_chans.values():
            ch.close()
        if aio is not None:
            aio.close()
        server_end = child.stop()
    out: dict[str, Any] = {"c1": {}, "c8": {}, "server": server_end,
                           "cpu_c1": cpu_c1, "cpu_c8": cpu_c8}
    for key, e in c1.items():
        out["c1"][key] = {"latency_us": distribution(e["lat"]), "rounds": e["rounds"],
                          "shed": dict(e["shed"]), "calls": e["calls"],
                          "server_cpu_us_per_decision": e["server_cpu_s"] / e["calls"] * 1e6}
    for key, e in c8.items():
        out["c8"][key] = {"latency_us": distribution(e["lat"]), "rounds": e["rounds"],
                          "shed": dict(e["shed"]), "calls": e["calls"],
                          "throughput_per_s": e["calls"] / e["wall_s"],
                          "throughput_rounds": e["throughput"],
                          "server_cpu_us_per_decision": e["server_cpu_s"] / e["calls"] * 1e6,
                          "server_cores": e["server_cpu_s"] / e["wall_s"]}
    return out


# --- report -------------------------------------------------------------------------------------


def build_rows(results: dict[str, Any]) -> list[list[str]]:
    rows: list[list[str]] = []
    ip = results.get("inproc")
    if ip:
        for strategy in STRATEGIES:
            for churn in ip["churns"]:
                runs = [r for r in ip["runs"]
                        if r["strategy"] == strategy and r["churn_per_s"] == churn]
                d = [r["score_us"] for r in runs]
                p99 = _median_of(d, "p99")
                regime = "steady" if churn == 0 else f"telemetry {churn:g}/s"
                p99s = [x["p99"] for x in d]
                notes = (f"{len(runs)} runs x {runs[0]['calls']}; p99 range "
                         f"{min(p99s):.0f}-{max(p99s):.0f} us; table builds/run "
                         f"{statistics.median(r['table_builds'] for r in runs):.0f}")
                sheds = sum(sum(r["shed"].values()) for r in runs)
                falls = Counter[str]()
                for r in runs:
                    falls.update(r["fallbacks"])
                if sheds:
                    notes += f"; shed {sheds}"
                if falls:
                    notes += "; p2c fallbacks " + ", ".join(f"{k} {v}" for k, v in falls.items())
                rows.append([f"in-process score, {TARGETS} targets, {strategy}, {regime}",
                             _us(_median_of(d, "p50")), _us(p99), _us(_median_of(d, "p999")),
                             notes, f"p99 <= {INPROC_P99_BAR_US:g} us",
                             verdict(p99 <= INPROC_P99_BAR_US)])
        jd = [j["us"] for j in ip["jitter"]]
        p50, p99 = _median_of(jd, "p50"), _median_of(jd, "p99")
        rows.append(["calibration: fixed pure-Python work, same timing loop",
                     _us(p50), _us(p99), _us(_median_of(jd, "p999")),
                     f"constant cost; p99/p50 {p99 / p50:.2f} is this machine's jitter alone",
                     "", "-"])
        churn = ip["churns"][-1]
        regime = "steady" if churn == 0 else f"telemetry {churn:g}/s"
        for strategy in STRATEGIES:
            runs = [r for r in ip["runs"]
                    if r["strategy"] == strategy and r["churn_per_s"] == churn]
            d = [r["score_report_us"] for r in runs]
            rows.append([f"in-process score + report, {strategy}, {regime}",
                         _us(_median_of(d, "p50")), _us(_median_of(d, "p99")),
                         _us(_median_of(d, "p999")), f"{len(runs)} runs", "", "-"])
    gr = results.get("grpc")
    if gr:
        for key, e in gr["c1"].items():
            d = e["latency_us"]
            t, c = key.split("/")
            r50 = [r["p50"] for r in e["rounds"]]
            p50 = d["p50"] / 1000
            rows.append([f"gRPC ScoreTargets, {'loopback TCP' if t == 'tcp' else 'Unix socket'},"
                         f" {'grpc.aio' if c == 'aio' else 'sync grpc'} client, concurrency 1",
                         _us(d["p50"]), _us(d["p99"]), _us(d["p999"]),
                         f"{e['calls']} calls; round p50s {min(r50):.0f}-{max(r50):.0f} us; "
                         f"server CPU {e['server_cpu_us_per_decision']:.0f} us/decision"
                         + (f"; shed {e['shed']}" if e["shed"] else ""),
                         f"p50 <= {GRPC_P50_BAR_MS:g} ms", verdict(p50 <= GRPC_P50_BAR_MS)])
        for t, e in gr["c8"].items():
            d = e["latency_us"]
            rows.append([f"gRPC ScoreTargets, {'loopback TCP' if t == 'tcp' else 'Unix socket'},"
                         " grpc.aio client, concurrency 8",
                         _us(d["p50"]), _us(d["p99"]), _us(d["p999"]),
                         f"{e['throughput_per_s']:.0f} decisions/s (ScoreTargets + "
                         f"ReportOutcome; rounds {min(e['throughput_rounds']):.0f}-"
                         f"{max(e['throughput_rounds']):.0f}); server {e['server_cores']:.2f} "
                         f"cores, {e['server_cpu_us_per_decision']:.0f} us CPU/decision"
                         + (f"; shed {e['shed']}" if e["shed"] else ""), "", "-"])
    return rows


def build_notes(results: dict[str, Any], args: argparse.Namespace) -> list[str]:
    notes = []
    if args.quick:
        notes.append("QUICK run: small sizes, a smoke check; run without --quick for the "
                     "reported numbers.")
    ip = results.get("inproc")
    if ip:
        gcs = [sum(r["gc_collections"][2:]) for r in ip["runs"]]
        notes.append(f"in-process: perf_counter_ns pair overhead {ip['timer_overhead_ns']:.0f} ns "
                     "(included in every figure); GC enabled (full collections per run: median "
                     f"{statistics.median(gcs):.0f}); quantiles are the median over runs "
                     "of each run's nearest-rank quantile.")
        cpu = ip["cpu"]
        notes.append(f"in-process section: load average {cpu['loadavg_before']} -> "
                     f"{cpu['loadavg_after']}; other processes used "
                     f"{cpu['other_cores'] or 0:.2f} cores during it.")
    gr = results.get("grpc")
    if gr:
        notes.append("gRPC: server in its own process; clients in this one; every decision "
                     "is released with ReportOutcome (untimed at concurrency 1). Quantiles "
                     "pooled over all rounds.")
        for k in ("cpu_c1", "cpu_c8"):
            cpu = gr[k]
            notes.append(f"gRPC {k[4:]}: load average {cpu['loadavg_before']} -> "
                         f"{cpu['loadavg_after']}; bench + server used {cpu['our_cores']:.2f} "
                         f"cores, other processes {cpu['other_cores'] or 0:.2f}.")
        srv = gr.get("server") or {}
        if srv.get("shed") or srv.get("fallbacks") or srv.get("unknown_outcomes"):
            notes.append(f"server counters: shed {srv.get('shed')}, fallbacks "
                         f"{srv.get('fallbacks')}, unknown outcomes "
                         f"{srv.get('unknown_outcomes')}")
    return notes


def write_markdown(path: Path, title: str, rows: list[list[str]], notes: list[str],
                   report: dict[str, Any]) -> None:
    lines = [f"# {title}", "",
             f"{report['when']}, {report['cpu_count']} CPUs ({report['cpu_model']}), Python "
             f"{report['python']}, commit {report['git']['commit'][:12]}"
             + (f" + uncommitted changes in {', '.join(report['git']['dirty_files'])}"
                if report["git"]["dirty_files"] else "") + ".", "",
             f"`{' '.join(report['argv'])}`", "",
             f"Bars: in-process ScoreTargets for {TARGETS} targets p99 <= "
             f"{INPROC_P99_BAR_US:g} us; gRPC ScoreTargets p50 <= {GRPC_P50_BAR_MS:g} ms.", "",
             format_table(HEAD, rows), ""]
    lines += [f"* {n}" for n in notes]
    lines += ["", f"Wall time {report['wall_s']:.0f} s. Full data: "
              f"`{path.with_suffix('.json').name}`.", ""]
    path.write_text("\n".join(lines))


# --- main ---------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes: a smoke check")
    ap.add_argument("--only", default="", help=f"comma-separated sections ({','.join(SECTIONS)})")
    ap.add_argument("--calls", type=int, help="in-process timed calls per run (50000; quick 5000)")
    ap.add_argument("--warmup", type=int, default=2000, help="untimed calls before each run")
    ap.add_argument("--repeats", type=int, help="in-process runs per strategy and regime "
                                                "(3; quick 1)")
    ap.add_argument("--churn", type=float, default=128.0,
                    help="telemetry updates per second (one node each); 0 = steady only")
    ap.add_argument("--grpc-calls", type=int, help="sequential calls per round and path "
                                                   "(2000; quick 300)")
    ap.add_argument("--grpc-calls-c8", type=int, help="decisions per concurrency-8 round "
                                                      "(4000; quick 600)")
    ap.add_argument("--grpc-rounds", type=int, help="interleaved rounds (3; quick 1)")
    ap.add_argument("--grpc-warmup", type=int, default=200)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "score.json")
    ap.add_argument("--server-child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.server_child:
        return server_child(json.loads(args.server_child))
    q = args.quick
    args.calls = args.calls or (5000 if q else 50_000)
    args.repeats = args.repeats or (1 if q else 3)
    args.grpc_calls = args.grpc_calls or (300 if q else 2000)
    args.grpc_calls_c8 = args.grpc_calls_c8 or (600 if q else 4000)
    args.grpc_rounds = args.grpc_rounds or (1 if q else 3)
    sections = set(args.only.split(",")) if args.only else set(SECTIONS)
    if sections - set(SECTIONS):
        ap.error(f"--only: unknown section(s) {sorted(sections - set(SECTIONS))}")

    started = time.perf_counter()
    _log(f"score bench: sections {','.join(s for s in SECTIONS if s in sections)}"
         f"{' (quick)' if q else ''}; load average {loadavg()}")
    results: dict[str, Any] = {}
    failed: list[str] = []
    if "inproc" in sections:
        results["inproc"] = inproc_bench(args)
    if "grpc" in sections:
        with tempfile.TemporaryDirectory(prefix="meshd-bench-score-") as tmp:
            try:
                results["grpc"] = grpc_bench(args, Path(tmp))
            except Exception as exc:  # noqa: BLE001 - reported
                failed.append(f"grpc: {type(exc).__name__}: {exc}")
                _log(f"grpc FAILED: {exc}")
    wall = time.perf_counter() - started

    rows = build_rows(results)
    for f in failed:
        rows.append([f"section {f.split(':', 1)[0]}", "", "", "",
                     f.split(":", 1)[1].strip()[:160], "", "FAIL"])
    notes = build_notes(results, args)
    title = f"Scorer: cost per decision, in-process and over gRPC{': QUICK sizes' if q else ''}"
    print(f"\n{title} ({os.cpu_count()} CPUs, Python {platform.python_version()})\n")
    print_table(HEAD, rows)
    for note in notes:
        print(f"\n* {note}")
    print(f"\nwall time {wall:.0f} s")
    # raw latencies are summarised, not stored
    report = {
        "benchmark": "score", "quick": q, "argv": sys.argv,
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **machine_info(),
        "loadavg_end": loadavg(), "git": git_state(), "wall_s": wall,
        "setup": {"targets": TARGETS, "model": MODEL, "payload_bytes": PAYLOAD,
                  "calls": args.calls, "warmup": args.warmup, "repeats": args.repeats,
                  "churn_per_s": args.churn, "grpc_calls": args.grpc_calls,
                  "grpc_calls_c8": args.grpc_calls_c8, "grpc_rounds": args.grpc_rounds,
                  "strategies": STRATEGIES,
                  "bars": {"inproc_p99_us": INPROC_P99_BAR_US, "grpc_p50_ms": GRPC_P50_BAR_MS}},
        "table": [dict(zip(HEAD, r, strict=True)) for r in rows],
        "notes": notes, "failed": failed, "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp_out = args.out.with_suffix(".json.tmp")
    tmp_out.write_text(json.dumps(report, indent=1, default=str) + "\n")
    os.replace(tmp_out, args.out)
    md = args.out.with_suffix(".md")
    write_markdown(md, title, rows, notes, report)
    for p in (args.out, md):
        print(f"wrote {p.relative_to(ROOT) if p.is_relative_to(ROOT) else p}")
    return 1 if any(r[-1] == "FAIL" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
