"""The telemetry section (wire form, strict decoding, fuzz), the gossip publication gate, and
the fused view (newest copy wins, ages from the local clock, local observations)."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from adapters.model import CommStats, GpuState, MigProfile, ReplicaState
from meshd.signals.fused import FusedState
from meshd.signals.publish import PublishConfig, PublishGate, material
from meshd.signals.wire import (
    MAX_TRANSIT,
    NodeSignals,
    SignalWireError,
    decode,
    encode,
    pack,
    replica_row,
)


def replica(model: str = "m", queue: int | None = 3, ready: bool = True, spu: float = 0.002,
            at: float = 99.5, http: str = "") -> ReplicaState:
    return ReplicaState(model=model, version="1", endpoint="10.0.0.1:8001", ready=ready,
                        queue=queue, instances=2, max_batch=8, dynamic_batching=True,
                        rate=120.0, queue_seconds=0.001, compute_seconds=0.004, spu=spu,
                        latency_ewma=0.005, failures=0,
                        at={"ready": at - 1, "queue": at, "stats": at - 0.5}, http=http)


def gpu(free: int = 10 << 30, ecc: int = 0, throttle: tuple[str, ...] = ()) -> GpuState:
    return GpuState(uuid="GPU-1", index=0, name="A100", memory_total=40 << 30,
                    memory_free=free, sm_util=50.0, mem_util=20.0, temperature_c=60.0,
                    power_w=250.0, ecc_uncorrected=ecc, ecc_corrected=0, throttle=throttle,
                    mig=(MigProfile("MIG-1", "1g.5gb", 5 << 30, 4 << 30),), at=99.0)


def signals(*reps: ReplicaState, seq: int = 1, gpus: tuple[GpuState, ...] = ()) -> NodeSignals:
    return NodeSignals(epoch=7, seq=seq, replicas=list(reps), gpus=list(gpus),
                       comm=[CommStats("job", "all_reduce", 0.02, 1 << 20, "ring", 4,
                                       ("a", "b"), at=98.0)])


def test_round_trip_keeps_values_and_turns_ages_into_local_times() -> None:
    sig = signals(replica(), replica("n", queue=None), gpus=(gpu(),))
    raw = encode(sig, now=100.0)
    back = decode(raw, received=500.0)
    assert back.epoch == 7 and back.seq == 1
    r = back.replicas[0]
    assert (r.model, r.version, r.endpoint, r.ready, r.queue, r.instances, r.max_batch,
            r.dynamic_batching) == ("m", "1", "10.0.0.1:8001", True, 3, 2, 8, True)
    assert r.spu == pytest.approx(0.002, rel=1e-6)  # float32 on the wire
    assert r.at["queue"] == pytest.approx(499.5) and r.at["ready"] == pytest.approx(498.5)
    assert back.replicas[1].queue is None
    g = back.gpus[0]
    assert g.memory_free == 10 << 30 and g.mig[0].profile == "1g.5gb"
    assert g.at == pytest.approx(499.0)
    assert back.comm[0].peers == ("a", "b") and back.comm[0].at == pytest.approx(498.0)


def test_the_http_address_rides_as_an_optional_last_column() -> None:
    sig = signals(replica(http="10.0.0.1:8000"), replica("n"))
    doc = msgpack.unpackb(encode(sig, now=100.0), raw=False)
    assert len(doc["r"][0]) == 19 and doc["r"][0][18] == "10.0.0.1:8000"
    assert len(doc["r"][1]) == 18  # without one, the row nodes before the column send
    back = decode(encode(sig, now=100.0), received=500.0)
    assert [r.http for r in back.replicas] == ["10.0.0.1:8000", ""]
    assert back.replicas[0].ready and back.replicas[0].at["queue"] == pytest.approx(499.5)


def test_a_node_without_http_encodes_the_rows_it_did_before() -> None:
    """Byte for byte the row of nodes that predate the column: they decode it, and it costs
    the gossip budget nothing."""
    r = replica()
    old_row = [r.model, r.version, r.endpoint, r.runtime, r.ready, r.queue, r.inflight,
               r.instances, r.max_batch, r.dynamic_batching, r.rate, r.queue_seconds,
               r.compute_seconds, r.spu, r.latency_ewma, r.latency_p95, r.failures,
               [1500, 500, 1000]]  # ages: ready, queue, stats
    assert pack(replica_row(r, now=100.0)) == pack(old_row)
    old = msgpack.packb({"e": 7, "s": 1, "r": [old_row], "g": [], "c": []},
                        use_bin_type=True, use_single_float=True)
    assert decode(old, received=100.0).replicas[0].http == ""


@pytest.mark.parametrize("sent, received, expect", [
    (1000.0, 1002.5, 2.5),  # 2.5 s in transit (gossip rounds, push-pull): ages grow by it
    (1000.0, 999.0, 0.0),   # publisher's clock ahead: never younger than at encoding
    (1000.0, 1500.0, MAX_TRANSIT),  # publisher's clock far behind: bounded
])
def test_transit_time_is_added_to_ages(sent: float, received: float, expect: float) -> None:
    back = decode(encode(signals(replica()), now=100.0, wall=sent), received=500.0,
                  wall=received)
    assert back.replicas[0].at["queue"] == pytest.approx(499.5 - expect)


def test_without_wall_clocks_ages_are_taken_as_encoded() -> None:
    raw = encode(signals(replica()), now=100.0, wall=1000.0)
    assert decode(raw, received=500.0).replicas[0].at["queue"] == pytest.approx(499.5)
    back = decode(encode(signals(replica()), now=100.0), received=500.0, wall=1e9)
    assert back.replicas[0].at["queue"] == pytest.approx(499.5)


def test_a_few_replicas_and_a_gpu_fit_a_gossip_broadcast() -> None:
    sig = signals(*(replica(f"model-{i}") for i in range(4)), gpus=(gpu(),))
    assert len(encode(sig, 100.0)) < 700
    sig = signals(*(replica(f"model-{i}", http="10.0.0.1:8000") for i in range(4)),
                  gpus=(gpu(),))
    assert len(encode(sig, 100.0)) < 700


@pytest.mark.parametrize("mutate, field", [
    (lambda d: d["r"][0].__setitem__(0, ""), "r[0].model"),
    (lambda d: d["r"][0].__setitem__(5, -1), "r[0].queue"),
    (lambda d: d["r"][0].__setitem__(13, float("nan")), "r[0].spu"),
    (lambda d: d["r"][0].__setitem__(4, 1), "r[0].ready"),
    (lambda d: d["r"][0].__setitem__(7, 0), "r[0].instances"),
    (lambda d: d["r"][0].pop(), "r[0]"),
    (lambda d: d["r"][0].extend(["10.0.0.1:8000", "x"]), "r[0]"),  # 20 fields
    (lambda d: d["r"][0].append(8000), "r[0].http"),
    (lambda d: d["r"][0].append("h" * 257), "r[0].http"),
    (lambda d: d["g"][0].__setitem__(4, 50 << 30), "g[0].memory_free"),
    (lambda d: d["g"][0].__setitem__(5, 101.0), "g[0].sm_util"),
    (lambda d: d.__setitem__("s", -1), "s"),
    (lambda d: d["c"][0].__setitem__(1, 5), "c[0].op"),
    (lambda d: d.__setitem__("w", 1.5), "w"),
    (lambda d: d.__setitem__("w", -1), "w"),
])
def test_bad_fields_are_named(mutate: object, field: str) -> None:
    doc = msgpack.unpackb(encode(signals(replica(), gpus=(gpu(),)), 100.0, 1e9), raw=False)
    mutate(doc)  # type: ignore[operator]
    with pytest.raises(SignalWireError) as err:
        decode(msgpack.packb(doc, use_bin_type=True), 0.0, 1e9)
    assert str(err.value).startswith(field), err.value


@settings(max_examples=300)
@given(st.binary(max_size=600))
def test_decode_fuzz_only_raises_wire_errors(raw: bytes) -> None:
    try:
        decode(raw, 0.0)
    except SignalWireError:
        pass


@settings(max_examples=200)
@given(st.recursive(st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats()
                    | st.text(max_size=5),
                    lambda kids: st.lists(kids, max_size=20)
                    | st.dictionaries(st.sampled_from("sercgxw"), kids, max_size=6),
                    max_leaves=60))
def test_decode_fuzz_structured(doc: object) -> None:
    try:
        decode(msgpack.packb(doc, use_bin_type=True), 0.0, 1e9)
    except SignalWireError:
        pass


# --- the publication gate -----------------------------------------------------------------


def test_material_changes() -> None:
    cfg = PublishConfig()
    base = signals(replica(queue=10), gpus=(gpu(),))
    assert material(None, base, cfg) == "first"
    assert material(base, signals(replica(queue=11), gpus=(gpu(),)), cfg) is None
    assert material(base, signals(replica(queue=13), gpus=(gpu(),)), cfg) == "queue"
    assert material(base, signals(replica(queue=10, ready=False), gpus=(gpu(),)),
                    cfg) == "ready"
    assert material(base, signals(replica(queue=10, spu=0.0021), gpus=(gpu(),)), cfg) is None
    assert material(base, signals(replica(queue=10, spu=0.003), gpus=(gpu(),)), cfg) == "spu"
    assert material(base, signals(replica(queue=10), replica("x"), gpus=(gpu(),)),
                    cfg) == "replicas"
    assert material(base, signals(replica(queue=10, http="10.0.0.1:8000"), gpus=(gpu(),)),
                    cfg) == "http"  # routers forward HTTP there (or stop, when it goes)
    assert material(base, signals(replica(queue=10), gpus=(gpu(free=1 << 30),)),
                    cfg) == "gpu_memory"
    assert material(base, signals(replica(queue=10), gpus=(gpu(ecc=1),)), cfg) == "gpu_health"
    assert material(base, signals(replica(queue=10), gpus=(gpu(throttle=("hw_thermal",)),)),
                    cfg) == "gpu_health"


def test_gate_rate_limits_material_and_refreshes_the_rest() -> None:
    gate = PublishGate(PublishConfig(min_interval=0.5, refresh=5.0, echo=1.0))
    assert gate.offer(signals(replica(queue=0)), now=0.0) == "first"
    assert gate.offer(signals(replica(queue=50)), now=0.1) is None  # too soon
    assert gate.next_due() == 0.5  # the caller wakes when it may go out
    assert gate.offer(signals(replica(queue=50)), now=0.5, changed=False) == "queue"
    assert gate.next_due() == 1.5  # the echo
    assert gate.offer(signals(replica(queue=51)), now=1.0) is None  # not material
    assert gate.offer(signals(replica(queue=51)), now=1.5, changed=False) == "echo"
    assert gate.next_due() is None  # echoes are not echoed; nothing pending
    assert gate.offer(signals(replica(queue=52)), now=2.0) is None  # not material
    assert gate.next_due() == 7.0
    assert gate.offer(signals(replica(queue=52)), now=6.9, changed=False) is None
    assert gate.offer(signals(replica(queue=52)), now=7.0, changed=False) == "refresh"
    assert gate.offer(signals(replica(queue=52)), now=20.0, changed=False) is None  # nothing new
    assert gate.next_due() is None
    assert gate.reasons == {"first": 1, "queue": 1, "echo": 1, "refresh": 1}


def test_a_material_change_that_vanishes_while_held_is_not_published() -> None:
    gate = PublishGate(PublishConfig(min_interval=0.5, refresh=5.0, echo=1.0))
    gate.offer(signals(replica(queue=0)), now=0.0)
    assert gate.offer(signals(replica(queue=50)), now=1.2) == "queue"
    assert gate.offer(signals(replica(queue=0)), now=1.3) is None  # back within min_interval
    assert gate.offer(signals(replica(queue=0)), now=1.7, changed=False) == "queue"
    assert gate.offer(signals(replica(queue=9)), now=1.8) is None
    assert gate.offer(signals(replica(queue=0)), now=2.3) is None  # 9 went away unpublished
    assert gate.offer(signals(replica(queue=0)), now=2.7, changed=False) == "echo"


# --- the fused view -----------------------------------------------------------------------


def test_newest_copy_wins_whichever_path() -> None:
    f = FusedState("me", flags_of=lambda n: ["cordoned"] if n == "b" else [])
    assert f.update("b", signals(replica(queue=5), seq=10), "stream", now=100.0)
    assert not f.update("b", signals(replica(queue=1), seq=8), "gossip", now=100.2)
    assert f.stale_drops == 1
    [r] = f.replicas(now=101.0)
    assert r.node == "b" and r.state.queue == 5 and r.via == "stream"
    assert r.flags == ["cordoned"]
    assert r.ages["queue"] == pytest.approx(1.5)  # measured at 99.5
    restarted = signals(replica(queue=2), seq=1)
    restarted.epoch = 8
    assert f.update("b", restarted, "gossip", now=102.0)  # a new run of the publisher
    assert f.replicas(now=102.0)[0].state.queue == 2


def test_observations_track_inflight_and_latency() -> None:
    f = FusedState("me")
    f.update("b", signals(replica()), "gossip", now=100.0)
    key = replica().key
    f.observe_start(key, 100.0)
    f.observe_start(key, 100.0)
    f.observe_outcome(key, 0.010, True, 100.1)
    f.observe_outcome(key, 0.5, False, 100.2)
    [r] = f.replicas(now=100.3, model="m")
    assert r.observed.inflight == 0 and r.observed.outcomes == 2 and r.observed.failures == 1
    assert r.observed.latency_ewma == pytest.approx(0.010)
    assert f.replicas(now=100.3, model="other") == []
