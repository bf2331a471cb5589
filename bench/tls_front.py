"""What the TLS front (``meshd/security/front.py``) costs a gRPC server per call.

Why: the router's gRPC port is the hot request path, so the front (which counts refused
handshakes) is opt-in there (``--router-tls-front``) unless it is cheap.  This measures it:
one server process serves the same trivial unary method twice, (A) with gRPC's own TLS and
(B) behind the front (Python's ``ssl`` on an asyncio splice to a plaintext inner port); this
process makes N small sequential calls over one mTLS channel to each, in interleaved rounds
A B A B ..., and reads the server process's CPU time (``time.process_time``: every thread,
gRPC's included) before and after each round.  Reported: the medians over rounds of server
CPU per call and of the client's wall time per call.

    python -m bench.tls_front [--calls 3000] [--rounds 6] [--payload 64]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import grpc

from bench.table import publish
from certs import tls
from certs.identity import Identity

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "bench" / "results" / "tls_front.json"
ECHO = "/bench.Bench/Echo"
CPU = "/bench.Bench/Cpu"


async def _serve(data: Path) -> None:
    """The server process: both servers, ports on stdout, until stdin closes."""
    from meshd.security.front import PeerTable, front_grpc, server_context
    from testbed.admin import dev_security

    sec = dev_security(data, "bench")

    async def echo(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return request

    async def cpu(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        return str(time.process_time()).encode()

    def handlers() -> grpc.GenericRpcHandler:
        return grpc.method_handlers_generic_handler("bench.Bench", {
            "Echo": grpc.unary_unary_rpc_method_handler(echo),
            "Cpu": grpc.unary_unary_rpc_method_handler(cpu)})

    direct = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    direct.add_generic_rpc_handlers((handlers(),))
    port_a = direct.add_secure_port("127.0.0.1:0",
                                    tls.grpc_server_credentials(lambda: sec.identity))
    await direct.start()
    inner = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    inner.add_generic_rpc_handlers((handlers(),))
    fronted, port_b = await front_grpc(
        inner, "127.0.0.1", 0, peers=PeerTable(), channel="bench",
        context=server_context(lambda: tls.server_context(sec.id_dir)),
        on_refused=lambda r: None)
    print(json.dumps({"direct": port_a, "front": port_b, "creds": str(data / "meshctl")}),
          flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await asyncio.gather(direct.stop(0), fronted.stop(0))


def _round(stub: grpc.UnaryUnaryMultiCallable, cpu: grpc.UnaryUnaryMultiCallable,
           calls: int, payload: bytes) -> tuple[float, float]:
    """Server CPU seconds and client wall seconds for ``calls`` calls."""
    c0 = float(cpu(b""))
    t0 = time.perf_counter()
    for _ in range(calls):
        stub(payload)
    wall = time.perf_counter() - t0
    return float(cpu(b"")) - c0, wall


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=3000)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--payload", type=int, default=64)
    p.add_argument("--serve", metavar="DIR", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve:
        asyncio.run(_serve(Path(args.serve)))
        return
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="tls-front-") as tmp:
        proc = subprocess.Popen([sys.executable, "-m", "bench.tls_front", "--serve", tmp],
                                cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                text=True)
        try:
            assert proc.stdout is not None and proc.stdin is not None
            info = json.loads(proc.stdout.readline())
            ident = Identity.load(Path(info["creds"]))
            payload = b"x" * args.payload
            channels, stubs = [], {}
            for name in ("direct", "front"):
                ch = tls.grpc_channel(f"127.0.0.1:{info[name]}", ident)
                channels.append(ch)
                stubs[name] = (ch.unary_unary(ECHO), ch.unary_unary(CPU))
                _round(*stubs[name], 300, payload)  # warm up: connection, caches
            samples: dict[str, list[tuple[float, float]]] = {"direct": [], "front": []}
            for _ in range(args.rounds):
                for name in ("direct", "front"):  # interleaved: A B A B ...
                    samples[name].append(_round(*stubs[name], args.calls, payload))
            for ch in channels:
                ch.close()
        finally:
            if proc.stdin is not None:
                proc.stdin.close()
            proc.wait(30)
    med = {name: (statistics.median(c for c, _ in s) / args.calls * 1e6,
                  statistics.median(w for _, w in s) / args.calls * 1e6)
           for name, s in samples.items()}
    base_cpu, base_wall = med["direct"]
    rows = [[name, f"{cpu_us:.1f}", f"{(cpu_us / base_cpu - 1) * 100:+.1f}%",
             f"{wall_us:.1f}", f"{(wall_us / base_wall - 1) * 100:+.1f}%"]
            for name, (cpu_us, wall_us) in med.items()]
    publish(OUT, "tls_front", "gRPC unary calls: gRPC's TLS vs the TLS front",
            ["server TLS", "server CPU µs/call", "vs gRPC TLS", "client wall µs/call",
             "vs gRPC TLS"], rows, started, False,
            {"calls": args.calls, "rounds": args.rounds, "payload": args.payload},
            {name: {"cpu_s": [c for c, _ in s], "wall_s": [w for _, w in s]}
             for name, s in samples.items()},
            footer=f"medians of {args.rounds} interleaved rounds of {args.calls} calls")


if __name__ == "__main__":
    main()
