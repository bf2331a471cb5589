"""What the router adds to a request, over gRPC and HTTP: latency and CPU, against a bare
byte-forwarding proxy of the same protocol (the floor) and NGINX (what users put in front of
Triton today).

    ./dev bench router_overhead [--quick] [--rounds 15] [--calls 500] [--profile] ...
    .venv/bin/python bench/router_overhead.py ...

Bars (from the issue), for gRPC and for HTTP, each against the bare proxy of the same
protocol measured in the same run:

* the router's added p50 at concurrency 1 <= the bare proxy's added p50 + 0.1 ms (added =
  path - direct; so: router p50 - proxy p50 <= 0.1 ms, pooled and as the median of the
  per-round differences);
* the router's CPU per request <= 1.2x the bare proxy's, at concurrency 16 (concurrency 1 is
  reported beside it);
* gRPC: the client library (``meshd.score.client``, no proxy hop) adds <= 0.15 ms p50 over calling
  Triton directly, at concurrency 1 (pooled and paired median).

NGINX's figures are reported beside ours as they are, with no bar.

One real Triton server (``meshd.dev.triton.TritonServer`` on ``tests/triton_models``, serving
``add_sub`` only), and the paths to it, for each protocol.  Every client is a ``tritonclient``
sending ``add_sub`` with two [1, 16] FP32 inputs (built once), binary tensor data both ways
over HTTP (tritonclient's default: binary inputs, ``binary_data_output``):

* ``direct``: tritonclient -> Triton (its gRPC port; its HTTP port);
* ``proxy``: tritonclient -> a bare proxy (a child process of this script).  gRPC: a
  ``grpc.aio`` server with one generic handler that forwards the request's raw bytes to
  Triton with a raw ``unary_unary`` multicallable (no serializers) and returns the reply's
  raw bytes - no parsing, no metadata, no deadline.  HTTP: an ``aiohttp.web`` server with one
  catch-all handler forwarding method, path, headers and body to Triton's HTTP port over one
  shared ``aiohttp.ClientSession`` and returning status, headers and body (hop-by-hop headers
  dropped, no decompression) - no parsing beyond what aiohttp does;
* ``nginx``: tritonclient -> Debian's nginx, started by this script as the current user with a
  generated config (``daemon off``, ``master_process on``, ``worker_processes 1``, access log
  off): ``grpc_pass grpc://`` on an ``http2`` listener, and ``proxy_pass`` with
  ``proxy_http_version 1.1`` and ``Connection ""``, each to an upstream block with
  ``keepalive 32``; ``keepalive_requests`` raised (client and upstream side) so connections
  are not recycled every 1000 requests.  Skipped ("nginx not installed") without
  ``/usr/sbin/nginx`` (``apt-get install nginx-light``);
* ``router``: tritonclient -> the meshd router (a child process, both protocols on separate
  ports): a ``FusedState`` listing the Triton gRPC endpoint as a ready replica of ``add_sub`` on
  one node, with Triton's HTTP address advertised as the adapter does with ``--triton
  ...,http=HOST:PORT`` (so the HTTP ingress forwards requests to Triton's HTTP port as they
  came, ``meshd.router.http_dispatch``); its ``at`` times refreshed every 0.5 s, as
  ``tests/test_router.py``'s RouterHarness does; a ``Scorer`` over it (default policy:
  ``hybrid``; its adaptive concurrency limit's floor raised from 2 to 32, else concurrency 16
  against the one replica sheds once the load raises its latency - the limiter still runs on
  every request),
  ``meshd.router.server.serve(..., dev=True)`` (gRPC) and ``serve_http`` (HTTP, the same
  gateway) on loopback;
* ``worker`` (gRPC): tritonclient -> a router worker process (``meshd.router.worker``, started
  by the router child through ``meshd.router.pool.WorkerPool``, as ``--router-workers`` does)
  on a port of its own, scoring through the router child's score link on a Unix socket.  Its
  CPU per request is the worker's plus the router child's (which serves the score calls and
  outcome stream in that round): what one request through a worker costs the node.  No bar;
* ``client`` (gRPC, concurrency 1 only: a synchronous library): ``meshd.score.client.MeshClient``
  in watch mode over the router child's score API (the worker's Unix socket) -> Triton
  directly.  Its CPU column is the agent's (the router child streaming weights and taking
  the outcome batches); the caller's own CPU is reported beside the direct path's.

CPU per request: each Python proxy runs in its own process and measures its own CPU
(``getrusage(RUSAGE_SELF)``: user + system, all threads), asked before and after each round;
NGINX's is its master's and workers' utime + stime from ``/proc/<pid>/stat`` (10 ms ticks)
before and after each round.  CPU per request = the difference over the round's requests.
For each protocol and concurrency, rounds interleave the paths (the starting path rotates),
so they share the machine's noise:

* concurrency 1: sync clients (``tritonclient.grpc``; ``tritonclient.http``, geventhttpclient),
  ``--calls`` requests per path and round, each timed (``perf_counter_ns``);
* concurrency 16: ``tritonclient.grpc.aio`` / ``tritonclient.http.aio`` (aiohttp) with 16
  workers, ``--calls-c16`` requests per path and round.  aiohttp asks for compressed replies
  by default (``Accept-Encoding: gzip, deflate, br``) and Triton gzips them; the sync HTTP
  client asks for none.  Each HTTP path's reply encoding to the aio client is recorded.

Every server child runs with the collector settled as meshd's serving processes are
(``meshd.collector.settle``), the bare proxies included.

Per path: p50 and p99; added p50 and p99 against direct, pooled and as the median of the
per-round paired differences (with their spread over rounds); CPU per request and its ratio to
the bare proxy of the same protocol; throughput.  Triton's own CPU (server and Python-backend
stub, /proc) and the client's are recorded for context.  Then, when the router misses a CPU
bar (or with ``--profile``), the router child is profiled at concurrency 16 for both protocols
- its own steps timed in place, and cProfile of its event-loop thread over ``--profile-calls``
requests, the bare proxies likewise for comparison - after the measurement, so the profilers'
cost is not in the numbers; the top functions are written next to the results.

The machine is shared (2 cores, other sessions' jobs): load averages and the CPU others used
are recorded.  Prints the tables and writes ``bench/results/router_overhead.{json,md}``.
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
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# Run as a script, this file's folder comes first on sys.path and a bench module could shadow
# a package of the project: put the project root first instead.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from bench import child  # noqa: E402
from bench.child import log  # noqa: E402
from bench.nginx import Nginx  # noqa: E402
from bench.nginx import installed as nginx_installed  # noqa: E402
from bench.nginx import version as nginx_version  # noqa: E402
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
from meshd import collector  # noqa: E402

PROTOCOLS = ("grpc", "http")
PATHS: dict[str, tuple[str, ...]] = {"grpc": ("direct", "proxy", "nginx", "router", "worker",
                                              "client"),
                                     "http": ("direct", "proxy", "nginx", "router")}
CONCURRENCY = (1, 16)
PHASES = tuple((proto, conc) for proto in PROTOCOLS for conc in CONCURRENCY)
LABEL = {"grpc": "gRPC", "http": "HTTP"}
MODEL = "add_sub"
WIDTH = 16
CPU_RATIO_BAR = 1.2
ADDED_P50_MARGIN_MS = 0.1
"""The router's added p50 may exceed the bare proxy's by this much (concurrency 1)."""
CLIENT_ADDED_P50_MS = 0.15
"""The client library (``meshd.score.client``, no proxy hop) may add this much p50 over calling
Triton directly (concurrency 1)."""
SYNC_ONLY = ("client",)
"""Paths measured at concurrency 1 only: ``meshd.score.client.MeshClient`` is a synchronous
library (its concurrency is its caller's threads)."""
CLIENT_URL = "meshclient+"
"""A target URL naming the client library over the agent's score API at the rest."""
MAX_MESSAGE = 1 << 30
LIMIT_FLOOR = 32.0
"""The router's scorer's adaptive concurrency limit floor (``LimiterConfig.min_limit``; 2 by
default): at the default, concurrency 16 on one replica sheds (model_limit) once the bench's
load raises its latency."""
HOP_BY_HOP = frozenset(("connection", "keep-alive", "proxy-connection", "te", "trailer",
                        "transfer-encoding", "upgrade", "host", "content-length"))
"""Headers the bare HTTP proxy does not copy (hop-by-hop ones, and the two aiohttp sets
itself for the message it sends)."""
TRACED: dict[str, Any] = {}
"""The router child's router and its tracer, when the OTEL_* variables turned tracing on
(``tracer on|off`` switches it, for bench/tracing.py)."""
HEAD = ("measurement", "value", "bar", "result")
PATH_HEAD = ("path", "p50", "p99", "added p50: pooled; paired median (rounds min-max)",
             "added p99: pooled; paired median (rounds min-max)",
             "CPU/request (rounds min-max)", "CPU vs proxy", "req/s")


def phase_key(proto: str, conc: int) -> str:
    return f"{proto}-c{conc}"


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
    """Serve ``kind`` (``proxy``: gRPC, ``httpproxy``: HTTP, or ``router``: gRPC, and HTTP
    when ``spec['http']``) to ``spec['upstream']``; print the address (and the router's
    ``http_addr``, ``worker_addr``, ``worker_pid``), then answer commands on stdin (``cpu``,
    ``profile-start``, ``profile-stop PATH``, ``stop``, ...), one JSON line each."""
    loop = asyncio.get_running_loop()
    upstream = spec["upstream"]
    counters: Callable[[], dict[str, Any]] = dict
    closers: list[Callable[[], Awaitable[Any]]] = []
    breakdown: Breakdown | None = None
    first: dict[str, Any] = {"pid": os.getpid()}
    if kind == "proxy":
        server, addr = await _bare_proxy(upstream)
        closers.append(functools.partial(server.stop, 0.5))
    elif kind == "httpproxy":
        cleanup, addr = await _bare_http_proxy(upstream)
        closers.append(cleanup)
    else:
        server, addr, counters, close, breakdown, http = await _router(
            upstream, bool(spec.get("http")), spec.get("http_upstream", ""))
        first.update(http)
        first["worker_addr"], first["worker_pid"], stop_worker, first["score_addr"] = \
            await _worker(breakdown.scorer)
        closers += [stop_worker, functools.partial(server.stop, 0.5), close]
    # Every server here runs as meshd's serving processes do once started (meshd.collector):
    # the router's requests leave it work the collector would otherwise take up; the bare
    # proxies get the same, so the floor is measured alike.
    collector.settle()
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


async def _bare_http_proxy(upstream: str) -> tuple[Callable[[], Awaitable[None]], str]:
    """An aiohttp.web server forwarding any request (method, path, headers, body) to
    ``upstream`` (``http://host:port``) over one shared ClientSession, and the reply (status,
    headers, body) back: what aiohttp parses, nothing more."""
    import aiohttp
    from aiohttp import web
    from multidict import CIMultiDict

    session = aiohttp.ClientSession(
        connector=aiohttp.TCPConnector(limit=0), auto_decompress=False,
        timeout=aiohttp.ClientTimeout(total=None),
        skip_auto_headers=("Accept", "Accept-Encoding", "User-Agent", "Content-Type"))
    hop = HOP_BY_HOP

    async def forward(request: web.Request) -> web.Response:
        body = await request.read()
        headers = [(k, v) for k, v in request.headers.items() if k.lower() not in hop]
        async with session.request(request.method, upstream + request.raw_path,
                                   headers=headers, data=body) as resp:
            data = await resp.read()
            return web.Response(status=resp.status, body=data, headers=CIMultiDict(
                (k, v) for k, v in resp.headers.items() if k.lower() not in hop))

    app = web.Application(client_max_size=MAX_MESSAGE)
    app.router.add_route("*", "/{tail:.*}", forward)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]

    async def cleanup() -> None:
        await runner.cleanup()
        await session.close()
    return cleanup, f"127.0.0.1:{port}"


