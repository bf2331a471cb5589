"""Gossip patches: how fast a large node's material changes reach peers that only gossip.

    ./dev bench patches [--duration 60] [--agents 8] [--models 64] [--changes 2]
    .venv/bin/python bench/patches.py ...

``--agents`` real meshd processes (``testbed/cluster.py``, LAN profile: push-pull every 30 s,
``--gpu off``), none subscribing.  One publisher, n2, carries ``--models`` replicas fed through
``StatePlane.ReportModelState`` (as a vLLM or TGI exporter would), brought up four at a time;
its ``sig`` section is then several times gossip's 1 KiB broadcast limit, so between
push-pulls its changes can only travel as patches (``meshd.signals.patch``).

Every 0.5 s this process changes ``--changes`` random models' queues by a material step (at
least 3 requests, and a quarter) and stamps each change with CLOCK_MONOTONIC (shared by all
processes on the machine).  Every other agent is asked ``StatePlane.State(node=n2)`` every
``--poll-ms``; a change's *lag* at an observer is the first reply showing the new queue minus
the change's stamp (it includes the publication gate's 0.5 s minimum interval and up to one
poll).  A change the observer never shows before that model changes again is *missed*.
Also recorded: what became of the patches at every observer (``meshd_signal_patches_total``),
how often the publisher moved its base (``meshd_signal_patch_rebases_total``) and how many row
changes it held back a publication (``meshd_signal_patch_deferred_rows_total``).

Bar (the signal plane's gossip-only bar, here for a node too large for whole-section
broadcasts): p99 lag <= 2 s.  Writes ``bench/results/patches.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT)]  # the project first: bench/ holds modules named like its packages

from bench.table import format_table, loadavg, machine_info  # noqa: E402

ENDPOINT = "127.0.0.9:9000"
PUBLISHER = "n2"
BAR_S = 2.0


def _quantile(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))] if s else float("nan")


def _log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


class Poller(threading.Thread):
    """Asks one observer for the publisher's replicas; records when each queue value shows."""

    def __init__(self, name: str, target: str, identity: Any, interval: float,
                 stop: threading.Event) -> None:
        super().__init__(daemon=True)
        self.name, self.target, self.identity = name, target, identity
        self.interval, self.stop = interval, stop
        self.seen: list[tuple[float, dict[str, int]]] = []
        self.errors = 0

    def run(self) -> None:
        from certs import tls
        from proto.mesh.v1 import state_pb2, state_pb2_grpc

        with tls.grpc_channel(self.target, self.identity) as channel:
            stub = state_pb2_grpc.StatePlaneStub(channel)
            while not self.stop.is_set():
                t0 = time.monotonic()
                try:
                    resp = stub.State(state_pb2.StateRequest(node=PUBLISHER), timeout=2)
                except Exception:  # noqa: BLE001 - counted; the bench goes on
                    self.errors += 1
                else:
                    t = (t0 + time.monotonic()) / 2
                    self.seen.append((t, {r.model: int(r.queue) for r in resp.replicas
                                          if r.endpoint == ENDPOINT}))
                self.stop.wait(max(0.0, self.interval - (time.monotonic() - t0)))


def report(target: str, identity: Any, rows: dict[str, int]) -> float:
    """Send queue figures; returns the monotonic time the call was made."""
    from certs import tls
    from proto.mesh.v1 import state_pb2, state_pb2_grpc

    with tls.grpc_channel(target, identity) as channel:
        t = time.monotonic()
        ack = state_pb2_grpc.StatePlaneStub(channel).ReportModelState(iter([
            state_pb2.ModelStateDelta(runtime="vllm", endpoint=ENDPOINT, model=m, ready=True,
                                      queue=q) for m, q in rows.items()]), timeout=5)
    if ack.accepted != len(rows):
        raise RuntimeError(f"publisher accepted {ack.accepted} of {len(rows)} figures")
    return t


