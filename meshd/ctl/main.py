"""``meshctl``: the operator's command line, a client of the admin gRPC API."""

from __future__ import annotations

import argparse
import datetime as dt
import os
import sys
from pathlib import Path

import grpc
from cryptography.hazmat.primitives import serialization

from certs import tls
from certs.ca import CaError, CertificateAuthority, new_mesh_id
from certs.identity import Identity, IdentityError, load_pem_certs
from certs.spiffe import SpiffeError, SpiffeId
from meshd.admin.rbac import ACCESS_ROLES
from meshd.ctl import jobs as ctl_jobs
from meshd.ctl import models as ctl_models
from meshd.ctl import policy as ctl_policy
from meshd.ctl import state as ctl_state
from meshd.ctl.diagnose import explain
from meshd.ctl.text import format_members_table, format_rtt_answer, to_json
from proto.mesh.v1 import admin_pb2, admin_pb2_grpc

DEFAULT_ADMIN = "127.0.0.1:7960"
DEFAULT_CREDS = os.path.join("~", ".meshd", "meshctl")


def members(stub: admin_pb2_grpc.AdminStub, args: argparse.Namespace) -> int:
    resp = stub.Members(admin_pb2.MembersRequest(status=args.status or [], role=args.role or []),
                        timeout=args.timeout)
    if args.format == "json":
        print(to_json(resp))
    else:
        print(format_members_table(resp, detailed=args.detailed))
    return 0


def rtt(stub: admin_pb2_grpc.AdminStub, args: argparse.Namespace) -> int:
    resp = stub.Rtt(admin_pb2.RttRequest(a=args.a, b=args.b or ""), timeout=args.timeout)
    if args.format == "json":
        print(to_json(resp))
    else:
        print(format_rtt_answer(resp))
    return 1 if resp.estimate.source == "none" else 0


def whoami(stub: admin_pb2_grpc.AdminStub, args: argparse.Namespace) -> int:
    resp = stub.Whoami(admin_pb2.WhoamiRequest(), timeout=args.timeout)
    print(f"{resp.principal} ({resp.kind}) roles: {', '.join(resp.roles) or '-'}; "
          f"answered by {resp.server}")
    return 0


def log_level(stub: admin_pb2_grpc.AdminStub, args: argparse.Namespace) -> int:
    """List the answering node's log levels, or set one: ``LEVEL`` (overall) or ``LAYER
    LEVEL`` (``inherit`` gives the layer back to the overall level)."""
    if len(args.words) > 2:
        print("meshctl: log-level takes [LAYER] [LEVEL]", file=sys.stderr)
        return 2
    if args.words:
        layer, level = ("", args.words[0]) if len(args.words) == 1 else args.words
        resp = stub.SetLogLevel(admin_pb2.SetLogLevelRequest(
            layer=layer, level="" if level == "inherit" else level), timeout=args.timeout)
    else:
        resp = stub.LogLevels(admin_pb2.LogLevelsRequest(), timeout=args.timeout)
    print(f"{resp.node}: {resp.level}")
    for x in resp.layers:
        print(f"  {x.layer:10s} {x.level}{' (inherited)' if x.inherited else ''}")
    return 0


def keys(stub: admin_pb2_grpc.AdminStub, args: argparse.Namespace) -> int:
    if args.op == "list":
        resp = stub.KeysList(admin_pb2.KeysListRequest(), timeout=args.timeout)
        if args.format == "json":
            print(to_json(resp))
            return 0
        print(f"{resp.members} live members reported their keyring "
              f"(answering node's primary: {resp.local_primary})")
        for k in resp.keys:
            print(f"  {k.fingerprint}  installed on {k.installed}/{resp.members}, "
                  f"primary on {k.primary}")
        return 0
    if not args.key:
        print(f"meshctl: keys {args.op}: KEY (base64 of 32 bytes) is required", file=sys.stderr)
        return 2
    resp = stub.KeysChange(admin_pb2.KeysChangeRequest(op=args.op, key=args.key,
                                                       timeout_seconds=args.wait),
                           timeout=args.wait + args.timeout)
    if args.format == "json":
        print(to_json(resp))
    else:
        print(f"{args.op} {resp.fingerprint}: acknowledged by {resp.acked}/{resp.total} "
              "live members")
        if resp.missing:
            print(f"not acknowledged (yet): {', '.join(resp.missing)}")
        for err in resp.errors:
            print(f"error: {err}")
    return 0 if resp.acked == resp.total else 1


