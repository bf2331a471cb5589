"""Tests for the linearizability checker in tests/linearizability.py.

The checker will be trusted to judge chaos runs, so it is tested both ways: hand-made histories
pin down each rule, and histories generated from a simulated correct store must pass while the
same histories with one stale read injected must fail.
"""

from __future__ import annotations

import math
import random
import threading
import time
from dataclasses import replace
from typing import Any

import pytest

from tests.linearizability import (
    CheckResult,
    History,
    Operation,
    check,
    check_monotonic,
    lost_writes,
)

INF = math.inf


class Builder:
    """Hand-made histories with readable times (arbitrary units, one op per line)."""

    def __init__(self) -> None:
        self.ops: list[Operation] = []

    def raw(
        self,
        client: str,
        kind: Any,
        key: str,
        arg: Any,
        result: Any,
        status: Any,
        call: int,
        ret: float,
    ) -> Operation:
        op = Operation(len(self.ops), client, kind, key, arg, result, status, call, ret)
        self.ops.append(op)
        return op

    def write(
        self,
        client: str,
        value: str,
        call: int,
        ret: float,
        version: int | None = None,
        key: str = "k",
        status: str = "ok",
    ) -> Operation:
        if version is None and status == "ok":
            raise ValueError("ok write needs a version")
        if status != "ok":
            version = None
        if status == "unknown":
            ret = INF
        return self.raw(client, "write", key, value, version, status, call, ret)

    def read(
        self, client: str, value: Any, version: int, call: int, ret: float, key: str = "k"
    ) -> Operation:
        return self.raw(client, "read", key, None, (value, version), "ok", call, ret)

    def cas(
        self,
        client: str,
        expected: int,
        value: str,
        call: int,
        ret: float,
        version: int | None = None,
        key: str = "k",
        status: str = "ok",
    ) -> Operation:
        if status == "unknown":
            ret = INF
        return self.raw(client, "cas", key, (expected, value), version, status, call, ret)


def both(ops: list[Operation]) -> tuple[CheckResult, CheckResult]:
    return check(ops), check_monotonic(ops)


# ---------------------------------------------------------------------------------------------
# Hand-made histories


def test_empty_history_is_linearizable() -> None:
    assert check([]).ok
    assert check_monotonic([]).ok


def test_sequential_ok() -> None:
    b = Builder()
    b.read("a", None, 0, 0, 1)
    b.write("a", "a1", 2, 3, version=5)
    b.read("b", "a1", 5, 4, 5)
    b.write("b", "b1", 6, 7, version=9)
    b.read("a", "b1", 9, 8, 9)
    r, m = both(b.ops)
    assert r.ok, r.explanation
    assert m.ok, m.explanation


@pytest.mark.parametrize("first", ["a1", "b1"])
def test_concurrent_writes_linearize_in_either_order(first: str) -> None:
    second = "b1" if first == "a1" else "a1"
    versions = {first: 3, second: 4}
    b = Builder()
    b.write("a", "a1", 0, 10, version=versions["a1"])
    b.write("b", "b1", 1, 11, version=versions["b1"])
    b.read("c", second, 4, 12, 13)
    r, m = both(b.ops)
    assert r.ok, r.explanation
    assert m.ok, m.explanation


def test_read_concurrent_with_write_may_see_old_or_new() -> None:
    for seen in [(None, 0), ("a1", 3)]:
        b = Builder()
        b.write("a", "a1", 0, 10, version=3)
        b.read("b", *seen, 5, 6)
        assert check(b.ops).ok
        assert check_monotonic(b.ops).ok


def test_concurrent_reads_must_agree_on_an_order() -> None:
    """Two overlapping writes; a reader sees a1 then b1, another b1 then a1: no single order."""
    b = Builder()
    b.write("a", "a1", 0, 100, version=3)
    b.write("b", "b1", 0, 100, version=4)
    b.read("c", "a1", 3, 10, 20)
    b.read("c", "b1", 4, 30, 40)
    b.read("d", "b1", 4, 10, 20)
    b.read("d", "a1", 3, 30, 40)
    r = check(b.ops)
    assert not r.ok and not r.inconclusive
    assert r.key == "k"
    assert "not linearizable" in r.explanation
    assert not check_monotonic(b.ops).ok  # client d goes back from version 4 to 3


