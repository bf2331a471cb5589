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

    def __init__(self, tmp: Path, **authz: Any) -> None:
        self.tmp = tmp
        self.authz = authz

    async def __aenter__(self) -> Server:
        self.swim = Swim(Config.local(), "a", ("127.0.0.1", 7000),
                         NodeMeta.build([], "", "", {}, {}), now=0.0)
        self.sec = dev_security(self.tmp / "a", "a")
        self.control = ControlPlane("a", self.sec.dir, self.sec, coordinator=False)
        self.control.attach(self.swim, None, "")
        self.port = free_port()
        self.server = await start_admin(self.swim, lambda: 0.0,
                                        CoordinatePlane("a", place_of=lambda n: None), self.sec,
                                        self.port, control=self.control, **self.authz)
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


def run(tmp: Path, body: Any, **authz: Any) -> None:
    async def main() -> None:
        async with Server(tmp, **authz) as srv:
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


# --- forwarded writes carry their caller, whom the coordinator checks itself ------------------


class OneVoterGroup:
    """Stands in for a coordinator's Raft group: commits each command at once into a store
    that feeds the node's copy, so the real ``Consensus.Propose`` handler can take writes."""

    def __init__(self, control: ControlPlane, group: str = "policy") -> None:
        from policy.store import PolicyStore
        self.view = control.views[group]
        self.store = PolicyStore(self.view.store.kinds)
        self.commands: list[dict[str, Any]] = []

    async def propose(self, command: dict[str, Any], timeout: float) -> dict[str, Any]:
        self.commands.append(command)
        result = self.store.apply(command)
        for change in self.store.changes_since(self.view.version) or []:
            self.view.apply(change)
        return result


class Entry:
    """A second node, ``b``, with no Raft member: its admin API forwards every write to the
    ``Server`` (node ``a``, the coordinator), as a GPU node's would.  Its RBAC policy may be
    looser than the coordinator's (``policy_file``): the coordinator must not care."""

    def __init__(self, srv: Server, monkeypatch: pytest.MonkeyPatch, **authz: Any) -> None:
        import meshd.control.plane
        from meshd.security.plane import Security

        monkeypatch.setattr(meshd.control.plane, "READ_YOUR_WRITE_WAIT", 0.0)  # b's copy stays
        self.srv = srv
        self.sec = Security(srv.tmp / "b", "b", dev=True, ca_dir=srv.sec.ca_dir,
                            trust_domain="mesh.test")  # the same CA as a
        self.sec.prepare()
        self.swim = Swim(Config.local(), "b", ("127.0.0.1", 7001),
                         NodeMeta.build([], "", "", {}, {}), now=0.0)
        self.control = ControlPlane("b", self.sec.dir, self.sec, coordinator=False)
        self.control.attach(self.swim, None, "")
        target = ("a", f"127.0.0.1:{srv.port}")
        monkeypatch.setattr(self.control, "_pick_coordinator", lambda group: target)
        self.authz = authz
        self.port = free_port()

    async def __aenter__(self) -> Entry:
        self.server = await start_admin(self.swim, lambda: 0.0,
                                        CoordinatePlane("b", place_of=lambda n: None), self.sec,
                                        self.port, control=self.control, **self.authz)
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.server.stop(0)

    async def code(self, method: str, request: Any, ident: Identity,
                   bearer: str = "") -> tuple[grpc.StatusCode, str]:
        md = (("authorization", f"Bearer {bearer}"),) if bearer else None
        try:
            async with admin_channel(self.sec, self.port, ident) as ch:
                await getattr(admin_pb2_grpc.AdminStub(ch), method)(request, metadata=md,
                                                                    timeout=5)
        except grpc.aio.AioRpcError as exc:
            return exc.code(), exc.details() or ""
        return grpc.StatusCode.OK, ""


def _audit(srv: Server) -> list[dict[str, Any]]:
    return [json.loads(x) for x in (srv.sec.dir / "audit.log").read_text().splitlines()]


def _pem(ident: Identity) -> bytes:
    from cryptography.hazmat.primitives import serialization
    return ident.cert.public_bytes(serialization.Encoding.PEM)


def _doc(name: str, rps: float = 1.0) -> str:
    return json.dumps({"kind": "TenantQuota", "name": name,
                       "spec": {"requests_per_second": rps}})


def _put(name: str, author: str = "x") -> str:
    return json.dumps({"op": "put", "doc": json.loads(_doc(name)), "if_version": None,
                       "author": author, "at": 1.0})