def token_create(stub: admin_pb2_grpc.AdminStub, args: argparse.Namespace) -> int:
    resp = stub.TokenCreate(admin_pb2.TokenCreateRequest(uses=args.uses, ttl_seconds=args.ttl),
                            timeout=args.timeout)
    if args.format == "json":
        print(to_json(resp))
    else:
        print(resp.token)
        print(f"id {resp.id}, {resp.uses} use(s), expires "
              f"{dt.datetime.fromtimestamp(resp.expires_unix, dt.UTC).isoformat()}",
              file=sys.stderr)
    return 0


def revoke(stub: admin_pb2_grpc.AdminStub, args: argparse.Namespace) -> int:
    resp = stub.Revoke(admin_pb2.RevokeRequest(name=args.name), timeout=args.timeout)
    print(f"revoked every certificate of {resp.spiffe_id} issued until "
          f"{dt.datetime.fromtimestamp(resp.cutoff_unix, dt.UTC).isoformat()}")
    return 0


# --- offline commands: they read CA files, not the admin API --------------------------------

def ca_init(args: argparse.Namespace) -> int:
    out = Path(args.out)
    if CertificateAuthority.exists(out):
        print(f"meshctl: {out} already holds a CA; refusing to overwrite it", file=sys.stderr)
        return 2
    try:
        if args.from_cert or args.from_key:
            if not (args.from_cert and args.from_key and args.bundle):
                print("meshctl: an existing CA needs --from-cert, --from-key and --bundle",
                      file=sys.stderr)
                return 2
            key = serialization.load_pem_private_key(Path(args.from_key).read_bytes(), None)
            cert = load_pem_certs(Path(args.from_cert).read_bytes(), args.from_cert)[0]
            chain = (load_pem_certs(Path(args.chain).read_bytes(), args.chain)
                     if args.chain else [])
            bundle = load_pem_certs(Path(args.bundle).read_bytes(), args.bundle)
            ca = CertificateAuthority.from_parts(args.trust_domain, key, cert, chain, bundle,
                                                 mesh=new_mesh_id())
        else:
            ca = CertificateAuthority.create(args.trust_domain)
        ca.save(out)
    except (CaError, SpiffeError, IdentityError, OSError, ValueError) as exc:
        print(f"meshctl: ca init: {exc}", file=sys.stderr)
        return 2
    print(f"CA for trust domain {ca.trust_domain}, mesh {ca.mesh}, in {out} (fingerprint "
          f"{ca.fingerprint()}); keep {out / 'ca.key'} secret")
    return 0


