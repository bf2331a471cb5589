"""SWIM + Lifeguard membership at scale, in the deterministic simulator.

    .venv/bin/python bench/gossip_sim.py [--quick] [--seed N] [--jobs 2]

Every scenario runs ``gossip.Swim`` cores (LAN profile) on ``testbed.sim.network.SimNetwork``: a
virtual clock, 1% random packet loss and 0.5-2 ms latency per packet.  Scenarios:

1. **join convergence** - a converged cluster of N nodes (built with ``Swim.restore``); one new
   node joins through one seed; how long until ceil(0.9999 N) members hold it (a JOIN event).
   Timed from the moment the seed learns of it (the first JOIN anywhere: pure dissemination,
   what Serf's convergence model measures, and what the bar applies to) and from the moment
   the joiner starts.  Rounds = seconds / gossip_interval (0.2 s).  Several joins per cluster,
   one after another, each given time to settle.
2. **failure detection** - kill one node of 1,000; time until the first member and until every
   live member declares it dead (FAILED).  A few kills, one after another.
3. **false positives** - 1,000 nodes for 10 minutes while 5% of them (chosen by seed) stall
   like a SIGSTOPped process: each stalling node cuts its timeline into consecutive windows of
   uniform(10, 20) s and stalls for 2 s once per window, at a uniform offset inside it (about
   13% of its time stalled; its timers do not run and packets to it wait until it resumes).
   A false positive is a FAILED event about a node that was never killed (there are no kills
   here): counted as distinct (observer, victim) pairs and distinct victims.  Lifeguard on
   (``Config.lan()``) vs off (``Config.lan().without_lifeguard()``), same seed, same stalls.
   The issue's stall model cannot tell Lifeguard apart (see the notes it prints), so a second
   anomaly is run the same way: **slow members** - the same 5% handle every packet 15 s late
   while their timers run on time (a CPU-starved process with a receive backlog, Lifeguard's
   "slow member").  They accuse healthy members they cannot hear; counted are false positives
   on members that are *not* slow.
4. **bandwidth** - bytes sent per node per second (UDP + push-pull) at 1,000 nodes: steady
   state without faults, and over the false-positive runs.

Prints one table and writes ``bench/results/gossip_sim.json``.  ``--quick`` runs small sizes
(a smoke check in well under a minute).  Scenarios run in at most ``--jobs`` processes; a
10,000-node cluster takes about 4 GB.
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing
import platform
import random
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# Run as a script, this file's folder comes first on sys.path and a bench module could shadow
# a package of the project (bench/consensus.py): put the project root first instead.
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != ROOT / "bench"]
sys.path.insert(0, str(ROOT))

from bench.table import print_table  # noqa: E402
from gossip.config import Config  # noqa: E402
from gossip.events import EventKind, MemberEvent  # noqa: E402
from gossip.state import Status  # noqa: E402
from gossip.suspicion import suspicion_timeout  # noqa: E402
from testbed.sim.network import SimNetwork  # noqa: E402

LOSS = 0.01
LATENCY = (0.0005, 0.002)
CONVERGED = 0.9999
JOIN_BAR_ROUNDS = 13  # Serf's convergence model at 10,000 nodes
STALL_FRACTION = 0.05
STALL_SECONDS = 2.0
STALL_WINDOW = (10.0, 20.0)
SLOW_DELAY = 15.0  # receive backlog of a slow member: past plain SWIM's 12 s timeout at N=1000


def lan(lifeguard: bool = True) -> Config:
    cfg = Config.lan()
    return cfg if lifeguard else cfg.without_lifeguard()


def detection_bar(cfg: Config, n: int) -> float:
    """Min suspicion timeout + 5 probe intervals (17 s for LAN at 1,000 nodes)."""
    return suspicion_timeout(cfg.suspicion_mult, n, cfg.probe_interval) + 5 * cfg.probe_interval


def _bytes_total(net: SimNetwork, names: list[str]) -> int:
    return sum(net.nodes[n].bytes_sent for n in names)


def _udp_total(net: SimNetwork, names: list[str]) -> int:
    return sum(net.nodes[n].swim.stats.bytes_sent for n in names)


# --- 1. join convergence ---------------------------------------------------------------------

def scenario_join(n: int, trials: int, seed: int) -> dict[str, Any]:
    cfg = lan()
    started = time.perf_counter()
    state: dict[str, Any] = {"joiner": None, "first": None, "known": set()}
    members: set[str] = set()

    def on_event(observer: str, ev: MemberEvent) -> None:
        if ev.kind is EventKind.JOIN and ev.member.name == state["joiner"]:
            if state["first"] is None:
                state["first"] = ev.at
            if observer in members:  # the original N, not earlier joiners
                state["known"].add(observer)

    net = SimNetwork(cfg, seed=seed, loss=LOSS, latency=LATENCY, on_event=on_event)
    names = net.add_cluster(n)
    members.update(names)
    build_s = time.perf_counter() - started
    need = math.ceil(CONVERGED * n)
    rng = random.Random(seed)
    net.run_until(2.0)
    out = []
    for trial in range(trials):
        joiner = f"joiner{trial}"
        seed_node = rng.choice(names)
        state.update(joiner=joiner, first=None, known=set())
        start = net.now
        net.add_node(joiner, join=[seed_node])
        net.run_until(start + 60.0, stop=lambda: len(state["known"]) >= need)
        done = net.now
        reached = len(state["known"])
        first = state["first"] if state["first"] is not None else math.nan
        out.append({
            "joiner": joiner, "seed_node": seed_node, "reached": reached, "needed": need,
            "converged": reached >= need,
            "from_seed_s": done - first, "from_start_s": done - start,
            "from_seed_rounds": (done - first) / cfg.gossip_interval,
            "from_start_rounds": (done - start) / cfg.gossip_interval,
        })
        net.run_until(net.now + 3.0)  # let the joiner's own broadcasts drain before the next
    return {"scenario": "join", "n": n, "trials": out, "build_s": build_s,
            "wall_s": time.perf_counter() - started}


# --- 2. failure detection --------------------------------------------------------------------

def scenario_kill(n: int, kills: int, seed: int, steady: float) -> dict[str, Any]:
    cfg = lan()
    started = time.perf_counter()
    failed: dict[str, dict[str, float]] = {}
    suspected: dict[str, float] = {}
    other_failed: list[tuple[str, str]] = []
    victims: set[str] = set()

    def on_event(observer: str, ev: MemberEvent) -> None:
        if ev.kind is EventKind.SUSPECT and ev.member.name in victims:
            suspected.setdefault(ev.member.name, ev.at)
        elif ev.kind is EventKind.FAILED:
            if ev.member.name in victims:
                failed.setdefault(ev.member.name, {}).setdefault(observer, ev.at)
            else:
                other_failed.append((observer, ev.member.name))

    net = SimNetwork(cfg, seed=seed, loss=LOSS, latency=LATENCY, on_event=on_event)
    names = net.add_cluster(n)
    # Steady state first: bandwidth of a healthy, converged cluster, measured after everyone's
    # first push-pull (30-60 s after start) over one scaled push-pull period.
    warm = min(60.0, steady)
    net.run_until(warm)
    b0, u0 = _bytes_total(net, names), _udp_total(net, names)
    net.run_until(warm + steady)
    b1, u1 = _bytes_total(net, names), _udp_total(net, names)
    bandwidth = {"window_s": steady, "bytes_per_node_s": (b1 - b0) / n / steady,
                 "udp_bytes_per_node_s": (u1 - u0) / n / steady}
    rng = random.Random(seed)
    out = []
    live = set(names)
    for _ in range(kills):
        victim = rng.choice(sorted(live))
        victims.add(victim)
        live.discard(victim)
        killed_at = net.now
        net.kill(victim)
        net.run_until(killed_at + 90.0,
                      stop=lambda v=victim: len(failed.get(v, ())) >= len(live))
        seen = failed.get(victim, {})
        times = sorted(t - killed_at for o, t in seen.items() if o in live)
        out.append({"victim": victim, "detected_by": len(times), "live": len(live),
                    "first_suspicion_s": suspected.get(victim, math.nan) - killed_at,
                    "first_s": times[0] if times else math.nan,
                    "all_s": times[-1] if len(times) == len(live) else math.nan,
                    "median_s": statistics.median(times) if times else math.nan})
        net.run_until(net.now + 5.0)
    return {"scenario": "kill", "n": n, "kills": out, "bar_s": detection_bar(cfg, n),
            "steady": bandwidth, "false_failures": len(other_failed),
            "wall_s": time.perf_counter() - started}


# --- 3. false positives under stalls ---------------------------------------------------------

def stall_schedule(names: list[str], duration: float, seed: int) -> list[tuple[float, str]]:
    rng = random.Random(seed)
    stallers = sorted(rng.sample(names, max(1, round(STALL_FRACTION * len(names)))))
    plan = []
    for name in stallers:
        t = 0.0
        while True:
            window = rng.uniform(*STALL_WINDOW)
            start = t + rng.uniform(0.0, window - STALL_SECONDS)
            if start >= duration:
                break
            plan.append((start, name))
            t += window
    plan.sort()
    return plan


def scenario_stalls(n: int, duration: float, lifeguard: bool, seed: int,
                    anomaly: str = "stall") -> dict[str, Any]:
    cfg = lan(lifeguard)
    started = time.perf_counter()
    kinds: Counter[str] = Counter()
    fp: list[tuple[float, str, str]] = []
    refuters: Counter[str] = Counter()

    def on_event(observer: str, ev: MemberEvent) -> None:
        kinds[ev.kind.value] += 1
        if ev.kind is EventKind.FAILED:
            fp.append((ev.at, observer, ev.member.name))
        elif ev.kind is EventKind.REFUTE:
            refuters[observer] += 1

    net = SimNetwork(cfg, seed=seed, loss=LOSS, latency=LATENCY, on_event=on_event)
    names = net.add_cluster(n)
    if anomaly == "stall":
        plan = stall_schedule(names, duration, seed)
        stallers = {name for _, name in plan}
        for at, name in plan:
            net.at(at, lambda name=name: net.stall(name, STALL_SECONDS))
    else:  # "slow": the same share of members handle every packet SLOW_DELAY late, all along
        stallers = set(random.Random(seed).sample(names, max(1, round(STALL_FRACTION * n))))
        plan = [(0.0, name) for name in sorted(stallers)]
        for name in stallers:
            net.slow(name, SLOW_DELAY)
    settle = 10.0  # bandwidth from here on: past the start-up transient
    net.run_until(settle)
    b0, u0 = _bytes_total(net, names), _udp_total(net, names)
    net.run_until(duration)
    b1, u1 = _bytes_total(net, names), _udp_total(net, names)
    span = duration - settle
    pairs = {(o, v) for _, o, v in fp}
    still_dead = sum(1 for o in names for v in stallers | {v for _, v in pairs}
                     if o != v and net.view(o, v) == Status.DEAD)
    return {
        "scenario": anomaly, "n": n, "duration_s": duration, "lifeguard": lifeguard,
        "stalling_nodes": len(stallers), "stalls": len(plan),
        "false_positive_pairs": len(pairs),
        "false_positive_victims": len({v for _, v in pairs}),
        "false_positive_victims_healthy": len({v for _, v in pairs} - stallers),
        "slow_members": sorted(stallers) if anomaly == "slow" else [],
        "false_positives": [{"at": round(t, 3), "observer": o, "victim": v} for t, o, v in fp],
        "dead_views_at_end": still_dead,
        "refutations": sum(refuters.values()),
        "refutations_by_healthy_nodes": sum(c for o, c in refuters.items() if o not in stallers),
        "events": dict(kinds),
        "bytes_per_node_s": (b1 - b0) / n / span,
        "udp_bytes_per_node_s": (u1 - u0) / n / span,
        "wall_s": time.perf_counter() - started,
    }


# --- driver ----------------------------------------------------------------------------------

def _run(job: tuple[str, Callable[..., dict[str, Any]], dict[str, Any]]) -> tuple[str, dict]:
    key, fn, kwargs = job
    result = fn(**kwargs)
    print(f"  done {key} in {result['wall_s']:.0f} s", file=sys.stderr, flush=True)
    return key, result


def plan_jobs(quick: bool, seed: int) -> list[tuple[str, Callable[..., dict[str, Any]], dict]]:
    if quick:
        big, small, fp_n, fp_t = 1000, 200, 200, 120.0
        return [
            ("stalls_on", scenario_stalls, dict(n=fp_n, duration=fp_t, lifeguard=True,
                                                seed=seed)),
            ("stalls_off", scenario_stalls, dict(n=fp_n, duration=fp_t, lifeguard=False,
                                                 seed=seed)),
            ("slow_on", scenario_stalls, dict(n=fp_n, duration=fp_t, lifeguard=True,
                                              seed=seed, anomaly="slow")),
            ("slow_off", scenario_stalls, dict(n=fp_n, duration=fp_t, lifeguard=False,
                                               seed=seed, anomaly="slow")),
            ("join_small", scenario_join, dict(n=small, trials=3, seed=seed)),
            ("join_big", scenario_join, dict(n=big, trials=2, seed=seed)),
            ("kill", scenario_kill, dict(n=small, kills=3, seed=seed, steady=20.0)),
        ]
    # Longest first, so two workers finish together.
    return [
        ("stalls_on", scenario_stalls, dict(n=1000, duration=600.0, lifeguard=True, seed=seed)),
        ("stalls_off", scenario_stalls, dict(n=1000, duration=600.0, lifeguard=False,
                                             seed=seed)),
        ("slow_on", scenario_stalls, dict(n=1000, duration=600.0, lifeguard=True, seed=seed,
                                          anomaly="slow")),
        ("slow_off", scenario_stalls, dict(n=1000, duration=600.0, lifeguard=False, seed=seed,
                                           anomaly="slow")),
        ("join_big", scenario_join, dict(n=10000, trials=3, seed=seed)),
        ("kill", scenario_kill, dict(n=1000, kills=10, seed=seed, steady=180.0)),
        ("join_small", scenario_join, dict(n=1000, trials=5, seed=seed)),
    ]


def _fmt(x: float, unit: str = "", digits: int = 2) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else \
        f"{x:.{digits}f}{unit}"


def _spread(values: list[float], unit: str = "", digits: int = 2) -> str:
    """median (min-max)"""
    vals = [v for v in values if not math.isnan(v)]
    if not vals:
        return "n/a"
    if len(vals) == 1:
        return _fmt(vals[0], unit, digits)
    return (f"{_fmt(statistics.median(vals), unit, digits)} "
            f"({_fmt(min(vals), '', digits)}-{_fmt(max(vals), '', digits)})")


def build_rows(res: dict[str, dict]) -> list[tuple[str, str, str, str, str]]:
    rows: list[tuple[str, str, str, str, str]] = []
    for key in ("join_small", "join_big"):
        r = res[key]
        tr = r["trials"]
        conv = all(t["converged"] for t in tr)
        rounds = [t["from_seed_rounds"] for t in tr]
        big = r["n"] >= 10000
        bar = f"<= {JOIN_BAR_ROUNDS} rounds" if big else "-"
        ok = ("PASS" if conv and max(rounds) <= JOIN_BAR_ROUNDS else "FAIL") if big else \
            ("ok" if conv else "FAIL")
        n = f"{r['n']:,}"
        rows.append((f"join: 99.99% know it, from seed's JOIN [{len(tr)} joins]", n,
                     _spread(rounds, " rounds", 1) + " = "
                     + _spread([t["from_seed_s"] for t in tr], " s"), bar, ok))
        rows.append(("join: same, from joiner start", n,
                     _spread([t["from_start_rounds"] for t in tr], " rounds", 1) + " = "
                     + _spread([t["from_start_s"] for t in tr], " s"), "-", ""))
    k = res["kill"]
    bar = k["bar_s"]
    first = [x["first_s"] for x in k["kills"]]
    every = [x["all_s"] for x in k["kills"]]
    within = sum(1 for x in every if not math.isnan(x) and x <= bar)
    n = f"{k['n']:,}"
    rows.append((f"failure detection: first suspicion [{len(first)} kills]", n,
                 _spread([x["first_suspicion_s"] for x in k["kills"]], " s"), "-", ""))
    rows.append(("failure detection: first member declares it dead", n,
                 _spread(first, " s"), "-", ""))
    rows.append(("failure detection: all live members", n, _spread(every, " s"),
                 f"<= {bar:g} s", ("PASS" if within == len(every) else "FAIL")
                 + f" ({within}/{len(every)} within)"))
    on, off = res["stalls_on"], res["stalls_off"]
    for r, label in ((on, "on"), (off, "off")):
        desc = (f"false positives, Lifeguard {label} ({r['stalling_nodes']} nodes stalling, "
                f"{r['stalls']} stalls, {r['duration_s'] / 60:g} min)")
        value = (f"{r['false_positive_pairs']} (observer,victim) / "
                 f"{r['false_positive_victims']} victims")
        if label == "on":
            bar, ok = "0", "PASS" if r["false_positive_pairs"] == 0 else "FAIL"
        else:
            bar = "> Lifeguard on"
            if on["false_positive_pairs"] < r["false_positive_pairs"]:
                ok = "PASS"
            elif r["false_positive_pairs"] == 0:
                ok = "NOT SHOWN (both 0)"
            else:
                ok = "FAIL"
        rows.append((desc, f"{r['n']:,}", value, bar, ok))
        rows.append((f"  refutations (by never-stalled nodes), Lifeguard {label}", f"{r['n']:,}",
                     f"{r['refutations']} ({r['refutations_by_healthy_nodes']})", "-", ""))
    counts = {}
    slow_runs = [(res[k], label) for k, label in (("slow_on", "on"), ("slow_off", "off"))
                 if k in res]
    for r, label in slow_runs if len(slow_runs) == 2 else []:
        slow = set(r["slow_members"])
        healthy = [p for p in r["false_positives"] if p["victim"] not in slow]
        pairs = {(p["observer"], p["victim"]) for p in healthy}
        by_healthy = {(o, v) for o, v in pairs if o not in slow}
        counts[label] = len(pairs)
        desc = (f"healthy members declared dead, Lifeguard {label} ({r['stalling_nodes']} slow "
                f"members, {SLOW_DELAY:g} s receive backlog, {r['duration_s'] / 60:g} min)")
        value = (f"{len(pairs)} (observer,victim), {len(by_healthy)} by healthy observers / "
                 f"{len({v for _, v in pairs})} victims")
        if label == "on":
            rows.append((desc, f"{r['n']:,}", value, "-", ""))
        else:
            ratio = counts["off"] / max(1, counts["on"])
            ok = ("PASS" if counts["on"] < counts["off"] else "FAIL") + f" ({ratio:.0f}x fewer)"
            rows.append((desc, f"{r['n']:,}", value, "on < off", ok))
    steady = k["steady"]
    rows.append(("bytes sent / node / s, steady state (UDP only)", n,
                 f"{steady['bytes_per_node_s']:.0f} ({steady['udp_bytes_per_node_s']:.0f})",
                 "-", ""))
    for r, label in ((on, "on"), (off, "off")):
        rows.append((f"bytes sent / node / s, stalls, Lifeguard {label} (UDP only)",
                     f"{r['n']:,}",
                     f"{r['bytes_per_node_s']:.0f} ({r['udp_bytes_per_node_s']:.0f})", "-", ""))
    return rows


def build_notes(res: dict[str, dict]) -> list[str]:
    cfg = lan()
    notes = []
    k = res["kill"]
    waits = [x["first_suspicion_s"] for x in k["kills"]]
    notes.append(
        "Detection time = first suspicion + minimum suspicion timeout (confirmed suspicions "
        "shrink to it) + dissemination of the death.  The first suspicion waits for some "
        "member's randomized round-robin probe to hit the dead node and fail (one probe "
        "interval later): roughly exponential with a mean of one probe interval whatever N, so "
        f"an 'all within' bar is missed in the tail (here first suspicion "
        f"{_spread(waits, ' s')}).")
    on, off = res["stalls_on"], res["stalls_off"]
    if on["false_positive_pairs"] == 0 and off["false_positive_pairs"] == 0:
        notes.append(
            "No false positives with or without Lifeguard: a stalled node is suspected by whoever "
            "probes it during the stall, reads its backlog on resume and refutes within a few "
            "gossip rounds, far inside even plain SWIM's fixed minimum suspicion timeout "
            f"({suspicion_timeout(cfg.suspicion_mult, on['n'], cfg.probe_interval):g} s at "
            f"{on['n']:,} nodes).  Lifeguard's edge (a suspicion few members confirm waits "
            "longer; an unhealthy prober slows down) needs lone or sick accusers, which this "
            "stall model does not produce.")
    notes.append(
        "Slow members (every packet handled 15 s late, timers on time) cannot hear acks, so they "
        "accuse healthy members, and cannot hear the refutations before a fixed 12 s suspicion "
        "timeout ends: without Lifeguard they declare healthy members dead in their own view. "
        "With Lifeguard their health score slows their probing and a lone suspicion waits up to "
        "6x longer for independent confirmations; what remains are slow members confirming "
        "each other's suspicions.")
    return notes


HEAD = ("scenario", "N", "measured: median (min-max)", "bar", "")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--quick", action="store_true", help="small sizes, a smoke check")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--jobs", type=int, default=2, help="worker processes (at most 2 advised)")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "gossip_sim.json")
    ap.add_argument("--only", default="",
                    help="comma-separated scenario keys to (re)run, merged into --out's results "
                         "(e.g. slow_on,slow_off)")
    ap.add_argument("--fp-minutes", type=float, default=0.0,
                    help="simulated minutes of the false-positive scenarios (default 10; quick 2)")
    ap.add_argument("--slow-nodes", type=int, default=0,
                    help="members in the slow-member scenarios (default 1,000; its cost grows "
                         "with N squared: every false accusation spreads to every member)")
    args = ap.parse_args(argv)
    jobs = plan_jobs(args.quick, args.seed)
    if args.slow_nodes:
        for key, _fn, kwargs in jobs:
            if key.startswith("slow_"):
                kwargs["n"] = args.slow_nodes
    if args.fp_minutes:
        for key, _fn, kwargs in jobs:
            if key.startswith(("stalls_", "slow_")):
                kwargs["duration"] = args.fp_minutes * 60.0
    previous: dict[str, dict] = {}
    if args.only:
        wanted = set(args.only.split(","))
        unknown = wanted - {key for key, _, _ in jobs}
        if unknown:
            ap.error(f"--only: unknown scenario(s) {sorted(unknown)}")
        jobs = [job for job in jobs if job[0] in wanted]
        if args.out.exists():
            previous = json.loads(args.out.read_text()).get("results", {})
    started = time.perf_counter()
    print(f"gossip_sim: {len(jobs)} scenarios in {args.jobs} processes"
          f"{' (quick)' if args.quick else ''}, seed {args.seed}", file=sys.stderr)
    results: dict[str, dict] = dict(previous)
    if args.jobs <= 1:
        for job in jobs:
            key, r = _run(job)
            results[key] = r
    else:
        ctx = multiprocessing.get_context("fork")
        with ctx.Pool(args.jobs, maxtasksperchild=1) as pool:
            for key, r in pool.imap_unordered(_run, jobs):
                results[key] = r
    wall = time.perf_counter() - started
    rows = build_rows(results)
    cfg = Config.lan()
    print(f"\nSWIM + Lifeguard membership, simulated: LAN profile, {LOSS:.0%} loss, "
          f"{LATENCY[0] * 1e3:g}-{LATENCY[1] * 1e3:g} ms latency, seed {args.seed}"
          f"{', QUICK sizes' if args.quick else ''}")
    print(f"(round = gossip_interval {cfg.gossip_interval} s; join bar applies to the "
          f"from-seed time, i.e. dissemination)\n")
    print_table(HEAD, rows)
    notes = build_notes(results)
    for note in notes:
        print(f"\n* {note}")
    print(f"\nwall time {wall:.0f} s")
    report = {
        "benchmark": "gossip_sim", "quick": args.quick, "seed": args.seed,
        "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "python": platform.python_version(), "machine": platform.machine(),
        "wall_s": wall,
        "setup": {"profile": "lan", "loss": LOSS, "latency_s": list(LATENCY),
                  "converged_fraction": CONVERGED, "gossip_interval_s": cfg.gossip_interval,
                  "join_bar_rounds": JOIN_BAR_ROUNDS,
                  "stall_model": {"fraction": STALL_FRACTION, "stall_s": STALL_SECONDS,
                                  "window_s": list(STALL_WINDOW),
                                  "rule": "one stall per consecutive uniform window, uniform "
                                          "offset; SIGSTOP semantics (timers frozen, packets "
                                          "buffered until resume)"}},
        "table": [dict(zip(("scenario", "n", "measured", "bar", "verdict"), r, strict=True))
                  for r in rows],
        "notes": notes,
        "results": results,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1, sort_keys=False, default=str) + "\n")
    print(f"wrote {args.out.relative_to(ROOT) if args.out.is_relative_to(ROOT) else args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
