"""``meshctl models``: what the placement controller was asked for and what it did.

An operator states intent in a ``ModelPin`` (where a model may run, how many replicas) and
the controller answers in a ``ModelPlacement`` (replicas, failures, cool-down, refusal).
Both are policy documents, so these commands are a view over ``PolicyList``/``PolicyGet``
that puts the two side by side, and writes to the pin with ``PolicyApply`` (the placement is
the controller's alone).  Writes are read-modify-write fenced by the pin's version, so two
operators scaling at once get a conflict (ABORTED) instead of one change silently lost.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from typing import Any

import grpc

from meshd.ctl.text import _age
from proto.mesh.v1 import admin_pb2, admin_pb2_grpc

PIN, PLACEMENT = "ModelPin", "ModelPlacement"
STATES = ("ready", "loading", "draining")
KEEP = object()
"""``--max`` not given: the pin's cap stays as it is (None would clear it)."""


def _cap(text: str) -> int | None:
    """``--max``: a positive count, or ``none`` for no cap."""
    if text.lower() in ("none", "null", "-"):
        return None
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a count or 'none'") from None
    if value < 1:
        raise argparse.ArgumentTypeError("must be at least 1 (or 'none')")
    return value


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError("must be 0 or more")
    return value


def _names(text: str) -> list[str]:
    """``a,b`` -> ``["a", "b"]``; ``""`` clears the list (any node, zone or GPU type)."""
    return [x.strip() for x in text.split(",") if x.strip()]


# --- reading ----------------------------------------------------------------------------------

def summary(model: str, pin: dict[str, Any] | None,
            placement: dict[str, Any] | None) -> dict[str, Any]:
    """One model's pin and placement documents, merged, with the counts and the reason
    ``list`` shows (the shape of ``--format json``)."""
    spec = (placement or {}).get("spec") or {}
    replicas = spec.get("replicas") or {}
    counts = {s: sum(1 for r in replicas.values() if r.get("state") == s) for s in STATES}
    return {"model": model,
            "pin": pin["spec"] if pin else None,
            "pin_version": pin["version"] if pin else None,
            "placement": spec if placement else None,
            "placement_version": placement["version"] if placement else None,
            "placed": len(replicas), **counts, "why": why(spec)}


def why(spec: dict[str, Any]) -> str:
    """The refusal when there is one; else the newest word the record holds: a replica's
    reason (placed, draining) or a failed load, whichever happened last."""
    if spec.get("refused"):
        return f"{spec['refused']}: {spec.get('refused_reason') or 'refused'}"
    said: list[tuple[float, str]] = []
    for node, r in (spec.get("replicas") or {}).items():
        if r.get("reason"):
            said.append((float(r.get("since") or 0), f"{node}: {r['reason']}"))
    for node, f in (spec.get("failures") or {}).items():
        times = f" ({f['count']} in a row)" if f.get("count", 1) > 1 else ""
        said.append((float(f.get("at") or 0),
                     f"load on {node} failed{times}: {f.get('reason') or '?'}"))
    return max(said)[1] if said else ""


def _pin_range(pin: dict[str, Any] | None) -> str:
    """``2..4``, ``2..-`` (no cap), ``-`` (unpinned)."""
    if pin is None:
        return "-"
    top = pin.get("max_replicas")
    return f"{pin.get('min_replicas') or 0}..{'-' if top is None else top}"


def pin_words(pin: dict[str, Any]) -> str:
    """A pin's fields in one line, defaults spelled out."""
    top = pin.get("max_replicas")
    vram = pin.get("min_free_vram_mb") or 0
    return (f"min {pin.get('min_replicas') or 0}, max {'none' if top is None else top}; "
            f"nodes {', '.join(pin.get('nodes') or []) or 'any'}; "
            f"zones {', '.join(pin.get('zones') or []) or 'any'}; "
            f"GPU types {', '.join(pin.get('gpu_types') or []) or 'any'}; "
            f"min free VRAM {f'{vram} MiB' if vram else 'any'}")


def _table(rows: list[tuple[str, ...]], indent: str = "") -> str:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(indent + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True))
                     .rstrip() for r in rows)


def _ago(at: float | None, now: float) -> str:
    """``12s ago``; clocks of the coordinator and this machine may differ, so never negative."""
    return "-" if not at else f"{_age(max(0.0, now - float(at)))} ago"


