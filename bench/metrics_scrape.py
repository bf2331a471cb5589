"""How long a Prometheus scrape of a large agent takes: 64 models on 8 GPUs.

    ./dev bench metrics_scrape [--quick] [--scrapes 200] [--models 64] [--gpus 8]
    .venv/bin/python bench/metrics_scrape.py ...

Bar (from the issue): a metrics scrape of an agent with 64 models x 8 GPUs <= 50 ms.

The agent is a real ``meshd`` process (``--dev``, ``--role router``), its NVML answered by
``tests/fake_nvml.py`` with ``--gpus`` GPUs (``tests.fake_gpu_agent``: this machine has none;
everything else is the real agent).  Its runtimes report ``--models`` models, each with one
replica per GPU (a runtime per GPU, 64 x 8 = 512 replicas), through the StatePlane's
``ReportModelState`` as an external runtime's exporter would.  A client thread keeps the score
API busy during the scrapes (``ScoreTargets`` and ``ReportOutcome`` for every model in turn,
``--rate`` requests a second, 500 by default: a busy router; ``--rate 0`` is as fast as one
client goes, which saturates this 2-core machine), so the scorer's per-model and per-target
series are all there and changing.  Then ``--scrapes`` sequential ``GET /metrics`` from this
process (a new connection each, as Prometheus's default), timed from request to the last
byte; and, when Prometheus is installed, a real Prometheus scraping the agent every second for
``--prometheus-seconds``, whose own ``scrape_duration_seconds`` is reported beside: not its
first 5 s (Prometheus starts on the same 2 cores) nor its first scrape of the agent (a new
target: the connection and 6,000 new series in its head; it took 59-88 ms where the next ones
took 20-30).

Prints one table and writes ``bench/results/metrics_scrape.{json,md}``.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from bench.child import log  # noqa: E402
from bench.table import distribution, loadavg, publish, quantile, verdict  # noqa: E402
from meshd.dev.ports import pick_ports  # noqa: E402

BAR_MS = 50.0
PROMETHEUS_SETTLE = 5.0
"""Seconds of Prometheus's own start (it shares these 2 cores) whose scrapes are not counted."""
HEAD = ("measurement", "value", "bar", "result")


def start_agent(work: Path, gpus: int) -> tuple[subprocess.Popen[bytes], dict[str, str]]:
    names = ("bind", "admin", "score", "metrics", "router", "router-http")
    ports = {k: f"127.0.0.1:{p}" for k, p in zip(names, pick_ports("127.0.0.1", len(names)),
                                                 strict=True)}
    cmd = [sys.executable, "-m", "tests.fake_gpu_agent", "--node", "bench", "--dev",
           "--role", "router", "--data-dir", str(work / "data"), "--log-level", "warning",
           *(x for k, v in ports.items() for x in (f"--{k}", v))]
    log_file = open(work / "agent.log", "ab")  # noqa: SIM115 - handed to the child
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=log_file, stderr=subprocess.STDOUT,
                            env={**os.environ, "MESHD_TEST_GPUS": str(gpus),
                                 "PYTHONPATH": str(ROOT)})
    log_file.close()
    end = time.monotonic() + 60
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(f"http://{ports['metrics']}/metrics", timeout=2):
                return proc, ports
        except OSError:
            if proc.poll() is not None:
                break
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError(f"the agent did not start; see {work / 'agent.log'}")


def report_replicas(admin: str, creds: Path, models: int, gpus: int) -> None:
    """``models`` x ``gpus`` ready replicas, one runtime (endpoint) per GPU."""
    from certs import tls
    from certs.identity import Identity
    from proto.mesh.v1 import state_pb2, state_pb2_grpc

    rng = random.Random(1)
    deltas = [state_pb2.ModelStateDelta(
        runtime="vllm", endpoint=f"127.0.0.1:{18000 + g}", model=f"model-{m:02d}",
        version="1", ready=True, queue=rng.randrange(5), inflight=rng.randrange(3),
        spu=0.001 + rng.random() * 0.01, latency_seconds=0.005 + rng.random() * 0.05,
        rate=rng.random() * 100) for m in range(models) for g in range(gpus)]
    with tls.grpc_channel(admin, Identity.load(creds)) as channel:
        ack = state_pb2_grpc.StatePlaneStub(channel).ReportModelState(iter(deltas), timeout=30)
    if ack.accepted != len(deltas):
        raise RuntimeError(f"ReportModelState accepted {ack.accepted} of {len(deltas)}")


def keep_scoring(score: str, models: int, rate: float, stop: threading.Event,
                 done: list[int]) -> None:
    """Score and report outcomes for every model in turn, ``rate`` requests a second (0: as
    fast as one client can), until ``stop``."""
    import grpc

    from proto.mesh.v1 import score_pb2, score_pb2_grpc

    rng = random.Random(2)
    with grpc.insecure_channel(score) as ch:
        stub = score_pb2_grpc.ScoreStub(ch)
        i = 0
        began = time.monotonic()
        while not stop.is_set():
            if rate:
                ahead = began + i / rate - time.monotonic()
                if ahead > 0:
                    stop.wait(ahead)
            model = f"model-{i % models:02d}"
            i += 1
            reply = stub.ScoreTargets(score_pb2.ScoreRequest(model=model, payload_bytes=4096),
                                      timeout=5)
            if not reply.targets:
                continue
            stub.ReportOutcome(score_pb2.OutcomeReport(
                decision_id=reply.decision_id, replica=reply.targets[0].replica,
                latency_seconds=0.002 + rng.random() * 0.05, last=True), timeout=5)
            done[0] += 1


