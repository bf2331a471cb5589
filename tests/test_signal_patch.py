"""Gossip patches of the telemetry section: wire form and strict decoding (with fuzz), which
rows a patch carries, base moves, and receivers that miss patches, simulated."""

from __future__ import annotations

import copy
import dataclasses
import random
import re

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adapters.model import GpuState, ReplicaState
from meshd.signals import nodestate
from meshd.signals.nodestate import NodeStateError, Publisher, decode_delta
from meshd.signals.patch import MAX_WAIT, PatchTracker
from meshd.signals.publish import PublishConfig, gpu_reason, replica_reason
from meshd.signals.wire import (
    NodeSignals,
    Patch,
    SignalWireError,
    decode,
    decode_patch,
    encode,
    encode_patch,
)
from tests.test_signal_state import gpu, replica

CFG = PublishConfig()


def fleet(n: int, queue: int = 0) -> list[ReplicaState]:
    return [replica(f"model-{i:02d}", queue=queue, at=100.0) for i in range(n)]


def sig(seq: int, reps: list[ReplicaState], gpus: list[GpuState] | None = None,
        epoch: int = 7) -> NodeSignals:
    return NodeSignals(epoch=epoch, seq=seq, replicas=copy.deepcopy(reps),
                       gpus=copy.deepcopy(gpus or []))


def values(r: ReplicaState) -> tuple[object, ...]:
    return (r.ready, r.queue, r.inflight, r.spu, r.rate, r.latency_ewma, r.failures)


def keyed(s: NodeSignals) -> dict[str, ReplicaState]:
    return {r.key: r for r in s.replicas}


# --- wire form ------------------------------------------------------------------------------


def test_patch_round_trip_and_apply() -> None:
    base = sig(3, fleet(3), [gpu()])
    gone = base.replicas[2]
    changed = replica("model-01", queue=9, at=100.0)
    new = replica("model-09", queue=1, at=100.0)
    patch = Patch(7, 3, 5, replicas=[changed, new],
                  removed=[(gone.model, gone.version, gone.endpoint)],
                  removed_gpus=["GPU-1"], cpu_only="NVML unavailable")
    back = decode_patch(encode_patch(patch, now=100.0, wall=1000.0), received=50.0,
                        wall=1000.25)
    assert (back.epoch, back.base, back.seq) == (7, 3, 5)
    assert [r.model for r in back.replicas] == ["model-01", "model-09"]
    assert back.replicas[0].at["queue"] == pytest.approx(49.75)  # transit counts, as in sections
    assert back.comm is None and back.cpu_only == "NVML unavailable"
    assert back.applies_to(base)
    after = back.apply(base)
    assert after.seq == 5 and [r.model for r in after.replicas] == [
        "model-00", "model-01", "model-09"]  # rows keep their places, new ones go last
    assert keyed(after)[changed.key].queue == 9 and after.gpus == []
    assert after.comm == base.comm and after.cpu_only == "NVML unavailable"


@pytest.mark.parametrize("held, ok", [(2, False), (3, True), (4, True), (5, False), (6, False)])
def test_a_patch_applies_to_copies_from_its_base_up_to_before_its_seq(held: int, ok: bool) -> None:
    patch = Patch(7, 3, 5)
    assert patch.applies_to(sig(held, [])) is ok
    assert not patch.applies_to(sig(4, [], epoch=8))  # another run of the publisher


@pytest.mark.parametrize("doc, field", [
    ({"e": 1, "b": 5, "s": 5}, "b"),
    ({"e": 1, "b": 6, "s": 5}, "b"),
    ({"e": 1, "s": 5}, "b"),
    ({"e": 1, "b": 1, "s": 5, "rd": [["m", "1"]]}, "rd[0]"),
    ({"e": 1, "b": 1, "s": 5, "rd": [["", "1", "e"]]}, "rd[0].model"),
    ({"e": 1, "b": 1, "s": 5, "gd": "GPU-1"}, "gd"),
    ({"e": 1, "b": 1, "s": 5, "gd": [7]}, "gd[0]"),
    ({"e": 1, "b": 1, "s": 5, "x": 3}, "x"),
    ({"e": 1, "b": 1, "s": 5, "r": [[1] * 18]}, "r[0].ages"),
    ({"e": 1, "b": 1, "s": 5, "r": [[1] * 17]}, "r[0]"),
    ({"e": 1, "b": 1, "s": 5, "r": [[1] * 20]}, "r[0]"),
])
def test_malformed_patches_name_the_field(doc: dict[str, object], field: str) -> None:
    with pytest.raises(SignalWireError, match="^" + re.escape(field)):
        decode_patch(msgpack.packb(doc), 0.0)


