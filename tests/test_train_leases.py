"""Soft GPU leases: the table's rules, snapshots, bad commands, and the fencing guarantee
(no two trainers ever run on one GPU) under delays, lost messages and clock skew."""

from __future__ import annotations

import heapq
import itertools
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshd.train.leases import LeaseKeeper, LeaseTable


def acquire(t: LeaseTable, job: str, at: float, gpus: list[str] | None = None,
            node: str = "n1", holder: str = "n1", ttl: float = 10.0,
            start: float = 5.0) -> dict:
    return t.apply({"op": "acquire", "job": job, "holder": holder, "node": node,
                    "gpus": ["0"] if gpus is None else gpus, "ttl": ttl,
                    "start_timeout": start, "at": at})


def test_a_gpu_is_leased_to_one_job_until_the_lease_lapses() -> None:
    t = LeaseTable()
    a = acquire(t, "a", 100.0)
    assert a["ok"] and a["token"] == 1 and a["expires_at"] == 105.0
    busy = acquire(t, "b", 101.0, holder="n2")
    assert busy == {"ok": False, "error": "busy", "field": "gpus",
                    "message": "n1/0 is leased to job 'a'"}
    assert acquire(t, "b", 101.0, gpus=["1"])["ok"]  # another GPU is free
    # no first renewal within start_timeout: the lease lapses and the GPU can move
    b = acquire(t, "c", 105.0, holder="n2")
    assert b["ok"] and b["token"] == 3
    assert t.holder_of("n1", "0", 105.0).job == "c"  # type: ignore[union-attr]
    # the old holder is fenced off
    r = t.apply({"op": "renew", "job": "a", "token": 1, "at": 105.5})
    assert r["error"] == "fenced"


def test_renewals_extend_by_ttl_and_carry_progress() -> None:
    t = LeaseTable()
    tok = acquire(t, "a", 0.0)["token"]
    r = t.apply({"op": "renew", "job": "a", "token": tok, "at": 4.0, "progress": 0.25,
                 "step": 40})
    assert r == {"ok": True, "token": tok, "expires_at": 14.0, "ttl": 10.0}
    lease = t.leases["a"]
    assert (lease.renewals, lease.progress, lease.step) == (1, 0.25, 40)
    late = t.apply({"op": "renew", "job": "a", "token": tok, "at": 14.0})
    assert late["error"] == "expired"
    # a released lease frees its GPUs at once, even when it had lapsed
    assert t.apply({"op": "release", "job": "a", "token": tok, "at": 15.0,
                    "outcome": "failed"})["ok"]
    assert t.holder_of("n1", "0", 15.0) is None and not t.leases


def test_a_job_holds_one_lease_at_a_time() -> None:
    t = LeaseTable()
    acquire(t, "a", 0.0)
    again = acquire(t, "a", 1.0, gpus=["1"])
    assert again["error"] == "held" and "held by 'n1' (token 1)" in again["message"]
    moved = acquire(t, "a", 6.0, gpus=["1"], node="n2", holder="n2")
    assert moved["ok"] and moved["token"] == 2
    assert t.holder_of("n1", "0", 6.0) is None  # the old GPU is free


def test_the_tables_clock_never_goes_back() -> None:
    """A new leader whose clock is behind the old one's must not revive a lapsed lease."""
    t = LeaseTable()
    tok = acquire(t, "a", 100.0)["token"]
    t.apply({"op": "renew", "job": "z", "token": 9, "at": 200.0})  # fenced, but time moves
    r = t.apply({"op": "renew", "job": "a", "token": tok, "at": 101.0})
    assert r["error"] == "expired" and t.now == 200.0


def test_bad_commands_are_error_results_naming_the_field() -> None:
    t = LeaseTable()
    cases = [
        (None, "command"), ({"op": "steal", "at": 0}, "op"), ({"op": "acquire"}, "at"),
        ({"op": "acquire", "at": math.nan}, "at"),
        ({"op": "acquire", "at": 0, "job": "", "holder": "h", "node": "n"}, "job"),
        ({"op": "acquire", "at": 0, "job": "j", "holder": "h", "node": "n", "gpus": "0"},
         "gpus"),
        ({"op": "acquire", "at": 0, "job": "j", "holder": "h", "node": "n", "gpus": ["0", "0"],
          "ttl": 1}, "gpus"),
        ({"op": "acquire", "at": 0, "job": "j", "holder": "h", "node": "n", "ttl": 0}, "ttl"),
        ({"op": "acquire", "at": 0, "job": "j", "holder": "h", "node": "n", "ttl": True},
         "ttl"),
        ({"op": "acquire", "at": 0, "job": "j", "holder": "h", "node": "n", "ttl": 5,
          "start_timeout": -1}, "start_timeout"),
        ({"op": "renew", "at": 0, "job": "j", "token": "1"}, "token"),
        ({"op": "release", "at": 0, "job": "j", "token": 1, "outcome": "meh"}, "outcome"),
    ]
    for cmd, field_name in cases:
        r = t.apply(cmd)
        assert r["ok"] is False and r["error"] == "invalid" and r["field"] == field_name, cmd
    tok = acquire(t, "a", 0.0)["token"]
    r = t.apply({"op": "renew", "job": "a", "token": tok, "at": 1, "progress": 2})
    assert r["field"] == "progress"
    r = t.apply({"op": "renew", "job": "a", "token": tok, "at": 1, "step": -1})
    assert r["field"] == "step"
    assert t.leases["a"].renewals == 0