def test_stale_read_after_acked_write_fails() -> None:
    b = Builder()
    b.write("a", "a1", 0, 1, version=3)
    b.write("a", "a2", 2, 3, version=7)
    stale = b.read("b", "a1", 3, 4, 5)
    r, m = both(b.ops)
    assert not r.ok
    assert not m.ok
    assert "stale read" in m.explanation and f"#{stale.id}" in m.explanation
    assert "version 7" in m.explanation


def test_read_going_back_for_one_client_fails() -> None:
    b = Builder()
    b.write("a", "a1", 0, 20, version=3)
    b.read("b", "a1", 3, 1, 2)
    b.read("b", None, 0, 3, 4)
    r, m = both(b.ops)
    assert not r.ok
    assert not m.ok and "its own read" in m.explanation


def test_read_of_value_never_written_fails() -> None:
    b = Builder()
    b.write("a", "a1", 0, 1, version=3)
    b.read("b", "ghost", 4, 2, 3)
    r, m = both(b.ops)
    assert not r.ok and "nobody ever wrote" in r.explanation
    assert not m.ok and "nobody ever wrote" in m.explanation


def test_read_of_failed_write_fails() -> None:
    b = Builder()
    b.write("a", "a1", 0, 1, status="fail")
    b.read("b", "a1", 3, 2, 3)
    r, m = both(b.ops)
    assert not r.ok and "never applied" in r.explanation
    assert not m.ok


def test_read_with_wrong_version_of_acked_write_fails() -> None:
    b = Builder()
    b.write("a", "a1", 0, 1, version=3)
    b.read("b", "a1", 4, 2, 3)
    r, m = both(b.ops)
    assert not r.ok and "two versions" in r.explanation
    assert not m.ok


def test_two_values_sharing_a_version_fail() -> None:
    b = Builder()
    b.write("a", "a1", 0, 1, version=3)
    b.write("b", "b1", 0, 1, version=3)
    r, m = both(b.ops)
    assert not r.ok and "share version 3" in r.explanation
    assert not m.ok


def test_versions_must_increase_along_the_order() -> None:
    """Sequential writes whose versions go down contradict the store-wide counter."""
    b = Builder()
    b.write("a", "a1", 0, 1, version=5)
    b.write("a", "a2", 2, 3, version=4)
    assert not check(b.ops).ok


def test_unknown_write_that_appears_later_is_ok() -> None:
    b = Builder()
    b.write("a", "a1", 0, 1, version=2)
    b.write("a", "a2", 2, INF, status="unknown")
    b.read("b", "a1", 2, 10, 11)  # not applied yet...
    b.read("b", "a2", 6, 50, 51)  # ...applied long after the client gave up
    b.read("c", "a2", 6, 60, 61)
    r, m = both(b.ops)
    assert r.ok, r.explanation
    assert m.ok, m.explanation


def test_unknown_write_that_never_appears_is_ok() -> None:
    b = Builder()
    b.write("a", "a1", 0, 1, version=2)
    b.write("a", "a2", 2, INF, status="unknown")
    b.read("b", "a1", 2, 10, 11)
    b.write("b", "b1", 12, 13, version=8)
    b.read("a", "b1", 8, 20, 21)
    r, m = both(b.ops)
    assert r.ok, r.explanation
    assert m.ok, m.explanation


def test_unknown_write_that_appears_then_disappears_fails() -> None:
    b = Builder()
    b.write("a", "a1", 0, 1, version=2)
    b.write("a", "a2", 2, INF, status="unknown")
    b.read("b", "a2", 6, 10, 11)
    b.read("c", "a1", 2, 20, 21)  # starts after a2 was seen: a2 was rolled back
    r, m = both(b.ops)
    assert not r.ok
    assert not m.ok and "stale read" in m.explanation


def test_unknown_write_cannot_apply_before_its_invocation() -> None:
    b = Builder()
    b.read("b", "a2", 6, 0, 1)
    b.write("a", "a2", 5, INF, status="unknown")
    r, m = both(b.ops)
    assert not r.ok and "before the write of its value was even invoked" in r.explanation
    assert not m.ok


def test_unknown_write_must_get_a_version_above_the_previous() -> None:
    b = Builder()
    b.write("a", "a1", 0, 1, version=9)
    b.write("a", "a2", 2, INF, status="unknown")
    b.read("b", "a2", 4, 10, 11)  # a2 landed after a1 yet claims an older version
    assert not check(b.ops).ok


