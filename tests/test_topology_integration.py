"""Vivaldi across real meshd processes on loopback, with WAN-like RTTs injected per peer.

These machines have no netem, so each agent holds its gossip datagrams to every peer for half
the configured pair RTT (``MESHD_TEST_SEND_DELAY``, a test-only transport hook): a probe and
its ack then take the full RTT.  The nodes sit on a plane with access-link heights, in two
regions; the test waits until the coordinates every agent learned (from acks and from the
gossiped node state) predict the configured RTTs, including for pairs the answering node is
not part of.
"""

from __future__ import annotations

import math
import statistics
import subprocess
import sys
import time
from pathlib import Path

import pytest

from testbed.cluster import ROOT, Cluster, metric_sum

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not sys.platform.startswith("linux"),
                       reason="needs Linux (one loopback address per node)"),
]

# (x, y) in ms, height in ms, region, zone.  RTT = distance + both heights (26-136 ms): long
# enough that the ~1 ms per hop of event-loop timer granularity stays a small fraction.
LAYOUT = [
    ((0.0, 0.0), 2.0, "eu", "eu-a"),
    ((20.0, 0.0), 4.0, "eu", "eu-b"),
    ((0.0, 24.0), 3.0, "eu", "eu-a"),
    ((90.0, 10.0), 2.0, "us", "us-a"),
    ((100.0, 40.0), 6.0, "us", "us-b"),
    ((80.0, 50.0), 2.0, "us", "us-a"),
]
CONVERGE_TIMEOUT = 150.0
MEDIAN_BAR = 0.12
WORST_BAR = 0.5


def true_rtt(i: int, j: int) -> float:
    (pi, hi, _, _), (pj, hj, _, _) = LAYOUT[i], LAYOUT[j]
    return (math.dist(pi, pj) + hi + hj) / 1000.0


def pair_errors(node: object, c: Cluster) -> dict[tuple[str, str], float]:
    """Relative error of ``node``'s estimate for every pair of members."""
    out = {}
    names = c.names
    for i in range(len(names)):
        for j in range(i + 1, len(names)):
            est = node.rtt(names[i], names[j])["estimate"]  # type: ignore[attr-defined]
            if est["source"] != "coordinates":
                out[(names[i], names[j])] = math.inf
                continue
            out[(names[i], names[j])] = abs(est["rtt_seconds"] - true_rtt(i, j)) / true_rtt(i, j)
    return out


def test_coordinates_converge_to_injected_delays(tmp_path: Path) -> None:
    c = Cluster(len(LAYOUT), tmp_path, node_args=lambda i: [
        "--region", LAYOUT[i - 1][2], "--zone", LAYOUT[i - 1][3]])
    try:
        for a, node in enumerate(c.nodes):
            node.env["MESHD_TEST_SEND_DELAY"] = ",".join(
                f"{peer.gossip}={true_rtt(a, b) / 2:.6f}"
                for b, peer in enumerate(c.nodes) if b != a)
        c.start()
        c.wait_converged(75.0)
        observer = c.nodes[0]
        errors: dict[tuple[str, str], float] = {}

        def settled() -> bool:
            nonlocal errors
            errors = pair_errors(observer, c)
            return (statistics.median(errors.values()) <= MEDIAN_BAR
                    and max(errors.values()) <= WORST_BAR)

        start = time.monotonic()
        c.wait_for(settled, CONVERGE_TIMEOUT, "coordinates within bars", interval=2.0,
                   on_timeout=lambda: f"pair errors {errors}")
        took = time.monotonic() - start
        worst = max(errors, key=errors.__getitem__)
        print(f"converged {took:.0f}s after membership; median "
              f"{statistics.median(errors.values()):.3f}, worst {errors[worst]:.3f} {worst}")

        # Every agent, not just the observer, learned every coordinate through the node state.
        for node in c.nodes[1:]:
            errs = pair_errors(node, c)
            assert statistics.median(errs.values()) <= 2 * MEDIAN_BAR, (node.name, errs)

        # The probes really took the injected time: measured medians match the layout, plus up
        # to ~1 ms per hop of event-loop timer granularity and processing.
        for b in range(1, len(LAYOUT)):
            measured = observer.rtt(c.names[b])["measured_rtt_seconds"]
            assert true_rtt(0, b) <= measured <= true_rtt(0, b) * 1.1 + 0.003, (c.names[b],
                                                                               measured)

        # Zone relations come from the labels.
        assert observer.rtt("n1", "n3")["estimate"]["relation"] == "same-zone"
        assert observer.rtt("n1", "n2")["estimate"]["relation"] == "same-region"
        assert observer.rtt("n2", "n5")["estimate"]["relation"] == "cross-region"

        metrics = observer.metrics()
        # Settled: well below the initial 1.5 (the estimate wanders around the true error; it
        # read 0.503 once with every pair within the bars above).
        assert metric_sum(metrics, "meshd_topology_coordinate_error_ratio") < 1.0
        # Estimates were checked against measured RTTs (a handful per probe period; read 10
        # once on a loaded machine, so the bar is "some", not a rate).
        assert metric_sum(metrics, "meshd_topology_rtt_estimate_error_ratio_count") >= 5
        assert metric_sum(metrics, "meshd_topology_known_coordinates") == len(LAYOUT) - 1

        # The operator's view: meshctl rtt and members --detailed.
        ctl = [sys.executable, "-m", "meshd.ctl", "--admin", observer.admin, "--creds",
               str(c.admin_creds)]
        out = subprocess.run([*ctl, "rtt", "n2", "n5"], capture_output=True, text=True,
                             cwd=ROOT, timeout=20)
        assert out.returncode == 0, out.stderr
        assert out.stdout.startswith("Estimated n2 <-> n5 rtt: "), out.stdout
        est_ms = float(out.stdout.split("rtt: ")[1].split(" ms")[0])
        assert est_ms == pytest.approx(true_rtt(1, 4) * 1000, rel=WORST_BAR)
        out = subprocess.run([*ctl, "members", "--detailed"], capture_output=True, text=True,
                             cwd=ROOT, timeout=20)
        assert out.returncode == 0, out.stderr
        header, *rows = out.stdout.splitlines()
        assert header.split()[-3:] == ["COORD-ERR", "HEIGHT", "RTT"]
        assert len(rows) == len(LAYOUT) and all(r.split()[-1] == "ms" for r in rows), rows
        out = subprocess.run([*ctl, "rtt", "nobody"], capture_output=True, text=True,
                             cwd=ROOT, timeout=20)
        assert out.returncode == 2 and "NOT_FOUND" in out.stderr and "nobody" in out.stderr
    finally:
        c.close()