def _propose(srv: Server, ident: Identity, command: str, **fields: Any
             ) -> Any:
    return srv.code("Propose", admin_pb2.ProposeRequest(group="policy", command_json=command,
                                                        **fields), ident, service="Consensus")


def _own_flags(name: str, value: Any, if_version: int) -> str:
    """The automatic quarantine (or its lift) the agent on ``name`` writes for itself."""
    return json.dumps({"op": "patch", "kind": "NodeFlags", "name": name,
                       "spec": {"quarantined": value}, "if_version": if_version,
                       "author": f"meshd/{name} (health)", "at": 1.0})


ADMIN = "spiffe://mesh.test/user/admin"
AUTO = {"reason": "auto: ECC", "auto": True}


def test_a_node_cannot_propose_a_policy_write_without_a_caller(tmp_path: Path) -> None:
    """``Consensus.Propose`` called directly with a node certificate: a policy write with no
    caller's credential is refused (PERMISSION_DENIED, counted, audited); nothing commits."""

    async def body(srv: Server) -> None:
        group = OneVoterGroup(srv.control)
        srv.control.groups["policy"] = group  # type: ignore[assignment]
        node = srv.mint("b", ["node"], kind="node")
        code, msg = await _propose(srv, node, _put("sneaky"))
        assert code is grpc.StatusCode.PERMISSION_DENIED, msg
        assert "no caller's credential" in msg and "forwarded by b" in msg, msg
        code, msg = await _propose(srv, node, json.dumps({
            "op": "delete", "kind": "TenantQuota", "name": "x", "if_version": None,
            "author": "x", "at": 1.0}), method="PolicyDelete")
        assert code is grpc.StatusCode.PERMISSION_DENIED and "PolicyDelete" in msg, msg
        assert group.commands == []
        assert dict(srv.sec.refusals) == {("forwarded", "no_credential"): 2}
        lines = _audit(srv)
        denied = [x for x in lines if not x["allowed"]]  # the write, under its own method
        assert [x["method"] for x in denied] == ["Propose", "PolicyDelete"], denied
        calls = [x for x in lines if x["allowed"]]  # the node's call, admitted then aborted
        assert [(x["method"], x["principal"], x["code"]) for x in calls] == [
            ("Propose", "spiffe://mesh.test/node/b", "PERMISSION_DENIED")] * 2, calls

    run(tmp_path, body)


def test_a_forged_on_behalf_of_is_refused(tmp_path: Path) -> None:
    """Naming an admin in ``on_behalf_of`` proves nothing: without the admin's credential, or
    with someone else's (a viewer's certificate), or with a credential whose method does not
    make this command (a Cordon that deletes a document), the write is refused and the
    refusal names the claimed caller."""

    async def body(srv: Server) -> None:
        group = OneVoterGroup(srv.control)
        srv.control.groups["policy"] = group  # type: ignore[assignment]
        node = srv.mint("b", ["node"], kind="node")
        viewer = srv.mint("vera", ["viewer"])
        operator = srv.mint("carl", ["operator"])
        code, msg = await _propose(srv, node, _put("forged"), on_behalf_of=ADMIN,
                                   method="PolicyApply")
        assert code is grpc.StatusCode.PERMISSION_DENIED, msg
        assert ADMIN in msg and "PolicyApply" in msg, msg
        code, msg = await _propose(srv, node, _put("forged2"), on_behalf_of=ADMIN,
                                   method="PolicyApply", caller_certificate_pem=_pem(viewer))
        assert code is grpc.StatusCode.PERMISSION_DENIED, msg
        assert ADMIN in msg and "spiffe://mesh.test/user/vera" in msg, msg
        code, msg = await _propose(srv, node, json.dumps({
            "op": "delete", "kind": "TenantQuota", "name": "x", "if_version": None,
            "author": "x", "at": 1.0}), method="Cordon", caller_certificate_pem=_pem(operator),
            on_behalf_of="spiffe://mesh.test/user/carl")
        assert code is grpc.StatusCode.PERMISSION_DENIED and "Cordon" in msg, msg
        # The agent's own write may not claim a person either.
        code, msg = await _propose(srv, node, _own_flags("b", AUTO, 0), on_behalf_of=ADMIN)
        assert code is grpc.StatusCode.PERMISSION_DENIED and ADMIN in msg, msg
        assert group.commands == []
        assert dict(srv.sec.refusals) == {("forwarded", "no_credential"): 1,
                                          ("forwarded", "forged_caller"): 2,
                                          ("forwarded", "wrong_method"): 1}
        denied = [x for x in _audit(srv) if not x["allowed"] and x["method"] != "Propose"]
        assert any(x["method"] == "PolicyApply" and ADMIN in x["detail"] for x in denied)
        assert any(x["method"] == "PolicyApply" and x["principal"] ==
                   "spiffe://mesh.test/user/vera" for x in denied), denied

    run(tmp_path, body)