def test_unknown_read_and_failed_ops_are_ignored() -> None:
    b = Builder()
    b.write("a", "a1", 0, 1, version=2)
    b.write("a", "a2", 2, 3, status="fail")
    b.raw("b", "read", "k", None, None, "unknown", 4, INF)
    b.raw("b", "read", "k", None, None, "fail", 5, 6)
    b.read("c", "a1", 2, 7, 8)
    assert check(b.ops).ok
    assert check_monotonic(b.ops).ok


def test_per_key_independence() -> None:
    """A bad key is reported by name; a good key's ops do not mask it, and vice versa."""
    b = Builder()
    b.write("a", "x1", 0, 1, version=1, key="policy/x")
    b.write("a", "y1", 2, 3, version=2, key="policy/y")
    b.read("b", "x1", 1, 4, 5, key="policy/x")  # x still at version 1 although y moved: fine
    b.read("b", None, 0, 6, 7, key="policy/z")
    assert check(b.ops).ok
    b.write("a", "y2", 8, 9, version=3, key="policy/y")
    b.read("c", "y1", 2, 10, 11, key="policy/y")
    r = check(b.ops)
    assert not r.ok and r.key == "policy/y"
    m = check_monotonic(b.ops)
    assert not m.ok and m.key == "policy/y"


def test_cas_success_conflict_and_unknown() -> None:
    b = Builder()
    b.write("a", "a1", 0, 1, version=2)
    b.cas("b", 2, "b1", 2, 3, version=5)
    b.cas("c", 2, "c1", 4, 5, status="fail")  # conflict: ignored
    b.cas("a", 5, "a2", 6, INF, status="unknown")
    b.read("c", "a2", 7, 10, 11)
    r, m = both(b.ops)
    assert r.ok, r.explanation
    assert m.ok, m.explanation


def test_cas_that_succeeds_against_the_wrong_version_fails() -> None:
    b = Builder()
    b.write("a", "a1", 0, 1, version=2)
    b.write("a", "a2", 2, 3, version=4)
    b.cas("b", 2, "b1", 5, 6, version=7)  # a2 was acked before: expected 2 is stale
    assert not check(b.ops).ok


def test_cas_may_depend_on_an_invisible_unknown_write() -> None:
    """The only source of version 5 is an unknown write nobody read; cas(5) can still succeed."""
    b = Builder()
    b.write("a", "a1", 0, 1, version=2)
    b.write("a", "a2", 2, INF, status="unknown")
    b.cas("b", 5, "b1", 10, 11, version=6)
    assert check(b.ops).ok
    b2 = Builder()
    b2.write("a", "a1", 0, 1, version=2)
    b2.cas("b", 5, "b1", 10, 11, version=6)  # no write could have had version 5
    assert not check(b2.ops).ok


def test_initial_state() -> None:
    b = Builder()
    b.read("a", "seed", 7, 0, 1)
    b.write("a", "a1", 2, 3, version=9)
    init = {"k": ("seed", 7)}
    assert check(b.ops, initial=init).ok
    assert check_monotonic(b.ops, initial=init).ok
    assert not check(b.ops).ok


def test_duplicate_write_values_are_a_harness_error() -> None:
    b = Builder()
    b.write("a", "same", 0, 1, version=1)
    b.write("b", "same", 2, 3, version=2)
    with pytest.raises(ValueError, match="written twice"):
        check(b.ops)


def test_budget_exhaustion_is_inconclusive_not_a_hang() -> None:
    b = Builder()
    for i in range(30):
        b.write(f"c{i}", f"v{i}", i, 100, version=30 - i)  # reverse order of calls
    r = check(b.ops, max_steps=50)
    assert not r.ok and r.inconclusive
    assert "inconclusive" in r.explanation
    assert check(b.ops).ok


def test_describe_mentions_ids_times_and_outcome() -> None:
    op = Operation(4, "c1", "write", "k", "c1-3", 12, "ok", 2_000_000, 3_500_000)
    text = op.describe(t0=1_000_000)
    assert "#4" in text and "'c1-3'" in text and "ok 12" in text
    assert "1.000ms" in text and "2.500ms" in text
    unknown = replace(op, status="unknown", result=None, ret=INF)
    assert "unknown" in unknown.describe() and "inf" in unknown.describe()


# ---------------------------------------------------------------------------------------------
# lost_writes


