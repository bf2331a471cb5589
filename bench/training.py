"""Training scheduler on real processes: submit-to-running, failover, and fencing under faults.

    .venv/bin/python bench/training.py [--quick] [--only submit,failover,gang,faults]

A local mesh of real meshd processes (``testbed/cluster.py``): 3 coordinators (n1-n3, which
run the ``placements`` Raft group and its scheduler) and ``--trainers`` CPU trainers (4;
``--role trainer --gpu off --tag train_slots=2``).  Every job is the canary
(:mod:`meshd.train.canary`): it appends a wall-clock heartbeat every 20 ms to a file named
by its lease token, so when each copy of a job really ran is read from its own record,
not from the scheduler's view.

* ``submit`` - ``--submits`` jobs (30; quick 8), one at a time on an idle mesh, through a
  rotating node (a coordinator, a trainer).  Measured from the ``SubmitJob`` call to the
  job's first heartbeat (its process running).  Bar: <= 1 s (max).
* ``failover`` - one long job at a time; its trainer's meshd is SIGKILLed (the job dies with
  it) and restarted afterwards.  Measured from the kill to the first heartbeat of the copy
  that replaced it.  ``--kills`` times (10; quick 3).  Bar: <= lease TTL + 2 s (max).
* ``gang`` - the same with a job over 2 nodes (``gpus.nodes: 2``, one canary rank on each):
  the trainer of rank 0, then of rank 1, in turn, is SIGKILLed.  Measured from the kill to
  the start of the later of the two ranks of the next attempt (the surviving rank is told to
  stop by its next renewal once the killed rank's part lapses).  Bar: <= TTL + 2 s (max),
  and no overlap in the canary audit.
* ``faults`` - under load (a 5 s job submitted every ``--every`` s, 8 slots), ``--faults``
  injected failures (100; quick 12), in turn: a trainer SIGKILLed (restarted 1 s later), a
  trainer frozen with SIGSTOP for TTL + 2 s (its job must be stopped by the watchdog, not by
  the frozen trainer) then SIGCONT, and the placements group's leader SIGKILLed (restarted
  3 s later).  Afterwards every job must end ``done`` and the canary audit
  (:func:`meshd.train.canary.audit`) must find no two runs of one job, and no two jobs on one
  slot, alive at the same time.  Bar: zero double ownership.  Also reported: per failure
  type, the time from the injection to the first heartbeat of the replacement copy of each
  job the victim was running.

Prints the tables and writes ``bench/results/training.{json,md}``.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

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
from meshd.train.canary import Run, audit, runs  # noqa: E402
from meshd.train.scheduler import TTL  # noqa: E402
from proto.mesh.v1 import admin_pb2  # noqa: E402

SUBMIT_BAR_S = 1.0
FAILOVER_BAR_S = TTL + 2.0
SLOTS_PER_TRAINER = 2


class Bench:
    """The mesh, an admin client, and the jobs' record directory."""

    def __init__(self, workdir: Path, trainers: int) -> None:
        from testbed.cluster import Cluster, node_ip
        from testbed.raft import coordinator_args, pick_raft_port

        self.records = workdir / "records"
        n = 3 + trainers
        port = pick_raft_port([node_ip(i) for i in range(1, n + 1)])

        def args(i: int) -> list[str]:
            if i <= 3:
                return coordinator_args(i, port, 3)
            return ["--role", "trainer", "--gpu", "off", "--tag",
                    f"train_slots={SLOTS_PER_TRAINER}"]

        self.c = Cluster(n, workdir / "mesh", node_args=args)
        self.coordinators = self.c.nodes[:3]
        self.trainers = self.c.nodes[3:]
        self.c.start()
        self.c.wait_converged(60)
        self.c.wait_for(lambda: self.leader("placements") is not None, 60,
                        "a placements leader")
        self.c.wait_for(lambda: len(self.c.seed.members(role=["trainer"])) == trainers, 30,
                        "every trainer visible")
        self.serial = 0

    def close(self) -> None:
        self.c.close()

    def call(self, method: str, request: Any, timeout: float = 5.0, via: Any = None) -> Any:
        """An admin call through ``via`` or, on failure, any other running node."""
        from testbed.cluster import RpcFailed

        nodes = [via] if via is not None else []
        nodes += [n for n in self.c.nodes if n.running and not n.stopped and n is not via]
        last: Exception | None = None
        for node in nodes:
            try:
                return self.c.client._call(node.admin, method, request, timeout)
            except RpcFailed as exc:
                last = exc
        raise RuntimeError(f"{method} failed everywhere: {last}")

    def leader(self, group: str) -> Any:
        try:
            resp = self.call("RaftStatus", admin_pb2.RaftStatusRequest(), 3.0)
        except RuntimeError:
            return None
        best = None
        for g in resp.groups:
            if g.group == group and g.state == "leader" and not g.error and (
                    best is None or g.term > best.term):
                best = g
        if best is None:
            return None
        return next((n for n in self.coordinators if n.name == best.node and n.running), None)

    def submit(self, seconds: float, via: Any = None, nodes: int = 0) -> tuple[str, float]:
        """Submit a canary job (over ``nodes`` nodes if > 1); (its id, wall-clock time of the
        call)."""
        self.serial += 1
        jid = f"canary-{self.serial:04d}"
        spec = {"id": jid, "model": "canary", "entry": "meshd.train.canary:main",
                "checkpoints": str(self.records / jid), "gpus": {"count": 0, "nodes": nodes},
                "hyperparameters": {"seconds": seconds}, "work_seconds": seconds}
        t0 = time.time()
        req = admin_pb2.SubmitJobRequest(spec=json.dumps(spec), timeout_seconds=5)
        for attempt in range(20):
            try:
                list(self.call("SubmitJob", req, 10.0, via=via))
                break
            except RuntimeError:
                if attempt == 19:
                    raise
                time.sleep(0.5)
        return jid, t0

    def jobs(self) -> dict[str, Any]:
        return {j.id: j for j in self.call("ListJobs", admin_pb2.ListJobsRequest()).jobs}

    def wait_jobs_end(self, ids: list[str], timeout: float) -> dict[str, Any]:
        end = time.monotonic() + timeout
        while True:
            jobs = self.jobs()
            if all(jobs.get(i) is not None and jobs[i].state in ("done", "failed", "cancelled")
                   for i in ids) or time.monotonic() > end:
                return jobs
            time.sleep(0.5)

    def first_beat(self, jid: str, after: float = 0.0, timeout: float = 30.0) -> Run | None:
        """The first run of ``jid`` that started after ``after`` (waiting up to ``timeout``)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            found = [r for r in runs(self.records / jid) if r.start > after]
            if found:
                return min(found, key=lambda r: r.start)
            time.sleep(0.02)
        return None

    def node(self, name: str) -> Any:
        return self.c.node(name)

    def put_back(self, jid: str, victim: Any) -> None:
        """After a kill: cancel the job, restart the killed trainer, wait for both."""
        self.call("CancelJob", admin_pb2.JobRequest(id=jid))
        victim.start()
        self.wait_jobs_end([jid], 30)
        self.c.wait_for(lambda: len(self.c.seed.members(role=["trainer"])) ==
                        len(self.trainers), 30, "every trainer back")


# --- submit ------------------------------------------------------------------------------------


def submit_section(b: Bench, count: int) -> dict[str, Any]:
    vias = [b.coordinators[0], b.coordinators[1], b.trainers[0], b.coordinators[2]]
    took: list[float] = []
    for k in range(count):
        jid, t0 = b.submit(0.3, via=vias[k % len(vias)])
        run = b.first_beat(jid, timeout=15)
        if run is None:
            raise RuntimeError(f"{jid} never ran")
        took.append(run.start - t0)
        b.wait_jobs_end([jid], 20)
    return {"seconds": took, "dist": distribution(took)}


# --- failover ----------------------------------------------------------------------------------


def failover_section(b: Bench, kills: int) -> dict[str, Any]:
    took: list[float] = []
    for _ in range(kills):
        jid, _ = b.submit(120.0)
        first = b.first_beat(jid, timeout=20)
        if first is None:
            raise RuntimeError(f"{jid} never ran")
        time.sleep(1.0)  # a few renewals in
        victim = b.node(first.node)
        t_kill = time.time()
        victim.kill()
        nxt = b.first_beat(jid, after=t_kill, timeout=TTL + 30)
        if nxt is None:
            raise RuntimeError(f"{jid} never ran again after {victim.name} was killed")
        took.append(nxt.start - t_kill)
        print(f"  kill {victim.name}: running again on {nxt.node} after "
              f"{took[-1]:.2f} s", flush=True)
        b.put_back(jid, victim)
    return {"seconds": took, "dist": distribution(took)}


def gang_section(b: Bench, kills: int) -> dict[str, Any]:
    """Two-node gangs; one rank's trainer (rank 0's, then rank 1's, in turn) is SIGKILLed.
    Measured from the kill to the start of the later of the next attempt's two ranks."""
    took: list[float] = []

    def ranks(jid: str, after: float) -> list[Run] | None:
        found = [r for r in runs(b.records / jid) if r.start > after]
        return found if len({r.node for r in found}) == 2 else None

    for i in range(kills):
        jid, t0 = b.submit(120.0, nodes=2)
        b.c.wait_for(lambda j=jid, t=t0: ranks(j, t), 20, f"both ranks of {jid} running")
        time.sleep(1.0)
        victim = b.node(b.jobs()[jid].nodes[i % 2])  # rank 0's trainer, then rank 1's
        t_kill = time.time()
        victim.kill()
        nxt = b.c.wait_for(lambda j=jid, t=t_kill: ranks(j, t), TTL + 30, f"{jid} running again")
        took.append(max(r.start for r in nxt) - t_kill)
        print(f"  kill {victim.name}: both ranks running again on "
              f"{sorted(r.node for r in nxt)} after {took[-1]:.2f} s", flush=True)
        b.put_back(jid, victim)
    return {"seconds": took, "dist": distribution(took), "overlaps": audit(runs(b.records))}


