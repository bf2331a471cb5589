"""Admin RPCs for policies, node flags, Raft status and events, and the node-to-node
``Consensus`` service.

Every write is validated here first (a bad document is INVALID_ARGUMENT naming the field before
anything reaches Raft), then committed through :meth:`meshd.control.plane.ControlPlane.write`, whose
failures map to gRPC codes that say whether a retry is safe:

- UNAVAILABLE: not applied (no quorum, no leader); retry later.
- DEADLINE_EXCEEDED: the outcome is unknown (timed out, or the leader changed under it).
- ABORTED: ``if_version`` did not match (re-read and retry); NOT_FOUND: nothing to delete.

A write that enters at a node without a Raft member is forwarded to a coordinator with
``Consensus.Propose``, carrying its caller's credential; the coordinator verifies that caller
itself and applies its own RBAC policy (:meth:`ConsensusService.Propose`).
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from typing import Any

import grpc

from consensus.group import GROUPS, ConsensusError
from meshd.admin import calls
from meshd.admin.authz import AUTHORIZER, CALLER, Refused
from meshd.control.plane import FOLLOW_HEARTBEAT, ControlPlane, Credential, status_pb
from meshd.train.board import LEASE_OPS
from policy.document import parse_documents
from policy.errors import PolicyError
from policy.model import KINDS, validate_key
from policy.store import Change
from proto.mesh.v1 import admin_pb2, admin_pb2_grpc

DEFAULT_DRAIN = 300.0
EVENT_WAIT = 1.0
OWN_WRITE_WAIT = 1.0
"""How long a coordinator waits for its copy to reach the version a node's own quarantine
write was decided on, before it can tell whether an operator's quarantine is in the way."""

FLAG_FIELDS = {"Cordon": frozenset({"cordoned"}), "Uncordon": frozenset({"cordoned", "draining"}),
               "Drain": frozenset({"draining"}), "Quarantine": frozenset({"quarantined"})}
DOCUMENT_OPS = {"PolicyApply": "put", "PolicyDelete": "delete"}
JOB_OPS = {"SubmitJob": "submit", "CancelJob": "cancel"}
"""The admin methods that write, by the command each one makes (``NodeFlags`` patches of
these fields, documents, jobs): a forwarded write must be what its method makes."""
NODE_OPS = ("read", "noop")
"""Commands that change nothing: any node may forward them (nodes read every policy anyway)."""


def fits(method: str, group: str, command: dict[str, Any]) -> bool:
    """Whether ``command`` is what admin method ``method`` writes, as the handlers here and in
    :mod:`meshd.admin.jobs` build it.  RBAC grants methods, so a forwarded write must not pass
    off one method's command as another's (a Cordon carrying a quarantine, say)."""
    op = command.get("op")
    if method in FLAG_FIELDS:
        spec = command.get("spec")
        return (group == "policy" and op == "patch" and command.get("kind") == "NodeFlags"
                and isinstance(spec, dict) and bool(spec) and set(spec) <= FLAG_FIELDS[method])
    if method in DOCUMENT_OPS:
        return op == DOCUMENT_OPS[method]
    if method in JOB_OPS:
        return group == "placements" and op == JOB_OPS[method]
    return False