def test_the_agents_own_quarantine_is_a_node_write(tmp_path: Path) -> None:
    """What a node's agent writes by itself needs no person: its automatic quarantine of
    itself, and the lift, go through under its own name.  Another node's flags, a manual
    quarantine, or replacing or lifting an operator's quarantine do not."""

    async def body(srv: Server) -> None:
        group = OneVoterGroup(srv.control)
        srv.control.groups["policy"] = group  # type: ignore[assignment]
        node = srv.mint("b", ["node"], kind="node")
        code, msg = await _propose(srv, node, _own_flags("b", AUTO, 0))
        assert code is grpc.StatusCode.OK, msg
        stored = srv.control.views["policy"].store.get("NodeFlags", "b")
        assert stored is not None and stored.author == "meshd/b (health) via b"
        code, msg = await _propose(srv, node, _own_flags("b", None, stored.version))
        assert code is grpc.StatusCode.OK, msg
        code, msg = await _propose(srv, node, _own_flags("c", AUTO, 0))
        assert code is grpc.StatusCode.PERMISSION_DENIED and "'c'" in msg, msg
        code, msg = await _propose(srv, node, _own_flags("b", {"reason": "manual"}, 0))
        assert code is grpc.StatusCode.PERMISSION_DENIED, msg
        # An operator quarantined b: b's agent can neither lift nor replace that.
        group.store.apply({"op": "patch", "kind": "NodeFlags", "name": "b", "if_version": None,
                           "spec": {"quarantined": {"reason": "bad fan"}}, "author": "op",
                           "at": 2.0})
        for change in group.store.changes_since(group.view.version) or []:
            group.view.apply(change)
        stored = srv.control.views["policy"].store.get("NodeFlags", "b")
        assert stored is not None
        for value in (None, AUTO):
            code, msg = await _propose(srv, node, _own_flags("b", value, stored.version))
            assert code is grpc.StatusCode.PERMISSION_DENIED and "operator" in msg, msg
        assert dict(srv.sec.refusals) == {("forwarded", "no_credential"): 4}

    run(tmp_path, body)


LOOSE = ('[roles]\nviewer = ["PolicyApply", "PolicyGet", "Cordon"]\n'
         'operator = ["PolicyApply", "PolicyDelete", "Cordon"]\n')
"""Node b's policy: viewers may write there.  The coordinator's (the default) is stricter."""


