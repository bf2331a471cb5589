"""Traffic for the local dev mesh: tritonclient requests through the router, and a report of
where they went.

The router is a node of the mesh with ``--role router``; outside ``--dev`` its ingress is
mTLS, so the client presents the dev mesh's operator identity (``<node1>/meshctl``), as any
mesh client would.  Where requests went is read from each Triton server's own statistics
(successful inferences per model), so the report shows what the servers did, not what the
router believes it did.
"""

from __future__ import annotations

import concurrent.futures
import threading
import time
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import tritonclient.grpc as tc
from tritonclient.utils import InferenceServerException

from certs.spiffe import any_node_dns
from meshd.dev.triton import TritonServer

MODELS = ("add_sub", "delay")


def router_client(router: str, creds: Path, trust_domain: str) -> tc.InferenceServerClient:
    return tc.InferenceServerClient(
        router, ssl=True, root_certificates=str(creds / "bundle.pem"),
        private_key=str(creds / "key.pem"), certificate_chain=str(creds / "cert.pem"),
        channel_args=[("grpc.ssl_target_name_override", any_node_dns(trust_domain))])


def served(server: TritonServer) -> dict[str, int]:
    """Successful inferences per model so far on ``server`` (empty if it cannot be asked)."""
    try:
        client = tc.InferenceServerClient(server.grpc_url)
        stats = client.get_inference_statistics()
        client.close()
    except InferenceServerException:
        return {}
    out: Counter[str] = Counter()
    for s in stats.model_stats:
        out[s.name] += s.inference_stats.success.count
    return dict(out)


def wait_ready(client: tc.InferenceServerClient, timeout: float,
               stop: threading.Event) -> bool:
    """Until the router says every model is ready (the mesh has gossiped the replicas)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end and not stop.is_set():
        try:
            if all(client.is_model_ready(m) for m in MODELS):
                return True
        except InferenceServerException:
            pass
        time.sleep(0.5)
    return False


def one(client: tc.InferenceServerClient, i: int) -> str:
    """One request (alternating models); its outcome: ``ok`` or the gRPC status."""
    try:
        if i % 2:
            a = np.full((1, 16), i, dtype=np.float32)
            inputs = []
            for name in ("INPUT0", "INPUT1"):
                inp = tc.InferInput(name, [1, 16], "FP32")
                inp.set_data_from_numpy(a)
                inputs.append(inp)
            got = client.infer("add_sub", inputs, client_timeout=10)
            if not np.array_equal(got.as_numpy("OUTPUT0"), a + a):
                return "wrong_answer"
        else:
            inp = tc.InferInput("PAYLOAD", [256], "FP32")
            inp.set_data_from_numpy(np.zeros(256, dtype=np.float32))
            client.infer("delay", [inp], client_timeout=10)
        return "ok"
    except InferenceServerException as exc:
        return str(exc.status() or "error").removeprefix("StatusCode.")


def round_of(client: tc.InferenceServerClient, servers: Sequence[TritonServer],
             requests: int, concurrency: int) -> str:
    """Send ``requests`` through the router; a report of outcomes and where they landed."""
    before = {s.name: served(s) for s in servers}
    t0 = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(concurrency) as pool:
        outcomes = Counter(pool.map(lambda i: one(client, i), range(requests)))
    took = time.monotonic() - t0
    lines = [f"traffic: {requests} requests through the router in {took:.1f} s "
             f"({requests / took:.0f}/s): "
             + ", ".join(f"{k} {v}" for k, v in sorted(outcomes.items()))]
    for s in servers:
        after = served(s)
        got = {m: after.get(m, 0) - before[s.name].get(m, 0) for m in MODELS}
        lines.append(f"  {s.name} ({s.grpc_url}): " + ", ".join(
            f"{m} {n}" for m, n in got.items()) + (
            "" if s.is_running() else "  (not running)"))
    return "\n".join(lines)