def cert_issue(args: argparse.Namespace) -> int:
    """A client identity for a person (or a node provisioned by hand), signed offline."""
    try:
        ca = CertificateAuthority.load(Path(args.ca))
        sid = SpiffeId(ca.trust_domain, args.kind, args.name)
        ident = ca.mint(sid, args.role or ["viewer"],
                        lifetime=dt.timedelta(seconds=args.ttl))
        ident.save(Path(args.out))
    except (CaError, SpiffeError, OSError) as exc:
        print(f"meshctl: cert issue: {exc}", file=sys.stderr)
        return 2
    print(f"{sid} roles {','.join(ident.roles)} until {ident.not_after.isoformat()} "
          f"in {args.out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="meshctl", description="operate a meshd mesh")
    p.add_argument("--admin", default=os.environ.get("MESHCTL_ADMIN", DEFAULT_ADMIN),
                   help=f"admin API of any node (default {DEFAULT_ADMIN}, or $MESHCTL_ADMIN)")
    p.add_argument("--creds", default=os.environ.get("MESHCTL_CREDS", DEFAULT_CREDS),
                   help="directory with key.pem, cert.pem, bundle.pem of a mesh client "
                        f"identity (default $MESHCTL_CREDS or {DEFAULT_CREDS}; `meshd --dev` "
                        "writes one to <data-dir>/meshctl)")
    p.add_argument("--bearer-file", default=os.environ.get("MESHCTL_BEARER_FILE", ""),
                   help="file holding a JWT to act as a person (or $MESHCTL_BEARER_FILE)")
    p.add_argument("--server-name", default="",
                   help="node name the admin server must prove (default: any mesh node)")
    p.add_argument("--timeout", type=float, default=5.0, help="seconds per call")
    sub = p.add_subparsers(dest="command", required=True)
    m = sub.add_parser("members", help="list members and their status")
    m.add_argument("--status", action="append", choices=["alive", "suspect", "dead", "left"],
                   help="only members in this status (repeatable)")
    m.add_argument("--role", action="append", help="only members with this role (repeatable)")
    m.add_argument("--detailed", action="store_true",
                   help="add coordinate error, height and estimated RTT from the answering node")
    m.add_argument("--format", choices=["table", "json"], default="table")
    m.set_defaults(func=members)
    r = sub.add_parser("rtt", help="estimated round-trip time between two members",
                       description="Estimate the RTT between members A and B (default: the "
                                   "answering node) from network coordinates, like `serf rtt`.")
    r.add_argument("a", metavar="A")
    r.add_argument("b", metavar="B", nargs="?")
    r.add_argument("--format", choices=["text", "json"], default="text")
    r.set_defaults(func=rtt)
    w = sub.add_parser("whoami", help="who the admin API takes you for, and your roles")
    w.set_defaults(func=whoami)
    ll = sub.add_parser("log-level", help="the answering node's log levels; set one with "
                                          "[LAYER] LEVEL (debug|info|warning|error|inherit)")
    ll.add_argument("words", nargs="*", metavar="[LAYER] LEVEL")
    ll.set_defaults(func=log_level)
    k = sub.add_parser("keys", help="gossip encryption keys across the mesh")
    k.add_argument("op", choices=["list", "install", "use", "remove"])
    k.add_argument("key", nargs="?", help="base64 of a 32-byte key (install/use/remove)")
    k.add_argument("--wait", type=float, default=10.0,
                   help="seconds to wait for members to acknowledge (default 10)")
    k.add_argument("--format", choices=["text", "json"], default="text")
    k.set_defaults(func=keys)
    t = sub.add_parser("token", help="join tokens")
    tsub = t.add_subparsers(dest="token_command", required=True)
    tc = tsub.add_parser("create", help="make a join token (ask a CA holder)")
    tc.add_argument("--uses", type=int, default=1, help="enrollments allowed (default 1)")
    tc.add_argument("--ttl", type=float, default=3600.0, help="seconds valid (default 3600)")
    tc.add_argument("--format", choices=["text", "json"], default="text")
    tc.set_defaults(func=token_create)
    rv = sub.add_parser("revoke", help="revoke a node (or a SPIFFE ID) everywhere")
    rv.add_argument("name", help="member name or spiffe:// ID")
    rv.set_defaults(func=revoke)
    c = sub.add_parser("ca", help="the mesh CA (offline, on the CA holder's files)")
    csub = c.add_subparsers(dest="ca_command", required=True)
    ci = csub.add_parser("init", help="create a CA directory (or import an existing CA)")
    ci.add_argument("--trust-domain", required=True)
    ci.add_argument("--out", required=True, help="directory to write")
    ci.add_argument("--from-cert", help="existing (intermediate) CA certificate, PEM")
    ci.add_argument("--from-key", help="its private key, PEM (EC)")
    ci.add_argument("--chain", help="intermediates above it, PEM")
    ci.add_argument("--bundle", help="root certificate(s) to trust, PEM")
    ci.set_defaults(func=ca_init, offline=True)
    ce = sub.add_parser("cert", help="client certificates (offline, with the CA files)")
    cesub = ce.add_subparsers(dest="cert_command", required=True)
    cis = cesub.add_parser("issue", help="issue an identity for a person or a node")
    cis.add_argument("--ca", required=True, help="CA directory")
    cis.add_argument("--name", required=True)
    cis.add_argument("--kind", choices=["user", "node"], default="user")
    cis.add_argument("--role", action="append", choices=list(ACCESS_ROLES),
                     help="access role (repeatable; default viewer)")
    cis.add_argument("--ttl", type=float, default=30 * 86400.0,
                     help="seconds valid (default 30 days)")
    cis.add_argument("--out", required=True, help="directory for key.pem, cert.pem, bundle.pem")
    cis.set_defaults(func=cert_issue, offline=True)
    ctl_policy.add_commands(sub)
    ctl_state.add_commands(sub)
    ctl_jobs.add_commands(sub)
    ctl_models.add_commands(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    try:
        return _run(argv)
    except BrokenPipeError:  # e.g. `meshctl members | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0


def _run(argv: list[str] | None) -> int:
    args = build_parser().parse_args(argv)
    if getattr(args, "offline", False):
        return int(args.func(args))
    when = getattr(args, "offline_if", None)  # (option, function): offline when it is given
    if when is not None and getattr(args, when[0]):
        return int(when[1](args))
    creds = Path(os.path.expanduser(args.creds))
    try:
        ident = Identity.load(creds)
    except IdentityError as exc:
        print(f"meshctl: --creds: {exc}. The admin API needs a mesh client certificate: "
              "`meshctl cert issue` on the CA holder, or <data-dir>/meshctl of a `meshd --dev` "
              "node", file=sys.stderr)
        return 2
    metadata: list[tuple[str, str]] = []
    if args.bearer_file:
        try:
            metadata.append(("authorization",
                             "Bearer " + Path(args.bearer_file).read_text().strip()))
        except OSError as exc:
            print(f"meshctl: --bearer-file: {exc.strerror}", file=sys.stderr)
            return 2
    server = (f"{args.server_name.lower()}.node.{ident.spiffe_id.trust_domain}"
              if args.server_name else "")

    def open_channel(target: str, node: str = "") -> grpc.Channel:
        """A channel like the main one, to ``target``; with ``node``, only that node's
        certificate is accepted."""
        name = f"{node.lower()}.node.{ident.spiffe_id.trust_domain}" if node else server
        channel = tls.grpc_channel(target, ident, server_name=name)
        return grpc.intercept_channel(channel, _Metadata(metadata)) if metadata else channel

    args.open_channel = open_channel  # for commands that talk to a second node (jobs logs)
    with open_channel(args.admin) as channel:
        stub = admin_pb2_grpc.AdminStub(channel)
        args.channel = channel  # for commands of other services (e.g. state)
        try:
            return int(args.func(stub, args))
        except grpc.RpcError as exc:
            code = exc.code()  # type: ignore[attr-defined]
            print(f"meshctl: {code.name}: {exc.details()} (admin {args.admin})",  # type: ignore[attr-defined]
                  file=sys.stderr)
            if code == grpc.StatusCode.UNAVAILABLE:
                why = explain(args.admin, creds)
                if why is not None:
                    print(f"meshctl: {why}", file=sys.stderr)
            return 2 if code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.NOT_FOUND) else 1


class _Metadata(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor):
    """Adds the bearer token to every call."""

    def __init__(self, metadata: list[tuple[str, str]]) -> None:
        self.metadata = metadata

    def intercept_unary_unary(self, continuation, details, request):  # type: ignore[no-untyped-def]
        details = details._replace(metadata=[*(details.metadata or []), *self.metadata])
        return continuation(details, request)

    def intercept_unary_stream(self, continuation, details, request):  # type: ignore[no-untyped-def]
        details = details._replace(metadata=[*(details.metadata or []), *self.metadata])
        return continuation(details, request)


if __name__ == "__main__":
    sys.exit(main())