@given(st.lists(st.one_of(st.none(), st.booleans(), st.integers(), st.floats(),
                          st.text(max_size=5), st.lists(st.text(max_size=3), max_size=3)),
                min_size=8, max_size=8))
@settings(max_examples=300, deadline=None)
def test_any_command_gives_a_result_never_an_exception(values: list[object]) -> None:
    keys = ["op", "at", "job", "holder", "node", "gpus", "ttl", "token"]
    t = LeaseTable()
    for op in ("acquire", "renew", "release"):
        cmd = dict(zip(keys, values, strict=True))
        cmd["op"] = op
        r = t.apply(cmd)
        assert isinstance(r, dict) and "ok" in r and r.get("error") != "internal"


def test_a_snapshot_restores_the_same_table() -> None:
    t = LeaseTable()
    acquire(t, "a", 0.0, gpus=["0", "1"])
    tok = acquire(t, "b", 1.0, gpus=["2"], node="n2")["token"]
    t.apply({"op": "renew", "job": "b", "token": tok, "at": 2.0, "progress": 0.5, "step": 3})
    copy = LeaseTable.restore(t.snapshot())
    assert copy.snapshot() == t.snapshot()
    assert copy.owner == t.owner and copy.leases == t.leases


def test_an_unanswered_renewal_is_hedged_and_any_grant_counts_from_its_own_send() -> None:
    k = LeaseKeeper(token=1, ttl=5.0, margin=1.0, hedge_after=1.0)
    k.sent(0.0)
    k.granted(sent_at=0.0)
    assert k.deadline == 4.0 and k.in_flight == []
    due = k.renew_at(0.5)
    assert due == pytest.approx(4.0 - 4.0 * 2 / 3)  # a third into the period
    k.sent(due)  # ... and it hangs at a stalled coordinator
    assert k.renew_at(due + 0.1) == due + 1.0  # another, a second later
    k.sent(due + 1.0)
    k.sent(due + 2.0)
    assert k.renew_at(due + 2.5) == math.inf  # MAX_IN_FLIGHT out: wait for one to end
    k.refused("no_leader", due + 1.0)  # a voter mid-election says so at once
    assert k.renew_at(due + 2.5) == due + 3.0 and k.may_run(due + 2.5)
    k.granted(sent_at=due + 2.0)  # the hedge got through: counted from its own send
    assert k.deadline == due + 2.0 + 4.0 and k.in_flight == [due]
    k.unanswered(due)  # the stuck one timed out at last
    k.unanswered(due)  # (an answer for a renewal it no longer waits on changes nothing)
    assert k.in_flight == [] and k.renew_at(due + 3.0) == pytest.approx(k.deadline - 8 / 3)


def test_the_keeper_runs_only_after_a_granted_renewal_and_stops_on_its_own() -> None:
    k = LeaseKeeper(token=1, ttl=10.0, margin=1.0)
    assert not k.may_run(0.0) and k.renew_at(0.0) == 0.0
    k.granted(sent_at=2.0)
    assert k.may_run(10.9) and not k.may_run(11.0)
    assert k.renew_at(5.0) == 5.0  # a third into the 9 s it may run
    k.refused("no_quorum")
    assert k.may_run(10.0)
    k.refused("fenced")
    assert not k.may_run(3.0)


# --- the fencing guarantee ------------------------------------------------------------------

MARGIN = 1.0
TTL = 3.0


Part = tuple[str, str]  # (job, node): what one keeper guards


@dataclass
class Trainer:
    offset: float  # its monotonic clock = real time + offset
    keepers: dict[Part, LeaseKeeper] = field(default_factory=dict)
    gpus: dict[Part, tuple[str, ...]] = field(default_factory=dict)
    cut_until: float = 0.0  # partitioned from the coordinators until then (real time)


