"""Does a node that keeps being suspected, and keeps refuting, survive?  In the simulator.

    .venv/bin/python bench/gossip_refute.py [--quick] [--runs 1000] [--jobs 2]

``tests/test_integration.py`` SIGSTOPs one node of 8 for 0.3 s of every 1 s (20 s), then for
1.5 s of every 2.5 s (15 s).  The long stops outlast a probe, so the node is suspected and
refutes every few seconds.  A member that misses one refutation keeps its timer and declares the
node dead.  CI saw that once, as one member declaring the stopped node dead.

This runs the same pattern on ``testbed.sim.network.SimNetwork`` (LAN profile, 0.5-2 ms latency),
``--runs`` seeds for each cluster size and loss rate, and counts the runs in which anybody
declared the node dead.  It also reports the UDP bytes each member sent per second, which is
what sending each broadcast more often in small clusters costs.  Writes
``bench/results/gossip_refute.json`` and its ``.md``.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from bench.table import publish  # noqa: E402
from gossip.broadcast import retransmit_limit  # noqa: E402
from gossip.config import Config  # noqa: E402
from gossip.events import EventKind, MemberEvent  # noqa: E402
from testbed.sim.network import STARVE_PHASES, SimNetwork  # noqa: E402

SIZES = (5, 8, 9, 16)
LOSSES = (0.0, 0.02)
HEAD = ("members", "packet loss", "sends per broadcast", "runs", "runs with a death",
        "deaths (observer, victim)", "UDP bytes/member/s")


def one_run(args: tuple[int, float, int]) -> tuple[int, float]:
    """(members that declared the stopped node dead, UDP bytes per member per second)."""
    n, loss, seed = args
    failed: set[str] = set()

    def on_event(observer: str, ev: MemberEvent) -> None:
        if ev.kind is EventKind.FAILED:
            failed.add(observer)

    net = SimNetwork(Config.lan(), seed=seed, loss=loss, on_event=on_event)
    names = net.add_cluster(n)
    net.run_until(5.0)
    start = net.now
    net.run_until(net.stall_in_bursts(names[n // 2], STARVE_PHASES) + 10.0)
    sent = sum(net.nodes[m].swim.stats.bytes_sent for m in names)
    return len(failed), sent / n / (net.now - start)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="100 runs per row")
    ap.add_argument("--runs", type=int, default=1000, help="seeds per cluster size and loss")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "gossip_refute.json")
    args = ap.parse_args(argv)
    runs = 100 if args.quick else args.runs
    started = time.perf_counter()
    rows: list[tuple[str, ...]] = []
    results: dict[str, Any] = {}
    with multiprocessing.Pool(args.jobs) as pool:
        for n in SIZES:
            for loss in LOSSES:
                out = pool.map(one_run, [(n, loss, seed) for seed in range(runs)], chunksize=20)
                bad = sum(1 for deaths, _ in out if deaths)
                pairs = sum(deaths for deaths, _ in out)
                rate = sum(b for _, b in out) / len(out)
                results[f"{n}/{loss}"] = {"runs": runs, "runs_with_death": bad, "deaths": pairs,
                                          "udp_bytes_per_member_s": rate}
                rows.append((str(n), f"{loss:.0%}", str(retransmit_limit(4, n)), str(runs),
                             f"{bad} ({bad / runs:.1%})", str(pairs), f"{rate:.0f}"))
    publish(args.out, "gossip_refute", "A node stopped in bursts: declared dead?", HEAD, rows,
            started, args.quick, {"phases": STARVE_PHASES, "profile": "lan", "runs": runs},
            results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
