"""The admin API's door: mTLS with mesh certificates, bearer tokens for people, RBAC, the
audit log, and a refusal (with a metric) for each kind of bad caller.  In process, real TLS."""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import time
from pathlib import Path

import grpc
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from certs.ca import CertificateAuthority
from certs.spiffe import SpiffeId
from gossip.config import Config
from gossip.protocol import Swim
from gossip.state import NodeMeta
from meshd.coordinates import CoordinatePlane
from meshd.dev.ports import free_port
from proto.mesh.v1 import admin_pb2, admin_pb2_grpc
from testbed.admin import admin_channel, dev_security, start_admin

ISSUER, AUDIENCE = "https://idp.test", "meshd"


@pytest.fixture(scope="module")
def idp_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _jwt(key: ec.EllipticCurvePrivateKey, **claims: object) -> str:
    body = {"iss": ISSUER, "aud": AUDIENCE, "sub": "alice", "exp": time.time() + 300,
            "roles": ["admin"], **claims}
    return jwt.encode(body, key, algorithm="ES256")


def test_admin_refuses_bad_callers_and_audits(tmp_path: Path,
                                              idp_key: ec.EllipticCurvePrivateKey) -> None:
    pub = tmp_path / "idp.pem"
    pub.write_bytes(idp_key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    other_idp = ec.generate_private_key(ec.SECP256R1())

    async def scenario() -> None:
        swim = Swim(Config.local(), "a", ("127.0.0.1", 7000), NodeMeta.build([], "", "", {}, {}),
                    now=0.0)
        plane = CoordinatePlane("a", place_of=lambda n: None)
        sec = dev_security(tmp_path / "a", "a")
        assert sec.ca is not None
        ca = sec.ca
        port = free_port()
        server = await start_admin(swim, lambda: 0.0, plane, sec, port, jwt_key=str(pub),
                                   jwt_issuer=ISSUER, jwt_audience=AUDIENCE)

        async def call(ident_dir: Path | None, method: str, request: object,
                       bearer: str | None = None) -> object:
            from certs.identity import Identity
            ident = Identity.load(ident_dir) if ident_dir else None
            md = (("authorization", f"Bearer {bearer}"),) if bearer else None
            async with admin_channel(sec, port, ident) as ch:
                return await getattr(admin_pb2_grpc.AdminStub(ch), method)(
                    request, metadata=md, timeout=5)

        def mint(name: str, roles: list[str], kind: str = "user",
                 authority: CertificateAuthority = ca, **kw: object) -> Path:
            out = tmp_path / f"id-{name}"
            authority.mint(SpiffeId(authority.trust_domain, kind, name), roles,
                           **kw).save(out)  # type: ignore[arg-type]
            return out

        async def refused(code: grpc.StatusCode, text: str, *args: object, **kw: object) -> str:
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await call(*args, **kw)  # type: ignore[arg-type]
            assert err.value.code() == code, (err.value.code(), err.value.details())
            details = err.value.details() or ""
            assert text in details, details
            return details

        try:
            admin_dir = tmp_path / "a" / "meshctl"
            who = await call(admin_dir, "Whoami", admin_pb2.WhoamiRequest())
            assert who.principal == "spiffe://mesh.test/user/admin"  # type: ignore[attr-defined]
            assert list(who.roles) == ["admin"]  # type: ignore[attr-defined]
            # A viewer reads but cannot mint tokens; the denial names method and principal.
            viewer = mint("vera", ["viewer"])
            await call(viewer, "Members", admin_pb2.MembersRequest())
            details = await refused(grpc.StatusCode.PERMISSION_DENIED, "TokenCreate",
                                    viewer, "TokenCreate", admin_pb2.TokenCreateRequest())
            assert "spiffe://mesh.test/user/vera" in details and "admin" in details
            # A node certificate is not an operator either.
            node = mint("n9", ["node"], kind="node")
            await refused(grpc.StatusCode.PERMISSION_DENIED, "Revoke", node, "Revoke",
                          admin_pb2.RevokeRequest(name="x"))
            # Revoked: refused with UNAUTHENTICATED, also on an identity seen before.
            sec.revoke(SpiffeId("mesh.test", "user", "vera"))
            await refused(grpc.StatusCode.UNAUTHENTICATED, "revoked", viewer, "Members",
                          admin_pb2.MembersRequest())
            # Another CA, an expired certificate: the TLS handshake itself fails.
            stranger = mint("eve", ["admin"], authority=CertificateAuthority.create("mesh.test"))
            await refused(grpc.StatusCode.UNAVAILABLE, "", stranger, "Members",
                          admin_pb2.MembersRequest())
            old = mint("old", ["admin"], lifetime=dt.timedelta(hours=1),
                       now=time.time() - 7200)
            await refused(grpc.StatusCode.UNAVAILABLE, "", old, "Members",
                          admin_pb2.MembersRequest())
            # People: a bearer token names the caller and carries the roles.
            good = _jwt(idp_key)
            who = await call(viewer.parent / "id-n9", "Whoami", admin_pb2.WhoamiRequest(),
                             bearer=good)
            assert who.principal == f"jwt:{ISSUER}/alice"  # type: ignore[attr-defined]
            for bad, why in ((_jwt(other_idp), "signature"),
                             (_jwt(idp_key, aud="other"), "audience"),
                             (_jwt(idp_key, exp=time.time() - 3600), "expired"),
                             (_jwt(idp_key, iss="https://evil.test"), "issuer"),
                             ("not-a-jwt", "malformed")):
                details = await refused(grpc.StatusCode.UNAUTHENTICATED, "bearer token",
                                        node, "Whoami", admin_pb2.WhoamiRequest(), bearer=bad)
                assert why in details.lower() or why == "malformed", details
                assert bad not in details
            viewer_jwt = _jwt(idp_key, sub="bob", roles=["viewer"])
            await refused(grpc.StatusCode.PERMISSION_DENIED, f"jwt:{ISSUER}/bob", node,
                          "TokenCreate", admin_pb2.TokenCreateRequest(), bearer=viewer_jwt)
            # Bad arguments get INVALID_ARGUMENT naming the field.
            await refused(grpc.StatusCode.INVALID_ARGUMENT, "op:", admin_dir, "KeysChange",
                          admin_pb2.KeysChangeRequest(op="shred", key=""))
            await refused(grpc.StatusCode.INVALID_ARGUMENT, "key:", admin_dir, "KeysChange",
                          admin_pb2.KeysChangeRequest(op="install", key="c2hvcnQ="))
            token = await call(admin_dir, "TokenCreate", admin_pb2.TokenCreateRequest(uses=2))
            assert token.token.startswith("mjt1.")  # type: ignore[attr-defined]
        finally:
            await server.stop(0)
            sec_refusals = dict(sec.refusals)
        # Every refusal is counted, by channel and reason.
        assert sec_refusals[("admin", "permission_denied")] == 3
        assert sec_refusals[("admin", "revoked")] >= 1
        for reason in ("jwt_bad_signature", "jwt_wrong_audience", "jwt_expired",
                       "jwt_wrong_issuer", "jwt_malformed"):
            assert sec_refusals[("admin", reason)] == 1, (reason, sec_refusals)
        # The audit log has every call, allowed or not, and never a token.
        lines = [json.loads(x) for x in (tmp_path / "a" / "audit.log").read_text().splitlines()]
        assert {x["method"] for x in lines} >= {"Whoami", "Members", "TokenCreate", "Revoke"}
        denied = [x for x in lines if not x["allowed"]]
        assert len(denied) >= 3 + 5 + 1
        assert any(x["principal"] == f"jwt:{ISSUER}/alice" for x in lines)
        text = (tmp_path / "a" / "audit.log").read_text()
        assert good not in text and token.token not in text  # type: ignore[attr-defined]

    asyncio.run(scenario())