# --- faults ------------------------------------------------------------------------------------


def faults_section(b: Bench, faults: int, every: float) -> dict[str, Any]:
    stop = threading.Event()
    submitted: list[str] = []
    errors: list[str] = []

    def feeder() -> None:
        while not stop.is_set():
            try:
                jid, _ = b.submit(5.0)
                submitted.append(jid)
            except Exception as exc:  # noqa: BLE001 - reported, not fatal
                errors.append(f"submit: {exc}")
            stop.wait(every)

    thread = threading.Thread(target=feeder, daemon=True)
    thread.start()
    time.sleep(8.0)  # load builds up
    kinds = ("kill", "freeze", "leader")
    injections: list[dict[str, Any]] = []
    try:
        for k in range(faults):
            kind = kinds[k % len(kinds)]
            jobs = b.jobs()
            if kind == "leader":
                victim = b.c.wait_for(lambda: b.leader("placements"), 30, "a placements leader")
            else:
                busy = Counter(j.node for j in jobs.values() if j.state == "running")
                live = [t for t in b.trainers if t.running and not t.stopped]
                victim = max(live, key=lambda t: (busy[t.name], t.name))
            held = [j.id for j in jobs.values()
                    if j.state in ("running", "placed") and j.node == victim.name]
            t0 = time.time()
            injections.append({"kind": kind, "victim": victim.name, "at": t0, "jobs": held})
            print(f"  {k + 1:3d}/{faults} {kind:6s} {victim.name} ({len(held)} jobs)",
                  flush=True)
            if kind == "kill":
                victim.kill()
                time.sleep(1.0)
                victim.start()
                time.sleep(2.0)
            elif kind == "freeze":
                victim.stop()
                time.sleep(TTL + 2.0)
                victim.cont()
                time.sleep(1.0)
            else:
                victim.kill()
                time.sleep(3.0)
                victim.start()
                time.sleep(1.0)
    finally:
        stop.set()
        thread.join(30)
    final = b.wait_jobs_end(list(submitted), 180)
    states = Counter(final[j].state if j in final else "missing" for j in submitted)
    found = runs(b.records)
    overlaps = audit(found)
    by_job: dict[str, list[Run]] = defaultdict(list)
    for r in found:
        by_job[r.job].append(r)
    replaced: dict[str, list[float]] = defaultdict(list)
    for inj in injections:
        if inj["kind"] == "leader":
            continue
        for jid in inj["jobs"]:
            later = [r.start for r in by_job[jid] if r.start > inj["at"]]
            if later:
                replaced[inj["kind"]].append(min(later) - inj["at"])
    attempts = Counter(final[j].attempt for j in submitted if j in final)
    return {"injections": Counter(i["kind"] for i in injections), "jobs": len(submitted),
            "states": dict(states), "runs": len(found), "overlaps": overlaps,
            "attempts": {str(k): v for k, v in sorted(attempts.items())},
            "replaced": {k: {"seconds": v, "dist": distribution(v)} for k, v in replaced.items()
                         if v},
            "failed": {j: f"attempt {final[j].attempt}, tried {list(final[j].tried)}: "
                          f"{final[j].message}" for j in submitted
                       if j in final and final[j].state != "done"},
            "feeder_errors": errors[:20], "log": injections}