def test_a_viewers_forwarded_write_is_refused_on_the_coordinator(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Node b lets viewers write; a viewer's write it forwards is refused on the coordinator
    (counted and audited there under the viewer's name; b's client is told who was refused
    which method), and so is an operator whose certificate the coordinator has revoked and
    b has not heard of yet: the coordinator checks the caller itself."""
    loose = tmp_path / "loose.toml"
    loose.write_text(LOOSE)

    async def body(srv: Server) -> None:
        group = OneVoterGroup(srv.control)
        srv.control.groups["policy"] = group  # type: ignore[assignment]
        async with Entry(srv, monkeypatch, policy_file=str(loose)) as b:
            viewer = srv.mint("vera", ["viewer"])
            code, msg = await b.code("PolicyApply", admin_pb2.PolicyApplyRequest(
                text=_doc("from-viewer")), viewer)
            assert code is grpc.StatusCode.PERMISSION_DENIED, msg
            assert "PolicyApply" in msg and "spiffe://mesh.test/user/vera" in msg, msg
            code, msg = await b.code("Cordon", admin_pb2.NodeFlagRequest(node="b"), viewer)
            assert code is grpc.StatusCode.PERMISSION_DENIED and "Cordon" in msg, msg
            from certs.spiffe import SpiffeId
            rita = srv.mint("rita", ["operator"])
            srv.sec.revoke(SpiffeId("mesh.test", "user", "rita"))
            code, msg = await b.code("PolicyApply", admin_pb2.PolicyApplyRequest(
                text=_doc("from-revoked")), rita)
            assert code is grpc.StatusCode.PERMISSION_DENIED and "revoked" in msg, msg
            assert "spiffe://mesh.test/user/rita" in msg, msg
        assert group.commands == []
        assert dict(srv.sec.refusals) == {("forwarded", "permission_denied"): 2,
                                          ("forwarded", "revoked"): 1}
        lines = _audit(srv)
        assert any(x["method"] == "PolicyApply" and not x["allowed"]
                   and x["principal"] == "spiffe://mesh.test/user/vera" for x in lines), lines
        assert any(x["method"] == "Cordon" and not x["allowed"]
                   and x["principal"] == "spiffe://mesh.test/user/vera" for x in lines), lines

    run(tmp_path, body)


def test_an_operators_forwarded_write_is_theirs(tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """An operator's write through b commits, authored by the operator, and the coordinator's
    audit log records the operator (verified there), not only the forwarding node."""
    loose = tmp_path / "loose.toml"
    loose.write_text(LOOSE)

    async def body(srv: Server) -> None:
        group = OneVoterGroup(srv.control)
        srv.control.groups["policy"] = group  # type: ignore[assignment]
        async with Entry(srv, monkeypatch, policy_file=str(loose)) as b:
            operator = srv.mint("olga", ["operator"])
            code, msg = await b.code("PolicyApply", admin_pb2.PolicyApplyRequest(
                text=_doc("from-operator")), operator)
            assert code is grpc.StatusCode.OK, msg
            code, msg = await b.code("Cordon", admin_pb2.NodeFlagRequest(node="b"), operator)
            assert code is grpc.StatusCode.OK, msg
        store = srv.control.views["policy"].store
        for kind, name in (("TenantQuota", "from-operator"), ("NodeFlags", "b")):
            stored = store.get(kind, name)
            assert stored is not None and stored.author == "spiffe://mesh.test/user/olga via b"
        assert not srv.sec.refusals
        allowed = {x["method"] for x in _audit(srv) if x["allowed"]
                   and x["principal"] == "spiffe://mesh.test/user/olga"
                   and x["detail"] == "forwarded by b"}
        assert allowed == {"PolicyApply", "Cordon"}

    run(tmp_path, body)


def test_a_forwarded_bearer_token_is_verified_on_the_coordinator(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """People with bearer tokens: the token goes along and the coordinator verifies it with
    its own keys; a viewer's token is refused there, an operator's write is theirs."""
    import time

    import jwt
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    idp = ec.generate_private_key(ec.SECP256R1())
    pub = tmp_path / "idp.pem"
    pub.write_bytes(idp.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    issuer = "https://idp.test"
    loose = tmp_path / "loose.toml"
    loose.write_text('[roles]\nviewer = ["PolicyApply"]\noperator = ["PolicyApply"]\n')

    def token(sub: str, roles: list[str]) -> str:
        return jwt.encode({"iss": issuer, "aud": "meshd", "sub": sub, "roles": roles,
                           "exp": time.time() + 300}, idp, algorithm="ES256")

    async def body(srv: Server) -> None:
        srv.control.groups["policy"] = OneVoterGroup(srv.control)  # type: ignore[assignment]
        async with Entry(srv, monkeypatch, policy_file=str(loose), jwt_key=str(pub),
                         jwt_issuer=issuer) as b:
            tls_only = srv.mint("n9", ["node"], kind="node")  # the certificate meshctl shows
            code, msg = await b.code("PolicyApply", admin_pb2.PolicyApplyRequest(
                text=_doc("by-bob")), tls_only, bearer=token("bob", ["viewer"]))
            assert code is grpc.StatusCode.PERMISSION_DENIED, msg
            assert "PolicyApply" in msg and f"jwt:{issuer}/bob" in msg, msg
            code, msg = await b.code("PolicyApply", admin_pb2.PolicyApplyRequest(
                text=_doc("by-alice")), tls_only, bearer=token("alice", ["operator"]))
            assert code is grpc.StatusCode.OK, msg
            stored = srv.control.views["policy"].store.get("TenantQuota", "by-alice")
            assert stored is not None and stored.author == f"jwt:{issuer}/alice via b"
            assert srv.control.views["policy"].store.get("TenantQuota", "by-bob") is None
        assert dict(srv.sec.refusals)[("forwarded", "permission_denied")] == 1
        text = (srv.sec.dir / "audit.log").read_text()
        assert "eyJ" not in text  # no token in the coordinator's audit log either

    run(tmp_path, body, jwt_key=str(pub), jwt_issuer=issuer)