def scrape(url: str) -> tuple[float, int]:
    t0 = time.perf_counter()
    with urllib.request.urlopen(url, timeout=10) as r:
        body = r.read()
    return (time.perf_counter() - t0) * 1000, len(body)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--scrapes", type=int, default=0)
    ap.add_argument("--models", type=int, default=64)
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--prometheus-seconds", type=float, default=0.0)
    ap.add_argument("--rate", type=float, default=500.0,
                    help="score requests a second during the scrapes (0: flat out)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" /
                    "metrics_scrape.json")
    args = ap.parse_args()
    q = args.quick
    args.scrapes = args.scrapes or (30 if q else 200)
    args.prometheus_seconds = args.prometheus_seconds or (10.0 if q else 40.0)
    work = Path(tempfile.mkdtemp(prefix="meshd-bench-scrape-"))
    started = time.perf_counter()
    log(f"metrics_scrape{' (quick)' if q else ''}: work dir {work}; load average {loadavg()}")
    proc, ports = start_agent(work, args.gpus)
    stop, done = threading.Event(), [0]
    result: dict[str, Any] = {}
    try:
        creds = work / "data" / "meshctl"
        end = time.monotonic() + 30
        while not (creds / "cert.pem").exists() and time.monotonic() < end:
            time.sleep(0.1)
        report_replicas(ports["admin"], creds, args.models, args.gpus)
        url = f"http://{ports['metrics']}/metrics"
        end = time.monotonic() + 30
        while time.monotonic() < end:  # the replicas reach the agent's own state
            text = urllib.request.urlopen(url, timeout=10).read().decode()
            if text.count("meshd_runtime_replica_ready{") >= args.models * args.gpus:
                break
            time.sleep(0.2)
        scorer = threading.Thread(target=keep_scoring,
                                  args=(ports["score"], args.models, args.rate, stop, done),
                                  daemon=True)
        scorer.start()
        time.sleep(3.0 if q else 10.0)  # every model scored many times before the first scrape
        took, sizes = [], []
        for _ in range(args.scrapes):
            ms, size = scrape(url)
            took.append(ms)
            sizes.append(size)
            time.sleep(0.05)
        text = urllib.request.urlopen(url, timeout=10).read().decode()
        samples = [line for line in text.splitlines() if line and not line.startswith("#")]
        result["client"] = {**distribution(took), "bytes": max(sizes), "samples": len(samples),
                            "families": text.count("# TYPE "),
                            "replica_series": text.count("meshd_runtime_replica_ready{"),
                            "gpu_series": text.count("meshd_gpu_temperature_celsius{")}
        result["prometheus"] = prometheus_view(work, ports["metrics"], args.prometheus_seconds)
        result["scored"] = done[0]
    finally:
        stop.set()
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
    c = result["client"]
    rows = [
        ["agent", f"{args.models} models x {args.gpus} GPUs: {c['replica_series']} replicas, "
                  f"{c['gpu_series']} GPUs, {c['families']} families, {c['samples']} samples, "
                  f"{c['bytes'] / 1024:.0f} KiB", "", ""],
        ["scrape p50 / p99 / max (this process, GET to last byte)",
         f"{c['p50']:.1f} / {c['p99']:.1f} / {c['max']:.1f} ms", f"<= {BAR_MS:.0f} ms",
         verdict(c["p99"] <= BAR_MS)],
    ]
    p = result["prometheus"]
    if p is not None:
        rows.append(["scrape_duration_seconds in Prometheus (scrapes: median / p90 / max)",
                     f"{p['n']}: {p['median_ms']:.1f} / {p['p90_ms']:.1f} / "
                     f"{p['max_ms']:.1f} ms",
                     f"<= {BAR_MS:.0f} ms", verdict(p["max_ms"] <= BAR_MS)])
    else:
        rows.append(["scrape_duration_seconds in Prometheus", "not installed", "", ""])
    rows.append(["score requests during the scrapes", f"{result['scored']} "
                 f"({'flat out' if not args.rate else f'{args.rate:.0f}/s'})", "", ""])
    title = f"Metrics scrape of a large agent{': QUICK sizes' if q else ''}"
    publish(args.out, "metrics_scrape", title, HEAD, rows, started, q,
            {"models": args.models, "gpus": args.gpus, "scrapes": args.scrapes,
             "rate": args.rate, "bar_ms": BAR_MS}, result)
    shutil.rmtree(work, ignore_errors=True)
    return 0 if all(r[3] != "FAIL" for r in rows) else 1


def prometheus_view(work: Path, target: str, seconds: float) -> dict[str, Any] | None:
    """A real Prometheus scraping the agent every second: its own scrape durations."""
    from meshd.dev import prometheus as devprometheus

    if devprometheus.binary() is None:
        return None
    prom = devprometheus.PrometheusServer(work / "prometheus", [target], interval=1.0,
                                          rules=[])
    prom.start()
    settled = time.time() + PROMETHEUS_SETTLE
    try:
        time.sleep(seconds + PROMETHEUS_SETTLE)
        values = prom.api("query", query=f"scrape_duration_seconds[{int(seconds) + 30}s]")
        timed = sorted((float(at), float(v) * 1000) for series in values["result"]
                       for at, v in series["values"] if float(at) >= settled)
        points = sorted(ms for _, ms in timed[1:])  # its first: a new target (see above)
    finally:
        prom.stop()
    return {"n": len(points), "median_ms": quantile(points, 0.5),
            "p90_ms": quantile(points, 0.9), "max_ms": points[-1]}


if __name__ == "__main__":
    sys.exit(main())
