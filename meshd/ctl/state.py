"""``meshctl state [NODE] [--model M]``: the answering agent's fused telemetry, with ages.

Every figure is shown with how old it is, because a queue depth without its age invites the
wrong conclusion: "0 queued, 40 s ago" is a replica we know nothing about.
"""

from __future__ import annotations

import argparse
from typing import Any

from meshd.ctl.text import to_json
from proto.mesh.v1 import state_pb2, state_pb2_grpc

GIB = 1 << 30


def _age(seconds: float) -> str:
    if seconds < 0:
        return "-"
    return f"{seconds * 1000:.0f}ms" if seconds < 10 else f"{seconds:.0f}s"


def _num(value: float, fmt: str, unknown: float = -1) -> str:
    return "-" if value == unknown else format(value, fmt)


def _ms(seconds: float, fmt: str) -> str:
    return "-" if seconds < 0 else format(seconds * 1000, fmt) + "ms"


def _print(rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())


def state(stub: Any, args: argparse.Namespace) -> int:
    plane = state_pb2_grpc.StatePlaneStub(args.channel)
    resp = plane.State(state_pb2.StateRequest(node=args.node or "", model=args.model or ""),
                       timeout=args.timeout)
    if args.format == "json":
        print(to_json(resp))
        return 0
    if not resp.nodes:
        print("no telemetry" + (f" from {args.node}" if args.node else "") + " yet")
        return 0
    rows: list[tuple[str, ...]] = [("NODE", "VIA", "AGE", "FLAGS", "GPUS")]
    for n in resp.nodes:
        gpus = sum(1 for g in resp.gpus if g.node == n.node)
        rows.append((n.node, n.via, _age(n.age), ",".join(n.flags) or "-",
                     str(gpus) if gpus else f"cpu-only ({n.cpu_only})" if n.cpu_only else "0"))
    _print(rows)
    if resp.replicas:
        print()
        rows = [("NODE", "MODEL", "VER", "ENDPOINT", "RUNTIME", "READY", "QUEUE", "INFLIGHT",
                 "INST", "SPU", "LATENCY", "RATE/S", "AGE(q)", "AGE(stats)", "FLAGS")]
        for r in resp.replicas:
            rows.append((r.node, r.model, r.version, r.endpoint, r.runtime,
                         "yes" if r.ready else "NO", _num(r.queue, "d"),
                         _num(r.inflight, "d"), str(r.instances), _ms(r.spu, ".3f"),
                         _ms(r.latency_seconds, ".1f"),
                         _num(r.rate, ".1f"), _age(r.queue_age), _age(r.stats_age),
                         ",".join(r.flags) or "-"))
        _print(rows)
    if resp.gpus and not args.model:
        print()
        rows = [("NODE", "GPU", "NAME", "MEM FREE/TOTAL", "SM%", "TEMP", "ECC", "THROTTLE",
                 "AGE")]
        for g in resp.gpus:
            rows.append((g.node, g.uuid, g.name,
                         f"{g.memory_free / GIB:.1f}/{g.memory_total / GIB:.1f} GiB",
                         _num(g.sm_util, ".0f"), _num(g.temperature_c, ".0f"),
                         _num(g.ecc_uncorrected, "d"), ",".join(g.throttle) or "-",
                         _age(g.age)))
        _print(rows)
    return 0


def add_commands(sub: Any) -> None:
    p = sub.add_parser("state", help="replicas, queues, SPU, GPU memory, with each figure's age")
    p.add_argument("node", nargs="?", help="only this node")
    p.add_argument("--model", help="only this model")
    p.add_argument("--format", choices=["table", "json"], default="table")
    p.set_defaults(func=state)