def simulate(seed: int, seconds: float = 20.0, gangs: bool = False) -> int:
    """Jobs move between trainers on one node's GPUs while messages take up to 5 ms (75%),
    are held up (15%, 0.5 s on average, exponential) or lost (10%), partitions cut trainers
    off for up to 8 s, and each new leader's clock is off by up to ``0.45 * MARGIN`` (so two
    leaders disagree by up to ``0.9 * MARGIN``).  Every 10 ms of real time, no GPU may have
    two trainers allowed to run on it.  Returns the number of grants.

    Checked to fail, in 1 or 2 of 40 seeds, when the keeper counts 1.2 s past the send of a
    granted renewal (more than its margin) and when each leader may be off by 1.5
    ``MARGIN``.  A first version let each leader be off by 0.9 ``MARGIN``, so two could
    disagree by 1.8: it failed once in CI, rightly.

    With ``gangs``, half the jobs span two nodes (n1, n2): each part is held by its own
    trainer, which renews only its part, and ranks also exit (releasing their part, a
    release that may be lost) at random."""
    rng = random.Random(seed)
    table = LeaseTable()
    trainers = [Trainer(rng.uniform(-1000, 1000)) for _ in range(3)]
    queue: list[tuple[float, int, Callable[[float], None]]] = []
    seq = itertools.count()
    skew = [0.0]
    grants = [0]

    def later(delay: float | None, action: Callable[[float], None], now: float) -> None:
        if delay is not None:
            heapq.heappush(queue, (now + delay, next(seq), action))

    def net(t: Trainer | None = None, real: float = 0.0) -> float | None:
        if t is not None and real < t.cut_until:
            return None
        x = rng.random()
        return None if x < 0.1 else rng.expovariate(2.0) if x < 0.25 else rng.uniform(0, 0.005)

    def commit(real: float, cmd: dict) -> dict:
        cmd["at"] = 1000.0 + real + skew[0]
        return table.apply(cmd)

    def place(real: float) -> None:
        job = f"j{rng.randrange(4)}"
        nodes = ["n1", "n2"] if gangs and rng.random() < 0.5 else [rng.choice(["n1", "n2"])]
        parts = [(n, rng.choice(trainers), tuple(rng.sample(["0", "1", "2"],
                                                            rng.randint(1, 2))))
                 for n in nodes]

        def at_leader(real: float) -> None:
            r = commit(real, {"op": "acquire", "job": job, "holder": "t", "ttl": TTL,
                              "start_timeout": 1.5,
                              "parts": [{"node": n, "gpus": list(g)} for n, _, g in parts]})
            if r["ok"]:
                grants[0] += 1
                for node, holder, gpus in parts:
                    def heard(real: float, holder: Trainer = holder, part: Part = (job, node),
                              gpus: tuple[str, ...] = gpus) -> None:
                        holder.keepers[part] = LeaseKeeper(r["token"], TTL, MARGIN)
                        holder.gpus[part] = gpus
                    later(net(holder, real), heard, real)
        later(net(), at_leader, real)

    def renew(t: Trainer, part: Part, k: LeaseKeeper, real: float) -> None:
        sent = real + t.offset
        k.sent(sent)

        def at_leader(real: float) -> None:
            r = commit(real, {"op": "renew", "job": part[0], "node": part[1], "token": k.token,
                              "progress": 0.1})

            def reply(real: float) -> None:
                if r["ok"]:
                    k.granted(sent_at=sent)
                else:
                    k.refused(r["error"], sent)
            later(net(t, real), reply, real)
        later(net(t, real), at_leader, real)
        later(1.5, lambda real: k.unanswered(sent), real)  # the RPC's deadline

    def release(t: Trainer, part: Part, k: LeaseKeeper, real: float) -> None:
        """The rank exited: the part stops at once; the release may be lost."""
        del t.keepers[part]
        later(net(t, real), lambda real: commit(real, {
            "op": "release", "job": part[0], "node": part[1], "token": k.token,
            "outcome": "done"}) and None, real)

    real = 0.0
    while real < seconds:
        real = round(real + 0.01, 6)
        while queue and queue[0][0] <= real:
            _, _, action = heapq.heappop(queue)
            action(real)
        if rng.random() < 0.02:
            skew[0] = rng.uniform(-0.45 * MARGIN, 0.45 * MARGIN)  # a new leader
        if rng.random() < 0.1:
            place(real)
        if rng.random() < 0.01:  # a partition isolates a trainer for a while
            rng.choice(trainers).cut_until = real + rng.uniform(0.5, 8.0)
        for t in trainers:
            mono = real + t.offset
            for part, k in list(t.keepers.items()):
                if k.fenced or (k.deadline != -math.inf and not k.may_run(mono)):
                    del t.keepers[part]  # the rank was killed
                elif gangs and k.may_run(mono) and rng.random() < 0.002:
                    release(t, part, k, real)
                elif mono >= k.renew_at(mono):  # hedged, as the trainer does
                    renew(t, part, k, real)
        running: dict[tuple[str, str], Part] = {}
        for t in trainers:
            mono = real + t.offset
            for part, k in t.keepers.items():
                if k.may_run(mono):
                    for g in t.gpus[part]:
                        gpu = (part[1], g)
                        assert gpu not in running, (seed, real, gpu, running[gpu], part)
                        running[gpu] = part
    return grants[0]


@given(st.integers(0, 2**32))
@settings(max_examples=150, deadline=None)
def test_no_two_trainers_ever_run_on_one_gpu(seed: int) -> None:
    simulate(seed)


@given(st.integers(0, 2**32))
@settings(max_examples=100, deadline=None)
def test_no_two_trainers_ever_run_on_one_gpu_with_gangs(seed: int) -> None:
    simulate(seed, gangs=True)


def test_the_fencing_simulation_moves_jobs_often() -> None:
    """The safety test means something only if jobs really change hands."""
    assert sum(simulate(s) for s in range(5)) > 40
    assert sum(simulate(s, gangs=True) for s in range(5)) > 40
