"""32 real meshd processes on loopback: join, failure detection, memory and CPU at idle.

    .venv/bin/python bench/gossip_procs.py [--nodes 32] [--idle 30] [--out PATH]

Uses the integration-test harness (``testbed/cluster.py``): node ``i`` runs on 127.0.0.(i+1)
(Linux) with a free port triple, LAN profile, plaintext gossip, one seed.

1. **join** - the seed starts; once it serves, the other N-1 start at once (``--join seed
   --retry-join``).  Converged = every node's admin API lists all N members alive (polled).
   The time each node completed its table is taken from its JSON log (the last ``member_join``
   it needed), so the numbers do not depend on the polling rate; reported from the seed's start,
   from the last process start, and from the last ``agent_started`` log line (what is left once
   Python start-up, slow with N processes importing on few cores, is taken out).
2. **idle** - with the mesh converged and nothing polling it, resident memory (VmRSS, or psutil
   off Linux) and CPU (utime+stime from /proc/PID/stat) of every agent over ``--idle`` seconds,
   as a percentage of one core.
3. **failure detection** - ``kill -9`` of one node; from the kill to the first and to the last
   survivor logging ``member_failed`` for it (log timestamps, ms resolution).  ``--kills``
   nodes are killed one after another (each once the previous one is dead everywhere), since
   one kill is a noisy sample: it depends on how soon random probes hit the dead node.

Bars: detection by all <= 11 s (every kill); idle agent <= 80 MB RSS and <= 2% of one core.
Prints one table and writes ``bench/results/gossip_procs.json``.

``--full`` runs the full agent: every node with the router, trainer, gpu (CPU-only here: no
NVML) and edge roles, the first three also coordinators running the Raft groups.  The idle
figures are then the agent processes' (the bars), with its children (the router's worker
processes) reported beside them.  It writes ``gossip_procs_full.json`` by default.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# Run as a script, this file's folder comes first on sys.path and a bench module could shadow
# a package of the project (bench/consensus.py): put the project root first instead.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from bench.table import print_table  # noqa: E402
from testbed.cluster import Cluster, Node  # noqa: E402

DETECT_BAR_S = 11.0
RSS_BAR_MB = 80.0
CPU_BAR_PCT = 2.0


def log_time(entry: dict[str, Any]) -> float:
    """Epoch seconds of a JSON log line's ``ts`` (``2026-01-02T03:04:05.678Z``)."""
    ts = str(entry["ts"]).replace("Z", "+00:00")
    return datetime.fromisoformat(ts).timestamp()


# --- per-process resource use ---------------------------------------------------------------


def rss_mb(pid: int) -> float | None:
    try:
        with open(f"/proc/{pid}/status") as fh:
            for line in fh:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    try:
        import psutil  # type: ignore[import-untyped]

        return float(psutil.Process(pid).memory_info().rss) / (1 << 20)
    except Exception:  # noqa: BLE001 - psutil missing or the process gone
        return None


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds the process has used so far."""
    try:
        with open(f"/proc/{pid}/stat") as fh:
            fields = fh.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        pass
    try:
        import psutil

        t = psutil.Process(pid).cpu_times()
        return float(t.user + t.system)
    except Exception:  # noqa: BLE001
        return None


def children(pid: int) -> list[int]:
    """The live processes whose parent is ``pid`` (Linux: /proc; elsewhere none)."""
    out = []
    try:
        entries = os.listdir("/proc")
    except OSError:
        return out
    for entry in entries:
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as fh:
                    fields = fh.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid and fields[0] != "Z":
                out.append(int(entry))
    return out


def measure_idle(nodes: list[Node], seconds: float) -> dict[str, Any]:
    kids = {n.name: children(n.pid) for n in nodes}
    before = {n.name: cpu_seconds(n.pid) for n in nodes}
    kids_before = {n.name: sum(cpu_seconds(k) or 0.0 for k in kids[n.name]) for n in nodes}
    t0 = time.monotonic()
    time.sleep(seconds)
    wall = time.monotonic() - t0
    kids_cpu = {n.name: 100.0 * (sum(cpu_seconds(k) or 0.0 for k in kids[n.name])
                                 - kids_before[n.name]) / wall for n in nodes if kids[n.name]}
    kids_rss = {n.name: sum(rss_mb(k) or 0.0 for k in kids[n.name]) for n in nodes
                if kids[n.name]}
    cpu: dict[str, float] = {}
    for n in nodes:
        after = cpu_seconds(n.pid)
        if after is not None and before[n.name] is not None:
            cpu[n.name] = 100.0 * (after - before[n.name]) / wall  # type: ignore[operator]
    rss = {n.name: r for n in nodes if (r := rss_mb(n.pid)) is not None}
    threads = {}
    for n in nodes:
        try:
            threads[n.name] = len(os.listdir(f"/proc/{n.pid}/task"))
        except OSError:
            pass
    return {"seconds": wall, "cpu_pct": cpu, "rss_mb": rss, "threads": threads,
            "children_cpu_pct": kids_cpu, "children_rss_mb": kids_rss}


# --- scenarios --------------------------------------------------------------------------------


def join_times(c: Cluster, t_first: float, t_last: float) -> dict[str, Any]:
    """When each node's table was complete, from its log."""
    names = set(c.names)
    done: dict[str, float] = {}
    for n in c.nodes:
        first_seen: dict[str, float] = {}
        for e in n.events("member_join"):
            first_seen.setdefault(e["member"], log_time(e))
        missing = names - {n.name} - set(first_seen)
        if missing:
            raise RuntimeError(f"{n.name} never logged a join of {sorted(missing)}")
        done[n.name] = max(first_seen.values(), default=t_first)
    converged = max(done.values())
    # Python start-up on a loaded machine is most of the time from process start; the last
    # agent to bind its sockets (``agent_started``) is where the protocol's own work begins.
    ready = max(log_time(n.events("agent_started")[0]) for n in c.nodes)
    return {"from_first_start_s": converged - t_first, "from_last_start_s": converged - t_last,
            "from_last_agent_started_s": converged - ready,
            "last_agent_started_after_s": ready - t_first,
            "last_node": max(done, key=lambda k: done[k]),
            "per_node_from_first_start_s": {k: v - t_first for k, v in sorted(done.items())}}


