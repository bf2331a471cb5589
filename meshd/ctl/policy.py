"""``meshctl`` commands for node flags, policies, Raft status and events.

Kept apart from :mod:`meshd.ctl` (connection handling, members, keys, certificates) because
these all speak in policy documents: files in (JSON/YAML, like ``kubectl apply -f``) and
documents out.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import sys
from typing import Any

from meshd.ctl.text import read_file_arg, to_json
from policy.document import dump_documents
from policy.model import KINDS
from proto.mesh.v1 import admin_pb2, admin_pb2_grpc

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*$")
_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``10m``, ``2h``, ``1d`` -> seconds."""
    m = _DURATION.match(text)
    if not m:
        raise argparse.ArgumentTypeError(f"{text!r} is not a duration like 90s, 10m or 2h")
    return float(m.group(1)) * _UNITS[m.group(2)]


def _flag(stub: admin_pb2_grpc.AdminStub, args: argparse.Namespace, method: str,
          **fields: Any) -> int:
    resp = getattr(stub, method)(admin_pb2.NodeFlagRequest(
        node=args.node, timeout_seconds=args.timeout, **fields), timeout=args.timeout + 1)
    spec = json.loads(resp.document_json)["spec"] if resp.document_json else {}
    on = [k for k in ("cordoned", "draining", "quarantined") if spec.get(k)] or ["none"]
    extra = ""
    if spec.get("draining"):
        deadline = dt.datetime.fromtimestamp(spec["draining"]["deadline_unix"], dt.UTC)
        extra = f"; drain deadline {deadline.isoformat(timespec='seconds')}"
    print(f"{args.node}: flags {', '.join(on)}{extra} (policy version {resp.version})")
    return 0


def cordon(stub: admin_pb2_grpc.AdminStub, args: argparse.Namespace) -> int:
    return _flag(stub, args, "Cordon")


def uncordon(stub: admin_pb2_grpc.AdminStub, args: argparse.Namespace) -> int:
    return _flag(stub, args, "Uncordon")


def drain(stub: admin_pb2_grpc.AdminStub, args: argparse.Namespace) -> int:
    return _flag(stub, args, "Drain", deadline_seconds=args.deadline)


def quarantine(stub: admin_pb2_grpc.AdminStub, args: argparse.Namespace) -> int:
    if not args.clear and not args.reason:
        print("meshctl: quarantine needs --reason (or --clear)", file=sys.stderr)
        return 2
    return _flag(stub, args, "Quarantine", reason=args.reason or "", clear=args.clear)


def policy_set(stub: admin_pb2_grpc.AdminStub, args: argparse.Namespace) -> int:
    text = read_file_arg(args.file)
    if text is None:
        return 2
    req = admin_pb2.PolicyApplyRequest(text=text, timeout_seconds=args.timeout)
    if args.if_version is not None:
        req.if_version = args.if_version
    resp = stub.PolicyApply(req, timeout=args.timeout + 1)
    for r in resp.results:
        doc = json.loads(r.document_json) if r.document_json else {}
        print(f"{doc.get('kind', '?')}/{doc.get('name', '?')} applied (version {r.version})")
    return 0


def _docs_out(docs: list[dict[str, Any]], fmt: str) -> None:
    if fmt == "json":
        print(json.dumps(docs if len(docs) != 1 else docs[0], indent=2))
    else:
        print(dump_documents(docs, "yaml"), end="")


def policy_get(stub: admin_pb2_grpc.AdminStub, args: argparse.Namespace) -> int:
    resp = stub.PolicyGet(admin_pb2.PolicyGetRequest(
        kind=args.kind, name=args.name, consistent=args.consistent,
        timeout_seconds=args.timeout), timeout=args.timeout + 1)
    if not resp.found:
        print(f"meshctl: {args.kind}/{args.name} not found (store version "
              f"{resp.store_version})", file=sys.stderr)
        return 1
    _docs_out([json.loads(resp.document_json)], args.format)
    return 0


def policy_list(stub: admin_pb2_grpc.AdminStub, args: argparse.Namespace) -> int:
    resp = stub.PolicyList(admin_pb2.PolicyListRequest(kind=args.kind or ""),
                           timeout=args.timeout)
    docs = [json.loads(d) for d in resp.documents_json]
    if args.format != "table":
        _docs_out(docs, args.format)
        return 0
    rows = [("KIND", "NAME", "VERSION", "UPDATED", "AUTHOR")]
    for d in docs:
        when = dt.datetime.fromtimestamp(d.get("updated_unix", 0), dt.UTC)
        rows.append((d["kind"], d["name"], str(d["version"]),
                     when.isoformat(timespec="seconds"), d.get("author", "")))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    versions = ", ".join(f"{g} {v}" for g, v in sorted(resp.versions.items()))
    print(f"({len(docs)} documents; copy versions: {versions})")
    return 0


def policy_delete(stub: admin_pb2_grpc.AdminStub, args: argparse.Namespace) -> int:
    req = admin_pb2.PolicyDeleteRequest(kind=args.kind, name=args.name,
                                        timeout_seconds=args.timeout)
    if args.if_version is not None:
        req.if_version = args.if_version
    resp = stub.PolicyDelete(req, timeout=args.timeout + 1)
    print(f"{args.kind}/{args.name} deleted (version {resp.version})")
    return 0