def lags(changes: list[tuple[float, str, int]], seen: list[tuple[float, dict[str, int]]]
         ) -> tuple[list[float], int]:
    """Per change: the first reply at or after it that shows the new value, before the model's
    next change (else missed)."""
    nxt: dict[int, float] = {}
    last: dict[str, int] = {}
    for i in range(len(changes) - 1, -1, -1):
        _t, model, _v = changes[i]
        nxt[i] = changes[last[model]][0] if model in last else float("inf")
        last[model] = i
    out, missed = [], 0
    for i, (t, model, value) in enumerate(changes):
        hit = next((ts for ts, view in seen if t <= ts < nxt[i] and view.get(model) == value),
                   None)
        if hit is None:
            missed += 1
        else:
            out.append(hit - t)
    return out, missed


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    ap.add_argument("--agents", type=int, default=8)
    ap.add_argument("--models", type=int, default=64)
    ap.add_argument("--changes", type=int, default=2, help="models changed every 0.5 s")
    ap.add_argument("--duration", type=float, default=60.0)
    ap.add_argument("--poll-ms", type=float, default=100.0)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "patches.json")
    args = ap.parse_args(argv)

    from certs.identity import Identity
    from testbed.cluster import Cluster, metric_sum

    rng = random.Random(args.seed)
    models = [f"model-{i:03d}" for i in range(args.models)]
    queues = dict.fromkeys(models, 0)
    with tempfile.TemporaryDirectory(prefix="meshd-bench-patches-") as tmp:
        cluster = Cluster(args.agents, Path(tmp), node_args=lambda i: ["--gpu", "off"])
        identity = Identity.load(cluster.admin_creds)
        stop = threading.Event()
        try:
            cluster.start()
            cluster.wait_converged(90)
            target = cluster.node(PUBLISHER).admin
            for i in range(0, len(models), 4):
                report(target, identity, {m: 0 for m in models[i:i + 4]})
                time.sleep(0.6)
            observers = [f"n{i}" for i in range(1, args.agents + 1) if f"n{i}" != PUBLISHER]
            pollers = [Poller(n, cluster.node(n).admin, identity, args.poll_ms / 1000, stop)
                       for n in observers]
            for p in pollers:
                p.start()
            t0 = time.monotonic()
            while not all(p.seen and len(p.seen[-1][1]) == len(models) for p in pollers):
                if time.monotonic() - t0 > 90:
                    raise RuntimeError("not every observer sees every replica after 90 s")
                time.sleep(0.2)
            _log(f"every observer sees the {len(models)} replicas "
                 f"{time.monotonic() - t0:.1f} s after the last was reported")
            before = {n: metric_sum(cluster.node(n).metrics(), "meshd_signal_patches_total",
                                    outcome="applied") for n in observers}
            changes: list[tuple[float, str, int]] = []
            end = time.monotonic() + args.duration
            refreshed = time.monotonic()
            load0 = loadavg()
            while time.monotonic() < end:
                tick = time.monotonic()
                picked = rng.sample(models, args.changes)
                rows = {}
                for m in picked:
                    q = queues[m]
                    step = max(3, q // 4 + 1)
                    queues[m] = q + step if q < 3 or rng.random() < 0.5 else q - step
                    rows[m] = queues[m]
                if tick - refreshed > 10:  # keep every figure alive (external TTL: 30 s)
                    rows = {**queues, **rows}
                    refreshed = tick
                t = report(target, identity, rows)
                changes += [(t, m, queues[m]) for m in picked]
                time.sleep(max(0.0, 0.5 - (time.monotonic() - tick)))
            time.sleep(3.0)  # the last changes' time to arrive
            stop.set()
            for p in pollers:
                p.join(5)
            outcomes: dict[str, dict[str, float]] = {}
            for n in observers:
                samples = cluster.node(n).metrics()
                outcomes[n] = {o: metric_sum(samples, "meshd_signal_patches_total", outcome=o)
                               for o in ("applied", "no_base", "stale", "malformed")}
                outcomes[n]["applied_during"] = outcomes[n]["applied"] - before[n]
            pub = cluster.node(PUBLISHER).metrics()
            rebases = {why: metric_sum(pub, "meshd_signal_patch_rebases_total", why=why)
                       for why in ("start", "moved")}
            rebases["deferred_rows"] = metric_sum(pub, "meshd_signal_patch_deferred_rows_total")
        finally:
            stop.set()
            cluster.close()

    per: dict[str, Any] = {}
    every: list[float] = []
    missed_total = 0
    for p in pollers:
        got, missed = lags(changes, p.seen)
        every += got
        missed_total += missed
        per[p.name] = {"p50_s": _quantile(got, 0.5), "p99_s": _quantile(got, 0.99),
                       "max_s": max(got, default=float("nan")), "seen": len(got),
                       "missed": missed, "poll_errors": p.errors}
    # Missed changes count as later than any seen one (they are in the tail).
    tail = every + [float("inf")] * missed_total
    result = {
        "config": vars(args) | {"out": str(args.out)}, "machine": machine_info(),
        "loadavg_before": load0, "loadavg_after": loadavg(), "changes": len(changes),
        "lag": {"p50_s": _quantile(tail, 0.5), "p99_s": _quantile(tail, 0.99),
                "max_seen_s": max(every, default=float("nan")), "seen": len(every),
                "missed": missed_total},
        "bar_p99_s": BAR_S, "pass": _quantile(tail, 0.99) <= BAR_S,
        "observers": per, "patch_outcomes": outcomes, "publisher_rebases": rebases,
    }
    rows = [[n, f"{v['p50_s'] * 1000:.0f}", f"{v['p99_s'] * 1000:.0f}",
             f"{v['max_s'] * 1000:.0f}", str(v["seen"]), str(v["missed"]),
             f"{outcomes[n]['applied_during']:.0f}", f"{outcomes[n]['no_base']:.0f}"]
            for n, v in per.items()]
    lag = result["lag"]
    rows.append(["all", f"{lag['p50_s'] * 1000:.0f}", f"{lag['p99_s'] * 1000:.0f}",
                 f"{lag['max_seen_s'] * 1000:.0f}", str(lag["seen"]), str(lag["missed"]),
                 "", ""])
    head = ["observer", "p50 ms", "p99 ms", "max ms", "seen", "missed", "patches applied",
            "no base (total)"]
    table = format_table(head, rows)
    verdict = "PASS" if result["pass"] else "FAIL"
    text = (f"# Gossip patches: a {args.models}-replica node seen by {len(per)} gossip-only "
            f"agents\n\n{len(changes)} material queue changes over {args.duration:.0f} s "
            f"({args.changes} every 0.5 s).  Bar: p99 lag <= {BAR_S:.0f} s: **{verdict}**.\n\n"
            f"{table}\n\nPublisher base moves: {json.dumps(rebases)}.  Load average before/"
            f"after: {load0} / {result['loadavg_after']}.\n")
    print(text)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2, default=str) + "\n")
    args.out.with_suffix(".md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