def detect_times(c: Cluster, victim: Node, killed_at: float, timeout: float) -> dict[str, Any]:
    survivors = [n for n in c.nodes if n.running]
    deadline = time.monotonic() + timeout
    seen: dict[str, float] = {}
    while time.monotonic() < deadline:
        for n in survivors:
            if n.name not in seen:
                ev = [e for e in n.events("member_failed") if e.get("member") == victim.name]
                if ev:
                    seen[n.name] = log_time(ev[0]) - killed_at
        if len(seen) == len(survivors):
            break
        time.sleep(0.2)
    return {"first_s": min(seen.values()) if seen else None,
            "all_s": max(seen.values()) if len(seen) == len(survivors) else None,
            "median_s": statistics.median(seen.values()) if seen else None,
            "marked_dead_by": len(seen), "survivors": len(survivors)}


FULL_ROLES = ["--role", "router", "--role", "trainer", "--role", "gpu", "--role", "edge"]
COORDINATORS = 3


def run(n_nodes: int, idle_s: float, kills: int, workdir: Path,
        full: bool = False) -> dict[str, Any]:
    node_args = None
    if full:
        from testbed.cluster import node_ip
        from testbed.raft import coordinator_args, pick_raft_port

        raft = pick_raft_port([node_ip(i) for i in range(1, n_nodes + 1)])

        def node_args(i: int) -> list[str]:
            coord = coordinator_args(i, raft, COORDINATORS) if i <= COORDINATORS else []
            return FULL_ROLES + coord
    c = Cluster(n_nodes, workdir, profile="lan", node_args=node_args)
    try:
        print(f"starting {n_nodes} meshd processes (logs under {workdir})", file=sys.stderr,
              flush=True)
        t_first = time.time()
        c.start()
        t_last = time.time()
        polled = c.wait_converged(120)
        join = join_times(c, t_first, t_last)
        join["polled_from_last_start_s"] = polled
        print(f"converged {join['from_first_start_s']:.2f} s after the first start; idle "
              f"for {idle_s:.0f} s", file=sys.stderr, flush=True)
        time.sleep(2)  # let the join traffic settle
        idle = measure_idle(c.nodes, idle_s)
        detect = []
        for k in range(kills):
            victim = c.nodes[(n_nodes // 2 + 3 * k) % n_nodes]  # never a coordinator
            killed_at = time.time()
            victim.kill()
            d = detect_times(c, victim, killed_at, 60)
            detect.append({"victim": victim.name, **d})
            print(f"kill -9 {victim.name}: first {fmt(d['first_s'], 's')}, all "
                  f"{fmt(d['all_s'], 's')}", file=sys.stderr, flush=True)
            time.sleep(2)
        killed = {d["victim"] for d in detect}
        deaths = [(e["node"], e["member"]) for e in c.events("member_failed")]
        false_deaths = sorted({f"{o}->{m}" for o, m in deaths if m not in killed})
        return {"join": join, "idle": idle, "detect": detect, "false_deaths": false_deaths}
    finally:
        c.close()


def fmt(v: float | None, unit: str, digits: int = 2) -> str:
    return "-" if v is None else f"{v:.{digits}f} {unit}"


def build_rows(n: int, r: dict[str, Any]) -> list[tuple[str, str, str, str]]:
    join, idle, dets = r["join"], r["idle"], r["detect"]
    rss = list(idle["rss_mb"].values())
    cpu = list(idle["cpu_pct"].values())
    rows: list[tuple[str, str, str, str]] = [
        (f"join: all {n} see {n} alive, from first start",
         fmt(join["from_first_start_s"], "s"), "-", ""),
        ("join: same, from last process start", fmt(join["from_last_start_s"], "s"), "-", ""),
        ("join: same, from last agent_started (sockets bound)",
         fmt(join["from_last_agent_started_s"], "s"), "-", ""),
    ]

    def verdict(ok: bool | None) -> str:
        return "-" if ok is None else "ok" if ok else "FAIL"

    def spread(key: str) -> str:
        vals = [d[key] for d in dets]
        if any(v is None for v in vals):
            return "not all detected"
        return f"{statistics.median(vals):.2f} s ({min(vals):.2f}-{max(vals):.2f})"

    k = len(dets)
    rows.append((f"detect kill -9, first member: median (range) of {k}", spread("first_s"),
                 "-", ""))
    everyone = all(d["all_s"] is not None for d in dets)
    rows.append((f"detect kill -9, all {dets[0]['survivors']}..{dets[-1]['survivors']} "
                 f"survivors: median (range) of {k}", spread("all_s"),
                 f"<= {DETECT_BAR_S:.0f} s",
                 verdict(everyone and max(d["all_s"] for d in dets) <= DETECT_BAR_S)))
    if rss:
        rows.append((f"idle RSS per agent: mean (max) over {len(rss)}",
                     f"{statistics.mean(rss):.1f} MB ({max(rss):.1f})", f"<= {RSS_BAR_MB:.0f} MB",
                     verdict(max(rss) <= RSS_BAR_MB)))
    else:
        rows.append(("idle RSS per agent", "unavailable", f"<= {RSS_BAR_MB:.0f} MB", "-"))
    if cpu:
        rows.append((f"idle CPU per agent, % of a core over {idle['seconds']:.0f} s: mean (max)",
                     f"{statistics.mean(cpu):.2f} % ({max(cpu):.2f})", f"<= {CPU_BAR_PCT:.0f} %",
                     verdict(max(cpu) <= CPU_BAR_PCT)))
    else:
        rows.append(("idle CPU per agent", "unavailable", f"<= {CPU_BAR_PCT:.0f} %", "-"))
    kids_rss = list(idle.get("children_rss_mb", {}).values())
    kids_cpu = list(idle.get("children_cpu_pct", {}).values())
    if kids_rss:
        rows.append((f"  its children (router workers): RSS mean (max) over {len(kids_rss)}",
                     f"{statistics.mean(kids_rss):.1f} MB ({max(kids_rss):.1f})", "-", ""))
        rows.append(("  its children: CPU, % of a core: mean (max)",
                     f"{statistics.mean(kids_cpu):.2f} % ({max(kids_cpu):.2f})", "-", ""))
    rows.append(("false deaths (members other than the killed ones)",
                 str(len(r["false_deaths"])), "0", verdict(not r["false_deaths"])))
    return rows


HEAD = ("scenario", "measured", "bar", "verdict")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="gossip_procs", description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=32)
    ap.add_argument("--idle", type=float, default=30.0, help="idle measurement, seconds")
    ap.add_argument("--kills", type=int, default=3, help="nodes killed one after another")
    ap.add_argument("--out", type=Path, default=None,
                    help="default bench/results/gossip_procs.json (gossip_procs_full.json)")
    ap.add_argument("--full", action="store_true",
                    help="every role on (coordinators on the first three): the full agent")
    ap.add_argument("--keep-logs", action="store_true", help="keep the agents' logs")
    args = ap.parse_args(argv)
    if not 2 <= args.nodes <= 250:
        ap.error("--nodes must be 2..250")
    if not 1 <= args.kills <= args.nodes - 2:
        ap.error("--kills must be 1..nodes-2")
    if args.full and args.nodes < 8:
        ap.error("--full needs at least 8 nodes (3 coordinators, kills elsewhere)")
    if args.out is None:
        name = "gossip_procs_full.json" if args.full else "gossip_procs.json"
        args.out = ROOT / "bench" / "results" / name
    wall0 = time.monotonic()
    workdir = Path(tempfile.mkdtemp(prefix="gossip-procs-"))
    r = run(args.nodes, args.idle, args.kills, workdir, full=args.full)
    wall = time.monotonic() - wall0
    rows = build_rows(args.nodes, r)
    print(f"\n{args.nodes} real meshd processes on loopback, LAN profile"
          f"{', every role on' if args.full else ''} "
          f"({os.cpu_count()} CPUs, Python {platform.python_version()})")
    print_table(HEAD, rows)
    print(f"\nwall time {wall:.0f} s")
    report = {
        "benchmark": "gossip_procs",
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "wall_s": wall,
        "setup": {"nodes": args.nodes, "profile": "lan", "idle_s": args.idle, "full": args.full,
                  "kills": args.kills,
                  "bars": {"detect_all_s": DETECT_BAR_S, "rss_mb": RSS_BAR_MB,
                           "cpu_pct_of_core": CPU_BAR_PCT}},
        "table": [dict(zip(("scenario", "measured", "bar", "verdict"), row, strict=True))
                  for row in rows],
        "results": r,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    tmp = args.out.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(report, indent=1, default=str) + "\n")
    os.replace(tmp, args.out)
    print(f"wrote {args.out.relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out}")
    if not args.keep_logs:
        import shutil

        shutil.rmtree(workdir, ignore_errors=True)
    return 1 if any(row[3] == "FAIL" for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