class Breakdown:
    """CPU time of the event loop's thread spent in the router's own steps, in place: the
    steps are wrapped (``time.thread_time`` around each call; ~1 us of wrapper per call)
    between ``start`` and ``stop``.  What the steps do not cover is gRPC, aiohttp and asyncio
    glue."""

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
        own = attr in getattr(obj, "__dict__", {})  # an attribute of the instance's own
        setattr(obj, attr, self._wrap(name, orig))
        if instance and not own:  # a bound method shadowed in the instance's dict
            self.undo.append(lambda: delattr(obj, attr))
        else:
            self.undo.append(lambda: setattr(obj, attr, orig))

    def start(self) -> dict[str, Any]:
        from types import SimpleNamespace

        from meshd.router import gateway, kserve
        from meshd.router.auth import ClientAuth

        self.acc.clear()
        r, sc = self.router, self.scorer
        self._patch(sc, "score", "scorer.score", True)
        self._patch(sc, "report", "scorer.report", True)
        self._patch(sc, "weights", "scorer.weights", True)
        self._patch(ClientAuth, "tenant", "auth.tenant", False)
        self._patch(r.schemas, "cached", "schemas.cached", True)
        self._patch(gateway, "validate", "validate", False)
        self._patch(r, "recognise", "gateway.recognise (known requests)", True)
        self._patch(r.known, "get", "known.get", True)
        with contextlib.suppress(ImportError):  # the HTTP ingress's tensor conversion
            from meshd.router import http_tensors

            for fn in ("header_length", "infer_request", "split_response", "render_infer"):
                if hasattr(http_tensors, fn):
                    self._patch(http_tensors, fn, f"http_tensors.{fn}", False)
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


