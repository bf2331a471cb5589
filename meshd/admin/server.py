"""The admin gRPC service (``mesh.v1.Admin``): what ``meshctl`` talks to.

Always mTLS (client certificates required) with RBAC and an audit log: see :mod:`meshd.admin.authz`.
The TLS is terminated by a :mod:`meshd.security.front` in this process (so a refused handshake
is counted, ``channel="admin"``, and audited); the gRPC server behind it listens in plaintext
on an ephemeral port of 127.0.0.1 and reads each caller's certificate from the front's table.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
import time
from collections import Counter

import grpc

from certs import tls
from certs.spiffe import SpiffeError, SpiffeId
from gossip.keyring import KEY_BYTES, KeyringError
from gossip.protocol import Swim
from gossip.state import ROLES, Status
from meshd import logs
from meshd.admin.authz import CALLER, Authorizer, AuthzInterceptor
from meshd.admin.jobs import JobsAdmin
from meshd.admin.policy import NODE_ONLY, ConsensusService, PolicyAdmin
from meshd.admin.rbac import AuditLog, JwtVerifier, Policy
from meshd.admin.state import StatePlaneService
from meshd.control.plane import ControlPlane
from meshd.coordinates import CoordinatePlane
from meshd.models.service import ModelService
from meshd.security.front import PeerTable, front_grpc, recorder, server_context
from meshd.security.plane import Security, SecurityError, key_fingerprint
from meshd.signals.plane import SignalPlane
from meshd.train.service import TrainService
from proto.mesh.v1 import admin_pb2, admin_pb2_grpc, state_pb2_grpc
from topology.coordinate import Coordinate
from topology.estimate import Estimate


def coordinate_pb(coord: Coordinate) -> admin_pb2.Coordinate:
    return admin_pb2.Coordinate(vec=list(coord.vec), error=coord.error,
                                adjustment=coord.adjustment, height=coord.height)


log = logging.getLogger("meshd.control")


def estimate_pb(est: Estimate) -> admin_pb2.RttEstimate:
    return admin_pb2.RttEstimate(rtt_seconds=est.rtt or 0.0,
                                 error=est.error if est.rtt is not None else 0.0,
                                 confidence=est.confidence, source=est.source,
                                 relation=est.relation.value, consistent=est.consistent)


READ_ONLY = ("Members", "Rtt", "Whoami", "KeysList", "PolicyGet", "PolicyList", "RaftStatus",
             "SubscribeEvents", "State", "GetJob", "ListJobs", "JobLogs", "LogLevels",
             "ModelsStatus")
STATE_REPORTS = ("ReportModelState", "ReportGpuState", "ReportCommStats")
"""StatePlane feeds: runtimes' exporters run as operators or with a node certificate."""
OPERATIONAL: tuple[str, ...] = ("Cordon", "Uncordon", "Drain", "Quarantine", "PolicyApply",
                                "PolicyDelete", "SubmitJob", "CancelJob", "SetLogLevel",
                                *STATE_REPORTS)
ADMIN_ONLY = ("KeysChange", "TokenCreate", "Revoke")
NODE_METHODS = (*NODE_ONLY, "Subscribe", *STATE_REPORTS)
METHODS = tuple(dict.fromkeys(READ_ONLY + OPERATIONAL + ADMIN_ONLY + NODE_METHODS))
"""Every admin method by what it may change; the default policy is built from these lists."""
KEY_ACK_POLL = 0.1


def default_policy() -> Policy:
    return Policy.default(READ_ONLY, OPERATIONAL, NODE_METHODS)