@settings(max_examples=300)
@given(st.binary(max_size=600))
def test_decode_patch_fuzz_only_raises_wire_errors(raw: bytes) -> None:
    try:
        decode_patch(raw, 0.0)
    except SignalWireError:
        pass


@settings(max_examples=300)
@given(st.recursive(st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats()
                    | st.text(max_size=5),
                    lambda kids: st.lists(kids, max_size=20)
                    | st.dictionaries(st.sampled_from(["e", "b", "s", "r", "rd", "g", "gd", "c",
                                                       "x", "w"]), kids, max_size=8),
                    max_leaves=60))
def test_decode_patch_fuzz_structured(doc: object) -> None:
    try:
        patch = decode_patch(msgpack.packb(doc, use_bin_type=True), 0.0, 1e9)
    except SignalWireError:
        return
    patch.apply(NodeSignals(epoch=patch.epoch, seq=patch.base))  # whatever decodes applies


# --- which rows a patch carries -------------------------------------------------------------


def test_first_publication_has_no_patch_then_only_material_rows_go() -> None:
    t = PatchTracker(CFG, budget=700)
    reps = fleet(40)
    assert t.publish(sig(1, reps), 100.0, None) is None and t.rebases["start"] == 1
    reps[5].queue = 1  # not material (queue_abs is 2): stays out
    reps[7].queue = 6
    reps[9].ready = False
    raw = t.publish(sig(2, reps), 100.5, None)
    assert raw is not None and len(raw) <= 700
    patch = decode_patch(raw, 0.0)
    assert patch.base == 1 and sorted(r.model for r in patch.replicas) == ["model-07", "model-09"]


def test_the_http_address_goes_in_a_patch_when_it_comes_and_goes() -> None:
    """Found or lost by the adapter's probe: routers forward HTTP requests there, or convert
    them to gRPC again, without waiting for push-pull."""
    t = PatchTracker(CFG)
    reps = fleet(40)
    held = sig(1, reps)
    t.publish(held, 100.0, None)
    reps[4].http = "10.0.0.1:8000"
    patch = decode_patch(t.publish(sig(2, reps), 100.5, None), 0.0)  # type: ignore[arg-type]
    assert [(r.model, r.http) for r in patch.replicas] == [("model-04", "10.0.0.1:8000")]
    held = patch.apply(held)
    assert keyed(held)[reps[4].key].http == "10.0.0.1:8000"
    reps[4].http = ""
    patch = decode_patch(t.publish(sig(3, reps), 101.0, None), 0.0)  # type: ignore[arg-type]
    assert [(r.model, r.http) for r in patch.replicas] == [("model-04", "")]
    assert keyed(patch.apply(held))[reps[4].key].http == ""


def test_patches_are_cumulative_and_carry_a_row_that_went_back() -> None:
    t = PatchTracker(CFG)
    reps = fleet(40)
    t.publish(sig(1, reps), 100.0, None)
    reps[7].queue = 6
    t.publish(sig(2, reps), 100.5, None)
    reps[7].queue = 0  # back to its base value: a receiver of seq 2 holds 6, so it is sent
    reps[8].queue = 5
    patch = decode_patch(t.publish(sig(3, reps), 101.0, None), 0.0)  # type: ignore[arg-type]
    assert patch.base == 1
    assert {r.model: r.queue for r in patch.replicas} == {"model-07": 0, "model-08": 5}


def test_removed_and_added_rows_and_gpus() -> None:
    t = PatchTracker(CFG)
    reps = fleet(20)
    other_gpu = dataclasses.replace(gpu(), uuid="GPU-2")
    t.publish(sig(1, reps, [gpu()]), 100.0, None)
    gone = reps.pop(3)
    reps.append(replica("model-new", at=100.0))
    patch = decode_patch(t.publish(sig(2, reps, [other_gpu]), 100.5, None),  # type: ignore[arg-type]
                         0.0)
    assert patch.removed == [(gone.model, gone.version, gone.endpoint)]
    assert [r.model for r in patch.replicas] == ["model-new"]
    assert [g.uuid for g in patch.gpus] == ["GPU-2"] and patch.removed_gpus == ["GPU-1"]