async def _router(upstream: str, http: bool = False, http_upstream: str = ""
                  ) -> tuple[Any, str, Callable[[], dict[str, Any]],
                             Callable[[], Awaitable[None]], Breakdown, dict[str, str]]:
    """The meshd router over a fused view listing ``upstream`` as a ready ``add_sub``; with
    ``http``, its HTTP ingress too (``serve_http``, same gateway): ``{"http_addr": ...}``."""
    import dataclasses

    from adapters.model import ReplicaState
    from meshd.router import server as router_server
    from meshd.router.scoring import LocalScoring
    from meshd.score.limiter import LimiterConfig
    from meshd.score.scorer import Scorer
    from meshd.signals.fused import FusedState
    from meshd.signals.wire import NodeSignals

    loop = asyncio.get_running_loop()
    fused = FusedState("router")
    # Admission must not shed at concurrency 16 against the one replica (whose latency rises
    # under the bench's load, which shrinks its adaptive limit): the floor is raised, the
    # limiter runs as ever.
    scorer = Scorer(fused, limiter=LimiterConfig(min_limit=LIMIT_FLOOR, initial=LIMIT_FLOOR))
    seq = [0]

    def refresh() -> None:
        """Telemetry as the Triton adapter would publish it: ready, queue figures fresh."""
        now = loop.time()
        seq[0] += 1
        rep = ReplicaState(model=MODEL, version="1", endpoint=upstream, ready=True, queue=0,
                           spu=0.002, at={"ready": now, "queue": now, "stats": now},
                           http=http_upstream)
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
    extra: dict[str, str] = {}
    runner: Any = None
    if http:
        runner, extra["http_addr"] = await router_server.serve_http(router, ("127.0.0.1", 0),
                                                                    ssl_context=None)

    def counters() -> dict[str, Any]:
        c, s = router.counters, scorer.counters
        return {"router": dataclasses.asdict(c),
                "scorer": {"shed": dict(s.shed), "fallbacks": dict(s.fallbacks),
                           "decisions": dict(s.decisions), "hedges_offered": s.hedges_offered,
                           "table_builds": scorer.table.builds}}

    async def close() -> None:
        feeder.cancel()
        if runner is not None:
            await runner.cleanup()
        await router.close()
        if traces is not None:
            traces.shutdown()

    return server, addr, counters, close, Breakdown(router, scorer), extra


async def _worker(scorer: Any) -> tuple[str, int, Callable[[], Any], str]:
    """A router worker process over ``scorer``'s score API on a Unix socket: its address,
    its pid, a coroutine function that stops it, and the score API's address (the client
    library's path asks it too)."""

    from meshd.dev.ports import free_port
    from meshd.router.pool import WorkerPool
    from meshd.score import link as score_link
    from meshd.score import service as score_api

    loop = asyncio.get_running_loop()
    d = tempfile.mkdtemp(prefix="meshd-bench-w-")
    score, where = await score_api.serve(scorer, loop.time, f"{d}/score.sock", lambda: None)
    link, _ = await score_link.serve(scorer, loop.time, f"{d}/link.sock")
    port = free_port()
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
    return f"127.0.0.1:{port}", pool.pids()[0], stop, where


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
    """add_sub's two inputs for ``module`` (``tritonclient.grpc`` or ``tritonclient.http``:
    binary tensor data, its default)."""
    import numpy as np

    a = np.arange(WIDTH, dtype=np.float32).reshape(1, WIDTH)
    b = np.ones((1, WIDTH), dtype=np.float32)
    inputs = []
    for name, value in (("INPUT0", a), ("INPUT1", b)):
        t = module.InferInput(name, [1, WIDTH], "FP32")
        t.set_data_from_numpy(value)
        inputs.append(t)
    return inputs


def sync_client(proto: str, url: str) -> Any:
    """A sync tritonclient for ``url`` (``host:port``) and its inputs; for a
    :data:`CLIENT_URL`, a ``meshd.score.client.MeshClient`` over that score API (watch mode: it
    picks locally from the agent's streamed weights and calls Triton itself)."""
    if url.startswith(CLIENT_URL):
        import tritonclient.grpc as tc

        from meshd.score.client import MeshClient

        return MeshClient(url.removeprefix(CLIENT_URL)), _inputs(tc)
    if proto == "grpc":
        import tritonclient.grpc as tc

        return tc.InferenceServerClient(url), _inputs(tc)
    import tritonclient.http as th

    return th.InferenceServerClient(url, concurrency=1), _inputs(th)


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
    """tritonclient.grpc.aio (or, with ``protocol="http"``, tritonclient.http.aio) clients to
    every path, on a loop in a thread of their own."""

    def __init__(self, urls: dict[str, str], protocol: str = "grpc") -> None:
        if protocol == "grpc":
            import tritonclient.grpc as module
            import tritonclient.grpc.aio as aio_module
        else:
            import tritonclient.http as module  # type: ignore[no-redef]
            import tritonclient.http.aio as aio_module  # type: ignore[no-redef]

        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

        async def make() -> dict[str, Any]:
            return {k: aio_module.InferenceServerClient(u) for k, u in urls.items()}
        self.clients = self.call(make())
        self.inputs = _inputs(module)

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


@dataclass
class Target:
    """One path of one protocol: where its clients connect (``host:port``) and what measures
    its CPU (None for ``direct``)."""

    url: str
    cpu: Callable[[], dict[str, Any]] | None = None
    child: bool = False
    """A process of this script (loop-thread CPU and GC figures)."""


def _triton_cpu(server: Any) -> float:
    return sum(v for p in server.child_pids() if (v := proc_cpu_s(p)) is not None)


def _check_answers(proto: str, urls: dict[str, str]) -> None:
    """Every path returns add_sub's right answer (else the bench measures nothing)."""
    import numpy as np

    a = np.arange(WIDTH, dtype=np.float32).reshape(1, WIDTH)
    for path, url in urls.items():
        client, inputs = sync_client(proto, url)
        try:
            res = client.infer(MODEL, inputs)
        except Exception as exc:
            raise RuntimeError(f"{proto} {path}: {type(exc).__name__}: {exc}") from None
        finally:
            with contextlib.suppress(Exception):
                client.close()
        if not (np.array_equal(res.as_numpy("OUTPUT0"), a + 1)
                and np.array_equal(res.as_numpy("OUTPUT1"), a - 1)):
            raise RuntimeError(f"{proto} {path}: wrong add_sub answer")


def _http_encodings(urls: dict[str, str]) -> dict[str, str]:
    """Per HTTP path, the Content-Encoding of its reply to what tritonclient.http.aio sends
    (aiohttp adds ``Accept-Encoding: gzip, deflate[, br]``; Triton then compresses)."""
    import aiohttp
    import tritonclient.http as th

    body, json_size = th.InferenceServerClient.generate_request_body(_inputs(th))

    async def probe() -> dict[str, str]:
        out = {}
        async with aiohttp.ClientSession(auto_decompress=False) as session:
            for path, url in urls.items():
                async with session.post(
                        f"http://{url}/v2/models/{MODEL}/infer", data=body,
                        headers={"Inference-Header-Content-Length": str(json_size)}) as r:
                    await r.read()
                    out[path] = f"{r.status} {r.headers.get('Content-Encoding', 'identity')}"
        return out
    return asyncio.run(probe())


_ZERO_CPU = {"cpu": 0.0, "loop_cpu": 0.0, "gc_count": [0, 0, 0], "gc_s": [0.0, 0.0, 0.0],
             "agent_cpu": 0.0}