class AdminService(PolicyAdmin, JobsAdmin, admin_pb2_grpc.AdminServicer):
    def __init__(self, swim: Swim, clock: object, coordinates: CoordinatePlane,
                 security: Security, control: ControlPlane,
                 train: TrainService | None = None, models: ModelService | None = None) -> None:
        self.control = control
        self.train = train
        self.models = models
        self.swim = swim
        self.clock = clock  # callable returning the core's "now"
        self.coordinates = coordinates
        self.security = security

    async def ModelsStatus(self, request: admin_pb2.ModelsStatusRequest,  # noqa: N802
                           context: grpc.aio.ServicerContext
                           ) -> admin_pb2.ModelsStatusResponse:
        if self.models is None:
            await context.abort(grpc.StatusCode.UNIMPLEMENTED,
                                "this node runs no placement controller")
            raise AssertionError("unreachable")
        plan = self.models.current_plan()
        demand = self.models.demand()
        return admin_pb2.ModelsStatusResponse(models=[
            admin_pb2.ModelStatus(model=key, desired=mp.desired, placed=mp.placed,
                                  ready=mp.ready, why=mp.why, refused=mp.refused,
                                  demand=demand.get(key.partition(":")[0], 0.0))
            for key, mp in sorted(plan.models.items())])

    async def Members(self, request: admin_pb2.MembersRequest,  # noqa: N802 - gRPC name
                      context: grpc.aio.ServicerContext) -> admin_pb2.MembersResponse:
        try:
            statuses = {Status.parse(s) for s in request.status}
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"status: {exc}")
        unknown = [r for r in request.role if r not in ROLES]
        if unknown:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"role: unknown role {unknown[0]!r}; expected one of "
                                f"{', '.join(ROLES)}")
        now = self.clock()  # type: ignore[operator]
        out = admin_pb2.MembersResponse(local_node=self.swim.name,
                                        health_score=self.swim.awareness.score)
        for m in self.swim.members():
            if statuses and m.status not in statuses:
                continue
            if request.role and not set(request.role) & set(m.meta.roles):
                continue
            host, port = m.addr
            pb = admin_pb2.Member(
                name=m.name,
                address=f"[{host}]:{port}" if ":" in host else f"{host}:{port}",
                status=m.status.label, incarnation=m.incarnation, roles=list(m.meta.roles),
                zone=m.meta.zone, region=m.meta.region, tags=m.meta.tags_dict,
                ports=m.meta.ports_dict, status_age_seconds=max(0.0, now - m.status_since),
                is_local=m.name == self.swim.name, flags=self.control.flags_of(m.name))
            coord = self.coordinates.coordinate_of(m.name)
            if coord is not None:
                pb.coordinate.CopyFrom(coordinate_pb(coord))
            pb.rtt_from_local.CopyFrom(
                estimate_pb(self.coordinates.estimate(self.swim.name, m.name)))
            out.members.append(pb)
        return out

    async def Rtt(self, request: admin_pb2.RttRequest,  # noqa: N802 - gRPC name
                  context: grpc.aio.ServicerContext) -> admin_pb2.RttResponse:
        if not request.a:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "a: a member name is required")
        b = request.b or self.swim.name
        for field, name in (("a", request.a), ("b", b)):
            if self.swim.member(name) is None:
                await context.abort(grpc.StatusCode.NOT_FOUND,
                                    f"{field}: no member named {name!r}")
        est = self.coordinates.estimate(request.a, b)
        # Only our own probes are measured; the latency filter has no entry for ourselves.
        measured = (self.coordinates.measured_rtt(b if request.a == self.swim.name else request.a)
                    if self.swim.name in (request.a, b) else None)
        return admin_pb2.RttResponse(a=request.a, b=b, estimate=estimate_pb(est),
                                     measured_rtt_seconds=measured or 0.0,
                                     local_node=self.swim.name)


    async def Whoami(self, request: admin_pb2.WhoamiRequest,  # noqa: N802 - gRPC name
                     context: grpc.aio.ServicerContext) -> admin_pb2.WhoamiResponse:
        caller = CALLER.get()
        assert caller is not None
        return admin_pb2.WhoamiResponse(principal=caller.label, roles=sorted(caller.roles),
                                        kind=caller.kind,
                                        server=str(self.security.identity.spiffe_id))

    async def LogLevels(self, request: admin_pb2.LogLevelsRequest,  # noqa: N802
                        context: grpc.aio.ServicerContext) -> admin_pb2.LogLevelsResponse:
        return self._log_levels()

    async def SetLogLevel(self, request: admin_pb2.SetLogLevelRequest,  # noqa: N802
                          context: grpc.aio.ServicerContext) -> admin_pb2.LogLevelsResponse:
        try:
            logs.set_level(request.layer, request.level)
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        caller = CALLER.get()
        log.info("log level set", extra={
            "event": "log_level_set", "layer": request.layer or "*",
            "to": request.level or "inherit", "by": caller.label if caller else ""})
        return self._log_levels()

    def _log_levels(self) -> admin_pb2.LogLevelsResponse:
        level, layers = logs.levels()
        return admin_pb2.LogLevelsResponse(
            node=self.control.node, level=level,
            layers=[admin_pb2.LayerLevel(layer=n, level=lv, inherited=i)
                    for n, lv, i in layers])

    def _live_keyrings(self) -> dict[str, dict[str, object]]:
        """What each live member last gossiped about its keyring (ours: as it is now)."""
        live = {m.name for m in self.swim.members() if m.live}
        rings = {name: self.security.peer_keys.get(name, {}) for name in live}
        rings[self.swim.name] = self.security.keys_section()
        return rings

    async def KeysList(self, request: admin_pb2.KeysListRequest,  # noqa: N802
                       context: grpc.aio.ServicerContext) -> admin_pb2.KeysListResponse:
        installed: Counter[str] = Counter()
        primary: Counter[str] = Counter()
        rings = self._live_keyrings()
        for ring in rings.values():
            fps = ring.get("fps") or []
            installed.update(str(f) for f in fps)  # type: ignore[attr-defined]
            if ring.get("p"):
                primary[str(ring["p"])] += 1
        out = admin_pb2.KeysListResponse(members=len(rings),
                                         local_primary=str(rings[self.swim.name]["p"]))
        for fp, n in installed.most_common():
            out.keys.append(admin_pb2.KeyInfo(fingerprint=fp, installed=n, primary=primary[fp]))
        return out

    async def KeysChange(self, request: admin_pb2.KeysChangeRequest,  # noqa: N802
                         context: grpc.aio.ServicerContext) -> admin_pb2.KeysChangeResponse:
        if request.op not in ("install", "use", "remove"):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"op: {request.op!r} is not one of install, use, remove")
        try:
            key = base64.b64decode(request.key.strip(), validate=True)
        except (binascii.Error, ValueError):
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "key: not valid base64")
        if len(key) != KEY_BYTES:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"key: must be {KEY_BYTES} bytes (AES-256), got {len(key)}")
        timeout = request.timeout_seconds or 10.0
        if not 0 < timeout <= 300:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                "timeout_seconds: must be in (0, 300]")
        try:
            self.security.key_op(request.op, key)
        except KeyringError as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, f"key: {exc}")
        fp = key_fingerprint(key)

        def acked(ring: dict[str, object]) -> bool:
            fps = ring.get("fps") or []
            if request.op == "install":
                return fp in fps  # type: ignore[operator]
            if request.op == "use":
                return ring.get("p") == fp
            return fp not in fps  # type: ignore[operator]

        deadline = time.monotonic() + timeout
        while True:
            rings = self._live_keyrings()
            missing = sorted(n for n, r in rings.items() if not acked(r))
            if not missing or time.monotonic() >= deadline:
                break
            await asyncio.sleep(KEY_ACK_POLL)
        errors = [f"{n}: {e}" for n, r in rings.items()
                  for e in (r.get("err") or []) if fp in str(e)]  # type: ignore[attr-defined]
        return admin_pb2.KeysChangeResponse(fingerprint=fp, acked=len(rings) - len(missing),
                                            total=len(rings), missing=missing, errors=errors)

    async def TokenCreate(self, request: admin_pb2.TokenCreateRequest,  # noqa: N802
                          context: grpc.aio.ServicerContext) -> admin_pb2.TokenCreateResponse:
        uses = request.uses or 1
        ttl = request.ttl_seconds or 3600.0
        try:
            token, claims = self.security.create_token(uses, ttl)
        except SecurityError as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        except ValueError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
        return admin_pb2.TokenCreateResponse(token=token, id=claims.id,
                                             expires_unix=claims.expires, uses=claims.uses)

    async def Revoke(self, request: admin_pb2.RevokeRequest,  # noqa: N802
                     context: grpc.aio.ServicerContext) -> admin_pb2.RevokeResponse:
        if not request.name:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                "name: a member name or SPIFFE ID is required")
        td = self.security.trust_domain
        try:
            sid = (SpiffeId.parse(request.name) if request.name.startswith("spiffe://")
                   else SpiffeId.node(td, request.name))
        except SpiffeError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"name: {exc}")
        if sid.trust_domain != td:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"name: {sid} is not in trust domain {td}")
        if sid == self.security.identity.spiffe_id:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION,
                                "name: a node cannot revoke its own identity")
        try:
            cutoff = self.security.revoke(sid)
        except SecurityError as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        return admin_pb2.RevokeResponse(spiffe_id=str(sid), cutoff_unix=cutoff)