def test_rows_not_sent_for_a_refresh_fill_the_room_left_oldest_first() -> None:
    t = PatchTracker(CFG, budget=700)
    reps = fleet(40)
    t.publish(sig(1, reps), 100.0, None)
    reps[0].queue = 9
    first = decode_patch(t.publish(sig(2, reps), 106.0, None), 0.0)  # type: ignore[arg-type]
    sent = [r.model for r in first.replicas]
    assert sent[0] == "model-00" and 3 <= len(sent) < 40  # the changed row, then fill
    second = decode_patch(t.publish(sig(3, reps), 107.0, None), 0.0)  # type: ignore[arg-type]
    refilled = [r.model for r in second.replicas][1:]
    assert refilled and not set(refilled) & set(sent)  # rotation: the next oldest rows
    assert len(encode_patch(second, 107.0)) <= 700


def test_the_base_moves_only_as_far_as_the_changed_rows_force_it() -> None:
    t = PatchTracker(CFG, budget=700)
    reps = fleet(40)
    t.publish(sig(1, reps), 100.0, None)
    bases = []
    for seq, i in enumerate(range(0, 40, 2), start=2):  # two rows at a time change, 1 s apart
        for r in reps[i:i + 2]:
            r.queue = 50
        patch = decode_patch(t.publish(sig(seq, reps), 100.0 + seq, None), 0.0)  # type: ignore[arg-type]
        bases.append((seq, patch.base))
        assert {f"model-{k:02d}" for k in range(i, i + 2)} <= {r.model for r in patch.replicas}
    assert bases[:3] == [(2, 1), (3, 1), (4, 1)] and t.rebases["moved"] >= 1
    assert all(seq - base >= 2 or base == 1 for seq, base in bases)  # none under 2 s old
    assert bases[-1][1] > 1 and t.deferred == 0  # moved on, as far as it had to


def test_a_burst_waits_a_little_rather_than_the_base_moving_past_recent_patches() -> None:
    t = PatchTracker(CFG, budget=700)
    reps = fleet(40)
    t.publish(sig(1, reps), 100.0, None)
    for r in reps:
        r.queue = 99  # every row at once, 0.5 s later: more than one patch can say
    patch = decode_patch(t.publish(sig(2, reps), 100.5, None), 0.0)  # type: ignore[arg-type]
    assert patch.base == 1 and 0 < len(patch.replicas) < 40  # the base stays ...
    assert t.deferred == 40 - len(patch.replicas)  # ... and the rest waits
    sent = {r.model for r in patch.replicas}
    seq, now = 2, 100.5
    while t.waiting:
        seq, now = seq + 1, now + 0.5
        assert now - 100.5 <= MAX_WAIT + 2.0, "held back longer than the bound"
        patch = decode_patch(t.publish(sig(seq, reps), now, None), 0.0)  # type: ignore[arg-type]
        sent |= {r.model for r in patch.replicas if r.queue == 99}
    assert len(sent) == 40 and t.rebases["moved"] >= 1


def test_readiness_and_removals_are_not_held_back() -> None:
    t = PatchTracker(CFG, budget=700)
    reps = fleet(40)
    t.publish(sig(1, reps), 100.0, None)
    for r in reps:
        r.queue = 99
    reps[39].ready = False
    gone = reps.pop(38)
    patch = decode_patch(t.publish(sig(2, reps), 100.5, None), 0.0)  # type: ignore[arg-type]
    assert "model-39" in {r.model for r in patch.replicas}
    assert patch.removed == [(gone.model, gone.version, gone.endpoint)]


def test_a_new_epoch_starts_over() -> None:
    t = PatchTracker(CFG)
    t.publish(sig(1, fleet(3)), 100.0, None)
    assert t.publish(sig(1, fleet(3), epoch=8), 101.0, None) is None
    assert t.rebases["start"] == 2


# --- receivers that miss patches, simulated --------------------------------------------------


