"""Model placement in a real mesh: pin to ready, demand surge to an added replica ready, and
the requests that fail while a replica is drained and unloaded (bar 0).

    .venv/bin/python bench/placement_models_live.py [--rounds 3] [--cool-down 8]

**The mesh**: three real meshd agents (``testbed/cluster.py``, LAN profile, mTLS), all
coordinators, each beside its own real Triton (``meshd.dev.triton``) in
``--model-control-mode=explicit`` with nothing loaded, started with ``--model-control
--model-slots 1`` and ``--model-cool-down`` (default 8 s, so a round takes seconds, not the
default two minutes); ``n1`` is the router.  The model is ``delay`` at 50 ms a request, one
at a time (one instance, no batching).

**Each round** (the same mesh, ``--rounds`` times):

1. *pin to ready*: a ModelPin ``delay`` with ``min_replicas 1``, ``max_replicas 3`` is
   written; the time until a Triton answers ``/v2/models/delay/ready``;
2. *surge to added replica ready*: 8 closed-loop callers through the router (about twice what
   one replica serves); the time from their start until a second replica is ready;
3. *scale-down*: the callers stop, a trickle of one caller (50 ms apart) goes on; the time
   until a replica is gone (the cool-down, the drain, the unload), and how many of the
   trickle's requests failed from 2 s after the surge until 2 s after the unload (bar 0);
4. the pin is deleted and the round waits until no replica is left.

Prints the table (median and min-max per measure) and writes
``bench/results/placement_models_live.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from meshd.dev.triton import DEFAULT_REPO, TritonServer, start_all, stop_all  # noqa: E402
from proto.mesh.v1 import admin_pb2  # noqa: E402
from testbed.cluster import TRUST_DOMAIN, Cluster, node_ip  # noqa: E402
from testbed.raft import coordinator_args, pick_raft_port  # noqa: E402

MODEL = "delay"
CALLERS = 8


def ready(server: TritonServer, model: str = MODEL) -> bool:
    return server.model_ready(model)


def caller(router: str, creds: Path, stop: threading.Event, pause: float,
           outcomes: list[tuple[float, bool]]) -> None:
    import numpy as np
    import tritonclient.grpc as tc

    from certs.spiffe import any_node_dns

    client = tc.InferenceServerClient(
        router, ssl=True, root_certificates=str(creds / "bundle.pem"),
        private_key=str(creds / "key.pem"), certificate_chain=str(creds / "cert.pem"),
        channel_args=[("grpc.ssl_target_name_override", any_node_dns(TRUST_DOMAIN))])
    payload = tc.InferInput("PAYLOAD", [16], "FP32")
    payload.set_data_from_numpy(np.zeros(16, dtype=np.float32))
    try:
        while not stop.is_set():
            try:
                client.infer(MODEL, [payload], client_timeout=30)
                outcomes.append((time.monotonic(), True))
            except Exception:  # noqa: BLE001 - counted
                outcomes.append((time.monotonic(), False))
            if pause:
                stop.wait(pause)
    finally:
        client.close()


def wait(pred: Any, timeout: float, what: str) -> float:
    start = time.monotonic()
    while not pred():
        if time.monotonic() - start > timeout:
            raise TimeoutError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(0.05)
    return time.monotonic() - start


def admin(c: Cluster, method: str, request: Any, timeout: float = 8.0) -> Any:
    """An admin API call to ``n1`` (mTLS, as the cluster's admin)."""
    rpc: Any = c.client
    return rpc._call(c.nodes[0].admin, method, request, timeout)


def apply(c: Cluster, doc: dict[str, Any]) -> None:
    admin(c, "PolicyApply", admin_pb2.PolicyApplyRequest(text=json.dumps(doc),
                                                         timeout_seconds=5))


def round_(c: Cluster, servers: list[TritonServer]) -> dict[str, float]:
    def count() -> int:
        return sum(map(ready, servers))

    pinned = time.monotonic()
    apply(c, {"kind": "ModelPin", "name": MODEL,
              "spec": {"min_replicas": 1, "max_replicas": 3}})
    wait(lambda: count() >= 1, 60, "the pinned replica")
    pin_ready = time.monotonic() - pinned
    stop, trickle_stop = threading.Event(), threading.Event()
    heavy: list[tuple[float, bool]] = []
    trickle: list[tuple[float, bool]] = []
    router = c.nodes[0].router
    threads = [threading.Thread(target=caller, args=(router, c.admin_creds, stop, 0.0, heavy))
               for _ in range(CALLERS)]
    threads.append(threading.Thread(target=caller, args=(router, c.admin_creds, trickle_stop,
                                                         0.05, trickle)))
    try:
        for t in threads:
            t.start()
        surge_ready = wait(lambda: count() >= 2, 90, "a replica added for the surge")
        time.sleep(3)
        stop.set()
        added = count()
        time.sleep(2)  # the surge's own queue drains
        calm = time.monotonic()
        removed = wait(lambda: count() < added, 120, "a replica removed") + 2.0
        time.sleep(2)
        end = time.monotonic()
    finally:
        stop.set()
        trickle_stop.set()
        for t in threads:
            t.join(30)
    window = [ok for at, ok in trickle if calm <= at <= end]
    admin(c, "PolicyDelete", admin_pb2.PolicyDeleteRequest(kind="ModelPin", name=MODEL,
                                                           timeout_seconds=5))
    wait(lambda: count() == 0, 120, "every replica gone once the pin is deleted")
    return {"pin_to_ready_s": pin_ready, "surge_to_added_ready_s": surge_ready,
            "surge_end_to_removed_s": removed, "scale_down_requests": len(window),
            "scale_down_failed": sum(not ok for ok in window),
            "surge_ok": sum(ok for _, ok in heavy)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--cool-down", type=float, default=8.0)
    ap.add_argument("--out", type=Path,
                    default=ROOT / "bench" / "results" / "placement_models_live.json")
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="meshd-bench-placement-"))
    servers = [TritonServer(DEFAULT_REPO, work / f"triton{i}", models=[], explicit=True,
                            name=f"triton{i}") for i in range(3)]
    start_all(servers, timeout=120)
    raft = pick_raft_port([node_ip(i) for i in range(1, 4)])
    c = Cluster(3, work / "mesh", node_args=lambda i: [
        "--gpu", "off", "--model-control", "--model-slots", "1",
        "--model-cool-down", str(args.cool_down), "--triton", servers[i - 1].meshd_spec,
        *(["--role", "router", "--subscribe", "*"] if i == 1 else []),
        *coordinator_args(i, raft, 3)])
    rounds = []
    try:
        for s in servers:
            s.set_behaviour("delay", delay_ms=50)
        c.start()
        c.wait_converged(60)
        wait(lambda: _leader(c), 60, "a policy leader")
        for i in range(args.rounds):
            r = round_(c, servers)
            rounds.append(r)
            print(f"round {i + 1}: {r}", file=sys.stderr, flush=True)
    finally:
        c.close()
        stop_all(servers)

    def cell(key: str) -> str:
        vals = [r[key] for r in rounds]
        return f"{statistics.median(vals):.2f} ({min(vals):.2f}-{max(vals):.2f})"

    failed = sum(r["scale_down_failed"] for r in rounds)
    sent = sum(r["scale_down_requests"] for r in rounds)
    rows = [("pin to replica ready, s", cell("pin_to_ready_s"), "-", ""),
            ("surge start to added replica ready, s", cell("surge_to_added_ready_s"), "-", ""),
            ("surge end to replica removed (cool-down "
             f"{args.cool_down:.0f} s + drain + unload), s", cell("surge_end_to_removed_s"),
             "-", ""),
            ("requests failed during scale-down (all rounds)", f"{failed} of {sent}", "0",
             "PASS" if failed == 0 and sent > 0 else "FAIL")]
    title = (f"# Model placement, live ({len(rounds)} rounds, 3 agents + 3 Triton servers, "
             f"model delay at 50 ms, {CALLERS} callers; median (min-max))")
    table = ["| measure | measured | bar | result |", "|---|---|---|---|",
             *(f"| {a} | {b} | {c_} | {d} |" for a, b, c_, d in rows)]
    md = "\n".join([title, "", *table, "",
                    "Command: `.venv/bin/python bench/placement_models_live.py`", ""])
    print(md)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"rounds": rounds, "cool_down_s": args.cool_down},
                                   indent=1) + "\n")
    args.out.with_suffix(".md").write_text(md)
    return 0 if failed == 0 and sent > 0 else 1


def _leader(c: Cluster) -> bool:
    try:
        resp = admin(c, "RaftStatus", admin_pb2.RaftStatusRequest(), 5)
    except Exception:  # noqa: BLE001 - not yet
        return False
    return any(g.group == "policy" and g.state == "leader" for g in resp.groups)


if __name__ == "__main__":
    sys.exit(main())