def build_authorizer(security: Security, *, policy_file: str = "", jwt_jwks: str = "",
                     jwt_key: str = "", jwt_audience: str = "meshd", jwt_issuer: str = "",
                     audit_log: str = "") -> Authorizer:
    """The admin API's access control from settings (errors name the setting)."""
    assert security.verifier is not None
    policy = (Policy.load(policy_file, METHODS) if policy_file else default_policy())
    jwt = None
    if jwt_jwks:
        jwt = JwtVerifier.from_jwks_file(jwt_jwks, audience=jwt_audience, issuer=jwt_issuer)
    elif jwt_key:
        jwt = JwtVerifier.from_public_key_file(jwt_key, audience=jwt_audience,
                                               issuer=jwt_issuer)
    path = None if audit_log == "off" else (audit_log or str(security.dir / "audit.log"))
    return Authorizer(security.verifier, policy, jwt=jwt, audit=AuditLog(path),
                      refuse=security.refuse)


async def serve(swim: Swim, clock: object, host: str, port: int, *,
                coordinates: CoordinatePlane, security: Security,
                authorizer: Authorizer, control: ControlPlane,
                signals: SignalPlane | None = None,
                train: TrainService | None = None, models: ModelService | None = None,
                tls_front: bool = True) -> grpc.aio.Server:
    """The started admin server on ``host:port``.  ``tls_front`` (the default) terminates TLS
    in a :class:`~meshd.security.front.TlsFront`; without it gRPC does (and a refused
    handshake is seen nowhere but gRPC's log)."""
    # gRPC enables SO_REUSEPORT by default: a second agent could then bind the same admin port
    # and the kernel would split meshctl's connections between the two.
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)],
                             interceptors=[AuthzInterceptor(authorizer)])
    admin_pb2_grpc.add_AdminServicer_to_server(
        AdminService(swim, clock, coordinates, security, control, train, models), server)
    admin_pb2_grpc.add_ConsensusServicer_to_server(ConsensusService(control), server)
    if signals is not None:
        state_pb2_grpc.add_StatePlaneServicer_to_server(StatePlaneService(signals), server)
    target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if tls_front:
        peers = PeerTable()
        authorizer.certificate = peers.certificate
        context = server_context(lambda: tls.server_context(security.id_dir))
        security.tls_contexts.append(context)  # given the renewed certificate
        try:
            fronted, _ = await front_grpc(
                server, host, port, context=context, peers=peers, channel="admin",
                on_refused=recorder("admin", security.refuse, authorizer.audit))
        except OSError as exc:
            raise OSError(f"cannot bind admin API on {target} ({exc})") from None
        return fronted
    try:
        bound = server.add_secure_port(
            target, tls.grpc_server_credentials(lambda: security.identity))
    except RuntimeError:  # grpcio raises instead of returning 0 on a bind failure
        bound = 0
    if bound == 0:
        raise OSError(f"cannot bind admin API on {target} (address in use?)")
    await server.start()
    return server