def raft_status(stub: admin_pb2_grpc.AdminStub, args: argparse.Namespace) -> int:
    resp = stub.RaftStatus(admin_pb2.RaftStatusRequest(), timeout=args.timeout)
    if args.format == "json":
        print(to_json(resp))
        return 0
    rows = [("GROUP", "NODE", "ADDRESS", "STATE", "LEADER", "TERM", "COMMIT", "APPLIED",
             "VERSION", "QUORUM", "VOTERS", "LAG")]
    for g in sorted(resp.groups, key=lambda g: (g.group, g.node)):
        if g.error:
            rows.append((g.group or "-", g.node, "-", "unreachable", g.error[:40], *"-" * 7))
            continue
        lag = ",".join(f"{a}={n}" for a, n in sorted(g.lag.items()) if n) or "-"
        rows.append((g.group, g.node, g.address, g.state, g.leader or "-", str(g.term),
                     str(g.commit_index), str(g.last_applied), str(g.version),
                     "yes" if g.has_quorum else "NO", str(len(g.members)), lag))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    for r in rows:
        print("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())
    local = ", ".join(f"{g} {v}" for g, v in sorted(resp.local_versions.items()))
    print(f"(answering node's read copies: {local})")
    return 0


def events(stub: admin_pb2_grpc.AdminStub, args: argparse.Namespace) -> int:
    req = admin_pb2.SubscribeEventsRequest(groups=args.group or [],
                                           no_membership=args.no_membership)
    for item in args.since or []:
        group, _, version = item.partition("=")
        req.from_versions[group] = int(version)
    count = 0
    for ev in stub.SubscribeEvents(req):
        if args.format == "json":
            print(to_json(ev).replace("\n", " "), flush=True)
        else:
            when = dt.datetime.fromtimestamp(ev.at_unix or 0, dt.UTC).isoformat(
                timespec="milliseconds")
            what = f"{ev.kind}/{ev.name}" if ev.kind else ev.name
            print(f"{when} {ev.group} v{ev.version} {ev.op} {what}"
                  + (f" by {ev.author}" if ev.author else ""), flush=True)
        count += 1
        if args.count and count >= args.count:
            return 0
    return 0


def add_commands(sub: Any) -> None:
    """Add the policy commands to ``meshctl``'s subparsers."""
    for name, func, text in (("cordon", cordon, "the node takes no new work"),
                             ("uncordon", uncordon, "the node takes work again"),
                             ("drain", drain, "finish in-flight work, take nothing new"),
                             ("quarantine", quarantine, "mark a node unusable, with a reason")):
        p = sub.add_parser(name, help=text)
        p.add_argument("node")
        if name == "drain":
            p.add_argument("--deadline", type=parse_duration, default=300.0,
                           help="time to finish in-flight work (e.g. 90s, 10m; default 5m)")
        if name == "quarantine":
            p.add_argument("--reason", help="why (required unless --clear)")
            p.add_argument("--clear", action="store_true", help="lift the quarantine")
        p.set_defaults(func=func)
    pol = sub.add_parser("policy", help="policy documents (kubectl-like)")
    psub = pol.add_subparsers(dest="policy_command", required=True)
    ps = psub.add_parser("set", help="create or replace documents from a JSON/YAML file")
    ps.add_argument("-f", "--file", required=True, help="file with documents, or - for stdin")
    ps.add_argument("--if-version", type=int,
                    help="only if the (single) document is at this version (0: create only)")
    ps.set_defaults(func=policy_set)
    pg = psub.add_parser("get", help="show one document")
    pg.add_argument("kind", choices=list(KINDS))
    pg.add_argument("name")
    pg.add_argument("--consistent", action="store_true",
                    help="read through the Raft log (linearizable) instead of the local copy")
    pg.add_argument("--format", choices=["yaml", "json"], default="yaml")
    pg.set_defaults(func=policy_get)
    pl = psub.add_parser("list", help="list documents from the answering node's copy")
    pl.add_argument("kind", nargs="?", choices=list(KINDS))
    pl.add_argument("--format", choices=["table", "yaml", "json"], default="table")
    pl.set_defaults(func=policy_list)
    pd = psub.add_parser("delete", help="delete a document")
    pd.add_argument("kind", choices=list(KINDS))
    pd.add_argument("name")
    pd.add_argument("--if-version", type=int, help="only if it is at this version")
    pd.set_defaults(func=policy_delete)
    raft = sub.add_parser("raft", help="the Raft groups")
    rsub = raft.add_subparsers(dest="raft_command", required=True)
    rs = rsub.add_parser("status", help="groups, leader, term, commit index, voters, lag")
    rs.add_argument("--format", choices=["table", "json"], default="table")
    rs.set_defaults(func=raft_status)
    ev = sub.add_parser("events", help="stream policy, placement and membership changes")
    ev.add_argument("--group", action="append", choices=["policy", "placements"],
                    help="only this group (repeatable)")
    ev.add_argument("--since", action="append", metavar="GROUP=VERSION",
                    help="resume after this version (repeatable)")
    ev.add_argument("--no-membership", action="store_true", help="policy changes only")
    ev.add_argument("--count", type=int, default=0, help="stop after N events")
    ev.add_argument("--format", choices=["text", "json"], default="text")
    ev.set_defaults(func=events)