def test_lost_writes() -> None:
    b = Builder()
    kept = b.write("a", "a1", 0, 1, version=3, key="x")
    lost = b.write("a", "a2", 2, 3, version=7, key="y")
    b.write("a", "a3", 4, INF, status="unknown", key="y")  # never acknowledged: not counted
    gone = b.write("b", "b1", 4, 5, version=8, key="z")  # key missing from the final state
    replaced = b.cas("b", 8, "b2", 6, 7, version=9, key="w")
    final = {"x": ("a1", 3), "y": ("a1", 5), "w": ("other", 9)}
    assert lost_writes(b.ops, final) == [lost, gone, replaced]
    assert lost_writes(b.ops, final, missing_is_absent=False) == [lost, replaced]
    assert kept not in lost_writes(b.ops, {"x": ("later", 11)})


# ---------------------------------------------------------------------------------------------
# History recorder


def test_history_records_with_injected_clock() -> None:
    ticks = iter(range(100, 10_000, 10))
    h = History(clock=lambda: next(ticks))
    w = h.invoke("c1", "write", "k", "c1-0")
    r = h.invoke("c2", "read", "k")
    c = h.invoke("c3", "cas", "k", [1, "c3-0"])
    p = h.invoke("c4", "write", "k", "c4-0")
    h.ok(w, 1)
    h.ok(r, ["c1-0", 1])
    h.fail(c)
    ops = h.operations()
    assert [o.id for o in ops] == [w.id, r.id, c.id, p.id]
    ow, orr, oc, op_ = ops
    assert (ow.status, ow.result, ow.call, ow.ret) == ("ok", 1, 100, 140)
    assert (orr.result, orr.call, orr.ret) == (("c1-0", 1), 110, 150)
    assert oc.arg == (1, "c3-0") and oc.status == "fail"
    assert op_.status == "unknown" and op_.ret == INF  # still pending: counts as unknown
    h.unknown(p)
    assert h.operations()[-1].status == "unknown"
    with pytest.raises(ValueError):
        h.ok(w, 2)
    with pytest.raises(ValueError):
        h.ok(h.invoke("c1", "read", "k"), 5)
    with pytest.raises(ValueError):
        h.invoke("c1", "delete", "k")  # type: ignore[arg-type]
    assert check(h.operations()).ok


