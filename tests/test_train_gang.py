"""Jobs over several nodes (gangs): the lease's per-node parts, placing exactly N nodes in
ring order, collective timings fed back into the next plan, and the sample job's ring
all-reduce between real processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adapters.model import CommStats
from meshd.dev.ports import pick_consecutive_ports
from meshd.train.board import PlacementStore
from meshd.train.leases import LeaseTable
from meshd.train.links import UNKNOWN_RTT, link_rtt, observed_hops
from meshd.train.placement import GpuSlot, Needs, Unplaceable, rank
from meshd.train.scheduler import Trainer, cpu_slots, plan
from meshd.train.spec import parse_job
from policy.errors import PolicyError

ROOT = Path(__file__).resolve().parent.parent


def gang(t: LeaseTable, at: float = 0.0, nodes: tuple[str, ...] = ("a", "b", "c")) -> int:
    r = t.apply({"op": "acquire", "job": "g", "holder": nodes[0], "ttl": 10.0,
                 "start_timeout": 5.0, "at": at,
                 "parts": [{"node": n, "gpus": ["0", "1"]} for n in nodes]})
    assert r["ok"], r
    return int(r["token"])


def renew(t: LeaseTable, tok: int, node: str | None, at: float, **kw: object) -> dict:
    cmd = {"op": "renew", "job": "g", "token": tok, "at": at, **kw}
    if node is not None:
        cmd["node"] = node
    return t.apply(cmd)


def release(t: LeaseTable, tok: int, node: str, at: float, outcome: str) -> dict:
    return t.apply({"op": "release", "job": "g", "token": tok, "node": node, "at": at,
                    "outcome": outcome})


# --- the lease ------------------------------------------------------------------------------

def test_each_part_is_renewed_by_its_own_node_and_covers_its_gpus() -> None:
    t = LeaseTable()
    tok = gang(t)
    assert {r for r in t.owner} == {f"{n}/{g}" for n in "abc" for g in "01"}
    busy = t.apply({"op": "acquire", "job": "x", "holder": "b", "node": "b", "gpus": ["1"],
                    "ttl": 10.0, "at": 1.0})
    assert busy["error"] == "busy" and "b/1" in busy["message"]
    no_node = renew(t, tok, None, 1.0)
    assert no_node["error"] == "invalid" and no_node["field"] == "node"
    stranger = renew(t, tok, "z", 1.0)
    assert stranger["error"] == "fenced" and "'z'" in stranger["message"]
    for n in "abc":
        assert renew(t, tok, n, 2.0, progress=0.5 if n == "a" else 0.9)["expires_at"] == 12.0
    lease = t.leases["g"]
    assert lease.progress == 0.5  # rank 0 speaks for the job
    assert [p.renewals for p in lease.parts] == [1, 1, 1]
    # b stops renewing: its part lapses alone; the others are told to stop their ranks too
    renew(t, tok, "a", 9.0)
    late = renew(t, tok, "b", 12.0)
    assert late["error"] == "expired"
    told = renew(t, tok, "a", 12.5)
    assert told["ok"] and told["stop"] == "the rank on b lost its lease"
    # the lease is live while any part is, so it cannot be reaped, nor b's GPUs taken
    assert t.apply({"op": "expire", "job": "g", "token": tok, "at": 13.0})["error"] == "live"
    assert t.holder_of("b", "0", 13.0) is not None


def test_the_gang_ends_with_its_last_part_and_its_first_bad_outcome() -> None:
    t = LeaseTable()
    tok = gang(t)
    for n in "abc":
        renew(t, tok, n, 1.0)
    first = release(t, tok, "c", 2.0, "done")
    assert first == {"ok": True, "token": tok, "outcome": "done", "final": False}
    assert t.holder_of("c", "0", 2.0) is None  # c's rank is gone: its GPUs are free
    assert "stop" not in renew(t, tok, "a", 2.5)  # a done rank does not stop the others
    assert release(t, tok, "c", 2.6, "done")["error"] == "fenced"  # released once only
    moved = release(t, tok, "b", 3.0, "moved")
    assert moved["final"] is False
    assert renew(t, tok, "a", 3.5)["stop"] == "the rank on b ended: moved"
    last = release(t, tok, "a", 4.0, "moved")
    assert last == {"ok": True, "token": tok, "outcome": "moved", "final": True}
    assert not t.leases and not t.owner


def test_a_gang_whose_parts_all_lapsed_or_ended_is_reaped_naming_the_lapsed() -> None:
    t = LeaseTable()
    tok = gang(t)
    renew(t, tok, "a", 1.0)
    release(t, tok, "a", 2.0, "failed")
    # b and c never renewed: they lapse at the start timeout
    assert t.apply({"op": "expire", "job": "g", "token": tok, "at": 4.9})["error"] == "live"
    r = t.apply({"op": "expire", "job": "g", "token": tok, "at": 5.0})
    assert r["ok"] and r["lapsed"] == ["b", "c"] and r["outcome"] == "failed"


def test_gang_parts_are_checked() -> None:
    t = LeaseTable()
    base = {"op": "acquire", "job": "g", "holder": "a", "ttl": 10.0, "at": 0.0}
    twice = t.apply({**base, "parts": [{"node": "a"}, {"node": "a"}]})
    assert twice["field"] == "parts" and "distinct nodes" in twice["message"]
    dup = t.apply({**base, "parts": [{"node": "a", "gpus": ["0", "0"]}]})
    assert dup["field"] == "parts[0].gpus"
    odd = t.apply({**base, "parts": [{"node": "a", "cores": 3}]})
    assert odd["error"] == "invalid" and odd["field"].startswith("parts[0]")


def test_a_gang_snapshot_restores_and_an_old_snapshot_still_loads() -> None:
    t = LeaseTable()
    tok = gang(t)
    renew(t, tok, "b", 1.0)
    release(t, tok, "c", 1.5, "failed")
    copy = LeaseTable.restore(t.snapshot())
    assert copy.leases == t.leases and copy.owner == t.owner
    old = {"format": 1, "token": 4, "now": 9.0,
           "leases": [["j", "n1", "n1", ["0"], 4, 1.0, 11.0, 10.0, 2, 0.5, 7]]}
    back = LeaseTable.restore(old)
    lease = back.leases["j"]
    assert (lease.node, lease.gpus, lease.expires_at, lease.step) == ("n1", ("0",), 11.0, 7)
    assert back.holder_of("n1", "0", 10.0) is lease


@given(st.lists(st.one_of(st.none(), st.integers(), st.text(max_size=4),
                          st.lists(st.one_of(st.text(max_size=3), st.dictionaries(
                              st.sampled_from(["node", "gpus", "x"]),
                              st.one_of(st.text(max_size=3), st.lists(st.text(max_size=2),
                                                                      max_size=3)),
                              max_size=3)), max_size=4)),
                min_size=4, max_size=4))
@settings(max_examples=300, deadline=None)
def test_any_gang_command_gives_a_result_never_an_exception(values: list[object]) -> None:
    t = LeaseTable()
    gang(t)
    for op in ("acquire", "renew", "release", "expire"):
        cmd = dict(zip(["parts", "node", "token", "outcome"], values, strict=True))
        r = t.apply({**cmd, "op": op, "job": "g", "holder": "a", "ttl": 1.0, "at": 1.0})
        assert isinstance(r, dict) and "ok" in r and r.get("error") != "internal", r


# --- placement ------------------------------------------------------------------------------

def line(positions: dict[str, float]):  # type: ignore[no-untyped-def]
    return lambda a, b: abs(positions[a] - positions[b]) / 1000


def test_a_fixed_gang_takes_exactly_its_nodes_near_each_other_in_ring_order() -> None:
    pos = {"a": 0.0, "b": 1.0, "c": 2.0, "d": 50.0, "e": 51.0, "f": 3.0}
    slots = [GpuSlot(n, str(g), "T4", 16_000, 16_000) for n in pos for g in range(2)]
    got = rank(Needs(gpus=6, work_s=100.0, nodes=3), slots, rtt=line(pos))
    best = got[0]
    assert len(best.nodes) == 3 and set(best.nodes) <= {"a", "b", "c", "f"}
    assert all(sum(s.node == n for s in best.slots) == 2 for n in best.nodes)
    # the far pair is never chosen with the near nodes while near ones are free
    assert all(not ({"d", "e"} & set(c.nodes) and {"a", "b"} & set(c.nodes)) for c in got[:1])
    # a busy near node is replaced by the next near one, not a far one
    busy = {("b", "0")}
    assert set(rank(Needs(gpus=6, work_s=100.0, nodes=3), slots, rtt=line(pos),
                    busy=busy)[0].nodes) == {"a", "c", "f"}
    # a much less loaded far group wins once the RTT costs less than the wait
    loaded = [GpuSlot(s.node, s.gpu, s.gpu_type, 16_000, 16_000,
                      backlog_s=0.0 if s.node in "de" else 500.0) for s in slots]
    far = rank(Needs(gpus=4, work_s=100.0, nodes=2, collective_rounds=100), loaded,
               rtt=line(pos))
    assert far[0].nodes in (("d", "e"), ("e", "d"))


def test_a_fixed_gang_that_could_never_fit_is_unplaceable() -> None:
    slots = [GpuSlot(n, str(g), "T4", 16_000, 16_000) for n in "ab" for g in range(2)]
    with pytest.raises(Unplaceable, match="no 3 nodes"):
        rank(Needs(gpus=3, work_s=1.0, nodes=3), slots)
    with pytest.raises(Unplaceable, match="no 2 nodes in the fleet have 4"):
        rank(Needs(gpus=8, work_s=1.0, nodes=2), slots)
    assert rank(Needs(gpus=4, work_s=1.0, nodes=2), slots, busy={("a", "0")}) == []


def test_a_gang_spec_needs_an_equal_share_per_node() -> None:
    base = {"id": "g", "model": "m", "command": ["x"]}
    assert parse_job({**base, "gpus": {"count": 0, "nodes": 3}}).needs().gpus == 3
    assert parse_job({**base, "gpus": {"count": 8, "nodes": 2}}).slots == 8
    with pytest.raises(PolicyError) as odd:
        parse_job({**base, "gpus": {"count": 3, "nodes": 2}})
    assert odd.value.field == "gpus.count" and "multiple of gpus.nodes" in odd.value.message
    with pytest.raises(PolicyError) as many:
        parse_job({**base, "gpus": {"nodes": 65}})
    assert many.value.field == "gpus.nodes"


def test_the_scheduler_places_a_cpu_gang_as_parts_and_counts_every_node_busy() -> None:
    spec = parse_job({"id": "g", "model": "m", "command": ["x"],
                      "gpus": {"count": 0, "nodes": 2}}).doc
    job = {"name": "g", "job": spec, "state": "queued", "submitted_at": 1.0, "tried": [],
           "token": 0, "cancel": False}
    trainers = [Trainer(n, cpu_slots(n, 1)) for n in ("t1", "t2", "t3")]
    pos = {"t1": 0.0, "t2": 9.0, "t3": 1.0}
    [cmd] = plan([job], {}, trainers, 5.0, rtt=line(pos))
    assert cmd["op"] == "acquire" and cmd["holder"] == "t1"
    assert cmd["parts"] == [{"node": "t1", "gpus": ["cpu0"]}, {"node": "t3", "gpus": ["cpu0"]}]
    other = {**job, "name": "h", "job": {**spec, "id": "h"}}
    placements = {"g": {"node": "t1", "gpus": ["cpu0"], "parts": cmd["parts"],
                        "lease": {"expires_unix": 100.0}}}
    running = {**job, "state": "running", "token": 1}
    assert plan([running, other], placements, trainers, 5.0, rtt=line(pos)) == []


# --- collective timings fed back --------------------------------------------------------------

def test_measured_collectives_raise_the_hops_they_crossed() -> None:
    now = 1000.0
    slow = CommStats("j1", "all_reduce", 0.4, 1 << 20, "ring", 3, ("a", "b", "c"), now)
    fast = CommStats("j2", "all_reduce", 0.008, 1 << 20, "ring", 3, ("a", "c", "d"), now)
    old = CommStats("j3", "all_reduce", 9.0, 1, "ring", 2, ("c", "d"), now - 10_000)
    hops = observed_hops([slow, fast, old], now)
    assert hops[("a", "b")] == pytest.approx(0.1)  # 0.4 s over 2(3-1) steps
    assert hops[("a", "c")] == pytest.approx(0.002)  # the fast ring bounds it tighter
    assert hops[("c", "d")] == pytest.approx(0.002)  # the old slow timing has aged out
    rtt = link_rtt(lambda a, b: None if "z" in (a, b) else 0.001, hops)
    assert rtt("b", "a") == pytest.approx(0.1) and rtt("b", "d") == 0.001
    assert rtt("a", "z") == UNKNOWN_RTT and rtt("a", "a") == 0.0


def test_the_next_plan_routes_around_a_link_the_collectives_found_slow() -> None:
    """Four nodes Vivaldi sees as equally near; a gang's all-reduces over a-b-c were slow.
    The next 2-node gang is not put across a-b."""
    trainers = [Trainer(n, cpu_slots(n, 1)) for n in "abcd"]
    spec = parse_job({"id": "g", "model": "m", "command": ["x"],
                      "gpus": {"count": 0, "nodes": 2}}).doc
    job = {"name": "g", "job": spec, "state": "queued", "submitted_at": 1.0, "tried": [],
           "token": 0, "cancel": False}
    vivaldi = link_rtt(lambda a, b: 0.001, {})
    [blind] = plan([job], {}, trainers, 5.0, rtt=vivaldi)
    assert [p["node"] for p in blind["parts"]] == ["a", "b"]  # ties go by name
    measured = observed_hops([CommStats("old", "all_reduce", 0.4, 1 << 20, "ring", 2,
                                        ("a", "b"), 5.0)], 5.0)
    [told] = plan([job], {}, trainers, 5.0, rtt=link_rtt(lambda a, b: 0.001, measured))
    assert {p["node"] for p in told["parts"]} != {"a", "b"}


# --- the sample job's ring ------------------------------------------------------------------

def start_ranks(tmp: Path, n: int, **hp: object) -> list[subprocess.Popen[str]]:
    # Rank r listens on port + r on every address: n consecutive ports, each checked free there,
    # below the ephemeral range (an ephemeral base hung a rank on another process's socket).
    port = pick_consecutive_ports("0.0.0.0", n)[0]
    procs = []
    for r in range(n):
        env = {**os.environ, "MESHD_RANK": str(r), "MESHD_NNODES": str(n),
               "MESHD_RING_ADDRS": ",".join(["127.0.0.1"] * n), "MESHD_COMM_PORT": str(port),
               "MESHD_LEASE_TOKEN": "7", "MESHD_CHECKPOINT_DIR": str(tmp / f"ck{r}"),
               "MESHD_HPARAMS": json.dumps({"steps": 40, **hp}), "PYTHONPATH": str(ROOT)}
        procs.append(subprocess.Popen([sys.executable, "-m", "meshd.train.sample"], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True))
    return procs


def reports(out: str) -> list[dict]:
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def test_ranks_sum_their_gradients_around_the_ring_and_agree(tmp_path: Path) -> None:
    procs = start_ranks(tmp_path, 3)
    outs = [p.communicate(timeout=60)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], outs
    losses = [[r["loss"] for r in reports(o) if "loss" in r] for o in outs]
    assert len(losses[0]) == 40 and losses[0] == losses[1] == losses[2]  # one model
    assert losses[0][-1] < losses[0][0]
    comm = [r["comm"] for r in reports(outs[1]) if "comm" in r]
    assert comm and comm[0]["op"] == "all_reduce" and comm[0]["world_size"] == 3
    assert list((tmp_path / "ck0").glob("step-*.npz"))  # rank 0 writes the checkpoints
    assert not list((tmp_path / "ck1").glob("step-*.npz"))


def test_sigterm_on_one_rank_stops_every_rank_at_one_step_with_a_checkpoint(
        tmp_path: Path) -> None:
    procs = start_ranks(tmp_path, 3, steps=100_000, step_seconds=0.01)
    # The ring is up once rank 0 reports a step (a fixed sleep raced the ranks' start on a
    # loaded machine: a SIGTERM before the handler is installed kills the rank outright).
    early = []
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        line = procs[0].stdout.readline()  # type: ignore[union-attr]
        early.append(line)
        if not line or '"step"' in line:
            break
    procs[2].send_signal(signal.SIGTERM)
    outs = [p.communicate(timeout=30)[0] for p in procs]
    outs[0] = "".join(early) + outs[0]
    # the stopped rank says so; the others ask to run again, so the gang takes its outcome
    assert [p.returncode for p in procs] == [75, 75, 143], outs
    last = [max(r["step"] for r in reports(o) if "step" in r) for o in outs]
    assert last[0] == last[1] == last[2]
    assert (tmp_path / "ck0" / f"step-{last[0]:08d}.npz").exists()
    # the next attempt resumes every rank from rank 0's checkpoint
    again = start_ranks(tmp_path, 3, steps=last[0] + 5)
    outs = [p.communicate(timeout=60)[0] for p in again]
    assert [p.returncode for p in again] == [0] * 3, outs
    assert all(reports(o)[0]["message"] == f"resumed from step {last[0]}" for o in outs)


def test_a_rank_whose_peer_died_asks_to_be_moved(tmp_path: Path) -> None:
    procs = start_ranks(tmp_path, 2, steps=100_000, step_seconds=0.01)
    time.sleep(2.0)
    procs[1].kill()
    out = procs[0].communicate(timeout=30)[0]
    procs[1].wait()
    assert procs[0].returncode == 75, out
    assert "handing the job back" in out


# --- outcomes and attempts --------------------------------------------------------------------

def test_the_gravest_outcome_of_its_ranks_is_the_gangs() -> None:
    for outcomes, final in ((["retry", "failed", "retry"], "failed"),
                            (["retry", "moved", "retry"], "moved"),
                            (["done", "retry", "done"], "retry"),
                            (["done", "done", "done"], "done")):
        t = LeaseTable()
        tok = gang(t)
        results = [release(t, tok, n, 1.0, o) for n, o in zip("abc", outcomes, strict=True)]
        assert results[-1]["final"] and results[-1]["outcome"] == final, (outcomes, results)
    t = LeaseTable()
    none = t.apply({"op": "acquire", "job": "g", "holder": "a", "ttl": 1.0, "at": 0.0,
                    "parts": []})
    assert none["field"] == "parts" and t.token == 0 and not t.leases


def _board_gang(nodes: tuple[str, ...] = ("a", "b")) -> tuple[PlacementStore, int]:
    s = PlacementStore(["TrainingJob", "TrainingPlacement"])
    s.apply({"op": "submit", "at": 1.0, "author": "t", "job": {
        "id": "g", "model": "m", "command": ["x"], "gpus": {"count": 0,
                                                            "nodes": len(nodes)}}})
    r = s.apply({"op": "acquire", "job": "g", "holder": nodes[0], "ttl": 5.0,
                 "start_timeout": 5.0, "at": 2.0,
                 "parts": [{"node": n, "gpus": ["cpu0"]} for n in nodes]})
    assert r["ok"], r
    return s, int(r["token"])


def _job(s: PlacementStore) -> dict:
    doc = s.get("TrainingJob", "g")
    assert doc is not None
    return doc.document.spec


def test_a_gang_lapse_is_one_lost_attempt_and_only_rank_0_reports_progress() -> None:
    s, tok = _board_gang(("a", "b", "c"))
    s.apply({"op": "renew", "job": "g", "token": tok, "node": "b", "at": 3.0, "step": 9,
             "loss": 0.1, "progress": 0.9})
    assert _job(s)["step"] == 0 and _job(s)["loss"] is None  # rank 1 does not speak
    s.apply({"op": "renew", "job": "g", "token": tok, "node": "a", "at": 3.0, "step": 4,
             "loss": 0.5, "progress": 0.4})
    assert (_job(s)["step"], _job(s)["loss"]) == (4, 0.5)
    r = s.apply({"op": "expire", "job": "g", "token": tok, "at": 9.0})
    assert r["ok"], r
    j = _job(s)
    assert j["state"] == "queued" and j["lapses"] == 1 and j["tried"] == ["a", "b", "c"]
    assert j["queued_at"] == 9.0


def test_a_job_that_keeps_asking_to_retry_fails_after_max_attempts() -> None:
    from meshd.train.board import MAX_ATTEMPTS

    s = PlacementStore(["TrainingJob", "TrainingPlacement"])
    s.apply({"op": "submit", "at": 1.0, "author": "t",
             "job": {"id": "g", "model": "m", "command": ["x"], "gpus": {"count": 0}}})
    for i in range(MAX_ATTEMPTS):
        a = s.apply({"op": "acquire", "job": "g", "holder": "a", "node": "a",
                     "gpus": ["cpu0"], "ttl": 5.0, "at": 2.0 + i})
        r = s.apply({"op": "release", "job": "g", "token": a["token"], "node": "a",
                     "at": 2.5 + i, "outcome": "retry", "message": "exit code 75"})
        assert r["ok"], r
        assert _job(s)["lapses"] == i + 1 and _job(s)["tried"] == []
    j = _job(s)
    assert j["state"] == "failed" and "giving up" in j["message"] and j["ended_at"] == 6.5


def test_a_ranks_malformed_comm_lines_are_dropped(tmp_path: Path) -> None:
    from types import SimpleNamespace

    from meshd.train.run import JobRun

    got: list[CommStats] = []
    service = SimpleNamespace(node="b", report_comm=got.append, tracer=None)
    job = {"token": 3, "attempt": 1, "job": {}, "node": "a", "gpus": ["cpu0"],
           "parts": [{"node": "a", "gpus": ["cpu0"]}, {"node": "b", "gpus": ["cpu0"]}]}
    run = JobRun(service, "g", job, tmp_path)  # type: ignore[arg-type]
    assert (run.rank, run.ring, run.gpus) == (1, ["a", "b"], ["cpu0"])
    for bad in ({"op": "all_reduce"}, {"op": "all_reduce", "seconds": 1e400},
                {"op": "all_reduce", "seconds": 0.1, "bytes": 1e400},
                {"op": "all_reduce", "seconds": 0.1, "bytes": -1},
                {"op": "teleport", "seconds": 0.1}, {"op": "all_reduce", "seconds": "x"},
                {"op": "all_reduce", "seconds": 0.1, "world_size": float("inf")}):
        run._comm(bad)
    assert got == []
    run._comm({"op": "all_reduce", "seconds": 0.01, "bytes": 136, "algorithm": "ring"})
    [c] = got
    assert (c.job, c.peers, c.world_size, c.seconds) == ("g", ("a", "b"), 2, 0.01)


def test_link_rows_answer_what_link_rtt_answers_for_every_pair() -> None:
    from meshd.train.links import link_rows

    names = ["a", "b", "c", "z"]
    measured = {("a", "b"): 0.1, ("b", "c"): 0.0001}

    def est(a: str, b: str) -> float | None:
        return None if "z" in (a, b) else 0.001 * (ord(a) + ord(b) - 2 * ord("a"))

    rows = link_rows(lambda ns: [[0.0 if a == b else est(a, b) for b in ns] for a in ns],
                     measured)(names)
    one = link_rtt(est, measured)
    assert rows == [[one(a, b) for b in names] for a in names]
