"""What tracing costs the router: CPU per request with OTLP tracing on (sampling 10%) against
off, through the same router code on the same Triton.

    ./dev bench tracing [--quick] [--rounds 30] [--calls 2000] [--ratio 0.1]
    .venv/bin/python bench/tracing.py ...

Bar (from the issue): tracing adds <= 5% to the router's CPU per request when enabled with
sampling at 10%.

One router process (``bench/router_overhead.py``'s router child: ``meshd.router.server``
over a ``Scorer`` whose fused view lists one real Triton's ``add_sub``) started with
``OTEL_EXPORTER_OTLP_ENDPOINT`` pointing at an OTLP/gRPC receiver in this process and
``OTEL_TRACES_SAMPLER=parentbased_traceidratio``, ``OTEL_TRACES_SAMPLER_ARG=--ratio``.
Between rounds the bench switches the router's tracer on and off (``tracer on|off``: the
router's ``tracer`` attribute, what the agent sets when the variables ask), so both paths run
in one process with the same connections, caches and core: two processes differ by more than
the few percent measured here on this shared machine.  Clients send no trace context, so the
router's own span is the root and the ratio decides.  The process measures its own CPU
(``getrusage``: all threads, the span exporter's included) before and after each round;
rounds of ``--calls`` requests at concurrency 8 (``tritonclient.grpc.aio``) alternate on and
off, the first rotating.  CPU per request is each path's total CPU over its requests; the
overhead is on / off - 1, with the median of the per-pair ratios beside it.

Prints one table and writes ``bench/results/tracing.{json,md}``.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from bench.child import log  # noqa: E402
from bench.router_overhead import MODEL, AioClients, Child  # noqa: E402
from bench.table import loadavg, publish, quantile, verdict  # noqa: E402
from testbed.otlp import Receiver  # noqa: E402

BAR = 0.05
CONCURRENCY = 8
HEAD = ("measurement", "value", "bar", "result")
PATHS = ("plain", "control", "traced")
"""Tracing off, off again (an A/A control: what the method reads when nothing differs), on."""


def start_router(upstream: str, env: dict[str, str], workdir: Path) -> Child:
    """The router child with exactly ``env``'s OTEL_* variables."""
    ours = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    return Child("router", {"upstream": upstream}, workdir / "router.log", env={**ours, **env})