def test_history_is_thread_safe_and_checkable() -> None:
    """Threads against a locked dict are linearizable by construction; the checker must agree."""
    h = History()
    lock = threading.Lock()
    store: dict[str, tuple[Any, int]] = {}
    counter = [0]

    def client(cid: int) -> None:
        rng = random.Random(cid)
        for i in range(150):
            key = f"k{rng.randrange(3)}"
            if rng.random() < 0.5:
                op = h.invoke(cid, "read", key)
                with lock:
                    result = store.get(key, (None, 0))
                h.ok(op, result)
            else:
                op = h.invoke(cid, "write", key, f"c{cid}-{i}")
                with lock:
                    counter[0] += 1
                    store[key] = (f"c{cid}-{i}", counter[0])
                    version = counter[0]
                if i % 10 == 0:
                    h.unknown(op)
                else:
                    h.ok(op, version)

    threads = [threading.Thread(target=client, args=(c,)) for c in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ops = h.operations()
    assert len(ops) == 900 and len({o.id for o in ops}) == 900
    r, m = both(ops)
    assert r.ok, r.explanation
    assert m.ok, m.explanation
    assert lost_writes(ops, store) == []


# ---------------------------------------------------------------------------------------------
# Randomized histories from a simulated correct store


def simulate(
    rng: random.Random,
    clients: int,
    ops_per_client: int,
    keys: int,
    p_unknown: float = 0.1,
    p_fail: float = 0.05,
    p_cas: float = 0.1,
) -> tuple[list[Operation], dict[str, tuple[Any, int]]]:
    """A linearizable history: each op takes effect at one instant inside its interval.

    Unknown writes take effect inside the interval, after the client gave up, or never; failed
    ones never.  Returns the ops (shuffled: the checker must not depend on input order) and the
    final state of the store.
    """
    planned: list[dict[str, Any]] = []
    for c in range(clients):
        t = rng.randrange(1_000)
        for i in range(ops_per_client):
            call = t
            ret = call + rng.randint(1, 3_000)
            roll = rng.random()
            kind = "read" if roll < 0.5 else ("cas" if roll < 0.5 + p_cas else "write")
            status = "ok"
            at: float | None = rng.randint(call, ret)
            roll = rng.random()
            if roll < p_unknown:
                status = "unknown"
                mode = rng.randrange(3)
                if mode == 1:
                    at = ret + rng.randint(0, 20_000)  # applied long after the timeout
                elif mode == 2:
                    at = None  # never applied
            elif roll < p_unknown + p_fail and kind != "read":
                status, at = "fail", None
            planned.append(
                dict(
                    client=f"c{c}",
                    kind=kind,
                    key=f"k{rng.randrange(keys)}",
                    value=f"c{c}-{i}",
                    status=status,
                    call=call,
                    ret=ret,
                    at=at,
                )
            )
            t = ret + rng.randint(0, 500)

    store: dict[str, tuple[Any, int]] = {}
    counter = 0
    results: dict[int, Any] = {}
    args: dict[int, Any] = {}
    applied = sorted((p["at"], n) for n, p in enumerate(planned) if p["at"] is not None)
    for _, n in applied:
        p = planned[n]
        current = store.get(p["key"], (None, 0))
        if p["kind"] == "read":
            results[n] = current
            continue
        if p["kind"] == "cas":
            expected = current[1] if rng.random() < 0.6 else max(0, current[1] - rng.randint(1, 3))
            args[n] = (expected, p["value"])
            if expected != current[1]:
                if p["status"] == "ok":
                    p["status"] = "fail"  # conflict
                continue
        counter += 1
        store[p["key"]] = (p["value"], counter)
        results[n] = counter

    ops = []
    for n, p in enumerate(planned):
        arg: Any = None
        if p["kind"] == "write":
            arg = p["value"]
        elif p["kind"] == "cas":
            arg = args.get(n, (rng.randint(0, 5), p["value"]))
        status = p["status"]
        result = results.get(n) if status == "ok" else None
        end: float = INF if status == "unknown" else p["ret"]
        ops.append(
            Operation(n, p["client"], p["kind"], p["key"], arg, result, status, p["call"], end)
        )
    rng.shuffle(ops)
    return ops, store


def corrupt_one_read(rng: random.Random, ops: list[Operation]) -> list[Operation] | None:
    """Make one read return an older (value, version) it definitely cannot see.

    The replacement predates a write acknowledged before the read began, so no linearization can
    place the read early enough; merely older results can be legal for concurrent reads.
    """
    acked = [o for o in ops if o.kind != "read" and o.status == "ok"]
    reads = [o for o in ops if o.kind == "read" and o.status == "ok"]
    rng.shuffle(reads)
    for read in reads:
        same_key = [w for w in acked if w.key == read.key]
        floor = max((w.result for w in same_key if w.ret < read.call), default=0)
        older = [(None, 0)] + [(w.value, w.result) for w in same_key if w.result < floor]
        if floor and read.result[1] >= floor:
            bad = replace(read, result=rng.choice(older))
            return [bad if o is read else o for o in ops]
    return None


@pytest.mark.parametrize("seed", range(30))
def test_random_linearizable_histories_pass_and_corrupted_fail(seed: int) -> None:
    rng = random.Random(seed)
    ops, final = simulate(
        rng, clients=rng.randint(2, 5), ops_per_client=rng.randint(10, 60), keys=rng.randint(1, 4)
    )
    r, m = both(ops)
    assert r.ok, r.explanation
    assert m.ok, m.explanation
    assert lost_writes(ops, final) == []

    bad = corrupt_one_read(rng, ops)
    assert bad is not None
    r, m = both(bad)
    assert not r.ok and not r.inconclusive, r.explanation
    assert not m.ok


def brute_force_linearizable(ops: list[Operation]) -> bool:
    """An independent, exhaustive reference for one key of a tiny history.

    No pruning, no memoization and nothing dropped: unknown writes are optional, and one that no
    read identifies is tried with every version that could matter.
    """
    ops = [o for o in ops if o.status == "ok" or (o.status == "unknown" and o.kind != "read")]
    mentioned = [0]
    for o in ops:
        if o.status == "ok":
            mentioned.append(o.result[1] if o.kind == "read" else o.result)
        if o.kind == "cas":
            mentioned.append(o.arg[0])
    top = max(mentioned) + 2

    def search(remaining: frozenset[int], state: tuple[Any, int]) -> bool:
        if all(ops[i].status == "unknown" for i in remaining):
            return True
        for i in remaining:
            o = ops[i]
            if any(ops[j].ret < o.call for j in remaining):
                continue  # something still unplaced finished before this one started
            rest = remaining - {i}
            value, version = state
            if o.kind == "read":
                if o.result == state and search(rest, state):
                    return True
                continue
            if o.kind == "cas" and version != o.arg[0]:
                continue
            floor = o.arg[0] if o.kind == "cas" else version
            options = [o.result] if o.status == "ok" else range(floor + 1, top)
            if any(v > floor and search(rest, (o.value, v)) for v in options):
                return True
        return False

    return search(frozenset(range(len(ops))), (None, 0))


def random_tiny_history(rng: random.Random) -> list[Operation]:
    """Arbitrary small single-key histories, biased toward plausible results."""
    ops: list[Operation] = []
    writes: list[Operation] = []
    for n in range(rng.randint(2, 7)):
        call = rng.randrange(20)
        ret: float = call + rng.randint(1, 8)
        kind: Any = rng.choice(["read", "read", "write", "write", "cas"])
        status: Any = rng.choices(["ok", "unknown", "fail"], [6, 3, 1])[0]
        if status == "unknown":
            ret = INF
        arg: Any = None
        result: Any = None
        if kind == "read":
            if status == "ok":
                w = rng.choice(writes) if writes and rng.random() < 0.8 else None
                if w is None:
                    result = (None, 0)
                elif w.status == "ok" and rng.random() < 0.8:
                    result = (w.value, w.result)
                else:
                    result = (w.value, rng.randint(1, 6))
        else:
            value = f"v{n}"
            arg = value if kind == "write" else (rng.randint(0, 4), value)
            if status == "ok":
                result = rng.randint(1, 6)
        op = Operation(n, f"c{n}", kind, "k", arg, result, status, call, ret)
        ops.append(op)
        if kind != "read":
            writes.append(op)
    return ops


def test_agrees_with_brute_force_on_tiny_histories() -> None:
    """Soundness (no false alarms) and completeness against the exhaustive reference.

    The one permitted disagreement is the documented approximation: a cas that succeeds on a
    version only an unobserved unknown write could have produced.
    """
    rng = random.Random(1234)
    verdicts = {True: 0, False: 0}
    for _ in range(1500):
        ops = random_tiny_history(rng)
        expected = brute_force_linearizable(ops)
        verdicts[expected] += 1
        got = check(ops)
        assert not got.inconclusive
        if expected:
            assert got.ok, (ops, got.explanation)
            assert check_monotonic(ops).ok, ops
        elif got.ok:
            observed = {o.result[0] for o in ops if o.kind == "read" and o.status == "ok"}
            identified = {0} | {o.result for o in ops if o.kind != "read" and o.status == "ok"}
            identified |= {o.result[1] for o in ops if o.kind == "read" and o.status == "ok"}
            assert any(
                o.kind == "cas" and o.status != "fail" and o.arg[0] not in identified for o in ops
            ) and any(
                o.status == "unknown" and o.kind != "read" and o.value not in observed for o in ops
            ), ops
    assert verdicts[True] > 200 and verdicts[False] > 200, verdicts


def test_lost_write_detected_in_random_history() -> None:
    rng = random.Random(7)
    ops, final = simulate(rng, clients=3, ops_per_client=40, keys=2, p_unknown=0.0)
    key, (value, version) = next(iter(final.items()))
    assert any(
        o.key == key and o.value == value
        for o in lost_writes(ops, {**final, key: ("rolled-back", version - 1)})
    )


def test_performance_5_clients_400_ops_20_keys() -> None:
    rng = random.Random(2024)
    ops, _ = simulate(rng, clients=5, ops_per_client=400, keys=20, p_unknown=0.1)
    assert sum(o.status == "unknown" for o in ops) > 100
    start = time.perf_counter()
    r = check(ops)
    elapsed = time.perf_counter() - start
    assert r.ok, r.explanation
    assert elapsed < 2.0, f"check took {elapsed:.2f}s"
    assert check_monotonic(ops).ok


def test_performance_hot_key_with_unknowns() -> None:
    """All contention on one key, the worst case for the per-key search."""
    rng = random.Random(99)
    ops, _ = simulate(rng, clients=5, ops_per_client=200, keys=1, p_unknown=0.1)
    start = time.perf_counter()
    r = check(ops)
    assert r.ok, r.explanation
    assert time.perf_counter() - start < 3.0
