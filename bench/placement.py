"""Placement decision time for a 1,000-GPU fleet (issue bar: <= 5 ms).

    .venv/bin/python bench/placement.py [--gpus 1000] [--per-node 8] [--calls 300]

A fleet of ``--gpus`` GPUs, ``--per-node`` per node, over 4 zones, with random free memory,
inference load, leased backlog and GPU types (A100 / L4 / T4), 10% of nodes excluded and 20%
of GPUs busy, as a coordinator's scheduler would see it.  Each case times
:func:`meshd.train.placement.rank` end to end (filtering, costing, gang forming, ring order)
over ``--calls`` calls with ``time.perf_counter_ns``; the table gives p50/p99/max.  The
gangs (``nodes``: exactly that many nodes, an equal share on each; one case on a fleet
with 2 free GPUs per node) also choose their node sets and rings from Vivaldi-like
coordinates through the scheduler's own RTT path (Vivaldi estimates with zone labels; rings
of more than 7 nodes by nearest-neighbour tours and 2-opt).  Writes
``bench/results/placement.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
import time
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from bench.table import (  # noqa: E402
    distribution,
    format_table,
    git_state,
    machine_info,
    print_table,
    verdict,
)
from meshd.train.links import link_rows, link_rtt  # noqa: E402
from meshd.train.placement import GpuSlot, Needs, Rtt, RttRows, rank  # noqa: E402
from topology.coordinate import Coordinate  # noqa: E402
from topology.estimate import estimate, rtt_rows  # noqa: E402
from topology.zones import Place, relation  # noqa: E402

BAR_MS = 5.0
TYPES = (("A100", 80_000), ("L4", 24_000), ("T4", 16_000))


def build(gpus: int, per_node: int, rng: random.Random, spread: bool = False
          ) -> tuple[list[GpuSlot], set[str], set[tuple[str, str]], dict[str, tuple]]:
    slots, coords = [], {}
    for n in range(math.ceil(gpus / per_node)):
        node = f"node-{n:04d}"
        kind, total = TYPES[n % len(TYPES)] if not spread else TYPES[2]
        zone = f"z{n % 4}"
        coords[node] = (rng.gauss(n % 4 * 20, 3), rng.gauss(0, 3))
        for g in range(min(per_node, gpus - n * per_node)):
            slots.append(GpuSlot(node, f"GPU-{n:04d}-{g}", kind, total,
                                 rng.choice([total, total // 2, total // 4]), zone,
                                 backlog_s=rng.choice([0.0, 0.0, 300.0, 3600.0]),
                                 inference_load=rng.random()))
    nodes = sorted(coords)
    excluded = set(rng.sample(nodes, len(nodes) // 10))
    busy = {(s.node, s.gpu) for s in slots if rng.random() < 0.2}
    if spread:  # leave two free GPUs per node, so no node can hold a 16-GPU gang
        busy = {(s.node, s.gpu) for s in slots if not s.gpu.endswith(("-0", "-1"))}
    return slots, excluded, busy, coords


def vivaldi_rtt(coords: dict[str, tuple]) -> tuple[Rtt, RttRows]:
    """The scheduler's own RTT path (``TrainService.rtt``): Vivaldi estimates between settled
    8-dimensional coordinates, with zone labels, under the collective-timing feedback; pair
    by pair and all pairs at once."""
    coord = {n: Coordinate((x / 1000, y / 1000, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0), 0.05, 0.0,
                           1e-5) for n, (x, y) in coords.items()}
    place = {n: Place(f"z{int(n[-4:]) % 4}", "r1") for n in coords}

    def est(a: str, b: str) -> float | None:
        return estimate(coord[a], coord[b], relation(place[a], place[b], a == b)).rtt

    def rows(names: Sequence[str]) -> list[list[float | None]]:
        return rtt_rows([coord[n] for n in names], [place[n] for n in names])
    return link_rtt(est, {}), link_rows(rows, {})


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--gpus", type=int, default=1000)
    ap.add_argument("--per-node", type=int, default=8)
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "placement.json")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    cases = [
        ("1 GPU, any type", Needs(1, 600.0), False),
        ("1 GPU, A100 >= 40 GB", Needs(1, 600.0, 40_000, "A100"), False),
        ("4-GPU gang, one node", Needs(4, 600.0, 8_000), False),
        ("8-GPU gang, one node", Needs(8, 600.0), False),
        ("16-GPU gang on 8 nodes, 2 free GPUs each", Needs(16, 600.0, 4_000, nodes=8), True),
        ("16-GPU gang on exactly 4 nodes", Needs(16, 600.0, 4_000, nodes=4), False),
        ("32-GPU gang on exactly 16 nodes", Needs(32, 600.0, nodes=16), False),
    ]
    rows, results = [], {}
    worst = 0.0
    for name, needs, spread in cases:
        slots, excluded, busy, coords = build(args.gpus, args.per_node, rng, spread)

        rtt, all_pairs = vivaldi_rtt(coords)

        took, found = [], 0
        for _ in range(args.calls):
            t0 = time.perf_counter_ns()
            got = rank(needs, slots, excluded_nodes=excluded, busy=busy, rtt=rtt,
                       rtt_rows=all_pairs)
            took.append((time.perf_counter_ns() - t0) / 1e6)
            found = len(got)
        d = distribution(took)
        worst = max(worst, d["p99"])
        results[name] = {"ms": d, "candidates": found, "gpus": len(slots)}
        rows.append([name, str(len(slots)), str(found), f"{d['p50']:.2f}", f"{d['p99']:.2f}",
                     f"{d['max']:.2f}", verdict(d["p99"] <= BAR_MS)])
    head = ["case", "GPUs", "candidates", "p50 ms", "p99 ms", "max ms", f"p99 <= {BAR_MS:g} ms"]
    title = f"Placement decision time ({args.gpus} GPUs, {args.per_node} per node)"
    print(f"\n{title}\n")
    print_table(head, rows)
    report = {"benchmark": "placement", "argv": sys.argv,
              "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **machine_info(),
              "git": git_state(), "setup": {k: str(v) for k, v in vars(args).items()},
              "table": [dict(zip(head, r, strict=True)) for r in rows], "results": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(
        f"# {title}\n\n{format_table(head, rows)}\n\ncommit "
        f"{report['git']['commit'][:12]}, {report['when']}\n")
    return 0 if worst <= BAR_MS else 1


if __name__ == "__main__":
    sys.exit(main())