def timed_row(rows: list[list[str]], what: str, r: dict[str, Any], bar: float | None = None,
              bar_text: str = "") -> bool:
    """Append a row of seconds (n, p50, p90, max; the bar on the max); whether it passed."""
    d = r["dist"]
    good = bar is None or d["max"] <= bar
    rows.append([what, str(len(r["seconds"])), f"{d['p50']:.3f}", f"{d['p90']:.3f}",
                 f"{d['max']:.3f}", f"{bar_text}: {verdict(good)}" if bar is not None else ""])
    return good


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="smaller sizes (a smoke check)")
    ap.add_argument("--only", default="submit,failover,gang,faults")
    ap.add_argument("--trainers", type=int, default=4)
    ap.add_argument("--submits", type=int, default=None)
    ap.add_argument("--kills", type=int, default=None)
    ap.add_argument("--faults", type=int, default=None)
    ap.add_argument("--every", type=float, default=1.0,
                    help="seconds between job submissions under faults")
    ap.add_argument("--out", type=Path, default=ROOT / "bench" / "results" / "training.json")
    args = ap.parse_args()
    only = set(args.only.split(","))
    submits = args.submits or (8 if args.quick else 30)
    kills = args.kills or (3 if args.quick else 10)
    faults = args.faults or (12 if args.quick else 100)
    results: dict[str, Any] = {}
    rows: list[list[str]] = []
    ok = True
    with tempfile.TemporaryDirectory(prefix="meshd-bench-training-") as tmp:
        b = Bench(Path(tmp), args.trainers)
        try:
            if "submit" in only:
                print(f"submit: {submits} jobs", flush=True)
                results["submit"] = r = submit_section(b, submits)
                ok &= timed_row(rows, "submit -> running", r, SUBMIT_BAR_S,
                                f"max <= {SUBMIT_BAR_S:g} s")
            if "failover" in only:
                print(f"failover: {kills} trainer kills", flush=True)
                results["failover"] = r = failover_section(b, kills)
                ok &= timed_row(rows, "trainer kill -> running elsewhere", r, FAILOVER_BAR_S,
                                f"max <= TTL+2 = {FAILOVER_BAR_S:g} s")
            if "gang" in only:
                print(f"gang: {kills} kills of a 2-node gang's trainer", flush=True)
                results["gang"] = r = gang_section(b, kills)
                ok &= timed_row(rows, "gang rank's trainer kill -> both ranks running again",
                                r, FAILOVER_BAR_S, f"max <= TTL+2 = {FAILOVER_BAR_S:g} s")
                rows.append(["gang double ownership (canary audit)", "", "", "",
                             str(len(r["overlaps"])), f"0: {verdict(not r['overlaps'])}"])
                ok &= not r["overlaps"]
            if "faults" in only:
                print(f"faults: {faults} injected failures", flush=True)
                r = faults_section(b, faults, args.every)
                results["faults"] = r
                good = not r["overlaps"] and set(r["states"]) == {"done"}
                ok &= good
                for kind, rep in sorted(r["replaced"].items()):
                    timed_row(rows, f"under load: {kind} -> replacement running", rep)
                kinds = ", ".join(f"{v} {k}" for k, v in sorted(r["injections"].items()))
                rows.append([f"double ownership over {sum(r['injections'].values())} failures "
                             f"({kinds})",
                             f"{r['runs']} runs", "", "", f"{len(r['overlaps'])}",
                             f"0 and every job done ({r['states']}): {verdict(good)}"])
                for line in r["overlaps"][:20]:
                    print("  OVERLAP", line)
                for jid, why in list(r["failed"].items())[:20]:
                    print(f"  NOT DONE {jid}: {why}")
        finally:
            b.close()
    head = ["measure", "n", "p50 s", "p90 s", "max", "bar"]
    title = f"Training scheduler (3 coordinators, {args.trainers} CPU trainers x " \
            f"{SLOTS_PER_TRAINER} slots, lease TTL {TTL:g} s)" + (" [quick]" if args.quick else "")
    print(f"\n{title}\n")
    print_table(head, rows)
    report = {"benchmark": "training", "argv": sys.argv,
              "when": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **machine_info(),
              "git": git_state(), "setup": {k: str(v) for k, v in vars(args).items()},
              "table": [dict(zip(head, r, strict=True)) for r in rows], "results": results}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=1, default=str) + "\n")
    args.out.with_suffix(".md").write_text(
        f"# {title}\n\n{format_table(head, rows)}\n\ncommit "
        f"{report['git']['commit'][:12]}, {report['when']}\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
