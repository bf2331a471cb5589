"""The agent's coordinate plane (probe hook, node state, publication policy), the node-state
format, the admin ``Rtt`` API in-process, and meshctl's rendering of it."""

from __future__ import annotations

import asyncio
import math
import random
import struct
from pathlib import Path

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gossip.config import Config
from gossip.protocol import Swim
from gossip.state import Member, NodeMeta, Status
from meshd.coordinates import CoordinatePlane, PublishPolicy
from meshd.ctl import main as ctl
from meshd.dev.ports import free_port
from meshd.signals import nodestate
from proto.mesh.v1 import admin_pb2, admin_pb2_grpc
from testbed.admin import admin_channel, dev_security, start_admin
from topology import wire
from topology.coordinate import Coordinate
from topology.zones import Place, Relation

FUZZ = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def member(name: str) -> Member:
    return Member(name, ("10.0.0.9", 7946), 1, Status.ALIVE)


def coord(x: float, error: float = 0.2, height: float = 1e-4) -> Coordinate:
    return Coordinate((x,) + (0.0,) * 7, error, 0.0, height)


# --- node state ------------------------------------------------------------------------------

def test_node_state_roundtrip_and_publisher_only_emits_changes() -> None:
    pub = nodestate.Publisher()
    assert pub.take() is None
    pub.set(nodestate.COORDINATE, b"abc")
    published = pub.take()
    assert published is not None and nodestate.decode(published[0]) == {"coord": b"abc"}
    assert pub.take() is None
    pub.set(nodestate.COORDINATE, b"abc")
    assert pub.take() is None, "setting the same bytes is not a change"
    pub.set("telemetry", b"t")
    published = pub.take()
    assert published is not None
    assert nodestate.decode(published[0]) == {"coord": b"abc", "telemetry": b"t"}


@pytest.mark.parametrize("blob", [b"", b"\xc1", b"\x92\x01\x02", b"\x81\x01\xc4\x00",
                                  b"\x81\xa1a\x01", b"\x81\xa1a\xc4\x01x\x00"])
def test_node_state_rejects_malformed(blob: bytes) -> None:
    with pytest.raises(nodestate.NodeStateError):
        nodestate.decode(blob)


@FUZZ
@given(st.binary(max_size=300))
def test_node_state_decode_fuzz(blob: bytes) -> None:
    try:
        doc = nodestate.decode(blob)
    except nodestate.NodeStateError:
        return
    assert all(isinstance(k, str) and isinstance(v, bytes) for k, v in doc.items())


# --- probe hook ------------------------------------------------------------------------------

def test_probe_acks_update_the_coordinate_and_count_bad_payloads() -> None:
    plane = CoordinatePlane("a", rng=random.Random(1))
    first = plane.ack_payload()
    assert wire.decode(first) == plane.client.coordinate
    assert plane.ack_payload() is first, "payload is cached until the coordinate moves"

    plane.probe_acked(member("b"), 0.010, b"")
    plane.probe_acked(member("b"), 0.010, b"\x01\x08short")
    plane.probe_acked(member("b"), 0.010, b"\x02\x08" + bytes(88))
    nan = wire.encode(coord(0.0)).replace(struct.pack("<d", 0.0), struct.pack("<d", math.nan), 1)
    plane.probe_acked(member("b"), 0.010, nan)
    assert dict(plane.rejected) == {"missing": 1, "malformed": 1, "unsupported_version": 1,
                                    "invalid_coordinate": 1}
    assert plane.client.stats.updates == 0 and plane.coordinate_of("b") is None

    peer = wire.encode(coord(0.005))
    plane.probe_acked(member("b"), 0.010, peer)
    assert plane.client.stats.updates == 1
    assert plane.coordinate_of("b") == wire.decode(peer)
    assert len(plane.estimate_errors) == 1
    assert plane.ack_payload() != first
    assert plane.measured_rtt("b") == 0.010

    plane.probe_acked(member("b"), 20.0, peer)  # outside (0, 10 s]: refused by the client
    assert plane.client.stats.rejected["rtt_out_of_range"] == 1
    plane.forget("b")
    assert plane.coordinate_of("b") is None and plane.measured_rtt("b") is None


def test_node_state_coordinates_feed_estimates_between_other_nodes() -> None:
    places = {"b": Place("z1", "r1"), "c": Place("z2", "r2")}
    plane = CoordinatePlane("a", place_of=places.get)
    plane.learned("b", wire.encode(coord(0.0, error=0.05)))
    plane.learned("c", wire.encode(coord(0.040, error=0.05)))
    plane.learned("a", wire.encode(coord(9.0)))  # our own state echoed back: ignored
    plane.learned("d", b"junk")
    assert plane.rejected["unsupported_version"] == 1  # b"j" is not version 1
    est = plane.estimate("b", "c")
    assert est.source == "coordinates" and est.relation == Relation.CROSS_REGION
    assert est.rtt == pytest.approx(0.040 + 2e-4)
    assert est.confidence == pytest.approx(0.95)
    assert plane.estimate("b", "b").source == "self"
    # A node we know nothing about, with no labels: nothing to say.
    assert plane.estimate("b", "x").source == "none"