@pytest.mark.parametrize("seed", range(4))
def test_lossy_receivers_stay_materially_right(seed: int) -> None:
    """A publisher with 60 replicas whose queues and readiness wander; 5 receivers each get a
    random subset of its patches (30% lost) and, now and then, its whole section (push-pull).
    Whenever a receiver has applied the latest patch it holds the current replica set, and
    every row is either the publisher's current value or one not materially different from
    the value the publisher last judged material (what a row left out may differ by), except
    for rows whose change the publisher is holding back to its next publication."""
    rng = random.Random(seed)
    reps = fleet(60)
    t = PatchTracker(CFG, budget=700)
    current = sig(1, reps)
    t.publish(current, 0.0, None)
    receivers = [copy.deepcopy(current) for _ in range(5)]
    applied = no_base = deferred = 0
    for seq in range(2, 400):
        now = seq * 0.5
        for r in rng.sample(reps, rng.randint(0, 6)):
            r.queue = max(0, (r.queue or 0) + rng.choice([-5, -1, 0, 1, 5, 20]))
            if rng.random() < 0.05:
                r.ready = not r.ready
        if rng.random() < 0.02:
            reps.append(replica(f"late-{seq}", at=now))
        if rng.random() < 0.02 and len(reps) > 10:
            reps.pop(rng.randrange(len(reps)))
        current = sig(seq, reps)
        raw = t.publish(current, now, None)
        for i, held in enumerate(receivers):
            if rng.random() < 0.03:
                receivers[i] = decode(encode_section(current, now), 0.0)  # push-pull
                continue
            if raw is None or rng.random() < 0.3:
                continue
            patch = decode_patch(raw, 0.0)
            if not patch.applies_to(held):
                no_base += 1
                continue
            receivers[i] = got = patch.apply(held)
            applied += 1
            mine, theirs = keyed(decode(encode(current, now), 0.0)), keyed(got)  # float32
            waiting = {k[2:] for k in t.waiting}  # changes held back to the next publication
            assert mine.keys() ^ theirs.keys() <= waiting
            deferred += len(waiting)
            for key, r in mine.items():
                if key in waiting or key not in theirs:
                    continue
                if values(theirs[key]) != values(r):  # then as good as what was judged
                    judged = t.rows["r:" + key].judged
                    assert replica_reason(judged, theirs[key], CFG) is None, key
    print(f"applied {applied}, no base {no_base}, rows held back {deferred}")
    assert applied > 200 and no_base < applied / 10


def encode_section(s: NodeSignals, now: float) -> bytes:
    return encode(s, now)


def test_gpu_rows_follow_the_same_rule() -> None:
    t = PatchTracker(CFG)
    g = gpu()
    t.publish(sig(1, [], [g]), 100.0, None)
    g2 = copy.copy(g)
    g2.ecc_uncorrected = 1
    assert gpu_reason(g, g2, CFG) == "gpu_health"
    patch = decode_patch(t.publish(sig(2, [], [g2]), 101.0, None), 0.0)  # type: ignore[arg-type]
    assert [x.ecc_uncorrected for x in patch.gpus] == [1]


# --- the node-state delta -------------------------------------------------------------------


def test_publisher_delta_carries_changed_sections_cumulatively() -> None:
    pub = Publisher(delta_limit=200)
    pub.set("coord", b"c1")
    pub.set("sig", bytes(500), b"p1")
    blob, delta = pub.take()  # type: ignore[misc]
    assert nodestate.decode(blob) == {"coord": b"c1", "sig": bytes(500)}
    assert decode_delta(delta) == ({"coord": b"c1"}, {"sig": b"p1"})  # type: ignore[arg-type]
    assert pub.take() is None
    pub.set("sig", bytes(501), b"p2")
    _, delta = pub.take()  # type: ignore[misc]
    assert decode_delta(delta) == ({"coord": b"c1"}, {"sig": b"p2"})  # type: ignore[arg-type]


def test_publisher_delta_starts_over_when_it_outgrows_the_limit() -> None:
    pub = Publisher(delta_limit=200)
    pub.set("keys", bytes(150))
    pub.take()
    pub.set("coord", b"c")
    _, delta = pub.take()  # type: ignore[misc]
    assert decode_delta(delta)[0] == {"keys": bytes(150), "coord": b"c"}  # type: ignore[arg-type]
    pub.set("rev", bytes(60))
    _, delta = pub.take()  # type: ignore[misc]
    assert decode_delta(delta)[0] == {"rev": bytes(60)} and pub.rebases == 1  # type: ignore[arg-type]
    pub.set("sig", bytes(900))  # whole and too big, no patch: push-pull only
    pub.set("coord", b"c2")
    _, delta = pub.take()  # type: ignore[misc]
    assert decode_delta(delta) == ({"coord": b"c2"}, {})  # type: ignore[arg-type]


@settings(max_examples=200)
@given(st.binary(max_size=200) | st.builds(
    lambda d: msgpack.packb(d, use_bin_type=True),
    st.lists(st.dictionaries(st.text(max_size=4) | st.integers(-9, 9),
                             st.binary(max_size=8) | st.integers(-9, 9), max_size=3), max_size=3)))
def test_decode_delta_fuzz_only_raises_node_state_errors(raw: bytes) -> None:
    try:
        decode_delta(raw)
    except NodeStateError:
        pass