def _paired(rounds: list[dict[str, float]], base: list[dict[str, float]], q: str
            ) -> dict[str, float]:
    diffs = [x[q] - y[q] for x, y in zip(rounds, base, strict=True)]
    return {"median": statistics.median(diffs), "min": min(diffs), "max": max(diffs)}


def measure_phase(args: argparse.Namespace, proto: str, conc: int, triton: Any,
                  targets: dict[str, Target], ours: Callable[[], float]) -> dict[str, Any]:
    """One protocol at one concurrency: rounds over ``targets``' paths, interleaved."""
    paths = tuple(targets)
    calls = args.calls if conc == 1 else args.calls_c16
    rounds = args.rounds if conc == 1 else args.rounds_c16
    sync: dict[str, tuple[Any, list[Any]]] = {}
    aio: AioClients | None = None
    try:
        if conc == 1:
            sync = {p: sync_client(proto, t.url) for p, t in targets.items()}
            for p in paths:  # warm up: connections, the router's schema cache, the scorer
                sync_round(*sync[p], args.warmup)
        else:
            aio = AioClients({p: t.url for p, t in targets.items()}, proto)
            for p in paths:
                aio.round(p, args.warmup, conc)

        def cpu_of(path: str) -> dict[str, Any]:
            fn = targets[path].cpu
            return {**_ZERO_CPU, **fn()} if fn is not None else _ZERO_CPU

        acc: dict[str, dict[str, Any]] = {
            p: {"lat": [], "rounds": [], "cpu_s": 0.0, "loop_cpu_s": 0.0, "gc_s": 0.0,
                "gc_count": [0, 0, 0], "triton_cpu_s": 0.0, "client_cpu_s": 0.0,
                "calls": 0, "wall_s": 0.0, "cpu_per_req_ms": [], "throughput": [],
                "agent_cpu_s": 0.0}
            for p in paths}
        watch = Others(ours)
        for rnd in range(rounds):
            k = rnd % len(paths)
            for path in paths[k:] + paths[:k]:
                c0, t0, u0 = cpu_of(path), _triton_cpu(triton), os.times()
                if aio is None:
                    w0 = time.perf_counter()
                    lat = sync_round(*sync[path], calls)
                    wall = time.perf_counter() - w0
                else:
                    lat, wall = aio.round(path, calls, conc)
                c1, t1, u1 = cpu_of(path), _triton_cpu(triton), os.times()
                e = acc[path]
                e["lat"].extend(lat)
                e["rounds"].append(distribution(lat))
                e["cpu_s"] += c1["cpu"] - c0["cpu"]
                e["agent_cpu_s"] += c1["agent_cpu"] - c0["agent_cpu"]
                e["loop_cpu_s"] += c1["loop_cpu"] - c0["loop_cpu"]
                e["gc_s"] += sum(c1["gc_s"]) - sum(c0["gc_s"])
                e["gc_count"] = [a + y - x for a, x, y in
                                 zip(e["gc_count"], c0["gc_count"], c1["gc_count"], strict=True)]
                e["cpu_per_req_ms"].append((c1["cpu"] - c0["cpu"]) / calls * 1000)
                e["triton_cpu_s"] += t1 - t0
                e["client_cpu_s"] += (u1.user + u1.system) - (u0.user + u0.system)
                e["calls"] += calls
                e["wall_s"] += wall
                e["throughput"].append(calls / wall)
            log(f"{LABEL[proto]} c={conc} round {rnd + 1}/{rounds}: " + ", ".join(
                f"{p} p50 {acc[p]['rounds'][-1]['p50']:.0f} us"
                + (f" cpu {acc[p]['cpu_per_req_ms'][-1]:.3f} ms"
                   if targets[p].cpu is not None else "")
                for p in paths))
    finally:
        if aio is not None:
            aio.close()
        for client, _ in sync.values():
            with contextlib.suppress(Exception):
                client.close()
    res: dict[str, Any] = {"protocol": proto, "concurrency": conc, "cpu": watch.done(),
                           "calls_per_round": calls, "rounds": rounds, "paths": {}}
    for p, e in acc.items():
        has_cpu, own = targets[p].cpu is not None, targets[p].child
        res["paths"][p] = {
            "latency_us": distribution(e["lat"]), "round_latency_us": e["rounds"],
            "calls": e["calls"], "throughput_per_s": e["calls"] / e["wall_s"],
            "throughput_rounds": e["throughput"],
            "cpu_ms_per_request": e["cpu_s"] / e["calls"] * 1000 if has_cpu else None,
            "cpu_ms_per_request_rounds": e["cpu_per_req_ms"] if has_cpu else [],
            "proxy_cores": e["cpu_s"] / e["wall_s"] if has_cpu else None,
            "loop_thread_cpu_ms_per_request": (e["loop_cpu_s"] / e["calls"] * 1000
                                               if own else None),
            "gc_us_per_request": e["gc_s"] / e["calls"] * 1e6 if own else None,
            "gc_collections": e["gc_count"] if own else None,
            "triton_cpu_ms_per_request": e["triton_cpu_s"] / e["calls"] * 1000,
            "agent_cpu_ms_per_request": e["agent_cpu_s"] / e["calls"] * 1000,
            "client_cpu_ms_per_request": e["client_cpu_s"] / e["calls"] * 1000}
    d = res["paths"]["direct"]
    proxy = res["paths"].get("proxy")
    for p, e in res["paths"].items():
        if p == "direct":
            continue
        for q in ("p50", "p99"):
            e[f"added_{q}_us_pooled"] = e["latency_us"][q] - d["latency_us"][q]
            e[f"added_{q}_us_paired"] = _paired(e["round_latency_us"], d["round_latency_us"], q)
        if p != "proxy" and proxy is not None:
            e["minus_proxy_p50_us_pooled"] = e["latency_us"]["p50"] - proxy["latency_us"]["p50"]
            e["minus_proxy_p50_us_paired"] = _paired(e["round_latency_us"],
                                                     proxy["round_latency_us"], "p50")
            if e["cpu_ms_per_request"] is not None and proxy["cpu_ms_per_request"]:
                e["cpu_ratio_to_proxy"] = e["cpu_ms_per_request"] / proxy["cpu_ms_per_request"]
                e["cpu_ratio_to_proxy_rounds"] = [
                    a / b if b else float("nan") for a, b in
                    zip(e["cpu_ms_per_request_rounds"], proxy["cpu_ms_per_request_rounds"],
                        strict=True)]
    return res


def measure(args: argparse.Namespace, triton: Any, targets: dict[str, dict[str, Target]],
            pids: Callable[[], list[int]]) -> dict[str, Any]:
    """Every protocol at concurrency 1 and 16 (``targets``: protocol -> path -> Target)."""
    for proto in PROTOCOLS:
        _check_answers(proto, {p: t.url for p, t in targets[proto].items()})

    def ours() -> float:
        t = os.times()
        return (t.user + t.system + _triton_cpu(triton)
                + sum(proc_cpu_s(p) or 0.0 for p in pids()))

    out: dict[str, Any] = {"http_aio_reply_encoding": _http_encodings(
        {p: t.url for p, t in targets["http"].items()})}
    for proto, conc in PHASES:
        here = {p: t for p, t in targets[proto].items() if conc == 1 or p not in SYNC_ONLY}
        out[phase_key(proto, conc)] = measure_phase(args, proto, conc, triton, here, ours)
    return out


