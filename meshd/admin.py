"""The admin gRPC service (``mesh.v1.Admin``): what ``meshctl`` talks to.

Plaintext and loopback-only until the identity issue adds mTLS and RBAC.
"""

from __future__ import annotations

import grpc

from gossip.protocol import Swim
from gossip.state import ROLES, Status
from meshd.coordinates import CoordinatePlane
from proto.mesh.v1 import admin_pb2, admin_pb2_grpc
from topology.coordinate import Coordinate
from topology.estimate import Estimate


def coordinate_pb(coord: Coordinate) -> admin_pb2.Coordinate:
    return admin_pb2.Coordinate(vec=list(coord.vec), error=coord.error,
                                adjustment=coord.adjustment, height=coord.height)


def estimate_pb(est: Estimate) -> admin_pb2.RttEstimate:
    return admin_pb2.RttEstimate(rtt_seconds=est.rtt or 0.0,
                                 error=est.error if est.rtt is not None else 0.0,
                                 confidence=est.confidence, source=est.source,
                                 relation=est.relation.value, consistent=est.consistent)


class AdminService(admin_pb2_grpc.AdminServicer):
    def __init__(self, swim: Swim, clock: object, coordinates: CoordinatePlane) -> None:
        self.swim = swim
        self.clock = clock  # callable returning the core's "now"
        self.coordinates = coordinates

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
                is_local=m.name == self.swim.name)
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


async def serve(swim: Swim, clock: object, host: str, port: int, *,
                coordinates: CoordinatePlane) -> grpc.aio.Server:
    # gRPC enables SO_REUSEPORT by default: a second agent could then bind the same admin port
    # and the kernel would split meshctl's connections between the two.
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    admin_pb2_grpc.add_AdminServicer_to_server(AdminService(swim, clock, coordinates), server)
    target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        bound = server.add_insecure_port(target)
    except RuntimeError:  # grpcio raises instead of returning 0 on a bind failure
        bound = 0
    if bound == 0:
        raise OSError(f"cannot bind admin API on {target} (address in use?)")
    await server.start()
    return server