def test_publication_is_rate_limited_and_waits_for_real_movement() -> None:
    plane = CoordinatePlane("a", policy=PublishPolicy(min_interval=5.0), rng=random.Random(2))
    assert plane.to_publish(0.0) is not None, "first publication is immediate"
    assert plane.to_publish(1.0) is None, "within min_interval"
    assert plane.to_publish(10.0) is None, "nothing moved"
    for _ in range(3):
        plane.probe_acked(member("b"), 0.050, wire.encode(coord(0.0, error=0.1)))
    assert plane.to_publish(11.0) is not None
    assert wire.decode(plane.to_publish(30.0) or wire.encode(plane.client.coordinate)) \
        == plane.client.coordinate


# --- admin API, in process -------------------------------------------------------------------


def test_admin_rtt_statuses_and_members_coordinates(tmp_path: Path) -> None:
    async def scenario() -> None:
        now = 0.0
        swim = Swim(Config.local(), "a", ("127.0.0.1", 7000), NodeMeta.build([], "z1", "r1",
                                                                              {}, {}), now=now)
        swim.restore({"b": Member("b", ("127.0.0.2", 7000), 1, Status.ALIVE,
                                  meta=NodeMeta.build([], "z1", "r1", {}, {}))})
        plane = CoordinatePlane("a", place_of=lambda n: (
            Place(m.meta.zone, m.meta.region) if (m := swim.member(n)) else None))
        port = free_port()
        sec = dev_security(tmp_path, "a")
        server = await start_admin(swim, lambda: now, plane, sec, port)
        try:
            async with admin_channel(sec, port) as ch:
                stub = admin_pb2_grpc.AdminStub(ch)
                for req, code, text in (
                    (admin_pb2.RttRequest(), grpc.StatusCode.INVALID_ARGUMENT, "a:"),
                    (admin_pb2.RttRequest(a="zz"), grpc.StatusCode.NOT_FOUND, "'zz'"),
                    (admin_pb2.RttRequest(a="a", b="yy"), grpc.StatusCode.NOT_FOUND, "b:"),
                ):
                    with pytest.raises(grpc.aio.AioRpcError) as err:
                        await stub.Rtt(req)
                    assert err.value.code() == code and text in (err.value.details() or "")
                # Labels only so far: a same-zone prior.
                resp = await stub.Rtt(admin_pb2.RttRequest(a="b"))
                assert resp.b == "a" and resp.local_node == "a"
                assert resp.estimate.source == "zone" and resp.estimate.relation == "same-zone"
                # Learn b's coordinate from probe acks: a coordinate estimate plus a measurement.
                for _ in range(40):
                    plane.probe_acked(swim.member("b"), 0.004,  # type: ignore[arg-type]
                                      wire.encode(coord(0.0, error=0.05)))
                resp = await stub.Rtt(admin_pb2.RttRequest(a="a", b="b"))
                assert resp.estimate.source == "coordinates"
                assert resp.estimate.rtt_seconds == pytest.approx(0.004, rel=0.1)
                assert resp.measured_rtt_seconds == pytest.approx(0.004)
                text = ctl.format_rtt_answer(resp)
                assert text.startswith("Estimated a <-> b rtt: ") and "same-zone" in text
                assert "Measured by a" in text
                members = await stub.Members(admin_pb2.MembersRequest())
                by_name = {m.name: m for m in members.members}
                assert len(by_name["a"].coordinate.vec) == 8
                assert by_name["b"].rtt_from_local.source == "coordinates"
                table = ctl.format_members_table(members, detailed=True)
                assert table.splitlines()[0].split()[-3:] == ["COORD-ERR", "HEIGHT", "RTT"]
        finally:
            await server.stop(0)

    asyncio.run(scenario())


def test_meshctl_rtt_text_for_each_source() -> None:
    def resp(**est: object) -> admin_pb2.RttResponse:
        return admin_pb2.RttResponse(a="x", b="y", estimate=admin_pb2.RttEstimate(**est))

    assert ctl.format_rtt_answer(resp(source="none", relation="unknown")).startswith(
        "No estimate for x <-> y yet")
    zone = ctl.format_rtt_answer(resp(source="zone", rtt_seconds=0.002, confidence=0.2,
                                      relation="same-region"))
    assert "2.000 ms" in zone and "zone labels only" in zone
    odd = ctl.format_rtt_answer(resp(source="coordinates", rtt_seconds=0.05, error=0.1,
                                     confidence=0.45, relation="same-zone", consistent=False))
    assert "50.000 ms" in odd and "contradict" in odd


def test_the_member_table_leaves_out_the_mesh_id_every_member_shares() -> None:
    resp = admin_pb2.MembersResponse(members=[admin_pb2.Member(
        name="a", address="127.0.0.1:7946", status="alive",
        tags={"mesh": "e" * 32, "rack": "r7"})])
    table = ctl.format_members_table(resp)
    assert "rack=r7" in table and "mesh=" not in table