def list_models(stub: admin_pb2_grpc.AdminStub, args: argparse.Namespace) -> int:
    resp = stub.PolicyList(admin_pb2.PolicyListRequest(), timeout=args.timeout)
    pins: dict[str, dict[str, Any]] = {}
    placements: dict[str, dict[str, Any]] = {}
    for text in resp.documents_json:
        doc = json.loads(text)
        if doc.get("kind") == PIN:
            pins[doc["name"]] = doc
        elif doc.get("kind") == PLACEMENT:
            placements[doc["name"]] = doc
    models = [summary(m, pins.get(m), placements.get(m)) for m in sorted({*pins, *placements})]
    planned = _planned(stub, args)
    for m in models:
        status = planned.get(m["model"])
        m["desired"] = status.desired if status is not None else None
        m["demand"] = status.demand if status is not None else None
        if status is not None and status.why:
            m["why"] = status.why if not m["why"] else f"{status.why}; {m['why']}"
    if args.format == "json":
        print(json.dumps(models, indent=2))
        return 0
    if not models:
        print("no models: none is pinned or placed (meshctl models pin MODEL --min N)")
        return 0
    rows: list[tuple[str, ...]] = [
        ("MODEL", "PIN", "DESIRED", "PLACED", "READY", "LOADING", "DRAINING", "WHY")]
    rows += [(m["model"], _pin_range(m["pin"]),
              "?" if m["desired"] is None else str(m["desired"]), str(m["placed"]),
              str(m["ready"]), str(m["loading"]), str(m["draining"]), m["why"] or "-")
             for m in models]
    print(_table(rows))
    return 0


def _planned(stub: admin_pb2_grpc.AdminStub, args: argparse.Namespace
             ) -> dict[str, admin_pb2.ModelStatus]:
    """What the node's placement controller would plan now, by model ({} from an agent
    that predates ``ModelsStatus``: the table then shows ``?`` as desired)."""
    try:
        resp = stub.ModelsStatus(admin_pb2.ModelsStatusRequest(), timeout=args.timeout)
    except grpc.RpcError as exc:
        if exc.code() == grpc.StatusCode.UNIMPLEMENTED:  # type: ignore[attr-defined]
            return {}
        raise
    return {m.model: m for m in resp.models}


def _get(stub: admin_pb2_grpc.AdminStub, args: argparse.Namespace, kind: str,
         consistent: bool = False) -> dict[str, Any] | None:
    resp = stub.PolicyGet(admin_pb2.PolicyGetRequest(
        kind=kind, name=args.model, consistent=consistent, timeout_seconds=args.timeout),
        timeout=args.timeout + 1)
    return json.loads(resp.document_json) if resp.found else None


def get_model(stub: admin_pb2_grpc.AdminStub, args: argparse.Namespace) -> int:
    pin, placement = _get(stub, args, PIN), _get(stub, args, PLACEMENT)
    if pin is None and placement is None:
        print(f"meshctl: model {args.model!r} has neither a ModelPin nor a ModelPlacement "
              f"(admin {args.admin}); `meshctl models pin {args.model} --min N` places it",
              file=sys.stderr)
        return 1
    m = summary(args.model, pin, placement)
    status = _planned(stub, args).get(args.model)
    m["desired"] = status.desired if status is not None else None
    m["demand"] = status.demand if status is not None else None
    m["plan"] = status.why if status is not None else ""
    if args.format == "json":
        print(json.dumps(m, indent=2))
        return 0
    print(format_model(m, time.time()))
    return 0


def format_model(m: dict[str, Any], now: float) -> str:
    """What ``models get`` prints: the pin, the replicas, failures, cool-down and refusal."""
    spec = m["placement"] or {}
    lines = [f"Model:      {m['model']}"]
    if m.get("desired") is not None:
        lines.append(f"Desired:    {m['desired']} ({m.get('plan') or 'no reason given'}; "
                     f"demand {m.get('demand') or 0:.2f} s of work/s)")
    if m["pin"] is None:
        lines.append("Pin:        none (its replicas are removed once the cool-down has "
                     "passed)")
    else:
        lines.append(f"Pin:        {pin_words(m['pin'])} (ModelPin version {m['pin_version']})")
    if m["placement"] is None:
        lines.append("Replicas:   none placed (no ModelPlacement yet)")
    else:
        lines.append(f"Replicas:   {m['placed']} placed: {m['ready']} ready, {m['loading']} "
                     f"loading, {m['draining']} draining (generation {spec.get('gen', 0)})")
    replicas = spec.get("replicas") or {}
    if replicas:
        rows: list[tuple[str, ...]] = [("NODE", "GPU", "STATE", "SINCE", "REASON")]
        rows += [(node, r.get("gpu") or "cpu", r.get("state", "?"), _ago(r.get("since"), now),
                  r.get("reason") or "-") for node, r in sorted(replicas.items())]
        lines.append(_table(rows, "  "))
    failures = spec.get("failures") or {}
    if failures:
        lines.append(f"Failures:   failed loads on {len(failures)} node(s), "
                     "retried there after a back-off")
        rows = [("NODE", "COUNT", "WHEN", "LAST REASON")]
        rows += [(node, str(f.get("count", 1)), _ago(f.get("at"), now), f.get("reason") or "-")
                 for node, f in sorted(failures.items())]
        lines.append(_table(rows, "  "))
    else:
        lines.append("Failures:   none")
    if spec.get("low_since") is not None:
        lines.append(f"Cool-down:  demand low since {_ago(spec['low_since'], now)}, needing "
                     f"at most {spec.get('low_peak', 0)} replica(s) meanwhile; replicas "
                     "above that are removed once the cool-down has passed")
    else:
        lines.append("Cool-down:  none (demand is not low)")
    if spec.get("refused"):
        lines.append(f"Refused:    yes, {spec['refused']}: "
                     f"{spec.get('refused_reason') or '(no reason given)'}")
    else:
        lines.append("Refused:    no")
    return "\n".join(lines)