def node_author(text: str, node: str) -> bool:
    """Whether ``text`` names the agent on ``node`` itself (``meshd/<node> (scheduler)``...)."""
    return text == f"meshd/{node}" or text.startswith(f"meshd/{node} ")


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
    """Node-to-node: forwarded writes, log following, status.  Only node certificates.

    A node certificate is enough to follow the log and to forward the agent's own writes, but
    not to write for a person: a forwarded admin write carries its caller's credential, which
    the coordinator verifies and judges by its own policy (:meth:`_authorize`).
    """

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
        try:
            who = await self._authorize(request, group, command, via, context)
        except Refused as exc:
            await context.abort(exc.code, str(exc))
        if "author" in command:
            command["author"] = f"{who} via {via}"[:256]
        timeout = await calls.timeout(request.timeout_seconds, context)
        try:
            result = await grp.propose(command, timeout)
        except ConsensusError as exc:
            await context.abort(calls.CONSENSUS_CODES.get(exc.code, grpc.StatusCode.UNAVAILABLE),
                                str(exc))
        return admin_pb2.ProposeResponse(result_json=json.dumps(result))

    async def _authorize(self, request: admin_pb2.ProposeRequest, group: str,
                         command: dict[str, Any], via: str,
                         context: grpc.aio.ServicerContext) -> str:
        """Who the forwarded ``command`` is written for (its author), or raises
        :class:`Refused`.

        - With a caller's credential: that caller, verified here and allowed ``method`` by this
          node's policy, and the command must be what ``method`` writes.
        - Without one: only what the agent on ``via`` writes by itself (reads, training leases,
          its own automatic quarantine), under its own name: a node must not write what no
          verified person asked for, nor claim (``on_behalf_of``) that one did.
        """
        claimed = request.on_behalf_of
        if command.get("op") in NODE_OPS:
            return claimed or f"meshd/{via}"
        authz = AUTHORIZER.get()
        peer = _peer(context)
        method = request.method
        if request.caller_certificate_pem or request.caller_bearer:
            if authz is None:  # not behind the interceptor: nobody here can verify a caller
                raise Refused(grpc.StatusCode.PERMISSION_DENIED,
                              f"{method or 'Propose'} (forwarded by {via}): callers cannot be "
                              "verified on this server")
            credential = Credential(method, bytes(request.caller_certificate_pem),
                                    request.caller_bearer)
            misfit = ("" if fits(method, group, command) else
                      f"a {command.get('op')!r} command in group {group} is not what "
                      f"{method or 'an unnamed method'} writes")
            principal = authz.forwarded(credential, claimed=claimed, via=via, peer=peer,
                                        misfit=misfit)
            return principal.label
        why = await self._not_own(group, command, via)
        if not why and claimed and not node_author(claimed, via):
            why = (f"it names {claimed} as the caller but carries no credential of theirs "
                   "(only the caller's certificate or bearer token proves who asked)")
            reason = "forged_caller"
        else:
            reason = "no_credential"
        if why:
            message = (f"{method or 'Propose'} (forwarded by {via}) on behalf of "
                       f"{claimed or 'nobody named'}: permission denied: {why}")
            if authz is None:
                raise Refused(grpc.StatusCode.PERMISSION_DENIED, message)
            raise authz.refuse_forwarded(method or "Propose", None, peer, message, reason)
        if claimed:
            return claimed
        author = command.get("author")
        return author if isinstance(author, str) and node_author(author, via) else f"meshd/{via}"

    async def _not_own(self, group: str, command: dict[str, Any], via: str) -> str:
        """"" when ``command`` is one the agent on node ``via`` makes by itself; else why not.

        Those are the training scheduler's and trainers' lease commands, its reports of the
        model replicas placed on it (:mod:`meshd.models.store`), and the automatic
        quarantine of ``via`` itself (set with ``auto: true``, or lifted) as long as it does not
        replace or lift an operator's quarantine.
        """
        op = command.get("op")
        if group == "placements" and op in LEASE_OPS:
            return ""
        if group == "policy" and op == "report":  # what its Triton did with a model replica
            node = command.get("node")
            return "" if node == via else f"a node reports only its own replicas, not {node!r}"
        if not (group == "policy" and op == "patch" and command.get("kind") == "NodeFlags"):
            return (f"a {op!r} command in group {group} is a person's write and comes with no "
                    "caller's credential")
        spec = command.get("spec")
        if not isinstance(spec, dict) or set(spec) != {"quarantined"}:
            return ("only an automatic quarantine is a node's own flag write; this one comes "
                    "with no caller's credential")
        if command.get("name") != via:
            return f"a node quarantines only itself, not {command.get('name')!r}"
        value = spec["quarantined"]
        if value is not None and not (isinstance(value, dict) and value.get("auto") is True):
            return "a quarantine a node sets on itself is automatic (auto: true)"
        if_version = command.get("if_version")
        if not isinstance(if_version, int) or isinstance(if_version, bool) or if_version < 0:
            return "a node's own quarantine write needs if_version"
        view = self.control.views["policy"]
        deadline = time.monotonic() + OWN_WRITE_WAIT
        while view.version < if_version and (left := deadline - time.monotonic()) > 0:
            await view.wait_beyond(view.version, left)
        if view.version < if_version:  # not a refusal: this copy is behind; retry later
            raise Refused(grpc.StatusCode.UNAVAILABLE,
                          f"no quorum reachable through {self.control.node} yet: its copy of "
                          f"group policy is at version {view.version}, the write at "
                          f"{if_version}; retry")
        stored = view.store.get("NodeFlags", via)
        if stored is None or stored.version != if_version:
            return ""  # not the flags it was decided on: the store refuses it as a conflict
        current = stored.document.spec.get("quarantined")
        if isinstance(current, dict) and not current.get("auto"):
            return "an operator's quarantine stays until a person lifts it"
        return ""

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


def _peer(context: grpc.aio.ServicerContext) -> str:
    try:
        return str(context.peer())
    except Exception:  # noqa: BLE001 - best effort, for the audit log only
        return ""


NODE_ONLY = ("Propose", "Follow", "Status")
"""Consensus methods: nodes only (admins may call them too, by the default policy)."""