# --- profiling ----------------------------------------------------------------------------------


def profile(args: argparse.Namespace, targets: dict[str, dict[str, Target]],
            children: dict[str, Child], workdir: Path) -> dict[str, Any]:
    """For each protocol, at concurrency 16: the router's own steps timed in place
    (:class:`Breakdown`), then cProfile of the router and the bare proxy, each over
    ``--profile-calls`` requests."""
    n = args.profile_calls
    conc = CONCURRENCY[-1]
    out: dict[str, Any] = {"breakdown": {}, "cprofile": {}}
    owners = {"grpc": {"router": children["router"], "proxy": children["proxy"]},
              "http": {"router": children["router"], "proxy": children["httpproxy"]}}
    for proto in PROTOCOLS:
        kinds = [k for k in ("router", "proxy") if k in targets[proto]]
        if "router" not in kinds:
            continue
        aio = AioClients({k: targets[proto][k].url for k in kinds}, proto)
        try:
            router = owners[proto]["router"]
            aio.round("router", 200, conc)
            router.cmd("breakdown-start")
            c0 = router.cpu()
            aio.round("router", n, conc)
            c1 = router.cpu()
            steps = router.cmd("breakdown-stop")["steps"]
            out["breakdown"][proto] = {
                "calls": n, "concurrency": conc,
                "cpu_ms_per_request": (c1["cpu"] - c0["cpu"]) / n * 1000,
                "loop_thread_cpu_ms_per_request": (c1["loop_cpu"] - c0["loop_cpu"]) / n * 1000,
                "steps": {k: {"calls_per_request": v["calls"] / n,
                              "us_per_request": v["cpu_s"] / n * 1e6}
                          for k, v in sorted(steps.items(), key=lambda kv: -kv[1]["cpu_s"])
                          if v["calls"]}}
            for kind in kinds:
                owner = owners[proto][kind]
                aio.round(kind, 200, conc)
                path = workdir / f"{kind}-{proto}.pstats"
                owner.cmd("profile-start")
                c0 = owner.cpu()
                aio.round(kind, n, conc)
                c1 = owner.cpu()
                owner.cmd(f"profile-stop {path}")
                p = summarize_profile(path, n)
                p["concurrency"] = conc
                p["cpu_ms_per_request_profiled"] = (c1["cpu"] - c0["cpu"]) / n * 1000
                p["pstats_file"] = str(path)
                out["cprofile"][f"{kind}/{proto}"] = p
        finally:
            aio.close()
    return out


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


def _added(e: dict[str, Any], q: str) -> str:
    pr = e[f"added_{q}_us_paired"]
    return (f"{e[f'added_{q}_us_pooled'] / 1000:+.3f}; {pr['median'] / 1000:+.3f} "
            f"({pr['min'] / 1000:+.3f} to {pr['max'] / 1000:+.3f}) ms")


def path_rows(res: dict[str, Any], skipped: dict[str, str]) -> list[list[str]]:
    """One row per path of one protocol at one concurrency."""
    rows: list[list[str]] = []
    for p in PATHS[res["protocol"]]:
        if p in skipped:
            rows.append([p, skipped[p], "", "", "", "", "", ""])
            continue
        if p not in res["paths"]:
            rows.append([p, "concurrency 1 only (a synchronous library)", "", "", "", "", "",
                         ""])
            continue
        e = res["paths"][p]
        d = e["latency_us"]
        cpu, ratio = "-", "-"
        if e["cpu_ms_per_request"] is not None:
            r = e["cpu_ms_per_request_rounds"]
            cpu = f"{e['cpu_ms_per_request']:.3f} ms ({min(r):.3f}-{max(r):.3f})"
            if p == "worker":
                cpu += f", {e['agent_cpu_ms_per_request']:.3f} of it the agent's"
        if p == "proxy" and e["cpu_ms_per_request"] is not None:
            ratio = "1"
        elif "cpu_ratio_to_proxy" in e:
            rr = e["cpu_ratio_to_proxy_rounds"]
            ratio = f"{e['cpu_ratio_to_proxy']:.2f}x ({min(rr):.2f}-{max(rr):.2f})"
        rows.append([p, _ms(d["p50"]), _ms(d["p99"]),
                     _added(e, "p50") if p != "direct" else "-",
                     _added(e, "p99") if p != "direct" else "-", cpu, ratio,
                     f"{e['throughput_per_s']:.0f}"])
    return rows


