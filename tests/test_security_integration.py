"""Identity and security across real meshd processes: enrollment with join tokens (and the
tokens that must fail), revocation reaching every node within a gossip round, gossip key
rotation acknowledged by every member, and certificate renewal under live connections."""

from __future__ import annotations

import base64
import os
import subprocess
import sys
import time
from pathlib import Path

import grpc
import pytest

from certs import tls, tokens
from certs.identity import Identity
from proto.mesh.v1 import admin_pb2, admin_pb2_grpc
from testbed.cluster import ROOT, Cluster, metric_sum

pytestmark = pytest.mark.slow
CONVERGE = 20.0


def _members_as(ident_dir: Path, target: str) -> grpc.StatusCode:
    """OK, or the status a Members call with this identity gets."""
    with tls.grpc_channel(target, Identity.load(ident_dir)) as ch:
        try:
            admin_pb2_grpc.AdminStub(ch).Members(admin_pb2.MembersRequest(), timeout=3)
            return grpc.StatusCode.OK
        except grpc.RpcError as exc:
            return exc.code()  # type: ignore[attr-defined, no-any-return]


def _meshctl(c: Cluster, target: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "meshd.ctl", "--admin", target, "--creds",
                           str(c.admin_creds), *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)


def test_enroll_revoke_rotate_renew(tmp_path: Path) -> None:
    c = Cluster(4, tmp_path, provision=False, spare=2, metrics=True,
                node_args=lambda i: ["--cert-lifetime", "15"] if i == 1 else [])
    try:
        c.seed.args += ["--ca-dir", str(c.ca_dir)]
        c.seed.start()
        c.wait_for(lambda: _members_as(c.admin_creds, c.seed.admin) == grpc.StatusCode.OK,
                   15, "CA holder's admin API up")
        # --- enrollment: one token, three uses -------------------------------------------
        r = _meshctl(c, c.seed.admin, "token", "create", "--uses", "3", "--ttl", "120")
        assert r.returncode == 0, r.stderr
        token = r.stdout.strip()
        for n in c.nodes[1:]:
            n.env["MESHD_JOIN_TOKEN"] = token
            n.start()
        c.wait_converged(CONVERGE)
        for n in c.nodes[1:]:
            ident = Identity.load(n.data_dir / "identity")
            assert str(ident.spiffe_id) == f"spiffe://mesh.test/node/{n.name}"
            assert ident.roles == ("node",)
            started = n.events("agent_started")[0]
            assert started["encrypted"] and not started["ca_holder"]
        # The token is a secret: in no log.
        assert not any(token in n.log_path.read_text() for n in c.nodes)

        # --- tokens that must fail: replayed (exhausted), expired, forged ---------------
        late = c.add_node(retry_join=False)
        late.env["MESHD_JOIN_TOKEN"] = token
        late.start()
        assert late.wait(20) == 1
        assert "exhausted" in late.log_path.read_text()
        short, _ = tokens.create(c.ca, uses=1, ttl=0.5, now=time.time())
        time.sleep(1.0)
        forged = token[:-4] + ("AAAA" if not token.endswith("AAAA") else "BBBB")
        for bad, why in ((short, "expired"), (forged, "bad_mac")):
            late.env["MESHD_JOIN_TOKEN"] = bad
            late.start()
            assert late.wait(20) == 1
            assert why in late.log_path.read_text().split("agent_started")[-1], why
        c.nodes.remove(late)  # it never got in
        seed_metrics = c.seed.metrics()
        for why in ("exhausted", "expired", "bad_mac"):
            assert metric_sum(seed_metrics, "meshd_security_refusals_total",
                              channel="enrollment", reason=why) >= 1, why
        assert metric_sum(seed_metrics, "meshd_security_issued_certificates_total",
                          op="enroll") == 3

        # --- renewal: 15 s certificates renew at 10 s, connections stay up --------------
        n2 = c.node("n2")
        first = Identity.load(n2.data_dir / "identity").cert.serial_number
        with tls.grpc_channel(n2.admin, Identity.load(c.admin_creds)) as ch:
            stub = admin_pb2_grpc.AdminStub(ch)
            stub.Members(admin_pb2.MembersRequest(), timeout=3)
            c.wait_for(lambda: Identity.load(n2.data_dir / "identity").cert.serial_number
                       != first, 20, "n2 renewed its certificate")
            stub.Members(admin_pb2.MembersRequest(), timeout=3)  # same channel, still up
        assert n2.events("renewed")
        c.wait_converged(10)

        # --- revocation: refused everywhere within a gossip round -----------------------
        n4 = c.node("n4")
        n4_id = n4.data_dir / "identity"
        others = [c.node("n2"), c.node("n3")]
        assert all(_members_as(n4_id, n.admin) == grpc.StatusCode.OK for n in others)
        r = _meshctl(c, c.seed.admin, "revoke", "n4")
        assert r.returncode == 0, r.stderr
        revoked_at = time.monotonic()
        pending = {n.name for n in others}
        while pending and time.monotonic() - revoked_at < 5:
            for n in others:
                if n.name in pending and _members_as(n4_id, n.admin) != grpc.StatusCode.OK:
                    pending.discard(n.name)
            time.sleep(0.02)
        took = time.monotonic() - revoked_at
        assert not pending, f"still accepted by {pending} after {took:.2f} s"
        assert took < 2.0, took  # gossip interval 0.2 s: a few rounds at most
        for n in others:
            assert metric_sum(n.metrics(), "meshd_security_refusals_total", channel="admin",
                              reason="revoked") >= 1

        # --- key rotation through gossip, acknowledged by every live member -------------
        new_key = base64.b64encode(os.urandom(32)).decode()
        old_key = base64.b64encode(_primary_key(c.node("n2"))).decode()
        for op, key in (("install", new_key), ("use", new_key), ("remove", old_key)):
            r = _meshctl(c, c.node("n2").admin, "keys", op, key, "--wait", "15")
            assert r.returncode == 0, (op, r.stdout, r.stderr)
            assert "acknowledged by 4/4 live members" in r.stdout, r.stdout
        r = _meshctl(c, c.seed.admin, "keys", "list")
        assert r.returncode == 0 and "installed on 4/4, primary on 4" in r.stdout, r.stdout
        assert new_key not in r.stdout
        c.wait_converged(10)
    finally:
        c.close()


def _primary_key(node: object) -> bytes:
    import json
    doc = json.loads((node.data_dir / "keyring.json").read_text())  # type: ignore[attr-defined]
    return base64.b64decode(doc["keys"][0])