# --- writing the pin --------------------------------------------------------------------------

def _write_pin(stub: admin_pb2_grpc.AdminStub, args: argparse.Namespace,
               changes: dict[str, Any]) -> int:
    """Read the pin through Raft, change ``changes``, write it back only if nobody changed it
    meanwhile (``if_version``; 0 = it must still be absent)."""
    current = _get(stub, args, PIN, consistent=True)
    spec = dict(current["spec"]) if current else {}
    spec.update(changes)
    doc = {"kind": PIN, "name": args.model, "spec": spec}
    req = admin_pb2.PolicyApplyRequest(text=json.dumps(doc), timeout_seconds=args.timeout,
                                       if_version=current["version"] if current else 0)
    resp = stub.PolicyApply(req, timeout=args.timeout + 1)
    for r in resp.results:
        stored = json.loads(r.document_json) if r.document_json else doc
        what = "created" if current is None else "updated"
        print(f"{PIN}/{args.model} {what} (version {r.version}): "
              f"{pin_words(stored.get('spec', spec))}")
    return 0


def scale(stub: admin_pb2_grpc.AdminStub, args: argparse.Namespace) -> int:
    changes: dict[str, Any] = {"min_replicas": args.replicas}
    if args.max is not KEEP:
        changes["max_replicas"] = args.max
    return _write_pin(stub, args, changes)


def pin(stub: admin_pb2_grpc.AdminStub, args: argparse.Namespace) -> int:
    changes: dict[str, Any] = {}
    for field in ("nodes", "zones", "gpu_types", "min_free_vram_mb"):
        if getattr(args, field) is not None:
            changes[field] = getattr(args, field)
    if args.min is not None:
        changes["min_replicas"] = args.min
    if args.max is not KEEP:
        changes["max_replicas"] = args.max
    return _write_pin(stub, args, changes)


def add_commands(sub: Any) -> None:
    """Add ``meshctl models ...`` to ``meshctl``'s subparsers."""
    models = sub.add_parser("models", help="model placement: pins and where replicas are")
    models.add_argument("--format", choices=["table", "json"], default="table",
                        help=argparse.SUPPRESS)  # for a bare `meshctl models`
    models.set_defaults(func=list_models)
    msub = models.add_subparsers(dest="models_command")
    ls = msub.add_parser("list", help="every pinned or placed model (the default)")
    ls.add_argument("--format", choices=["table", "json"], default="table")
    ls.set_defaults(func=list_models)
    g = msub.add_parser("get", help="one model: pin, replicas, failures, cool-down, refusal")
    g.add_argument("model")
    g.add_argument("--format", choices=["text", "json"], default="text")
    g.set_defaults(func=get_model)
    s = msub.add_parser("scale", help="set the pin's min_replicas (creating the pin)")
    s.add_argument("model")
    s.add_argument("replicas", type=_count, metavar="N")
    s.add_argument("--max", type=_cap, default=KEEP, metavar="M|none",
                   help="also set max_replicas (none: no cap)")
    s.set_defaults(func=scale)
    p = msub.add_parser("pin", help="create or update the pin (fields not named are kept)")
    p.add_argument("model")
    p.add_argument("--nodes", type=_names, metavar="A,B", help="pinned nodes ('' = any)")
    p.add_argument("--zones", type=_names, metavar="Z1,Z2", help="allowed zones ('' = any)")
    p.add_argument("--gpu-types", type=_names, metavar="T1,T2",
                   help="allowed GPU products, as NVML names them ('' = any)")
    p.add_argument("--min-free-vram-mb", type=_count, metavar="N",
                   help="free GPU memory a target needs (MiB; 0 = any)")
    p.add_argument("--min", type=_count, metavar="N", help="replicas to keep loaded")
    p.add_argument("--max", type=_cap, default=KEEP, metavar="M|none",
                   help="replicas demand may add, at most (none: no cap)")
    p.set_defaults(func=pin)