def bar_rows(results: dict[str, Any], skipped: dict[str, dict[str, str]]) -> list[list[str]]:
    """The two bars per protocol, NGINX beside them, and the worker path."""
    rows: list[list[str]] = []
    m = results.get("measure")
    if not m:
        return rows
    lo, hi = CONCURRENCY
    for proto in PROTOCOLS:
        name = LABEL[proto]
        c1, c16 = m[phase_key(proto, lo)]["paths"], m[phase_key(proto, hi)]["paths"]
        if "router" not in c1:
            why = skipped[proto].get("router", "n/a")
            rows.append([f"{name}: router added p50 - proxy added p50, concurrency {lo}", why,
                         f"<= {ADDED_P50_MARGIN_MS:g} ms", "n/a"])
            rows.append([f"{name}: CPU per request router / proxy, concurrency {hi}", why,
                         f"<= {CPU_RATIO_BAR:g}x", "n/a"])
        else:
            e = c1["router"]
            pooled, pr = e["minus_proxy_p50_us_pooled"], e["minus_proxy_p50_us_paired"]
            rows.append([f"{name}: router added p50 - proxy added p50, concurrency {lo}",
                         f"{pooled / 1000:+.3f} ms pooled; {pr['median'] / 1000:+.3f} ms median "
                         f"of per-round differences ({pr['min'] / 1000:+.3f} to "
                         f"{pr['max'] / 1000:+.3f}); router added "
                         f"{e['added_p50_us_pooled'] / 1000:.3f} ms, proxy added "
                         f"{c1['proxy']['added_p50_us_pooled'] / 1000:.3f} ms",
                         f"<= {ADDED_P50_MARGIN_MS:g} ms",
                         verdict(max(pooled, pr["median"]) <= ADDED_P50_MARGIN_MS * 1000)])
            for conc, paths in ((hi, c16), (lo, c1)):
                r = paths["router"]
                ratio, rr = r["cpu_ratio_to_proxy"], r["cpu_ratio_to_proxy_rounds"]
                ok = verdict(ratio <= CPU_RATIO_BAR)
                rows.append([f"{name}: CPU per request router / proxy, concurrency {conc}",
                             f"{ratio:.2f}x (per-round {min(rr):.2f}-{max(rr):.2f}, median "
                             f"{statistics.median(rr):.2f}); router "
                             f"{r['cpu_ms_per_request']:.3f} ms, proxy "
                             f"{paths['proxy']['cpu_ms_per_request']:.3f} ms",
                             f"<= {CPU_RATIO_BAR:g}x" + ("" if conc == hi else " (reported)"),
                             ok if conc == hi else f"({ok})"])
        if "nginx" in c1:
            n1, n16 = c1["nginx"], c16["nginx"]
            rows.append([f"{name}: NGINX beside (no bar)",
                         f"added p50 at c={lo} {n1['added_p50_us_pooled'] / 1000:.3f} ms "
                         f"(proxy {c1['proxy']['added_p50_us_pooled'] / 1000:.3f}"
                         + (f", router {c1['router']['added_p50_us_pooled'] / 1000:.3f}"
                            if "router" in c1 else "")
                         + f"); CPU per request c={hi} {n16['cpu_ms_per_request']:.3f} ms = "
                         f"{n16['cpu_ratio_to_proxy']:.2f}x the proxy, c={lo} "
                         f"{n1['cpu_ms_per_request']:.3f} ms = {n1['cpu_ratio_to_proxy']:.2f}x",
                         "", "-"])
        else:
            rows.append([f"{name}: NGINX beside (no bar)",
                         skipped[proto].get("nginx", "n/a"), "", "-"])
        if "client" in c1:
            e = c1["client"]
            pooled, pr = e["added_p50_us_pooled"], e["added_p50_us_paired"]
            rows.append([f"{name}: client library (meshd.score.client) added p50 over direct, "
                         f"concurrency {lo}",
                         f"{pooled / 1000:+.3f} ms pooled; {pr['median'] / 1000:+.3f} ms median "
                         f"of per-round differences ({pr['min'] / 1000:+.3f} to "
                         f"{pr['max'] / 1000:+.3f}); the agent's CPU "
                         f"{e['cpu_ms_per_request']:.3f} ms/request, the caller's "
                         f"{e['client_cpu_ms_per_request']:.3f} ms (direct "
                         f"{c1['direct']['client_cpu_ms_per_request']:.3f})",
                         f"<= {CLIENT_ADDED_P50_MS:g} ms",
                         verdict(max(pooled, pr["median"]) <= CLIENT_ADDED_P50_MS * 1000)])
        if "worker" in c1:
            w = [(conc, paths["worker"]) for conc, paths in ((lo, c1), (hi, c16))]
            rows.append([f"{name}: worker path (worker + agent CPU; no bar)", "; ".join(
                f"c={conc}: added p50 {e['added_p50_us_pooled'] / 1000:.3f} ms, CPU "
                f"{e['cpu_ms_per_request']:.3f} ms/request ({e['agent_cpu_ms_per_request']:.3f}"
                f" the agent's) = {e['cpu_ratio_to_proxy']:.2f}x the proxy" for conc, e in w),
                "", "-"])
    return rows


def build_notes(results: dict[str, Any], args: argparse.Namespace) -> list[str]:
    notes = []
    if args.quick:
        notes.append("QUICK run: small sizes, a smoke check; run without --quick for the "
                     "reported numbers.")
    setup = results.get("setup", {})
    if setup.get("nginx_version"):
        notes.append(f"NGINX {setup['nginx_version']} (Debian nginx-light), master_process on, "
                     "worker_processes 1 (one worker process: one core at most, as our "
                     "proxies and router are one event loop each), access_log off, upstream "
                     "keepalive 32, keepalive_requests 1000000; its CPU is its master's and "
                     "worker's utime+stime from /proc (10 ms ticks).")
    m = results.get("measure")
    if m:
        enc = m.get("http_aio_reply_encoding")
        if enc:
            notes.append("HTTP clients: tritonclient.http (geventhttpclient) asks for no "
                         "compression; tritonclient.http.aio's aiohttp session asks for "
                         "gzip/deflate/br by default, and the replies it gets (status, "
                         "Content-Encoding) are: " + ", ".join(f"{p} {v}" for p, v in enc.items())
                         + ".")
        for proto, conc in PHASES:
            res = m[phase_key(proto, conc)]
            cpu = res["cpu"]
            notes.append(f"{LABEL[res['protocol']]} concurrency {res['concurrency']} "
                         f"({res['rounds']} rounds x {res['calls_per_round']} requests per path):"
                         f" load average {cpu['loadavg_before']} -> {cpu['loadavg_after']}; "
                         f"bench, Triton and proxies used {cpu['our_cores']:.2f} cores, other "
                         f"processes {cpu['other_cores'] or 0:.2f}.")
        for proto in PROTOCOLS:
            c1 = m[phase_key(proto, CONCURRENCY[0])]["paths"]
            notes.append(f"{LABEL[proto]}, concurrency 1: client (this process) CPU per "
                         "request: " + ", ".join(
                             f"{p} {e['client_cpu_ms_per_request']:.3f} ms"
                             for p, e in c1.items())
                         + "; Triton (server + stub) CPU per request: " + ", ".join(
                             f"{p} {e['triton_cpu_ms_per_request']:.3f} ms"
                             for p, e in c1.items()) + " (/proc, 10 ms ticks).")
            cores = ", ".join(f"{p} {e['proxy_cores']:.2f}" for p, e in
                              m[phase_key(proto, CONCURRENCY[-1])]["paths"].items()
                              if e["proxy_cores"] is not None)
            loops = ", ".join(
                f"{p} {e['loop_thread_cpu_ms_per_request']:.3f} ms (GC "
                f"{e['gc_us_per_request'] / 1000:.3f})"
                for p, e in m[phase_key(proto, CONCURRENCY[-1])]["paths"].items()
                if e["loop_thread_cpu_ms_per_request"] is not None)
            notes.append(f"{LABEL[proto]}, concurrency {CONCURRENCY[-1]}: cores busy per "
                         f"process: {cores}; event-loop thread CPU per request: {loops}.")
    ends = results.get("children_end") or {}
    rc = (ends.get("router") or {}).get("counters")
    if rc:
        notes.append(f"router counters at the end: {json.dumps(rc['router'])}; scorer "
                     f"{json.dumps(rc['scorer'])}")
    prof = results.get("profile")
    if prof:
        for proto, b in prof["breakdown"].items():
            res = (m or {}).get(phase_key(proto, b["concurrency"]), {}).get("paths", {})
            own = sum(v["us_per_request"] for k, v in b["steps"].items()
                      if not k.startswith("upstream call"))
            text = (f"{LABEL[proto]}: the router's own steps, timed in place over {b['calls']} "
                    f"requests at concurrency {b['concurrency']}, take {own:.0f} us per request "
                    "(" + ", ".join(f"{k} {v['us_per_request']:.1f}"
                                    for k, v in b["steps"].items()
                                    if not k.startswith("upstream call")) + ")")
            if res.get("router", {}).get("loop_thread_cpu_ms_per_request") is not None and \
                    res.get("proxy", {}).get("loop_thread_cpu_ms_per_request") is not None:
                extra = (res["router"]["loop_thread_cpu_ms_per_request"]
                         - res["proxy"]["loop_thread_cpu_ms_per_request"]) * 1000
                text += (f"; in the measurement its event-loop thread used {extra:.0f} us per "
                         "request more than the bare proxy's")
            notes.append(text + ".")
        for key, p in prof["cprofile"].items():
            notes.append(f"cProfile ({key}, {p['calls']} requests at concurrency "
                         f"{p['concurrency']}, CPU time of its loop thread): "
                         f"{p['python_us_per_request']:.0f} us per request under the profiler "
                         f"(process CPU/request while profiled "
                         f"{p['cpu_ms_per_request_profiled']:.3f} ms); top by own time: "
                         + "; ".join(f"{r['function']} {r['tottime_us_per_request']:.1f} us"
                                     for r in p["top_tottime"][:12]))
    return notes


