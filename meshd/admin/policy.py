"""Admin RPCs for policies, node flags, Raft status and events, and the node-to-node
``Consensus`` service.

Every write is validated here first (a bad document is INVALID_ARGUMENT naming the field before
anything reaches Raft), then committed through :meth:`meshd.control.plane.ControlPlane.write`, whose
failures map to gRPC codes that say whether a retry is safe:

- UNAVAILABLE: not applied (no quorum, no leader); retry later.
- DEADLINE_EXCEEDED: the outcome is unknown (timed out, or the leader changed under it).
- ABORTED: ``if_version`` did not match (re-read and retry); NOT_FOUND: nothing to delete.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc

from consensus.group import GROUPS, ConsensusError
from meshd.admin import calls
from meshd.admin.authz import CALLER
from meshd.control.plane import FOLLOW_HEARTBEAT, ControlPlane, status_pb
from policy.document import parse_documents
from policy.errors import PolicyError
from policy.model import KINDS, validate_key
from policy.store import Change
from proto.mesh.v1 import admin_pb2, admin_pb2_grpc

DEFAULT_DRAIN = 300.0
EVENT_WAIT = 1.0


def change_event(group: str, change: Change) -> admin_pb2.Event:
    doc = change.doc.to_dict() if change.doc is not None else None
    return admin_pb2.Event(group=group, version=change.version, op=change.op, kind=change.kind,
                           name=change.name, document_json=json.dumps(doc) if doc else "",
                           at_unix=change.at, author=change.author)


class PolicyAdmin:
    """The policy half of :class:`meshd.admin.server.AdminService` (a mixin: it needs ``control``
    and ``swim``)."""

    control: ControlPlane
    swim: Any

    async def _flags(self, request: admin_pb2.NodeFlagRequest,
                     context: grpc.aio.ServicerContext, spec: dict[str, Any]
                     ) -> admin_pb2.PolicyWriteResponse:
        try:
            validate_key("NodeFlags", request.node)
        except PolicyError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"node: {exc.message}")
        if self.swim.member(request.node) is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"node: no member named "
                                f"{request.node!r}")
        timeout = await calls.timeout(request.timeout_seconds, context)
        result = await calls.commit(self.control, context, "policy", {
            "op": "patch", "kind": "NodeFlags", "name": request.node, "spec": spec,
            "author": calls.caller(), "at": time.time()}, timeout)
        return self._written("policy", "NodeFlags", request.node, result)

    def _written(self, group: str, kind: str, name: str, result: dict[str, Any]
                 ) -> admin_pb2.PolicyWriteResponse:
        stored = self.control.views[group].store.get(kind, name)
        doc = stored.to_dict() if stored is not None else None
        return admin_pb2.PolicyWriteResponse(version=int(result.get("version", 0)),
                                             document_json=json.dumps(doc) if doc else "",
                                             group=group)

    async def Cordon(self, request: admin_pb2.NodeFlagRequest,  # noqa: N802 - gRPC name
                     context: grpc.aio.ServicerContext) -> admin_pb2.PolicyWriteResponse:
        return await self._flags(request, context, {"cordoned": True})

    async def Uncordon(self, request: admin_pb2.NodeFlagRequest,  # noqa: N802
                       context: grpc.aio.ServicerContext) -> admin_pb2.PolicyWriteResponse:
        return await self._flags(request, context, {"cordoned": None, "draining": None})

    async def Drain(self, request: admin_pb2.NodeFlagRequest,  # noqa: N802
                    context: grpc.aio.ServicerContext) -> admin_pb2.PolicyWriteResponse:
        seconds = request.deadline_seconds or DEFAULT_DRAIN
        if not 0 < seconds <= 7 * 86400:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"deadline_seconds: must be > 0 and at most 7 days, got "
                                f"{request.deadline_seconds}")
        return await self._flags(request, context,
                                 {"draining": {"deadline_unix": time.time() + seconds}})

    async def Quarantine(self, request: admin_pb2.NodeFlagRequest,  # noqa: N802
                         context: grpc.aio.ServicerContext) -> admin_pb2.PolicyWriteResponse:
        if request.clear:
            return await self._flags(request, context, {"quarantined": None})
        if not request.reason.strip():
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                "reason: a quarantine needs a reason (or clear)")
        return await self._flags(request, context,
                                 {"quarantined": {"reason": request.reason}})

    async def PolicyApply(self, request: admin_pb2.PolicyApplyRequest,  # noqa: N802
                          context: grpc.aio.ServicerContext) -> admin_pb2.PolicyApplyResponse:
        try:
            docs = parse_documents(request.text, "text")
        except PolicyError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        if not docs:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "text: no documents")
        if request.HasField("if_version") and len(docs) != 1:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                "if_version: only with a single document")
        timeout = await calls.timeout(request.timeout_seconds, context)
        if_version = request.if_version if request.HasField("if_version") else None
        out = admin_pb2.PolicyApplyResponse()
        for doc in docs:
            group = KINDS[doc.kind]
            result = await calls.commit(self.control, context, group, {
                "op": "put", "doc": doc.to_dict(), "if_version": if_version,
                "author": calls.caller(), "at": time.time()}, timeout)
            out.results.append(self._written(group, doc.kind, doc.name, result))
        return out

    async def _key(self, kind: str, name: str, context: grpc.aio.ServicerContext
                   ) -> tuple[str, str, str]:
        try:
            kind, name = validate_key(kind, name)
        except PolicyError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return KINDS[kind], kind, name

    async def PolicyGet(self, request: admin_pb2.PolicyGetRequest,  # noqa: N802
                        context: grpc.aio.ServicerContext) -> admin_pb2.PolicyGetResponse:
        group, kind, name = await self._key(request.kind, request.name, context)
        if request.consistent:
            timeout = await calls.timeout(request.timeout_seconds, context)
            result = await calls.commit(self.control, context, group,
                                  {"op": "read", "kind": kind, "name": name}, timeout)
            doc = result.get("doc")
            return admin_pb2.PolicyGetResponse(
                document_json=json.dumps(doc) if doc else "", found=doc is not None,
                store_version=int(result.get("version", 0)))
        store = self.control.views[group].store
        stored = store.get(kind, name)
        return admin_pb2.PolicyGetResponse(
            document_json=json.dumps(stored.to_dict()) if stored else "",
            found=stored is not None, store_version=store.version)

    async def PolicyList(self, request: admin_pb2.PolicyListRequest,  # noqa: N802
                         context: grpc.aio.ServicerContext) -> admin_pb2.PolicyListResponse:
        if request.kind and request.kind not in KINDS:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"kind: unknown kind {request.kind!r}; expected one of "
                                f"{', '.join(KINDS)}")
        out = admin_pb2.PolicyListResponse()
        for group, view in self.control.views.items():
            out.versions[group] = view.version
            if request.kind and KINDS[request.kind] != group:
                continue
            for stored in view.store.list(request.kind or None):
                out.documents_json.append(json.dumps(stored.to_dict()))
        return out

    async def PolicyDelete(self, request: admin_pb2.PolicyDeleteRequest,  # noqa: N802
                           context: grpc.aio.ServicerContext) -> admin_pb2.PolicyWriteResponse:
        group, kind, name = await self._key(request.kind, request.name, context)
        timeout = await calls.timeout(request.timeout_seconds, context)
        result = await calls.commit(self.control, context, group, {
            "op": "delete", "kind": kind, "name": name,
            "if_version": request.if_version if request.HasField("if_version") else None,
            "author": calls.caller(), "at": time.time()}, timeout)
        return admin_pb2.PolicyWriteResponse(version=int(result.get("version", 0)),
                                             group=group)

    async def RaftStatus(self, request: admin_pb2.RaftStatusRequest,  # noqa: N802
                         context: grpc.aio.ServicerContext) -> admin_pb2.RaftStatusResponse:
        out = admin_pb2.RaftStatusResponse(groups=await self.control.cluster_status())
        for group, view in self.control.views.items():
            out.local_versions[group] = view.version
        return out

    async def SubscribeEvents(self, request: admin_pb2.SubscribeEventsRequest,  # noqa: N802
                              context: grpc.aio.ServicerContext
                              ) -> AsyncIterator[admin_pb2.Event]:
        unknown = [g for g in request.groups if g not in GROUPS]
        if unknown:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"groups: unknown group {unknown[0]!r}; expected one of "
                                f"{', '.join(GROUPS)}")
        groups = list(request.groups) or list(GROUPS)
        seen = {g: int(request.from_versions.get(g, 0)) for g in groups}
        members_seq = self.control.membership_seq
        while True:
            generation = self.control.generation
            for g in groups:
                view = self.control.views[g]
                changes = (view.store.changes_since(seen[g]) if seen[g] <= view.version
                           else None)
                if changes is None:  # history too short (or our copy was reset): start over
                    yield admin_pb2.Event(group=g, version=view.version, op="reset")
                    for stored in view.store.list():
                        yield admin_pb2.Event(group=g, version=stored.version, op="put",
                                              kind=stored.document.kind,
                                              name=stored.document.name,
                                              document_json=json.dumps(stored.to_dict()),
                                              at_unix=stored.updated_unix,
                                              author=stored.author)
                    seen[g] = view.version
                    continue
                for change in changes:
                    yield change_event(g, change)
                    seen[g] = change.version
            if not request.no_membership:
                for seq, kind, name, at in self.control.membership_since(members_seq):
                    yield admin_pb2.Event(group="membership", version=seq, op=kind, name=name,
                                          at_unix=at)
                    members_seq = seq
            await self.control.wait_moved(generation, EVENT_WAIT)


class ConsensusService(admin_pb2_grpc.ConsensusServicer):
    """Node-to-node: forwarded writes, log following, status.  Only node certificates."""

    def __init__(self, control: ControlPlane) -> None:
        self.control = control

    async def _nodes_only(self, context: grpc.aio.ServicerContext) -> str:
        caller = CALLER.get()
        if caller is None or caller.kind != "node":
            await context.abort(grpc.StatusCode.PERMISSION_DENIED,
                                "the Consensus service is for mesh nodes only")
        assert caller is not None
        return caller.name

    async def _group(self, name: str, context: grpc.aio.ServicerContext) -> str:
        if name not in GROUPS:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"group: unknown group {name!r}; expected one of "
                                f"{', '.join(GROUPS)}")
        return name

    async def Propose(self, request: admin_pb2.ProposeRequest,  # noqa: N802 - gRPC name
                      context: grpc.aio.ServicerContext) -> admin_pb2.ProposeResponse:
        via = await self._nodes_only(context)
        group = await self._group(request.group, context)
        grp = self.control.groups.get(group)
        if grp is None:
            await context.abort(grpc.StatusCode.UNAVAILABLE,
                                f"no quorum reachable through {self.control.node}: it is not a "
                                f"member of raft group {group}")
        assert grp is not None
        try:
            command = json.loads(request.command_json)
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"command_json: {exc}")
        if not isinstance(command, dict):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                "command_json: must be a JSON object")
        if "author" in command:
            who = request.on_behalf_of or "?"
            command["author"] = f"{who} via {via}"[:256]
        timeout = await calls.timeout(request.timeout_seconds, context)
        try:
            result = await grp.propose(command, timeout)
        except ConsensusError as exc:
            await context.abort(calls.CONSENSUS_CODES.get(exc.code, grpc.StatusCode.UNAVAILABLE),
                                str(exc))
        return admin_pb2.ProposeResponse(result_json=json.dumps(result))

    async def Follow(self, request: admin_pb2.FollowRequest,  # noqa: N802
                     context: grpc.aio.ServicerContext) -> AsyncIterator[admin_pb2.FollowMessage]:
        await self._nodes_only(context)
        group = await self._group(request.group, context)
        view = self.control.views[group]
        at = int(request.from_version)
        while True:
            changes = view.store.changes_since(at) if at <= view.version else None
            if changes is None:
                snapshot = view.store.snapshot()
                yield admin_pb2.FollowMessage(snapshot_json=json.dumps(snapshot))
                at = int(snapshot["version"])
            else:
                for change in changes:
                    yield admin_pb2.FollowMessage(change_json=json.dumps(change.to_dict()))
                    at = change.version
            if not await view.wait_beyond(at, FOLLOW_HEARTBEAT):
                yield admin_pb2.FollowMessage()

    async def Status(self, request: admin_pb2.RaftStatusRequest,  # noqa: N802
                     context: grpc.aio.ServicerContext) -> admin_pb2.RaftStatusResponse:
        await self._nodes_only(context)
        out = admin_pb2.RaftStatusResponse(
            groups=[status_pb(s, self.control.node) for s in self.control.local_status()])
        for group, view in self.control.views.items():
            out.local_versions[group] = view.version
        return out


NODE_ONLY = ("Propose", "Follow", "Status")
"""Consensus methods: nodes only (admins may call them too, by the default policy)."""
