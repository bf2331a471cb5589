"""What the router adds to a request: latency and CPU, against a bare byte-forwarding proxy.

    ./dev bench router_overhead [--quick] [--rounds 15] [--calls 500] [--profile] ...
    .venv/bin/python bench/router_overhead.py ...

Bars (from the issue): the router's CPU per request <= 1.2x a bare grpc.aio byte-forwarding
proxy's measured in the same run (that proxy costs about 0.55-0.6 ms of CPU per request on
these machines); added p50 latency (router - direct) <= 1 ms at concurrency 1.

One real Triton server (``meshd.devtriton.TritonServer`` on ``tests/triton_models``, serving
``add_sub`` only), and three paths to it, each client a ``tritonclient`` sending ``add_sub``
with two [1, 16] FP32 inputs (built once):

* ``direct``: tritonclient -> Triton;
* ``proxy``: tritonclient -> a bare proxy (a child process of this script): a ``grpc.aio``
  server with one generic handler that forwards the request's raw bytes to Triton with a raw
  ``unary_unary`` multicallable (no serializers) and returns the reply's raw bytes - no
  parsing, no metadata, no deadline;
* ``router``: tritonclient -> the meshd router (a child process): a ``FusedState`` listing
  the Triton endpoint as a ready replica of ``add_sub`` on one node (its ``at`` times
  refreshed every 0.5 s, as ``tests/test_router.py``'s RouterHarness does), a ``Scorer`` over
  it (default policy: ``hybrid``) and ``meshd.router.server.serve(..., dev=True)`` on
  loopback;
* ``worker``: tritonclient -> a router worker process (``meshd.router.worker``, started by the
  router child through ``meshd.router.pool.WorkerPool``, as ``--router-workers`` does) on a
  port of its own, scoring through the router child's score link on a Unix socket.  Its CPU
  per request is the worker's plus the router child's (which serves the score calls and
  outcome stream in that round): what one request through a worker costs the node.  No bar:
  it is the price of serving one port from several cores.

Each proxy runs in its own process and measures its own CPU (``getrusage(RUSAGE_SELF)``: user
+ system, all threads), asked before and after each round: CPU per request = the difference
over the round's requests.  Rounds interleave the paths (the starting path rotates), so
they share the machine's noise:

* concurrency 1: sync ``tritonclient.grpc``, ``--calls`` requests per path and round, each
  timed (``perf_counter_ns``): p50/p99 latency per path, added p50 (router - direct, proxy -
  direct; pooled, and the median of the per-round paired differences), CPU per request;
* concurrency 8: ``tritonclient.grpc.aio`` with 8 workers, ``--calls-c8`` requests per path
  and round: throughput and CPU per request.

Triton's own CPU (the server and its Python-backend stub) per request is recorded for
context.  Then, when the router misses the CPU bar (or with ``--profile``), both proxies are
profiled with cProfile (in their event-loop thread) over ``--profile-calls`` requests at
concurrency 8 - after the measurement, so the profiler's cost is not in the numbers - and the
top functions are written next to the results.

The machine is shared (2 cores, other sessions' jobs): load averages and the CPU others used
are recorded.  Prints one table and writes ``bench/results/router_overhead.{json,md}``.
``--quick`` is a smoke check (small sizes) and says so.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import io
import json
import os
import platform
import pstats
import resource
import shutil
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# Run as a script, this file's folder comes first on sys.path and a bench module could shadow
# a package of the project: put the project root first instead.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from bench import child  # noqa: E402
from bench.child import log  # noqa: E402
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

PATHS = ("direct", "proxy", "router", "worker")
PROXIES = ("proxy", "router", "worker")
MODEL = "add_sub"
WIDTH = 16
CPU_RATIO_BAR = 1.2
ADDED_P50_BAR_MS = 1.0
PROXY_CPU_EXPECTED_MS = (0.55, 0.6)
MAX_MESSAGE = 1 << 30
TRACED: dict[str, Any] = {}
"""The router child's router and its tracer, when the OTEL_* variables turned tracing on
(``tracer on|off`` switches it, for bench/tracing.py)."""
HEAD = ("measurement", "value", "bar", "result")


# --- helpers ------------------------------------------------------------------------------------


def _rusage_s() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _thread_oncpu_s(tid: int) -> float:
    """Seconds thread ``tid`` of this process has run (schedstat: ns, user + system)."""
    try:
        return int(Path(f"/proc/self/task/{tid}/schedstat").read_text().split()[0]) / 1e9
    except (OSError, ValueError, IndexError):
        return float("nan")


class GcClock:
    """Collections and seconds spent in them, per generation (``gc.callbacks``)."""

    def __init__(self) -> None:
        import gc

        self.count = [0, 0, 0]
        self.seconds = [0.0, 0.0, 0.0]
        self._t0 = 0.0
        gc.callbacks.append(self._on)

    def _on(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._t0 = time.perf_counter()
        else:
            gen = info["generation"]
            self.count[gen] += 1
            self.seconds[gen] += time.perf_counter() - self._t0


# --- the proxies (child processes) --------------------------------------------------------------


def child_main(kind: str, spec: dict[str, Any]) -> int:
    return asyncio.run(_child(kind, spec))


async def _child(kind: str, spec: dict[str, Any]) -> int:
    """Serve ``kind`` (``proxy`` or ``router``) to ``spec['upstream']``; print the address,
    then answer commands on stdin (``cpu``, ``profile-start``, ``profile-stop PATH``,
    ``stop``), one JSON line each."""
    loop = asyncio.get_running_loop()
    upstream = spec["upstream"]
    counters: Callable[[], dict[str, Any]]
    closers: list[Callable[[], Any]] = []
    breakdown: Breakdown | None = None
    first: dict[str, Any] = {"pid": os.getpid()}
    if kind == "proxy":
        server, addr = await _bare_proxy(upstream)
        counters = dict
    else:
        server, addr, counters, close, breakdown = await _router(upstream)
        closers.append(close)
        first["worker_addr"], first["worker_pid"], stop_worker = await _worker(
            breakdown.scorer)
        closers.insert(0, stop_worker)
    print(json.dumps({"addr": addr, **first}), flush=True)

    stop = asyncio.Event()
    profiler: list[Any] = []
    gc_clock = GcClock()
    main_tid = threading.get_native_id()  # the event loop's thread

    def on_loop(fn: Callable[[], Any]) -> Any:
        async def run() -> Any:
            return fn()
        return asyncio.run_coroutine_threadsafe(run(), loop).result(30)

    def profile_start() -> dict[str, Any]:
        import cProfile

        # CPU time of the loop's thread (the thread it profiles): time blocked in epoll or
        # preempted is not charged to whatever function was running.
        p = cProfile.Profile(time.thread_time)
        p.enable()
        profiler.append(p)
        return {"ok": True}

    def profile_stop(path: str) -> dict[str, Any]:
        p = profiler.pop()
        p.disable()
        p.dump_stats(path)
        return {"ok": True}

    def commands() -> None:
        for line in sys.stdin:
            cmd, _, arg = line.strip().partition(" ")
            if cmd == "cpu":
                out: dict[str, Any] = {"cpu": _rusage_s(), "loop_cpu": _thread_oncpu_s(main_tid),
                                       "gc_count": list(gc_clock.count),
                                       "gc_s": list(gc_clock.seconds)}
            elif cmd == "profile-start":
                out = on_loop(profile_start)
            elif cmd == "profile-stop":
                out = on_loop(functools.partial(profile_stop, arg))
            elif cmd == "breakdown-start" and breakdown is not None:
                out = on_loop(breakdown.start)
            elif cmd == "breakdown-stop" and breakdown is not None:
                out = on_loop(breakdown.stop)
            elif cmd == "tracecost":
                out = trace_cost()
            elif cmd == "tracer" and TRACED.get("tracer") is not None:  # on / off
                on_loop(functools.partial(setattr, TRACED["router"], "tracer",
                                          TRACED["tracer"] if arg == "on" else None))
                out = {"ok": True}
            elif cmd == "stop":
                out = {"counters": on_loop(counters), "cpu": _rusage_s()}
                print(json.dumps(out, default=str), flush=True)
                break
            else:
                out = {"error": f"unknown command {cmd!r}"}
            print(json.dumps(out, default=str), flush=True)
        loop.call_soon_threadsafe(stop.set)

    threading.Thread(target=commands, daemon=True).start()
    await stop.wait()
    await server.stop(0.5)
    for close in closers:
        await close()
    return 0


_TRACE_CALLS: dict[str, list[float]] = {}
"""Per call: [count, CPU seconds (the calling thread's)]."""


def _account_tracing() -> None:
    """Time every call the router makes into its request tracing (thread CPU, ~0.3 us of
    wrapper each, counted in): the direct cost on the event loop's thread."""
    from meshd.router import traces

    def timed(cls: Any, name: str) -> None:
        fn = getattr(cls, name)

        acc = _TRACE_CALLS.setdefault(f"{cls.__name__}.{name}", [0, 0.0])

        @functools.wraps(fn)
        def wrapper(*a: Any, **kw: Any) -> Any:
            t0 = time.thread_time()
            try:
                return fn(*a, **kw)
            finally:
                took = time.thread_time() - t0
                acc[0] += 1
                acc[1] += took
        setattr(cls, name, wrapper)
    for cls, names in ((traces.RequestTracer, ("start",)),
                       (traces.RequestTrace, ("child", "metadata", "finish")),
                       (traces.SpanRecord, ("end",))):
        for name in names:
            timed(cls, name)


def trace_cost() -> dict[str, Any]:
    """The tracing calls' CPU so far, and the span exporter threads' (from /proc)."""
    exporter = 0.0
    for t in threading.enumerate():
        if t.name.startswith("OtelBatch") and t.native_id is not None:
            exporter += _thread_oncpu_s(t.native_id)
    hot = sum(s for _, s in _TRACE_CALLS.values())
    return {"hot": hot, "exporter": exporter,
            "calls": {k: [int(n), s] for k, (n, s) in _TRACE_CALLS.items()}}


async def _bare_proxy(upstream: str) -> tuple[Any, str]:
    """A grpc.aio server forwarding any unary call's raw bytes to ``upstream``."""
    import grpc

    opts = [("grpc.max_send_message_length", MAX_MESSAGE),
            ("grpc.max_receive_message_length", MAX_MESSAGE)]
    channel = grpc.aio.insecure_channel(upstream, options=opts)

    class Forward(grpc.GenericRpcHandler):
        def __init__(self) -> None:
            self.handlers: dict[str, grpc.RpcMethodHandler] = {}

        def service(self, details: grpc.HandlerCallDetails) -> grpc.RpcMethodHandler:
            method = details.method  # type: ignore[attr-defined]
            h = self.handlers.get(method)
            if h is None:
                call = channel.unary_unary(method)  # raw bytes both ways

                async def forward(raw: bytes, context: grpc.aio.ServicerContext) -> bytes:
                    return await call(raw)  # type: ignore[no-any-return]
                h = self.handlers[method] = grpc.unary_unary_rpc_method_handler(forward)
            return h

    server = grpc.aio.server(options=[("grpc.so_reuseport", 0), *opts])
    server.add_generic_rpc_handlers((Forward(),))
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


class Breakdown:
    """CPU time of the event loop's thread spent in the router's own steps, in place: the
    steps are wrapped (``time.thread_time`` around each call; ~1 us of wrapper per call)
    between ``start`` and ``stop``.  What the steps do not cover is gRPC and asyncio glue."""

    def __init__(self, router: Any, scorer: Any) -> None:
        self.router, self.scorer = router, scorer
        self.acc: dict[str, list[float]] = {}
        self.undo: list[Callable[[], None]] = []

    def _wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        acc = self.acc.setdefault(name, [0, 0.0])
        tt = time.thread_time

        def timed(*a: Any, **kw: Any) -> Any:
            t0 = tt()
            try:
                return fn(*a, **kw)
            finally:
                acc[0] += 1
                acc[1] += tt() - t0
        return timed

    def _patch(self, obj: Any, attr: str, name: str, instance: bool) -> None:
        orig = getattr(obj, attr)
        setattr(obj, attr, self._wrap(name, orig))
        if instance:  # a bound method shadowed in the instance's dict
            self.undo.append(lambda: delattr(obj, attr))
        else:
            self.undo.append(lambda: setattr(obj, attr, orig))

    def start(self) -> dict[str, Any]:
        from types import SimpleNamespace

        from meshd.router import kserve

        self.acc.clear()
        r, sc = self.router, self.scorer
        self._patch(sc, "score", "scorer.score", True)
        self._patch(sc, "report", "scorer.report", True)
        self._patch(sc, "weights", "scorer.weights", True)
        self._patch(r.auth, "tenant", "auth.tenant (_caller)", True)
        self._patch(r.schemas, "cached", "schemas.cached", True)
        self._patch(kserve, "validate", "validate", False)
        pb = kserve.service_pb2
        mir = SimpleNamespace(FromString=self._wrap("ModelInferRequest.FromString",
                                                    pb.ModelInferRequest.FromString))
        shim = SimpleNamespace(**{k: getattr(pb, k) for k in dir(pb) if not k.startswith("__")})
        shim.ModelInferRequest = mir
        kserve.service_pb2 = shim  # type: ignore[assignment]
        self.undo.append(lambda: setattr(kserve, "service_pb2", pb))
        unary = r.upstreams.unary
        wrapped: dict[Any, Any] = {}

        def unary_timed(endpoint: str, method: str) -> Any:
            mc = unary(endpoint, method)
            w = wrapped.get(mc)
            if w is None:
                w = wrapped[mc] = self._wrap("upstream call creation (the proxy pays it too)",
                                             mc)
            return w
        r.upstreams.unary = unary_timed
        self.undo.append(lambda: delattr(r.upstreams, "unary"))
        return {"ok": True}

    def stop(self) -> dict[str, Any]:
        while self.undo:
            self.undo.pop()()
        return {"steps": {k: {"calls": int(v[0]), "cpu_s": v[1]} for k, v in self.acc.items()}}


async def _router(upstream: str) -> tuple[Any, str, Callable[[], dict[str, Any]],
                                          Callable[[], Any], Breakdown]:
    """The meshd router over a fused view listing ``upstream`` as a ready ``add_sub``."""
    import dataclasses

    from adapters.model import ReplicaState
    from meshd.fused import FusedState
    from meshd.router import server as router_server
    from meshd.router.scoring import LocalScoring
    from meshd.score.scorer import Scorer
    from meshd.signal_wire import NodeSignals

    loop = asyncio.get_running_loop()
    fused = FusedState("router")
    scorer = Scorer(fused)
    seq = [0]

    def refresh() -> None:
        """Telemetry as the Triton adapter would publish it: ready, queue figures fresh."""
        now = loop.time()
        seq[0] += 1
        rep = ReplicaState(model=MODEL, version="1", endpoint=upstream, ready=True, queue=0,
                           spu=0.002, at={"ready": now, "queue": now, "stats": now})
        fused.update("node-0", NodeSignals(1, seq[0], [rep]), "gossip", now)

    async def feed() -> None:
        while True:
            await asyncio.sleep(0.5)
            refresh()

    refresh()
    feeder = asyncio.ensure_future(feed())
    server, router, addr = await router_server.serve(LocalScoring(scorer, loop.time),
                                                     loop.time, ("127.0.0.1", 0), dev=True,
                                                     identity=lambda: None)
    # Traced only when the OTEL_* variables ask (bench/tracing.py sets them for its child).
    from meshd import tracing
    from meshd.router.traces import request_tracer

    traces = tracing.setup("meshd-bench", "router")
    router.tracer = request_tracer(traces)
    TRACED.update(router=router, tracer=router.tracer)
    if router.tracer is not None:
        _account_tracing()

    def counters() -> dict[str, Any]:
        c, s = router.counters, scorer.counters
        return {"router": dataclasses.asdict(c),
                "scorer": {"shed": dict(s.shed), "fallbacks": dict(s.fallbacks),
                           "decisions": dict(s.decisions), "hedges_offered": s.hedges_offered,
                           "table_builds": scorer.table.builds}}

    async def close() -> None:
        feeder.cancel()
        await router.close()
        if traces is not None:
            traces.shutdown()

    return server, addr, counters, close, Breakdown(router, scorer)


async def _worker(scorer: Any) -> tuple[str, int, Callable[[], Any]]:
    """A router worker process over ``scorer``'s score API on a Unix socket: its address,
    its pid, and a coroutine function that stops it."""
    import socket

    from meshd import score_api, score_link
    from meshd.router.pool import WorkerPool

    loop = asyncio.get_running_loop()
    d = tempfile.mkdtemp(prefix="meshd-bench-w-")
    score, where = await score_api.serve(scorer, loop.time, f"{d}/score.sock", lambda: None)
    link, _ = await score_link.serve(scorer, loop.time, f"{d}/link.sock")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    pool = WorkerPool(1, ["--score", where, "--link", f"{d}/link.sock", "--router",
                          f"127.0.0.1:{port}", "--data", d, "--node", "bench", "--dev",
                          "--log-level", "warning"])
    await pool.start()
    end = loop.time() + 60
    while True:  # listening?
        try:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()
            break
        except OSError:
            if loop.time() > end:
                raise RuntimeError("the router worker never listened") from None
            await asyncio.sleep(0.1)

    async def stop() -> None:
        await pool.stop(1)
        await score.stop(0)
        link.close()
        shutil.rmtree(d, ignore_errors=True)
    return f"127.0.0.1:{port}", pool.pids()[0], stop


class WorkerPath:
    """The ``worker`` path: the worker process's CPU (``/proc``) plus the router child's,
    which serves the worker's score calls."""

    def __init__(self, router: Child) -> None:
        self.router = router
        self.addr = str(router.info["worker_addr"])
        self.pid = int(router.info["worker_pid"])

    def cpu(self) -> dict[str, Any]:
        r = self.router.cpu()
        w = proc_cpu_s(self.pid)
        if w is None:
            raise RuntimeError("the router worker exited")
        return {**r, "cpu": r["cpu"] + w, "worker_cpu": w, "agent_cpu": r["cpu"]}

    def stop(self) -> dict[str, Any]:
        return {}  # the router child stops it


class Child(child.Child):
    """A proxy process of this script."""

    def __init__(self, kind: str, spec: dict[str, Any], log: Path,
                 env: dict[str, str] | None = None) -> None:
        super().__init__(__file__, kind, spec, log, env=env)

    def cpu(self) -> dict[str, Any]:
        """``cpu`` (process, s), ``loop_cpu`` (its event loop's thread, s), ``gc_count`` and
        ``gc_s`` (per generation)."""
        return self.cmd("cpu")


# --- the clients --------------------------------------------------------------------------------


def _inputs(module: Any) -> list[Any]:
    import numpy as np

    a = np.arange(WIDTH, dtype=np.float32).reshape(1, WIDTH)
    b = np.ones((1, WIDTH), dtype=np.float32)
    inputs = []
    for name, value in (("INPUT0", a), ("INPUT1", b)):
        t = module.InferInput(name, [1, WIDTH], "FP32")
        t.set_data_from_numpy(value)
        inputs.append(t)
    return inputs


def sync_round(client: Any, inputs: list[Any], calls: int) -> list[float]:
    """``calls`` sequential requests; latencies in microseconds."""
    pc = time.perf_counter_ns
    lat = []
    for _ in range(calls):
        t0 = pc()
        client.infer(MODEL, inputs)
        lat.append((pc() - t0) / 1000)
    return lat


class AioClients:
    """tritonclient.grpc.aio clients to every path, on a loop in a thread of their own."""

    def __init__(self, urls: dict[str, str]) -> None:
        import tritonclient.grpc.aio as tca

        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

        async def make() -> dict[str, Any]:
            return {k: tca.InferenceServerClient(u) for k, u in urls.items()}
        self.clients = self.call(make())
        self.inputs = _inputs(tca)

    def call(self, coro: Any) -> Any:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(600)

    def round(self, path: str, calls: int, concurrency: int) -> tuple[list[float], float]:
        """Latencies (us) and wall seconds of ``calls`` requests over ``concurrency`` workers."""
        client, inputs = self.clients[path], self.inputs

        async def run() -> tuple[list[float], float]:
            pc = time.perf_counter_ns
            lat: list[float] = []
            left = [calls]

            async def worker() -> None:
                while left[0] > 0:
                    left[0] -= 1
                    t0 = pc()
                    await client.infer(MODEL, inputs)
                    lat.append((pc() - t0) / 1000)
            t0 = time.perf_counter()
            await asyncio.gather(*(worker() for _ in range(concurrency)))
            return lat, time.perf_counter() - t0
        return self.call(run())  # type: ignore[no-any-return]

    def close(self) -> None:
        async def close_all() -> None:
            for c in self.clients.values():
                await c.close()
        with contextlib.suppress(Exception):
            self.call(close_all())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


# --- the measurement ----------------------------------------------------------------------------


def _triton_cpu(server: Any) -> float:
    return sum(v for p in server.child_pids() if (v := proc_cpu_s(p)) is not None)


def _check_answers(urls: dict[str, str]) -> None:
    """Every path returns add_sub's right answer (else the bench measures nothing)."""
    import numpy as np
    import tritonclient.grpc as tc

    a = np.arange(WIDTH, dtype=np.float32).reshape(1, WIDTH)
    for path, url in urls.items():
        res = tc.InferenceServerClient(url).infer(MODEL, _inputs(tc))
        if not (np.array_equal(res.as_numpy("OUTPUT0"), a + 1)
                and np.array_equal(res.as_numpy("OUTPUT1"), a - 1)):
            raise RuntimeError(f"{path}: wrong add_sub answer")


def measure(args: argparse.Namespace, triton: Any, children: dict[str, Child],
            workdir: Path) -> dict[str, Any]:
    import tritonclient.grpc as tc

    urls = {"direct": triton.grpc_url, **{k: c.addr for k, c in children.items()}}
    _check_answers(urls)
    sync = {k: tc.InferenceServerClient(u) for k, u in urls.items()}
    inputs = _inputs(tc)
    aio = AioClients(urls)
    try:
        for path in PATHS:  # warm up: channels, the router's schema cache, the scorer
            sync_round(sync[path], inputs, args.warmup)
            aio.round(path, args.warmup, 8)

        zero = {"cpu": 0.0, "loop_cpu": 0.0, "gc_count": [0, 0, 0], "gc_s": [0.0, 0.0, 0.0]}

        def cpu_of(path: str) -> dict[str, Any]:
            return children[path].cpu() if path in children else zero

        def ours() -> float:
            t = os.times()
            return (t.user + t.system + _triton_cpu(triton)
                    + sum(proc_cpu_s(c.pid) or 0.0 for c in children.values()))

        out: dict[str, Any] = {}
        for phase, conc, calls, rounds in (("c1", 1, args.calls, args.rounds),
                                           ("c8", 8, args.calls_c8, args.rounds_c8)):
            acc: dict[str, dict[str, Any]] = {
                p: {"lat": [], "rounds": [], "cpu_s": 0.0, "loop_cpu_s": 0.0, "gc_s": 0.0,
                    "gc_count": [0, 0, 0], "triton_cpu_s": 0.0, "client_cpu_s": 0.0,
                    "calls": 0, "wall_s": 0.0, "cpu_per_req_ms": [], "throughput": [],
                    "agent_cpu_s": 0.0}
                for p in PATHS}
            watch = Others(ours)
            for rnd in range(rounds):
                k = rnd % len(PATHS)
                for path in PATHS[k:] + PATHS[:k]:
                    c0, t0, u0 = cpu_of(path), _triton_cpu(triton), os.times()
                    if conc == 1:
                        w0 = time.perf_counter()
                        lat = sync_round(sync[path], inputs, calls)
                        wall = time.perf_counter() - w0
                    else:
                        lat, wall = aio.round(path, calls, conc)
                    c1, t1, u1 = cpu_of(path), _triton_cpu(triton), os.times()
                    e = acc[path]
                    e["lat"].extend(lat)
                    e["rounds"].append(distribution(lat))
                    e["cpu_s"] += c1["cpu"] - c0["cpu"]
                    e["agent_cpu_s"] += c1.get("agent_cpu", 0.0) - c0.get("agent_cpu", 0.0)
                    e["loop_cpu_s"] += c1["loop_cpu"] - c0["loop_cpu"]
                    e["gc_s"] += sum(c1["gc_s"]) - sum(c0["gc_s"])
                    e["gc_count"] = [a + y - x for a, x, y in
                                     zip(e["gc_count"], c0["gc_count"], c1["gc_count"],
                                         strict=True)]
                    e["cpu_per_req_ms"].append((c1["cpu"] - c0["cpu"]) / calls * 1000)
                    e["triton_cpu_s"] += t1 - t0
                    e["client_cpu_s"] += (u1.user + u1.system) - (u0.user + u0.system)
                    e["calls"] += calls
                    e["wall_s"] += wall
                    e["throughput"].append(calls / wall)
                log(f"{phase} round {rnd + 1}/{rounds}: " + ", ".join(
                    f"{p} p50 {acc[p]['rounds'][-1]['p50']:.0f} us"
                    + (f" cpu {acc[p]['cpu_per_req_ms'][-1]:.3f} ms" if p in children else "")
                    for p in PATHS))
            res: dict[str, Any] = {"cpu": watch.done(), "concurrency": conc,
                                   "calls_per_round": calls, "rounds": rounds, "paths": {}}
            for p, e in acc.items():
                res["paths"][p] = {
                    "latency_us": distribution(e["lat"]), "round_latency_us": e["rounds"],
                    "calls": e["calls"], "throughput_per_s": e["calls"] / e["wall_s"],
                    "throughput_rounds": e["throughput"],
                    "cpu_ms_per_request": (e["cpu_s"] / e["calls"] * 1000
                                           if p in children else None),
                    "cpu_ms_per_request_rounds": e["cpu_per_req_ms"] if p in children else [],
                    "proxy_cores": e["cpu_s"] / e["wall_s"] if p in children else None,
                    "loop_thread_cpu_ms_per_request": (e["loop_cpu_s"] / e["calls"] * 1000
                                                       if p in children else None),
                    "gc_us_per_request": (e["gc_s"] / e["calls"] * 1e6
                                          if p in children else None),
                    "gc_collections": e["gc_count"] if p in children else None,
                    "triton_cpu_ms_per_request": e["triton_cpu_s"] / e["calls"] * 1000,
                    "agent_cpu_ms_per_request": e["agent_cpu_s"] / e["calls"] * 1000,
                    "client_cpu_ms_per_request": e["client_cpu_s"] / e["calls"] * 1000}
            d = res["paths"]["direct"]["round_latency_us"]
            for p in PROXIES:
                r = res["paths"][p]["round_latency_us"]
                res["paths"][p]["added_p50_us_pooled"] = (
                    res["paths"][p]["latency_us"]["p50"] - res["paths"]["direct"]["latency_us"]
                    ["p50"])
                res["paths"][p]["added_p50_us_paired_median"] = statistics.median(
                    x["p50"] - y["p50"] for x, y in zip(r, d, strict=True))
            out[phase] = res
        return out
    finally:
        aio.close()
        for c in sync.values():
            with contextlib.suppress(Exception):
                c.close()


def profile(args: argparse.Namespace, triton: Any, children: dict[str, Child],
            workdir: Path) -> dict[str, Any]:
    """The router's own steps timed in place (:class:`Breakdown`), then cProfile of both
    proxies, each over ``--profile-calls`` requests at concurrency 8."""
    urls = {k: c.addr for k, c in children.items()}
    aio = AioClients(urls)
    out: dict[str, Any] = {}
    n = args.profile_calls
    try:
        router = children["router"]
        aio.round("router", 100, 8)
        router.cmd("breakdown-start")
        c0 = router.cpu()
        aio.round("router", n, 8)
        c1 = router.cpu()
        steps = router.cmd("breakdown-stop")["steps"]
        out["breakdown"] = {
            "calls": n, "cpu_ms_per_request": (c1["cpu"] - c0["cpu"]) / n * 1000,
            "loop_thread_cpu_ms_per_request": (c1["loop_cpu"] - c0["loop_cpu"]) / n * 1000,
            "steps": {k: {"calls_per_request": v["calls"] / n,
                          "us_per_request": v["cpu_s"] / n * 1e6}
                      for k, v in sorted(steps.items(), key=lambda kv: -kv[1]["cpu_s"])}}
        for kind, child in children.items():
            if isinstance(child, WorkerPath):
                continue  # its CPU is in two processes; the router's profile covers scoring
            aio.round(kind, 100, 8)
            path = workdir / f"{kind}.pstats"
            child.cmd("profile-start")
            c0 = child.cpu()
            aio.round(kind, args.profile_calls, 8)
            c1 = child.cpu()
            child.cmd(f"profile-stop {path}")
            out[kind] = summarize_profile(path, args.profile_calls)
            out[kind]["cpu_ms_per_request_profiled"] = ((c1["cpu"] - c0["cpu"])
                                                        / args.profile_calls * 1000)
            out[kind]["pstats_file"] = str(path)
    finally:
        aio.close()
    return {"breakdown": out.pop("breakdown"), "cprofile": out}


def summarize_profile(path: Path, calls: int, top: int = 25) -> dict[str, Any]:
    st = pstats.Stats(str(path), stream=io.StringIO())
    raw: dict[Any, Any] = st.stats  # type: ignore[attr-defined]
    total = sum(v[2] for v in raw.values())

    def name(func: tuple[str, int, str]) -> str:
        file, line, fn = func
        if file == "~":
            return fn
        try:
            rel = str(Path(file).resolve().relative_to(ROOT))
        except ValueError:
            parts = Path(file).parts
            rel = "/".join(parts[-2:])
        return f"{rel}:{line}({fn})"

    rows = [{"function": name(f), "ncalls": v[1], "tottime_s": v[2], "cumtime_s": v[3],
             "tottime_us_per_request": v[2] / calls * 1e6,
             "cumtime_us_per_request": v[3] / calls * 1e6}
            for f, v in raw.items()]
    by_tot = sorted(rows, key=lambda r: -r["tottime_s"])[:top]
    by_cum = sorted(rows, key=lambda r: -r["cumtime_s"])[:top]
    return {"calls": calls, "total_tottime_s": total,
            "python_us_per_request": total / calls * 1e6, "top_tottime": by_tot,
            "top_cumtime": by_cum}


# --- report -------------------------------------------------------------------------------------


def _ms(us: float) -> str:
    return f"{us / 1000:.3f} ms"


def build_rows(results: dict[str, Any]) -> list[list[str]]:
    rows: list[list[str]] = []
    m = results.get("measure")
    if not m:
        return rows
    c1, c8 = m["c1"], m["c8"]
    for p in PATHS:
        d = c1["paths"][p]["latency_us"]
        r50 = [x["p50"] for x in c1["paths"][p]["round_latency_us"]]
        rows.append([f"latency at concurrency 1, {p}",
                     f"p50 {_ms(d['p50'])}, p99 {_ms(d['p99'])} ({d['n']} requests; round "
                     f"p50s {min(r50) / 1000:.3f}-{max(r50) / 1000:.3f} ms)", "", "-"])
    for p in ("router", "proxy", "worker"):
        e = c1["paths"][p]
        pooled, paired = e["added_p50_us_pooled"], e["added_p50_us_paired_median"]
        bar = p == "router"
        rows.append([f"added p50 latency, {p} - direct (concurrency 1)",
                     f"{_ms(pooled)} pooled; {_ms(paired)} median of per-round differences",
                     f"<= {ADDED_P50_BAR_MS:g} ms" if bar else "",
                     verdict(max(pooled, paired) <= ADDED_P50_BAR_MS * 1000) if bar else "-"])
    rr = c1["paths"]["router"]["added_p50_us_pooled"] - c1["paths"]["proxy"][
        "added_p50_us_pooled"]
    rows.append(["router - proxy p50 (concurrency 1)", _ms(rr), "", "-"])
    for phase, res in (("1", c1), ("8", c8)):
        for p in ("proxy", "router"):
            e = res["paths"][p]
            rounds = e["cpu_ms_per_request_rounds"]
            rows.append([f"CPU per request, {p} process, concurrency {phase}",
                         f"{e['cpu_ms_per_request']:.3f} ms (rounds {min(rounds):.3f}-"
                         f"{max(rounds):.3f}; {e['proxy_cores']:.2f} cores; event-loop thread "
                         f"{e['loop_thread_cpu_ms_per_request']:.3f} ms, of which GC "
                         f"{e['gc_us_per_request'] / 1000:.3f} ms)",
                         (f"~{PROXY_CPU_EXPECTED_MS[0]:g}-{PROXY_CPU_EXPECTED_MS[1]:g} ms "
                          "expected" if p == "proxy" else ""), "-"])
        ratio = res["paths"]["router"]["cpu_ms_per_request"] / res["paths"]["proxy"][
            "cpu_ms_per_request"]
        rr_rounds = [a / b for a, b in zip(res["paths"]["router"]["cpu_ms_per_request_rounds"],
                                           res["paths"]["proxy"]["cpu_ms_per_request_rounds"],
                                           strict=True)]
        rows.append([f"CPU ratio router / proxy, concurrency {phase}",
                     f"{ratio:.2f}x (per-round ratios {min(rr_rounds):.2f}-"
                     f"{max(rr_rounds):.2f}, median {statistics.median(rr_rounds):.2f})",
                     f"<= {CPU_RATIO_BAR:g}x", verdict(ratio <= CPU_RATIO_BAR)])
        w = res["paths"]["worker"]
        rows.append([f"CPU per request, worker path (worker + agent), concurrency {phase}",
                     f"{w['cpu_ms_per_request']:.3f} ms ({w['agent_cpu_ms_per_request']:.3f} ms "
                     f"of it the agent's) = {w['proxy_cores']:.2f} cores; "
                     f"{w['cpu_ms_per_request'] / res['paths']['proxy']['cpu_ms_per_request']:.2f}"
                     "x the proxy (10 ms /proc ticks for the worker)", "", "-"])
    for p in PATHS:
        e = c8["paths"][p]
        d = e["latency_us"]
        rows.append([f"throughput at concurrency 8, {p}",
                     f"{e['throughput_per_s']:.0f} req/s (rounds "
                     f"{min(e['throughput_rounds']):.0f}-{max(e['throughput_rounds']):.0f}); "
                     f"p50 {_ms(d['p50'])}, p99 {_ms(d['p99'])}; Triton CPU "
                     f"{e['triton_cpu_ms_per_request']:.3f} ms/req", "", "-"])
    return rows


def build_notes(results: dict[str, Any], args: argparse.Namespace) -> list[str]:
    notes = []
    if args.quick:
        notes.append("QUICK run: small sizes, a smoke check; run without --quick for the "
                     "reported numbers.")
    m = results.get("measure")
    if m:
        for phase in ("c1", "c8"):
            cpu = m[phase]["cpu"]
            notes.append(f"concurrency {phase[1:]}: load average {cpu['loadavg_before']} -> "
                         f"{cpu['loadavg_after']}; bench, Triton and proxies used "
                         f"{cpu['our_cores']:.2f} cores, other processes "
                         f"{cpu['other_cores'] or 0:.2f}.")
        c1 = m["c1"]["paths"]
        notes.append("client (this process, sync tritonclient) CPU per request at "
                     "concurrency 1: " + ", ".join(
                         f"{p} {c1[p]['client_cpu_ms_per_request']:.3f} ms" for p in PATHS)
                     + "; Triton (server + stub) CPU per request: " + ", ".join(
                         f"{p} {c1[p]['triton_cpu_ms_per_request']:.3f} ms" for p in PATHS)
                     + " (/proc, 10 ms ticks).")
    ends = results.get("children_end") or {}
    rc = (ends.get("router") or {}).get("counters")
    if rc:
        notes.append(f"router counters at the end: {json.dumps(rc['router'])}; scorer "
                     f"{json.dumps(rc['scorer'])}")
    prof = results.get("profile")
    if prof and m:
        b = prof["breakdown"]
        c8 = m["c8"]["paths"]
        extra = (c8["router"]["loop_thread_cpu_ms_per_request"]
                 - c8["proxy"]["loop_thread_cpu_ms_per_request"]) * 1000
        own = sum(v["us_per_request"] for k, v in b["steps"].items()
                  if not k.startswith("upstream call"))
        notes.append(f"where the router's extra CPU goes (concurrency 8): its event-loop thread "
                     f"used {extra:.0f} us per request more than the bare proxy's in the "
                     f"measurement; its own steps, timed in place over {b['calls']} requests, "
                     f"take {own:.0f} us (" + ", ".join(
                         f"{k} {v['us_per_request']:.1f}" for k, v in b["steps"].items()
                         if not k.startswith("upstream call"))
                     + f"); the other {extra - own:.0f} us is gRPC/asyncio glue around them "
                     "(the handler's coroutine chain, context metadata and deadline calls, "
                     "result objects).")
    if prof:
        for kind, p in prof["cprofile"].items():
            notes.append(f"cProfile ({kind}, {p['calls']} requests at concurrency 8, CPU time "
                         f"of its loop thread): {p['python_us_per_request']:.0f} us per request "
                         f"under the profiler (process CPU/request while profiled "
                         f"{p['cpu_ms_per_request_profiled']:.3f} ms); top by own time: "
                         + "; ".join(f"{r['function']} {r['tottime_us_per_request']:.1f} us"
                                     for r in p["top_tottime"][:12]))
    return notes


def profile_md(prof: dict[str, Any]) -> list[str]:
    lines = []
    for kind, p in prof.items():
        for key, label in (("top_tottime", "own time"), ("top_cumtime", "cumulative time")):
            lines += ["", f"### cProfile, {kind}: top functions by {label} "
                          f"({p['calls']} requests at concurrency 8; CPU time of the event "
                          "loop's thread, inflated by the profiler; Cython code of grpc.aio is "
                          "not seen by cProfile and is counted in its caller, mostly "
                          "Context.run)", ""]
            lines.append(format_table(
                ("function", "calls/request", "own us/request", "cumulative us/request"),
                [[r["function"], f"{r['ncalls'] / p['calls']:.2f}",
                  f"{r['tottime_us_per_request']:.1f}", f"{r['cumtime_us_per_request']:.1f}"]
                 for r in p[key]]))
    return lines


def write_markdown(path: Path, title: str, rows: list[list[str]], notes: list[str],
                   report: dict[str, Any]) -> None:
    lines = [f"# {title}", "",
             f"{report['when']}, {report['cpu_count']} CPUs ({report['cpu_model']}), Python "
             f"{report['python']}, commit {report['git']['commit'][:12]}"
             + (f" + uncommitted changes in {', '.join(report['git']['dirty_files'])}"
                if report["git"]["dirty_files"] else "") + ".", "",
             f"`{' '.join(report['argv'])}`", "",
             f"Bars: router CPU per request <= {CPU_RATIO_BAR:g}x the bare proxy's (same run); "
             f"added p50 latency (router - direct) <= {ADDED_P50_BAR_MS:g} ms at concurrency "
             "1.", "", format_table(HEAD, rows), ""]
    lines += [f"* {n}" for n in notes]
    if report["results"].get("profile"):
        b = report["results"]["profile"]["breakdown"]
        lines += ["", f"### The router's own steps, timed in place ({b['calls']} requests at "
                      "concurrency 8; CPU of the event loop's thread)", "",
                  format_table(("step", "calls/request", "us/request"),
                               [[k, f"{v['calls_per_request']:.2f}",
                                 f"{v['us_per_request']:.1f}"]
                                for k, v in b["steps"].items()]),
                  "", f"Process CPU per request during it {b['cpu_ms_per_request']:.3f} ms, "
                      f"event-loop thread {b['loop_thread_cpu_ms_per_request']:.3f} ms "
                      "(with the wrappers)."]
        lines += profile_md(report["results"]["profile"]["cprofile"])
    lines += ["", f"Wall time {report['wall_s']:.0f} s. Full data: "
              f"`{path.with_suffix('.json').name}`.", ""]
    path.write_text("\n".join(lines))


# --- main ---------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes: a smoke check")
    ap.add_argument("--rounds", type=int, help="concurrency-1 rounds (15; quick 2)")
    ap.add_argument("--calls", type=int, help="requests per path per concurrency-1 round "
                                              "(500; quick 100)")
    ap.add_argument("--rounds-c8", type=int, help="concurrency-8 rounds (8; quick 1)")
    ap.add_argument("--calls-c8", type=int, help="requests per path per concurrency-8 round "
                                                 "(2000; quick 300)")
    ap.add_argument("--warmup", type=int, default=200, help="untimed requests per path")
    ap.add_argument("--profile", action=argparse.BooleanOptionalAction, default=None,
                    help="profile the proxies after the measurement (default: when the "
                         "router misses the CPU bar)")
    ap.add_argument("--profile-calls", type=int, help="requests profiled (3000; quick 500)")
    ap.add_argument("--out", type=Path,
                    default=ROOT / "bench" / "results" / "router_overhead.json")
    ap.add_argument("--keep", action="store_true",
                    help="keep the work dir (logs, the profiles' .pstats files)")
    ap.add_argument("--proxy-child", help=argparse.SUPPRESS)
    ap.add_argument("--router-child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.proxy_child:
        return child_main("proxy", json.loads(args.proxy_child))
    if args.router_child:
        return child_main("router", json.loads(args.router_child))
    q = args.quick
    args.rounds = args.rounds or (2 if q else 15)
    args.calls = args.calls or (100 if q else 500)
    args.rounds_c8 = args.rounds_c8 or (1 if q else 8)
    args.calls_c8 = args.calls_c8 or (300 if q else 2000)
    args.profile_calls = args.profile_calls or (500 if q else 3000)

    from meshd.devtriton import DEFAULT_REPO, TritonServer, unavailable_reason

    reason = unavailable_reason()
    if reason:
        print(f"router_overhead: Triton is unavailable here: {reason}", file=sys.stderr)
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="meshd-bench-router-"))
    started = time.perf_counter()
    log(f"router_overhead{' (quick)' if q else ''}: work dir {workdir}; load average "
         f"{loadavg()}")
    results: dict[str, Any] = {}
    failed: list[str] = []
    triton = TritonServer(DEFAULT_REPO, workdir / "triton", models=[MODEL], name="triton")
    children: dict[str, Child] = {}
    try:
        t0 = time.monotonic()
        triton.start(timeout=180)
        log(f"Triton ready in {time.monotonic() - t0:.1f} s at {triton.grpc_url}")
        for kind in ("proxy", "router"):
            children[kind] = Child(kind, {"upstream": triton.grpc_url},
                                   workdir / f"{kind}.log")
            log(f"{kind} (pid {children[kind].pid}) on {children[kind].addr}")
        children["worker"] = WorkerPath(children["router"])  # type: ignore[assignment]
        log(f"router worker (pid {children['worker'].pid}) on {children['worker'].addr}")
        try:
            results["measure"] = measure(args, triton, children, workdir)
        except Exception as exc:  # noqa: BLE001 - reported
            failed.append(f"measure: {type(exc).__name__}: {exc}")
            log(f"measure FAILED: {exc}")
        m: Any = results.get("measure")
        missed = bool(m) and any(
            m[ph]["paths"]["router"]["cpu_ms_per_request"]
            > CPU_RATIO_BAR * m[ph]["paths"]["proxy"]["cpu_ms_per_request"]
            for ph in ("c1", "c8"))
        if args.profile or (args.profile is None and missed):
            try:
                log("profiling the proxies" + (" (the router missed the CPU bar)"
                                                if missed else ""))
                results["profile"] = profile(args, triton, children, workdir)
            except Exception as exc:  # noqa: BLE001 - reported
                failed.append(f"profile: {type(exc).__name__}: {exc}")
                log(f"profile FAILED: {exc}")
    finally:
        results["children_end"] = {k: c.stop() for k, c in children.items()}
        triton.stop()
        if args.keep or failed:
            print(f"work dir kept: {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    wall = time.perf_counter() - started

    rows = build_rows(results)
    for f in failed:
        rows.append([f"section {f.split(':', 1)[0]}", f.split(":", 1)[1].strip()[:160], "",
                     "FAIL"])
    notes = build_notes(results, args)
    title = (f"Router overhead: direct vs bare proxy vs meshd router, one Triton"
             f"{': QUICK sizes' if q else ''}")
    print(f"\n{title} ({os.cpu_count()} CPUs, Python {platform.python_version()})\n")
    print_table(HEAD, rows)
    for note in notes:
        print(f"\n* {note}")
    print(f"\nwall time {wall:.0f} s")
    report = {
        "benchmark": "router_overhead", "quick": q, "argv": sys.argv,
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **machine_info(),
        "loadavg_end": loadavg(), "git": git_state(), "wall_s": wall,
        "setup": {"model": MODEL, "inputs": f"2 x [1, {WIDTH}] FP32", "rounds": args.rounds,
                  "calls": args.calls, "rounds_c8": args.rounds_c8, "calls_c8": args.calls_c8,
                  "warmup": args.warmup, "profile_calls": args.profile_calls,
                  "bars": {"cpu_ratio": CPU_RATIO_BAR, "added_p50_ms": ADDED_P50_BAR_MS,
                           "proxy_cpu_expected_ms": PROXY_CPU_EXPECTED_MS}},
        "table": [dict(zip(HEAD, r, strict=True)) for r in rows],
        "notes": notes, "failed": failed, "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(report, indent=1, default=str) + "\n")
    os.replace(tmp, args.out)
    md = args.out.with_suffix(".md")
    write_markdown(md, title, rows, notes, report)
    for p in (args.out, md):
        print(f"wrote {p.relative_to(ROOT) if p.is_relative_to(ROOT) else p}")
    return 1 if any(r[3] == "FAIL" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