def profile_md(prof: dict[str, Any]) -> list[str]:
    lines = []
    for key, p in prof.items():
        for col, label in (("top_tottime", "own time"), ("top_cumtime", "cumulative time")):
            lines += ["", f"### cProfile, {key}: top functions by {label} "
                          f"({p['calls']} requests at concurrency {p['concurrency']}; CPU time "
                          "of the event loop's thread, inflated by the profiler; Cython code of "
                          "grpc.aio is not seen by cProfile and is counted in its caller, "
                          "mostly Context.run)", ""]
            lines.append(format_table(
                ("function", "calls/request", "own us/request", "cumulative us/request"),
                [[r["function"], f"{r['ncalls'] / p['calls']:.2f}",
                  f"{r['tottime_us_per_request']:.1f}", f"{r['cumtime_us_per_request']:.1f}"]
                 for r in p[col]]))
    return lines


def phase_title(proto: str, conc: int, res: dict[str, Any] | None) -> str:
    t = f"{LABEL[proto]}, concurrency {conc}"
    if res:
        t += f" ({res['rounds']} rounds x {res['calls_per_round']} requests per path)"
    return t


BARS_TEXT = (f"Bars, per protocol, against the bare proxy of the same protocol in the same run: "
             f"router added p50 at concurrency 1 <= proxy added p50 + {ADDED_P50_MARGIN_MS:g} ms "
             f"(pooled and paired median); router CPU per request <= {CPU_RATIO_BAR:g}x the "
             f"proxy's at concurrency {CONCURRENCY[-1]} (concurrency 1 reported); gRPC: the "
             f"client library (meshd.score.client) added p50 over direct <= "
             f"{CLIENT_ADDED_P50_MS:g} "
             "ms at concurrency 1. NGINX beside, no bar. Latencies in ms; added = path - "
             "direct; CPU per request of the path's process(es).")


def write_markdown(path: Path, title: str, rows: list[list[str]],
                   phase_rows: dict[str, list[list[str]]], notes: list[str],
                   report: dict[str, Any]) -> None:
    lines = [f"# {title}", "",
             f"{report['when']}, {report['cpu_count']} CPUs ({report['cpu_model']}), Python "
             f"{report['python']}, commit {report['git']['commit'][:12]}"
             + (f" + uncommitted changes in {', '.join(report['git']['dirty_files'])}"
                if report["git"]["dirty_files"] else "") + ".", "",
             f"`{' '.join(report['argv'])}`", "", BARS_TEXT, "", format_table(HEAD, rows), ""]
    m = report["results"].get("measure") or {}
    for proto, conc in PHASES:
        key = phase_key(proto, conc)
        if key in phase_rows:
            lines += [f"### {phase_title(proto, conc, m.get(key))}", "",
                      format_table(PATH_HEAD, phase_rows[key]), ""]
    lines += [f"* {n}" for n in notes]
    prof = report["results"].get("profile")
    if prof:
        for proto, b in prof["breakdown"].items():
            lines += ["", f"### {LABEL[proto]}: the router's own steps, timed in place "
                          f"({b['calls']} requests at concurrency {b['concurrency']}; CPU of "
                          "the event loop's thread)", "",
                      format_table(("step", "calls/request", "us/request"),
                                   [[k, f"{v['calls_per_request']:.2f}",
                                     f"{v['us_per_request']:.1f}"]
                                    for k, v in b["steps"].items()]),
                      "", f"Process CPU per request during it {b['cpu_ms_per_request']:.3f} ms, "
                          f"event-loop thread {b['loop_thread_cpu_ms_per_request']:.3f} ms "
                          "(with the wrappers)."]
        lines += profile_md(prof["cprofile"])
    lines += ["", f"Wall time {report['wall_s']:.0f} s. Full data: "
              f"`{path.with_suffix('.json').name}`.", ""]
    path.write_text("\n".join(lines))


# --- main ---------------------------------------------------------------------------------------


