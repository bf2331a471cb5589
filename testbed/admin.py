"""An in-process admin API with real mTLS, for tests and benches: a ``--dev`` security plane in
a temp dir (its CA, the node's identity and an admin client identity), the server, and client
channels."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import grpc

from certs import tls
from certs.identity import Identity
from certs.spiffe import SpiffeId
from gossip.protocol import Swim
from meshd.admin import server as admin
from meshd.control.plane import ControlPlane
from meshd.coordinates import CoordinatePlane
from meshd.security.plane import Security
from meshd.signals.plane import SignalPlane


def dev_security(directory: Path, node: str) -> Security:
    sec = Security(directory, node, dev=True, trust_domain="mesh.test")
    sec.prepare()
    return sec


async def start_admin(swim: Swim, clock: object, plane: CoordinatePlane, sec: Security,
                      port: int, control: ControlPlane | None = None,
                      signals: SignalPlane | None = None, **authz: Any) -> grpc.aio.Server:
    """The admin server; without ``control`` a control plane with no coordinators (its
    policy copies stay empty and writes fail with UNAVAILABLE)."""
    authz.setdefault("audit_log", str(sec.dir / "audit.log"))
    authorizer = admin.build_authorizer(sec, **authz)
    if control is None:
        control = ControlPlane(swim.name, sec.dir, sec, coordinator=False)
        control.attach(swim, None, "")
    return await admin.serve(swim, clock, "127.0.0.1", port, coordinates=plane,
                             security=sec, authorizer=authorizer, control=control,
                             signals=signals)


def admin_channel(sec: Security, port: int, ident: Identity | None = None) -> grpc.aio.Channel:
    """An aio channel presenting ``ident`` (default: the dev admin client identity)."""
    ident = ident or Identity.load(sec.dir / "meshctl")
    return tls.grpc_channel(f"127.0.0.1:{port}", ident, aio=True)  # type: ignore[return-value]


def mint(sec: Security, out_dir: Path, name: str, roles: list[str],
         kind: str = "user") -> Identity:
    """An identity signed by ``sec``'s dev CA (a person by default, or ``kind="node"``)."""
    ca = sec.ca
    assert ca is not None
    out = out_dir / f"id-{kind}-{name}"
    ca.mint(SpiffeId(ca.trust_domain, kind, name), roles).save(out)  # type: ignore[arg-type]
    return Identity.load(out)
