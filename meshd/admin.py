"""The admin gRPC service (``mesh.v1.Admin``): what ``meshctl`` talks to.

Plaintext and loopback-only until the identity issue adds mTLS and RBAC.
"""

from __future__ import annotations

import grpc

from gossip.protocol import Swim
from gossip.state import ROLES, Status
from proto.mesh.v1 import admin_pb2, admin_pb2_grpc


class AdminService(admin_pb2_grpc.AdminServicer):
    def __init__(self, swim: Swim, clock: object) -> None:
        self.swim = swim
        self.clock = clock  # callable returning the core's "now"

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
            out.members.append(admin_pb2.Member(
                name=m.name,
                address=f"[{host}]:{port}" if ":" in host else f"{host}:{port}",
                status=m.status.label, incarnation=m.incarnation, roles=list(m.meta.roles),
                zone=m.meta.zone, region=m.meta.region, tags=m.meta.tags_dict,
                ports=m.meta.ports_dict, status_age_seconds=max(0.0, now - m.status_since),
                is_local=m.name == self.swim.name))
        return out


async def serve(swim: Swim, clock: object, host: str, port: int) -> grpc.aio.Server:
    # gRPC enables SO_REUSEPORT by default: a second agent could then bind the same admin port
    # and the kernel would split meshctl's connections between the two.
    server = grpc.aio.server(options=[("grpc.so_reuseport", 0)])
    admin_pb2_grpc.add_AdminServicer_to_server(AdminService(swim, clock), server)
    target = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    try:
        bound = server.add_insecure_port(target)
    except RuntimeError:  # grpcio raises instead of returning 0 on a bind failure
        bound = 0
    if bound == 0:
        raise OSError(f"cannot bind admin API on {target} (address in use?)")
    await server.start()
    return server