def measure(args: argparse.Namespace, router: Child, clients: AioClients) -> dict[str, Any]:
    for path in PATHS:  # warm up: connections, the router's caches, the exporter's channel
        router.cmd(f"tracer {'on' if path == 'traced' else 'off'}")
        clients.round("router", min(args.calls, 500), CONCURRENCY)
    acc = {p: {"cpu_s": 0.0, "calls": 0, "per_round_ms": [], "wall_s": 0.0, "lat_us": []}
           for p in PATHS}
    ratios, controls = [], []
    direct = {"hot_s": 0.0, "exporter_s": 0.0}
    for r in range(args.rounds):
        order = PATHS[r % 3:] + PATHS[:r % 3]
        this: dict[str, float] = {}
        for path in order:
            router.cmd(f"tracer {'on' if path == 'traced' else 'off'}")
            t0 = router.cmd("tracecost")
            c0 = router.cpu()["cpu"]
            lat, wall = clients.round("router", args.calls, CONCURRENCY)
            c1 = router.cpu()["cpu"]
            t1 = router.cmd("tracecost")
            if path == "traced":
                direct["hot_s"] += t1["hot"] - t0["hot"]
                direct["exporter_s"] += t1["exporter"] - t0["exporter"]
            e = acc[path]
            e["cpu_s"] += c1 - c0
            e["calls"] += args.calls
            e["wall_s"] += wall
            e["lat_us"].extend(lat)
            this[path] = (c1 - c0) / args.calls * 1000
            e["per_round_ms"].append(this[path])
        ratios.append(this["traced"] / this["plain"] - 1)
        controls.append(this["control"] / this["plain"] - 1)
        log(f"round {r + 1}/{args.rounds}: off {this['plain']:.3f} ms, off again "
            f"{this['control']:.3f} ms ({controls[-1]:+.1%}), on {this['traced']:.3f} ms "
            f"({ratios[-1]:+.1%}) CPU per request")
    out: dict[str, Any] = {"paths": {}, "paired_overhead": ratios, "paired_control": controls}
    for path, e in acc.items():
        lat = sorted(e["lat_us"])
        out["paths"][path] = {
            "cpu_ms_per_request": e["cpu_s"] / e["calls"] * 1000, "calls": e["calls"],
            "throughput": e["calls"] / e["wall_s"],
            "p50_ms": quantile(lat, 0.5) / 1000, "p99_ms": quantile(lat, 0.99) / 1000,
            "per_round_ms": e["per_round_ms"]}
    p = out["paths"]
    out["overhead"] = p["traced"]["cpu_ms_per_request"] / p["plain"]["cpu_ms_per_request"] - 1
    out["paired_median"] = statistics.median(ratios)
    out["control"] = p["control"]["cpu_ms_per_request"] / p["plain"]["cpu_ms_per_request"] - 1
    out["control_median"] = statistics.median(controls)
    calls = p["traced"]["calls"]
    out["direct_hot_us"] = direct["hot_s"] / calls * 1e6
    out["direct_exporter_us"] = direct["exporter_s"] / calls * 1e6
    out["calls"] = {k: {"count": n, "us_each": sec / n * 1e6 if n else 0.0}
                    for k, (n, sec) in router.cmd("tracecost")["calls"].items()}
    out["direct"] = ((direct["hot_s"] + direct["exporter_s"]) / calls * 1000
                     / p["plain"]["cpu_ms_per_request"])
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes (a smoke check)")
    ap.add_argument("--rounds", type=int, default=0)
    ap.add_argument("--calls", type=int, default=0)
    ap.add_argument("--ratio", type=float, default=0.1, help="the sampling ratio (0.1)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "tracing.json")
    args = ap.parse_args()
    q = args.quick
    args.rounds = args.rounds or (3 if q else 30)
    args.calls = args.calls or (300 if q else 2000)
    from meshd.dev.triton import DEFAULT_REPO, TritonServer, unavailable_reason

    reason = unavailable_reason()
    if reason:
        print(f"tracing: Triton is unavailable here: {reason}", file=sys.stderr)
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="meshd-bench-tracing-"))
    started = time.perf_counter()
    log(f"tracing{' (quick)' if q else ''}: work dir {workdir}; load average {loadavg()}")
    receiver = Receiver().start()
    triton = TritonServer(DEFAULT_REPO, workdir / "triton", models=[MODEL], name="triton")
    router: Child | None = None
    clients: AioClients | None = None
    try:
        triton.start(timeout=180)
        traced_env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
                      "OTEL_EXPORTER_OTLP_INSECURE": "true",
                      "OTEL_TRACES_SAMPLER": "parentbased_traceidratio",
                      "OTEL_TRACES_SAMPLER_ARG": str(args.ratio)}
        router = start_router(triton.grpc_url, traced_env, workdir)
        clients = AioClients({"router": router.addr})
        result = measure(args, router, clients)
    finally:
        if clients is not None:
            clients.close()
        if router is not None:
            router.stop()  # it flushes its last spans as it stops
        triton.stop()
        receiver.stop()
        spans = len(receiver.spans)
        routed = sum(1 for s in receiver.spans if s.name == "router ModelInfer")
        if not routed:
            print(f"work dir kept: {workdir}", file=sys.stderr)
        else:
            shutil.rmtree(workdir, ignore_errors=True)
    p = result["paths"]
    total = p["traced"]["calls"] + min(args.calls, 500)  # the warm-up's were traced too
    rows = [
        ["router CPU per request, tracing off",
         f"{p['plain']['cpu_ms_per_request']:.3f} ms", "", ""],
        ["router CPU per request, tracing on (sampling "
         f"{args.ratio:.0%})", f"{p['traced']['cpu_ms_per_request']:.3f} ms", "", ""],
        ["tracing overhead (pooled)", f"{result['overhead']:+.1%}", f"<= {BAR:.0%}",
         verdict(result["overhead"] <= BAR)],
        ["tracing overhead (median of paired rounds)", f"{result['paired_median']:+.1%}",
         "", ""],
        ["tracing's own CPU per request: its calls on the loop + the exporter thread",
         f"{result['direct_hot_us']:.1f} + {result['direct_exporter_us']:.1f} us "
         f"= {result['direct']:+.1%} of off", f"<= {BAR:.0%}", verdict(result["direct"] <= BAR)],
        ["A/A control: off again vs off (pooled; paired median)",
         f"{result['control']:+.1%}; {result['control_median']:+.1%}", "", ""],
        ["p50 / p99 latency, off", f"{p['plain']['p50_ms']:.2f} / {p['plain']['p99_ms']:.2f} ms",
         "", ""],
        ["p50 / p99 latency, on", f"{p['traced']['p50_ms']:.2f} / {p['traced']['p99_ms']:.2f} ms",
         "", ""],
        ["requests traced (router spans received / sent)",
         f"{routed} / {total} ({routed / total:.1%})", f"~{args.ratio:.0%}", ""],
    ]
    title = f"Tracing overhead in the router{': QUICK sizes' if q else ''}"
    publish(args.out, "tracing", title, HEAD, rows, started, q,
            {"rounds": args.rounds, "calls": args.calls, "ratio": args.ratio,
             "concurrency": CONCURRENCY, "bar": BAR},
            {**result, "spans_received": spans}, f"{spans} spans received")
    return 0 if result["direct"] <= BAR and result["overhead"] <= BAR else 1


if __name__ == "__main__":
    sys.exit(main())
