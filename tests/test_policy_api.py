"""The policy admin RPCs and the node-to-node Consensus service, in process with real mTLS:
bad input gets INVALID_ARGUMENT naming the field, writes without coordinators fail fast with
UNAVAILABLE, streaming methods go through RBAC, and only node certificates may use Consensus."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from certs.identity import Identity
from gossip.config import Config
from gossip.protocol import Swim
from gossip.state import NodeMeta
from meshd.control.plane import ControlPlane
from meshd.coordinates import CoordinatePlane
from meshd.dev.ports import free_port
from proto.mesh.v1 import admin_pb2, admin_pb2_grpc
from testbed.admin import admin_channel, dev_security, mint, start_admin


class Server:
    """One admin server with a control plane that has no coordinators, plus identities."""

    def __init__(self, tmp: Path) -> None:
        self.tmp = tmp

    async def __aenter__(self) -> Server:
        self.swim = Swim(Config.local(), "a", ("127.0.0.1", 7000),
                         NodeMeta.build([], "", "", {}, {}), now=0.0)
        self.sec = dev_security(self.tmp / "a", "a")
        self.control = ControlPlane("a", self.sec.dir, self.sec, coordinator=False)
        self.control.attach(self.swim, None, "")
        self.port = free_port()
        self.server = await start_admin(self.swim, lambda: 0.0,
                                        CoordinatePlane("a", place_of=lambda n: None), self.sec,
                                        self.port, control=self.control)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.server.stop(0)

    def mint(self, name: str, roles: list[str], kind: str = "user") -> Identity:
        return mint(self.sec, self.tmp, name, roles, kind)

    async def call(self, method: str, request: Any, ident: Identity | None = None,
                   service: str = "Admin") -> Any:
        async with admin_channel(self.sec, self.port, ident) as ch:
            stub = getattr(admin_pb2_grpc, f"{service}Stub")(ch)
            return await getattr(stub, method)(request, timeout=5)

    async def code(self, method: str, request: Any, ident: Identity | None = None,
                   service: str = "Admin") -> tuple[grpc.StatusCode, str]:
        try:
            await self.call(method, request, ident, service)
        except grpc.aio.AioRpcError as exc:
            return exc.code(), exc.details() or ""
        return grpc.StatusCode.OK, ""


def run(tmp: Path, body: Any) -> None:
    async def main() -> None:
        async with Server(tmp) as srv:
            await body(srv)
    asyncio.run(main())


def test_bad_documents_name_the_field(tmp_path: Path) -> None:
    async def body(srv: Server) -> None:
        bad = {"kind": "TenantQuota", "name": "acme", "spec": {"requests_per_second": -1}}
        code, msg = await srv.code("PolicyApply", admin_pb2.PolicyApplyRequest(
            text=json.dumps(bad)))
        assert code is grpc.StatusCode.INVALID_ARGUMENT and "spec.requests_per_second" in msg
        code, msg = await srv.code("PolicyApply", admin_pb2.PolicyApplyRequest(
            text="kind: SloClass\nname: x\nspec: {deadline_ms: 10, colour: red}\n"))
        assert code is grpc.StatusCode.INVALID_ARGUMENT and "spec.colour" in msg
        code, msg = await srv.code("PolicyApply", admin_pb2.PolicyApplyRequest(text="{oops"))
        assert code is grpc.StatusCode.INVALID_ARGUMENT and "text" in msg
        code, msg = await srv.code("PolicyApply", admin_pb2.PolicyApplyRequest(text=""))
        assert code is grpc.StatusCode.INVALID_ARGUMENT
        code, msg = await srv.code("PolicyGet", admin_pb2.PolicyGetRequest(kind="Nope",
                                                                          name="x"))
        assert code is grpc.StatusCode.INVALID_ARGUMENT and "kind" in msg
        code, msg = await srv.code("PolicyList", admin_pb2.PolicyListRequest(kind="Nope"))
        assert code is grpc.StatusCode.INVALID_ARGUMENT and "kind" in msg
        code, msg = await srv.code("Cordon", admin_pb2.NodeFlagRequest(node="not a name!"))
        assert code is grpc.StatusCode.INVALID_ARGUMENT and msg.startswith("node:")
        code, msg = await srv.code("Cordon", admin_pb2.NodeFlagRequest(node="ghost"))
        assert code is grpc.StatusCode.NOT_FOUND and "ghost" in msg
        code, msg = await srv.code("Drain", admin_pb2.NodeFlagRequest(node="a",
                                                                      deadline_seconds=-3))
        assert code is grpc.StatusCode.INVALID_ARGUMENT and "deadline_seconds" in msg
        code, msg = await srv.code("Quarantine", admin_pb2.NodeFlagRequest(node="a"))
        assert code is grpc.StatusCode.INVALID_ARGUMENT and "reason" in msg
        code, msg = await srv.code("PolicyApply", admin_pb2.PolicyApplyRequest(
            text=json.dumps({"kind": "SloClass", "name": "x", "spec": {"deadline_ms": 5}}),
            timeout_seconds=1e9))
        assert code is grpc.StatusCode.INVALID_ARGUMENT and "timeout_seconds" in msg

    run(tmp_path, body)


def test_writes_without_coordinators_fail_fast_and_reads_still_answer(tmp_path: Path) -> None:
    async def body(srv: Server) -> None:
        doc = {"kind": "SloClass", "name": "gold", "spec": {"deadline_ms": 100}}
        code, msg = await srv.code("PolicyApply", admin_pb2.PolicyApplyRequest(
            text=json.dumps(doc)))
        assert code is grpc.StatusCode.UNAVAILABLE and "no quorum in raft group policy" in msg
        code, msg = await srv.code("Cordon", admin_pb2.NodeFlagRequest(node="a"))
        assert code is grpc.StatusCode.UNAVAILABLE
        listing = await srv.call("PolicyList", admin_pb2.PolicyListRequest())
        assert list(listing.documents_json) == [] and dict(listing.versions) == {
            "policy": 0, "placements": 0}
        status = await srv.call("RaftStatus", admin_pb2.RaftStatusRequest())
        assert list(status.groups) == []

    run(tmp_path, body)


def test_events_stream_is_guarded_and_resumable(tmp_path: Path) -> None:
    async def body(srv: Server) -> None:
        nobody = srv.mint("nobody", [])
        code2 = None
        async with admin_channel(srv.sec, srv.port, nobody) as ch:
            stream = admin_pb2_grpc.AdminStub(ch).SubscribeEvents(
                admin_pb2.SubscribeEventsRequest(), timeout=5)
            try:
                async for _ in stream:
                    break
            except grpc.aio.AioRpcError as exc:
                code2 = exc.code()
        assert code2 is grpc.StatusCode.PERMISSION_DENIED
        async with admin_channel(srv.sec, srv.port) as ch:
            stream = admin_pb2_grpc.AdminStub(ch).SubscribeEvents(
                admin_pb2.SubscribeEventsRequest(groups=["nope"]), timeout=5)
            with pytest.raises(grpc.aio.AioRpcError) as info:
                async for _ in stream:
                    pass
            assert info.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        # Feed the copy as a coordinator would, and read the changes back from version 1 on.
        from policy.store import PolicyStore
        src = PolicyStore()
        for name in ("a1", "a2", "a3"):
            src.apply({"op": "put", "doc": {"kind": "TenantQuota", "name": name, "spec": {}},
                       "author": "t", "at": 1.0})
        for change in src.changes_since(0) or []:
            srv.control.views["policy"].apply(change)
        got = []
        async with admin_channel(srv.sec, srv.port) as ch:
            stream = admin_pb2_grpc.AdminStub(ch).SubscribeEvents(
                admin_pb2.SubscribeEventsRequest(from_versions={"policy": 1},
                                                 no_membership=True), timeout=5)
            async for ev in stream:
                got.append((ev.group, ev.version, ev.op, ev.name))
                if len(got) == 2:
                    break
        assert got == [("policy", 2, "put", "a2"), ("policy", 3, "put", "a3")]

    run(tmp_path, body)


def test_consensus_service_is_for_nodes_only(tmp_path: Path) -> None:
    async def body(srv: Server) -> None:
        viewer = srv.mint("viewer", ["viewer"])
        code, _ = await srv.code("Propose", admin_pb2.ProposeRequest(group="policy"), viewer,
                                 service="Consensus")
        assert code is grpc.StatusCode.PERMISSION_DENIED
        node = srv.mint("b", ["node"], kind="node")
        code, msg = await srv.code("Propose", admin_pb2.ProposeRequest(group="nope"), node,
                                   service="Consensus")
        assert code is grpc.StatusCode.INVALID_ARGUMENT and "group" in msg
        code, msg = await srv.code("Propose", admin_pb2.ProposeRequest(
            group="policy", command_json="{}"), node, service="Consensus")
        assert code is grpc.StatusCode.UNAVAILABLE and "not a member" in msg
        # A node may follow the log: it gets the whole copy first (from version 0).
        async with admin_channel(srv.sec, srv.port, node) as ch:
            stream = admin_pb2_grpc.ConsensusStub(ch).Follow(
                admin_pb2.FollowRequest(group="policy", from_version=7), timeout=5)
            async for msg_ in stream:
                assert json.loads(msg_.snapshot_json)["version"] == 0
                break

    run(tmp_path, body)


@settings(max_examples=40, deadline=None)
@given(st.text(max_size=300))
def test_apply_text_fuzz_is_invalid_argument_or_unavailable(tmp_path_factory: Any,
                                                            text: str) -> None:
    """Whatever the text, the answer is INVALID_ARGUMENT (naming where) or, for a valid
    document with no coordinators, UNAVAILABLE: never INTERNAL or UNKNOWN."""
    tmp = tmp_path_factory.mktemp("fuzz")

    async def body(srv: Server) -> None:
        code, msg = await srv.code("PolicyApply", admin_pb2.PolicyApplyRequest(text=text))
        assert code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.UNAVAILABLE), msg
        assert msg

    run(tmp, body)


@pytest.mark.parametrize("heartbeats", [True, False])
def test_follower_drops_a_silent_coordinator(tmp_path: Path, heartbeats: bool,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """A partitioned coordinator never closes its Follow stream; its heartbeats stopping is
    how a follower notices.  With heartbeats the stream is kept; without, it is dropped."""
    import meshd.admin.policy
    import meshd.control.plane
    monkeypatch.setattr(meshd.control.plane, "FOLLOW_HEARTBEAT", 0.2)
    monkeypatch.setattr(meshd.control.plane, "FOLLOW_SILENCE", 0.8)
    monkeypatch.setattr(meshd.admin.policy, "FOLLOW_HEARTBEAT", 0.2 if heartbeats else 60.0)

    async def body(srv: Server) -> None:
        follower = ControlPlane("b", tmp_path / "b", srv.sec, coordinator=False)
        follower.attach(srv.swim, None, "")
        target = ("a", f"127.0.0.1:{srv.port}")
        monkeypatch.setattr(follower, "_pick_coordinator", lambda group: target)
        task = asyncio.get_running_loop().create_task(follower._follow("policy"))
        try:
            await asyncio.sleep(2.5)
        finally:
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
        if heartbeats:
            assert follower.views["policy"].source == "a"  # the stream was open and spoke
            assert follower.follow_errors["silent"] == 0, follower.follow_errors
        else:
            assert follower.follow_errors["silent"] >= 1, follower.follow_errors
            assert "a" in follower._failed  # not picked again for a while

    run(tmp_path, body)


def test_a_coordinator_sitting_on_a_forwarded_write_is_picked_last(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stalled leader keeps its connections up: a write it has held past ``SLOW_AFTER``
    sends the next one (a hedged lease renewal, say) to another voter, which hands it to
    whoever leads after the election."""
    from types import SimpleNamespace

    import meshd.control.plane
    from gossip.state import Status
    from meshd.control.plane import SLOW_AFTER

    clock = [100.0]
    monkeypatch.setattr(meshd.control.plane, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    sec = dev_security(tmp_path / "t", "t")
    cp = ControlPlane("t", sec.dir, sec, coordinator=False)
    members = [SimpleNamespace(name=n, live=True, status=Status.ALIVE, addr=(ip, 7946),
                               meta=SimpleNamespace(ports_dict={"admin": 9000}))
               for n, ip in (("c1", "127.0.0.2"), ("c2", "127.0.0.3"))]
    cp.swim = SimpleNamespace(members=lambda: members)  # type: ignore[assignment]
    cp.node_names = {"127.0.0.2:7000": "c1"}
    cp.published = {n: {"placements": ("127.0.0.2:7000", 5, ())} for n in ("c1", "c2")}
    assert cp._pick_coordinator("placements") == ("c1", "127.0.0.2:9000")  # the leader
    with cp._waiting_on("c1"):  # a write just went there: still the leader
        assert cp._pick_coordinator("placements") == ("c1", "127.0.0.2:9000")
        clock[0] += SLOW_AFTER + 0.1  # ... and it has not answered since
        assert cp._pick_coordinator("placements") == ("c2", "127.0.0.3:9000")
    assert cp._waiting["c1"] == []
    assert cp._pick_coordinator("placements") == ("c1", "127.0.0.2:9000")  # it answered