def build_targets(triton: Any, children: dict[str, Any], nginx: Nginx | None,
                  skipped: dict[str, dict[str, str]]) -> dict[str, dict[str, Target]]:
    """protocol -> path -> Target, in the order of PATHS, without the skipped paths."""
    router = children["router"]
    avail: dict[str, dict[str, Target]] = {
        "grpc": {"direct": Target(triton.grpc_url),
                 "proxy": Target(children["proxy"].addr, children["proxy"].cpu, True),
                 "router": Target(router.addr, router.cpu, True),
                 "worker": Target(children["worker"].addr, children["worker"].cpu),
                 # the agent's CPU here: its score API streaming weights, taking outcomes
                 "client": Target(CLIENT_URL + str(router.info["score_addr"]), router.cpu)},
        "http": {"direct": Target(triton.http_url.removeprefix("http://")),
                 "proxy": Target(children["httpproxy"].addr, children["httpproxy"].cpu, True)}}
    if router.info.get("http_addr"):
        avail["http"]["router"] = Target(str(router.info["http_addr"]), router.cpu, True)
    if nginx is not None:
        avail["grpc"]["nginx"] = Target(nginx.grpc_addr, nginx.cpu)
        avail["http"]["nginx"] = Target(nginx.http_addr, nginx.cpu)
    return {proto: {p: avail[proto][p] for p in PATHS[proto] if p not in skipped[proto]}
            for proto in PROTOCOLS}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes: a smoke check")
    ap.add_argument("--rounds", type=int, help="concurrency-1 rounds (15; quick 2)")
    ap.add_argument("--calls", type=int, help="requests per path per concurrency-1 round "
                                              "(500; quick 100)")
    ap.add_argument("--rounds-c16", type=int, help="concurrency-16 rounds (8; quick 1)")
    ap.add_argument("--calls-c16", type=int, help="requests per path per concurrency-16 round "
                                                  "(2000; quick 300)")
    ap.add_argument("--warmup", type=int, default=200, help="untimed requests per path")
    ap.add_argument("--profile", action=argparse.BooleanOptionalAction, default=None,
                    help="profile the router and the bare proxies after the measurement "
                         "(default: when the router misses a CPU bar)")
    ap.add_argument("--profile-calls", type=int, help="requests profiled (3000; quick 500)")
    ap.add_argument("--out", type=Path,
                    default=ROOT / "bench" / "results" / "router_overhead.json")
    ap.add_argument("--keep", action="store_true",
                    help="keep the work dir (logs, the profiles' .pstats files)")
    ap.add_argument("--proxy-child", help=argparse.SUPPRESS)
    ap.add_argument("--httpproxy-child", help=argparse.SUPPRESS)
    ap.add_argument("--router-child", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    for kind in ("proxy", "httpproxy", "router"):
        spec = getattr(args, f"{kind}_child")
        if spec:
            return child_main(kind, json.loads(spec))
    q = args.quick
    args.rounds = args.rounds or (2 if q else 15)
    args.calls = args.calls or (100 if q else 500)
    args.rounds_c16 = args.rounds_c16 or (1 if q else 8)
    args.calls_c16 = args.calls_c16 or (300 if q else 2000)
    args.profile_calls = args.profile_calls or (500 if q else 3000)

    from meshd.dev.triton import DEFAULT_REPO, TritonServer, unavailable_reason

    reason = unavailable_reason()
    if reason:
        print(f"router_overhead: Triton is unavailable here: {reason}", file=sys.stderr)
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="meshd-bench-router-"))
    started = time.perf_counter()
    log(f"router_overhead{' (quick)' if q else ''}: work dir {workdir}; load average "
        f"{loadavg()}")
    results: dict[str, Any] = {"setup": {}}
    failed: list[str] = []
    skipped: dict[str, dict[str, str]] = {proto: {} for proto in PROTOCOLS}
    triton = TritonServer(DEFAULT_REPO, workdir / "triton", models=[MODEL], name="triton")
    children: dict[str, Any] = {}
    nginx: Nginx | None = None
    try:
        t0 = time.monotonic()
        triton.start(timeout=180)
        log(f"Triton ready in {time.monotonic() - t0:.1f} s at {triton.grpc_url} (gRPC), "
            f"{triton.http_url} (HTTP)")
        for kind, spec in (("proxy", {"upstream": triton.grpc_url}),
                           ("httpproxy", {"upstream": triton.http_url}),
                           ("router", {"upstream": triton.grpc_url, "http": True,
                                       "http_upstream": triton.http_url.removeprefix(
                                           "http://")})):
            children[kind] = Child(kind, spec, workdir / f"{kind}.log")
            log(f"{kind} (pid {children[kind].pid}) on {children[kind].addr}"
                + (f" (gRPC), {children[kind].info['http_addr']} (HTTP)"
                   if kind == "router" else ""))
        children["worker"] = WorkerPath(children["router"])
        log(f"router worker (pid {children['worker'].pid}) on {children['worker'].addr}")
        if not nginx_installed():
            for proto in PROTOCOLS:
                skipped[proto]["nginx"] = "skipped: nginx not installed"
        else:
            results["setup"]["nginx_version"] = nginx_version()
            try:
                nginx = Nginx(workdir, [triton.grpc_url], [triton.http_url.removeprefix("http://")])
                log(f"nginx {results['setup']['nginx_version']} (pid {nginx.pid}) on "
                    f"{nginx.grpc_addr} (gRPC), {nginx.http_addr} (HTTP)")
            except Exception as exc:  # noqa: BLE001 - reported
                for proto in PROTOCOLS:
                    skipped[proto]["nginx"] = f"skipped: nginx failed to start: {exc}"[:200]
                log(f"nginx failed to start: {exc}")
        targets = build_targets(triton, children, nginx, skipped)

        def pids() -> list[int]:
            return [*(c.pid for c in children.values()), *(nginx.pids() if nginx else [])]
        try:
            results["measure"] = measure(args, triton, targets, pids)
        except Exception as exc:  # noqa: BLE001 - reported
            failed.append(f"measure: {type(exc).__name__}: {exc}")
            log(f"measure FAILED: {exc}")
        m: Any = results.get("measure")
        missed = bool(m) and any(
            m[phase_key(proto, conc)]["paths"]["router"]["cpu_ratio_to_proxy"] > CPU_RATIO_BAR
            for proto, conc in PHASES if "router" in m[phase_key(proto, conc)]["paths"])
        if args.profile or (args.profile is None and missed):
            try:
                log("profiling the router and the bare proxies"
                    + (" (the router missed a CPU bar)" if missed else ""))
                results["profile"] = profile(args, targets, children, workdir)
            except Exception as exc:  # noqa: BLE001 - reported
                failed.append(f"profile: {type(exc).__name__}: {exc}")
                log(f"profile FAILED: {exc}")
    finally:
        results["children_end"] = {k: c.stop() for k, c in children.items()}
        if nginx is not None:
            results["children_end"]["nginx"] = nginx.stop()
        triton.stop()
        if args.keep or failed:
            print(f"work dir kept: {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    wall = time.perf_counter() - started

    rows = bar_rows(results, skipped)
    for f in failed:
        rows.append([f"section {f.split(':', 1)[0]}", f.split(":", 1)[1].strip()[:160], "",
                     "FAIL"])
    m = results.get("measure") or {}
    phase_rows = {key: path_rows(m[key], skipped[proto]) for proto, conc in PHASES
                  if (key := phase_key(proto, conc)) in m}
    notes = build_notes(results, args)
    title = (f"Router overhead, gRPC and HTTP: direct vs bare proxy vs NGINX vs meshd router, "
             f"one Triton{': QUICK sizes' if q else ''}")
    print(f"\n{title} ({os.cpu_count()} CPUs, Python {platform.python_version()})\n")
    print(BARS_TEXT + "\n")
    print_table(HEAD, rows)
    for proto, conc in PHASES:
        key = phase_key(proto, conc)
        if key in phase_rows:
            print(f"\n{phase_title(proto, conc, m.get(key))}\n")
            print_table(PATH_HEAD, phase_rows[key])
    for note in notes:
        print(f"\n* {note}")
    print(f"\nwall time {wall:.0f} s")
    report = {
        "benchmark": "router_overhead", "quick": q, "argv": sys.argv,
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **machine_info(),
        "loadavg_end": loadavg(), "git": git_state(), "wall_s": wall,
        "setup": {"model": MODEL, "inputs": f"2 x [1, {WIDTH}] FP32", "rounds": args.rounds,
                  "calls": args.calls, "rounds_c16": args.rounds_c16,
                  "calls_c16": args.calls_c16, "warmup": args.warmup,
                  "profile_calls": args.profile_calls, "concurrency": CONCURRENCY,
                  "skipped": skipped, **results.pop("setup"),
                  "nginx_conf": nginx.conf if nginx is not None else None,
                  "bars": {"cpu_ratio": CPU_RATIO_BAR,
                           "added_p50_margin_ms": ADDED_P50_MARGIN_MS}},
        "table": [dict(zip(HEAD, r, strict=True)) for r in rows],
        "path_tables": {k: [dict(zip(PATH_HEAD, r, strict=True)) for r in v]
                        for k, v in phase_rows.items()},
        "notes": notes, "failed": failed, "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(report, indent=1, default=str) + "\n")
    os.replace(tmp, args.out)
    md = args.out.with_suffix(".md")
    write_markdown(md, title, rows, phase_rows, notes, report)
    for p in (args.out, md):
        print(f"wrote {p.relative_to(ROOT) if p.is_relative_to(ROOT) else p}")
    return 1 if any(r[3] == "FAIL" for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
