"""What meshctl prints and reads: aligned tables, JSON renderings of the API's answers, and
the files operators hand it (``-f PATH``, ``-`` for stdin)."""

from __future__ import annotations

import json
import sys

from google.protobuf.json_format import MessageToDict

from gossip.state import MESH_TAG
from proto.mesh.v1 import admin_pb2


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

    The mesh id tag is left out: every member of one mesh has the same (``--format json``
    shows it).
    """
    header: tuple[str, ...] = ("NAME", "ADDRESS", "STATUS", "INC", "AGE", "ROLES", "ZONE",
                               "FLAGS", "TAGS")
    if detailed:
        header += ("COORD-ERR", "HEIGHT", "RTT")
    rows: list[tuple[str, ...]] = [header]
    for m in resp.members:
        row: tuple[str, ...] = (
            ("*" if m.is_local else "") + m.name, m.address, m.status, str(m.incarnation),
            _age(m.status_age_seconds), ",".join(m.roles) or "-",
            "/".join(x for x in (m.region, m.zone) if x) or "-", ",".join(m.flags) or "-",
            ",".join(f"{k}={v}" for k, v in sorted(m.tags.items()) if k != MESH_TAG) or "-")
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


def to_json(resp: object) -> str:
    return json.dumps(MessageToDict(resp, preserving_proto_field_name=True,  # type: ignore[arg-type]
                                    always_print_fields_with_no_presence=True), indent=2)


def read_file_arg(path: str) -> str | None:
    """The text of ``-f PATH`` (``-`` = stdin); None, after saying why, if it cannot be read."""
    try:
        if path == "-":
            return sys.stdin.read()
        with open(path, encoding="utf-8") as fh:
            return fh.read()
    except OSError as exc:
        print(f"meshctl: -f {path}: {exc.strerror}", file=sys.stderr)
        return None
