"""``meshctl``: the operator's command line, a client of the admin gRPC API."""

from __future__ import annotations

import argparse
import json
import os
import sys

import grpc
from google.protobuf.json_format import MessageToDict

from proto.mesh.v1 import admin_pb2, admin_pb2_grpc

DEFAULT_ADMIN = "127.0.0.1:7960"


def _age(seconds: float) -> str:
    if seconds < 60:
        return f"{seconds:.0f}s"
    if seconds < 3600:
        return f"{seconds / 60:.0f}m"
    return f"{seconds / 3600:.1f}h"


def _ms(seconds: float) -> str:
    return f"{seconds * 1000:.3f} ms"


def format_rtt(est: admin_pb2.RttEstimate) -> str:
    """``10.213 ms`` from coordinates, ``~2.000 ms`` from zone labels alone, ``-`` unknown."""
    if est.source == "none":
        return "-"
    return ("~" if est.source == "zone" else "") + _ms(est.rtt_seconds)


def format_members_table(resp: admin_pb2.MembersResponse, detailed: bool = False) -> str:
    """An aligned table like ``serf members`` (a ``*`` marks the answering node).

    ``detailed`` adds each member's coordinate error and height and the estimated RTT from
    the answering node (``~`` when it comes from zone labels, not coordinates).
    """
    header: tuple[str, ...] = ("NAME", "ADDRESS", "STATUS", "INC", "AGE", "ROLES", "ZONE",
                               "TAGS")
    if detailed:
        header += ("COORD-ERR", "HEIGHT", "RTT")
    rows: list[tuple[str, ...]] = [header]
    for m in resp.members:
        row: tuple[str, ...] = (
            ("*" if m.is_local else "") + m.name, m.address, m.status, str(m.incarnation),
            _age(m.status_age_seconds), ",".join(m.roles) or "-",
            "/".join(x for x in (m.region, m.zone) if x) or "-",
            ",".join(f"{k}={v}" for k, v in sorted(m.tags.items())) or "-")
        if detailed:
            has = m.HasField("coordinate")
            row += (f"{m.coordinate.error:.3f}" if has else "-",
                    _ms(m.coordinate.height) if has else "-", format_rtt(m.rtt_from_local))
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(header))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
                     for r in rows)


def format_rtt_answer(resp: admin_pb2.RttResponse) -> str:
    """Like ``serf rtt``: one line with the estimate and where it came from."""
    est = resp.estimate
    if est.source == "none":
        return (f"No estimate for {resp.a} <-> {resp.b} yet: no coordinates known and no "
                f"zone/region labels ({est.relation})")
    if est.source == "self":
        return f"Estimated {resp.a} <-> {resp.b} rtt: 0.000 ms (same node)"
    how = ("from zone labels only, coordinates not settled" if est.source == "zone" else
           f"using coordinates, error {est.error:.1%}")
    line = (f"Estimated {resp.a} <-> {resp.b} rtt: {_ms(est.rtt_seconds)} ({how}, confidence "
            f"{est.confidence:.2f}, {est.relation})")
    if not est.consistent:
        line += "\nwarning: the coordinates contradict the zone/region labels"
    if resp.measured_rtt_seconds > 0:
        line += f"\nMeasured by {resp.local_node} (median of recent probes): " \
                f"{_ms(resp.measured_rtt_seconds)}"
    return line


def members(stub: admin_pb2_grpc.AdminStub, args: argparse.Namespace) -> int:
    resp = stub.Members(admin_pb2.MembersRequest(status=args.status or [], role=args.role or []),
                        timeout=args.timeout)
    if args.format == "json":
        print(json.dumps(MessageToDict(resp, preserving_proto_field_name=True,
                                       always_print_fields_with_no_presence=True), indent=2))
    else:
        print(format_members_table(resp, detailed=args.detailed))
    return 0


def rtt(stub: admin_pb2_grpc.AdminStub, args: argparse.Namespace) -> int:
    resp = stub.Rtt(admin_pb2.RttRequest(a=args.a, b=args.b or ""), timeout=args.timeout)
    if args.format == "json":
        print(json.dumps(MessageToDict(resp, preserving_proto_field_name=True,
                                       always_print_fields_with_no_presence=True), indent=2))
    else:
        print(format_rtt_answer(resp))
    return 1 if resp.estimate.source == "none" else 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="meshctl", description="operate a meshd mesh")
    p.add_argument("--admin", default=os.environ.get("MESHCTL_ADMIN", DEFAULT_ADMIN),
                   help=f"admin API of any node (default {DEFAULT_ADMIN}, or $MESHCTL_ADMIN)")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds per call")
    sub = p.add_subparsers(dest="command", required=True)
    m = sub.add_parser("members", help="list members and their status")
    m.add_argument("--status", action="append", choices=["alive", "suspect", "dead", "left"],
                   help="only members in this status (repeatable)")
    m.add_argument("--role", action="append", help="only members with this role (repeatable)")
    m.add_argument("--detailed", action="store_true",
                   help="add coordinate error, height and estimated RTT from the answering node")
    m.add_argument("--format", choices=["table", "json"], default="table")
    m.set_defaults(func=members)
    r = sub.add_parser("rtt", help="estimated round-trip time between two members",
                       description="Estimate the RTT between members A and B (default: the "
                                   "answering node) from network coordinates, like `serf rtt`.")
    r.add_argument("a", metavar="A")
    r.add_argument("b", metavar="B", nargs="?")
    r.add_argument("--format", choices=["text", "json"], default="text")
    r.set_defaults(func=rtt)
    return p


def main(argv: list[str] | None = None) -> int:
    try:
        return _run(argv)
    except BrokenPipeError:  # e.g. `meshctl members | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _run(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    with grpc.insecure_channel(args.admin) as channel:
        stub = admin_pb2_grpc.AdminStub(channel)
        try:
            return int(args.func(stub, args))
        except grpc.RpcError as exc:
            code = exc.code()  # type: ignore[attr-defined]
            print(f"meshctl: {code.name}: {exc.details()} (admin {args.admin})",  # type: ignore[attr-defined]
                  file=sys.stderr)
            return 2 if code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND) else 1


if __name__ == "__main__":
    sys.exit(main())
