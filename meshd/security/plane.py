"""The agent's security plane: its identity, the CA it may hold, enrollment and renewal, who
may use which channel, revocations, join-token use counts and the gossip keyring.

Files in the data dir::

    identity/   key.pem (0600), cert.pem, bundle.pem    this node's mesh identity
                (key.next.pem only while a renewal is being written)
    ca/         the dev CA (``--dev``); ``--ca-dir`` points elsewhere for a real one
    meshctl/    an admin client identity for ``meshctl --creds`` (``--dev`` only)
    keyring.json  gossip keys (0600), key operations applied
    revocations.json, tokens.json

Node-state sections it publishes and reads (see :mod:`meshd.signals.nodestate`): ``rev`` (signed
revocations, CA holders), ``tok`` (join-token use counts, CA holders), ``keys`` (fingerprints
of the installed gossip keys: the acknowledgement of a key rotation) and ``kop`` (key operations
issued from this node's admin API).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime as dt
import hashlib
import json
import logging
import ssl
import struct
import time
from collections import Counter
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import msgpack
from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from certs import enroll, tls, tokens
from certs.ca import CertificateAuthority
from certs.enroll import MAGIC, Authority, EnrollError
from certs.identity import Identity, IdentityError, make_csr, new_key, write_private
from certs.names import HostName, SanError, check_requested, host_names, to_names
from certs.revocation import RevocationError, Revocations, sign_list
from certs.spiffe import SpiffeId
from certs.tokens import TokenError, TokenLedger
from certs.verify import Peer, PeerRejected, PeerVerifier
from consensus.transport import RaftTls, mesh_authorizer
from gossip.keyring import Keyring, KeyringError, generate_key
from gossip.state import Addr
from gossip.transport import StreamSecurity, peer_cert

log = logging.getLogger("meshd.security")

_LEN = struct.Struct(">I")
DEV_TRUST_DOMAIN = "mesh.local"
RENEW_RETRY = 30.0
"""Seconds between renewal attempts while no CA holder answers."""
NAMES_CHECK = 5.0
"""Seconds between looks for a CA holder while the certificate lacks host names the settings
now ask for (one early renewal fixes that)."""
KEY_OPS = ("install", "use", "remove")
MAX_KEY_OPS = 8
"""Key operations a node keeps publishing, so a member that missed one still applies it."""


class SecurityError(RuntimeError):
    """The agent cannot get an identity; the message says what to do."""


class EnrollmentRefused(SecurityError):
    """A CA holder refused our enrollment (bad token, name in use, ...): retrying won't help."""


def key_fingerprint(key: bytes) -> str:
    """What nodes gossip about their keys: never the key, a short hash of it."""
    return hashlib.sha256(b"meshd gossip key" + key).hexdigest()[:16]


def _pack(obj: object) -> bytes:
    return bytes(msgpack.packb(obj, use_bin_type=True))


class Security:
    """Everything identity-related one agent holds; the agent wires it to its channels."""

    def __init__(self, data_dir: Path, node: str, *, dev: bool = False, ca_dir: str = "",
                 join_token: str = "", trust_domain: str = "", encrypt: str = "",
                 cert_lifetime: float = 86400.0,
                 cert_names: Callable[[], Sequence[str]] | None = None) -> None:
        self.dir = data_dir
        self.node = node
        self.dev = dev
        self.join_token = join_token
        self.trust_domain = trust_domain or DEV_TRUST_DOMAIN
        self.encrypt = encrypt
        self.cert_lifetime = cert_lifetime
        self._cert_names = cert_names or (lambda: ())
        """The host names and addresses this node's certificate carries (the settings'
        :meth:`~meshd.settings.Settings.cert_names`), asked for again at each renewal."""
        self.names: list[HostName] = []
        self._names_renewal_tried = False
        self.id_dir = data_dir / "identity"
        self.ca_dir = Path(ca_dir) if ca_dir else (data_dir / "ca" if dev else None)
        self.ca: CertificateAuthority | None = None
        self._identity: Identity | None = None
        self.revocations: Revocations | None = None
        self.verifier: PeerVerifier | None = None
        self.tls_contexts: list[ssl.SSLContext] = []
        """Server and client contexts given the renewed certificate (Raft, the router's HTTPS)."""
        self.ledger = TokenLedger(data_dir / "tokens.json")
        self.keyring: Keyring | None = None
        self.authority: Authority | None = None
        self.refusals: Counter[tuple[str, str]] = Counter()
        """(channel, reason) -> connections or calls refused."""
        self.renewals: Counter[str] = Counter()
        self.enrollments: Counter[str] = Counter()
        self.key_ops_seq = 0
        self.key_ops: list[list[Any]] = []
        self._applied_ops: dict[str, int] = {}
        self.key_errors: list[str] = []
        self.peer_keys: dict[str, dict[str, Any]] = {}
        self.stream_security: StreamSecurity | None = None
        self._signed_rev: tuple[int, bytes] = (-1, b"")
        self.changed: Callable[[], None] = lambda: None
        """Set by the agent: something to publish changed (revocations, tokens, keys)."""
        self.members: Callable[[], list[tuple[str, Addr, dict[str, int]]]] = lambda: []
        """Set by the agent: live members as (name, address, ports)."""

    # --- start-up --------------------------------------------------------------------------

    @property
    def identity(self) -> Identity:
        assert self._identity is not None, "prepare() first"
        return self._identity

    @property
    def needs_enrollment(self) -> bool:
        return self._identity is None

    def prepare(self, now: float | None = None) -> None:
        """Load or make what can be had locally; enrollment (if needed) comes after."""
        now = time.time() if now is None else now
        self.dir.mkdir(parents=True, exist_ok=True)
        self.names = self._derive_names()
        try:
            Identity.settle(self.id_dir)
        except IdentityError as exc:
            raise SecurityError(f"identity: {exc}") from None
        have_identity = Identity.exists(self.id_dir)
        if self.ca_dir is not None and (self.ca_dir / "ca.json").exists():
            self.ca = CertificateAuthority.load(self.ca_dir)
        elif self.dev and not have_identity and not self.join_token:
            assert self.ca_dir is not None
            self.ca = CertificateAuthority.create(self.trust_domain)
            self.ca.save(self.ca_dir)
            log.warning("created a development CA; use a real one (meshctl ca init) outside "
                        "development", extra={"event": "dev_ca_created", "dir": str(self.ca_dir),
                                              "trust_domain": self.trust_domain})
        elif self.ca_dir is not None and not self.dev:
            raise SecurityError(f"ca-dir: no CA in {self.ca_dir} (create one with "
                                "`meshctl ca init`)")
        ident: Identity | None = None
        if have_identity:
            try:
                ident = Identity.load(self.id_dir)
            except IdentityError as exc:
                raise SecurityError(f"identity: {exc}") from None
            if self.ca is not None and (ident.bundle != self.ca.bundle or
                                        ident.spiffe_id.name != self.node or
                                        self.names_stale(ident)):
                ident = None  # the CA, our name or addresses changed: a holder re-issues
            elif ident.not_after.timestamp() <= now and self.ca is None:
                if not self.join_token:
                    raise SecurityError(f"identity in {self.id_dir} expired at "
                                        f"{ident.not_after.isoformat()}; re-enroll with "
                                        "--join-token")
                ident = None
            elif ident.spiffe_id.name != self.node:
                raise SecurityError(f"identity in {self.id_dir} is for "
                                    f"{ident.spiffe_id.name!r}, not {self.node!r}")
        if ident is None and self.ca is not None:
            ident = self._mint_own(now)
        if ident is None and not self.join_token:
            raise SecurityError("no identity: give --join-token (from `meshctl token create`), "
                                "--ca-dir (a CA holder) or --dev (one-machine development)")
        if ident is not None:
            self._check_names(ident.spiffe_id)
            self._adopt(ident)
        self._load_keyring()
        if self.dev and self.ca is not None:
            self._write_dev_client(now)

    def _derive_names(self) -> list[HostName]:
        try:
            return to_names(self._cert_names())
        except SanError as exc:
            raise SecurityError(f"cert_san: {exc}") from None

    def _check_names(self, sid: SpiffeId, names: list[HostName] | None = None) -> None:
        """Refuse at start names the CA would refuse at each renewal (another identity's)."""
        try:
            check_requested(sid, self.names if names is None else names)
        except SanError as exc:
            raise SecurityError(f"cert_san: {exc}") from None

    def names_stale(self, ident: Identity) -> bool:
        """Whether ``ident``'s host names differ from those the settings ask for now."""
        return ident.host_names != host_names(self.names)

    def _mint_own(self, now: float) -> Identity:
        assert self.ca is not None
        sid = SpiffeId.node(self.ca.trust_domain, self.node)
        self._check_names(sid)
        ident = self.ca.mint(sid, ["node"], lifetime=dt.timedelta(seconds=self.cert_lifetime),
                             now=now, names=self.names)
        ident.save(self.id_dir)
        return ident

    def _adopt(self, ident: Identity) -> None:
        first = self._identity is None
        self._identity = ident
        td = ident.spiffe_id.trust_domain
        self.trust_domain = td
        if first:
            self.revocations = Revocations(ident.bundle, td, self.dir / "revocations.json")
            self.verifier = PeerVerifier(ident.bundle, td, self.revocations,
                                         intermediates=ident.chain[1:], mesh=ident.mesh)
        else:
            assert self.verifier is not None
            self.verifier.set_bundle(ident.bundle)
        if self.stream_security is not None:
            tls.reload(self.stream_security.server, self.id_dir)
            tls.reload(self.stream_security.client, self.id_dir)
        for ctx in self.tls_contexts:
            tls.reload(ctx, self.id_dir)

    def server_tls(self) -> ssl.SSLContext:
        """A TLS server context presenting this node's identity that asks for a client
        certificate without requiring one (the router's HTTPS port: a bearer token will do);
        reloaded when the identity is renewed."""
        ctx = tls.server_context(self.id_dir, require_client_cert=False)
        self.tls_contexts.append(ctx)
        return ctx

    def raft_tls(self, node_names: Mapping[str, str]) -> RaftTls:
        """TLS for a Raft group: node certificates only, each peer pinned to the member name
        gossip gives for its address (``node_names``, kept current by the caller).  The
        contexts are reloaded when our certificate is renewed."""
        assert self.verifier is not None
        server = tls.server_context(self.id_dir)
        client = tls.client_context(self.id_dir)
        self.tls_contexts += [server, client]
        return RaftTls(server, client, mesh_authorizer(self.verifier),
                       on_refused=lambda why: self.refuse("raft", why, ""),
                       node_names=node_names)

    def _write_dev_client(self, now: float) -> None:
        """An admin identity for ``meshctl --creds <data>/meshctl`` on this machine."""
        assert self.ca is not None
        out = self.dir / "meshctl"
        if Identity.exists(out):
            with contextlib.suppress(IdentityError):
                old = Identity.load(out)
                if old.bundle == self.ca.bundle and old.renew_at() > now:
                    return
        self.ca.mint(SpiffeId(self.ca.trust_domain, "user", "admin"), ["admin"],
                     lifetime=dt.timedelta(days=30), now=now).save(out)

    # --- keyring ---------------------------------------------------------------------------

    def _load_keyring(self) -> None:
        path = self.dir / "keyring.json"
        if path.exists():
            try:
                doc = json.loads(path.read_text())
                self.keyring = Keyring([base64.b64decode(k) for k in doc["keys"]])
                self._applied_ops = {str(k): int(v) for k, v in doc.get("applied", {}).items()}
                self.key_ops_seq = int(doc.get("seq", 0))
                return
            except (OSError, ValueError, KeyError, TypeError, KeyringError) as exc:
                raise SecurityError(f"keyring: {path} is unreadable ({exc})") from None
        if self.encrypt:
            self.keyring = Keyring.from_base64(self.encrypt)
        elif self.ca is not None:
            self.keyring = Keyring([generate_key()])
            log.info("generated a gossip key", extra={"event": "gossip_key_generated"})
        if self.keyring is not None:
            self.save_keyring()

    def save_keyring(self) -> None:
        if self.keyring is None:
            return
        doc = {"keys": [base64.b64encode(k).decode() for k in self.keyring.keys()],
               "applied": self._applied_ops, "seq": self.key_ops_seq}
        write_private(self.dir / "keyring.json", json.dumps(doc).encode())

    def keys_section(self) -> dict[str, Any]:
        """What this node gossips about its keyring: fingerprints, and the last failure."""
        if self.keyring is None:
            return {"fps": [], "p": ""}
        fps = [key_fingerprint(k) for k in self.keyring.keys()]
        return {"fps": fps, "p": fps[0], "err": self.key_errors[-3:]}

    def key_op(self, op: str, key: bytes) -> None:
        """Apply a key operation here and publish it for every member to apply."""
        if op not in KEY_OPS:
            raise KeyringError(f"unknown key operation {op!r}")
        if self.keyring is None:
            raise KeyringError("gossip encryption is off on this node; there is no keyring")
        getattr(self.keyring, op)(key)
        self.key_ops_seq = max(self.key_ops_seq + 1, int(time.time() * 1000))
        self.key_ops = [*self.key_ops, [self.key_ops_seq, op, key]][-MAX_KEY_OPS:]
        self.save_keyring()
        self.changed()

    def _apply_key_ops(self, origin: str, ops: object) -> None:
        if self.keyring is None or not isinstance(ops, list):
            return
        done = self._applied_ops.get(origin, 0)
        changed = False
        for item in ops:
            if not (isinstance(item, list) and len(item) == 3):
                continue
            seq, op, key = item
            if not isinstance(seq, int) or seq <= done or op not in KEY_OPS or \
                    not isinstance(key, bytes):
                continue
            try:
                getattr(self.keyring, op)(key)
                log.info("gossip key operation applied", extra={
                    "event": "key_op_applied", "op": op, "origin": origin,
                    "key_fingerprint": key_fingerprint(key)})
            except KeyringError as exc:
                self.key_errors.append(f"{op} {key_fingerprint(key)} from {origin}: {exc}")
                log.warning("gossip key operation failed", extra={
                    "event": "key_op_failed", "op": op, "origin": origin, "detail": str(exc)})
            done = seq
            changed = True
        if changed:
            self._applied_ops[origin] = done
            self.save_keyring()
            self.changed()

    # --- gossip sections -------------------------------------------------------------------

    def sections(self, now: float) -> dict[str, bytes]:
        """The security sections of this node's state (each msgpack, ``rev`` signed)."""
        out: dict[str, bytes] = {"keys": _pack(self.keys_section())}
        if self.key_ops:
            out["kop"] = _pack(self.key_ops)
        if self.ca is not None and self.revocations is not None:
            self.revocations.prune(now)
            if self.revocations.cutoffs:
                if self._signed_rev[0] != self.revocations.version:
                    self._signed_rev = (self.revocations.version,
                                        sign_list(self.ca, self.revocations.cutoffs, now))
                out["rev"] = self._signed_rev[1]
            counts = self.ledger.counts(now)
            if counts:
                out["tok"] = _pack(counts)
        return out

    def learn(self, member: str, raw: dict[str, bytes]) -> None:
        """A member's published state: merge revocations, token uses, key operations."""
        sections: dict[str, Any] = {}
        for name in ("keys", "kop", "tok"):
            if name in raw:
                try:
                    sections[name] = msgpack.unpackb(raw[name], raw=False)
                except (ValueError, TypeError, msgpack.UnpackException):
                    self.refusals[("node_state", f"bad_{name}")] += 1
        rev = raw.get("rev")
        if isinstance(rev, bytes) and self.revocations is not None:
            try:
                if self.revocations.update(rev):
                    log.info("revocations updated", extra={
                        "event": "revocations_updated", "member": member,
                        "revoked": len(self.revocations.cutoffs)})
                    if self.ca is not None:
                        self.changed()  # CA holders republish what they learn
            except RevocationError as exc:
                self.refusals[("revocations", "invalid")] += 1
                log.warning("bad revocation list", extra={"event": "bad_revocations",
                                                          "member": member, "detail": str(exc)})
        tok = sections.get("tok")
        if isinstance(tok, dict) and member != self.node:
            with contextlib.suppress(TypeError, ValueError):
                self.ledger.learn(member, tok)
        keys = sections.get("keys")
        if isinstance(keys, dict):
            self.peer_keys[member] = keys
        if member != self.node:
            self._apply_key_ops(member, sections.get("kop"))

    def forget(self, member: str) -> None:
        self.peer_keys.pop(member, None)

    # --- who may connect -------------------------------------------------------------------

    def refuse(self, channel: str, reason: str, detail: str) -> None:
        self.refusals[(channel, reason)] += 1
        log.warning("connection refused", extra={"event": "security_refused",
                                                 "channel": channel, "reason": reason,
                                                 "detail": detail})

    def check_peer(self, der: bytes | None, channel: str) -> Peer | None:
        """The verified peer, or None (counted and logged)."""
        assert self.verifier is not None
        try:
            return self.verifier.verify_der(der)
        except PeerRejected as exc:
            self.refuse(channel, exc.reason, str(exc))
            return None

    def authorize_stream(self, der: bytes | None, outgoing: bool) -> bool:
        """Push-pull is for mesh nodes only (not people's client certificates)."""
        peer = self.check_peer(der, "gossip_stream")
        if peer is None:
            return False
        if peer.spiffe_id.kind != "node":
            self.refuse("gossip_stream", "not_a_node", f"{peer.spiffe_id} is not a node")
            return False
        return True

    def build_stream_security(self) -> StreamSecurity:
        self.stream_security = StreamSecurity(
            server=tls.server_context(self.id_dir, require_client_cert=False),
            client=tls.client_context(self.id_dir),
            authorize=self.authorize_stream,
            handlers={MAGIC: self.serve_enrollment},
            on_handshake_failed=lambda why: self.refuse("gossip_stream", "tls_handshake", why))
        return self.stream_security

    # --- enrollment and renewal: the CA holder's side --------------------------------------

    def build_authority(self, name_in_use: Callable[[str], bool]) -> Authority:
        assert self.verifier is not None
        self.authority = Authority(
            identity=lambda: self.identity, verifier=self.verifier, ca=self.ca,
            ledger=self.ledger,
            gossip_keys=lambda: self.keyring.keys() if self.keyring is not None else [],
            ca_holders=self.ca_holders, name_in_use=name_in_use,
            lifetime_s=self.cert_lifetime)
        return self.authority

    def ca_holders(self) -> list[str]:
        """Gossip addresses of live members that advertise a CA (the ``ca`` port)."""
        return [f"{addr[0]}:{ports['ca']}" for name, addr, ports in self.members()
                if "ca" in ports and name != self.node]

    async def serve_enrollment(self, reader: asyncio.StreamReader,
                               writer: asyncio.StreamWriter, der: bytes | None) -> None:
        """Up to two request/reply exchanges (HELLO, then ENROLL or RENEW) on one stream."""
        assert self.authority is not None
        peer = self.check_peer(der, "enrollment") if der else None
        for _ in range(2):
            try:
                data = await asyncio.wait_for(_read_msg(reader), 10.0)
            except (TimeoutError, OSError, asyncio.IncompleteReadError, EnrollError):
                return
            try:
                msg = enroll.unpack(data)
            except EnrollError as exc:
                reply = enroll.refusal(exc.reason, str(exc))
            else:
                if der and peer is None:
                    reply = enroll.refusal("not_authenticated",
                                           "the certificate presented was refused")
                else:
                    reply = self.authority.handle(msg, peer)
            if not reply.get("ok"):
                self.refuse("enrollment", str(reply.get("reason")), str(reply.get("error")))
            elif msg.get("op") in (enroll.ENROLL, enroll.RENEW):
                self.enrollments[str(msg.get("op"))] += 1
                log.info("certificate issued", extra={
                    "event": "certificate_issued", "op": msg.get("op"),
                    "for": str(peer.spiffe_id) if peer else "new node"})
            _write_msg(writer, enroll.pack(reply))
            await writer.drain()
            if not reply.get("ok") or msg.get("op") != enroll.HELLO:
                return

    def revoke(self, sid: SpiffeId, now: float | None = None) -> float:
        """Void every certificate of ``sid`` issued until now (CA holders only)."""
        if self.ca is None or self.revocations is None:
            raise SecurityError("this node holds no CA key; revoke on a CA holder")
        cutoff = time.time() if now is None else now
        self.revocations.revoke(sid, cutoff)
        log.warning("identity revoked", extra={"event": "revoked", "spiffe_id": str(sid)})
        self.changed()
        return cutoff

    def create_token(self, uses: int, ttl: float) -> tuple[str, tokens.TokenClaims]:
        if self.ca is None:
            raise SecurityError("this node holds no CA key; create tokens on a CA holder")
        token, claims = tokens.create(self.ca, uses=uses, ttl=ttl, now=time.time())
        log.info("join token created", extra={"event": "token_created", "token_id": claims.id,
                                              "uses": uses, "ttl": ttl})
        return token, claims

    # --- enrollment and renewal: the node's side -------------------------------------------

    async def enroll(self, seeds: list[Addr], timeout: float = 10.0) -> None:
        """Get an identity and the gossip keys through a seed, with the join token."""
        try:
            claims = tokens.read(self.join_token)
        except TokenError as exc:
            raise SecurityError(f"join-token: {exc}") from None
        key = new_key()
        tried: set[str] = set()
        queue = [f"{h}:{p}" for h, p in seeds]
        last = "no seed to enroll through"
        while queue:
            target = queue.pop(0)
            if target in tried:
                continue
            tried.add(target)
            try:
                async with asyncio.timeout(timeout):
                    reply, more = await self._enroll_at(target, claims, key)
            except EnrollError as exc:
                if exc.reason in ("wrong_mesh", "malformed"):
                    last = f"{target}: {exc}"
                    continue
                raise EnrollmentRefused(f"enrollment refused by {target}: {exc} "
                                    f"({exc.reason})") from None
            except (OSError, TimeoutError, asyncio.IncompleteReadError) as exc:
                last = f"{target}: {exc or type(exc).__name__}"
                continue
            if reply is None:
                queue.extend(more)
                last = f"{target} holds no CA key"
                continue
            self._install_enrollment(key, reply)
            log.info("enrolled", extra={"event": "enrolled", "via": target,
                                        "token_id": claims.id,
                                        "spiffe_id": str(self.identity.spiffe_id)})
            return
        raise SecurityError(f"enrollment failed: {last}")

    async def _enroll_at(self, target: str, claims: tokens.TokenClaims,
                         key: Any) -> tuple[dict[str, object] | None, list[str]]:
        async with _enrollment_stream(target, tls.unverified_client_context()) as (reader,
                                                                                 writer):
            hello = await _exchange(reader, writer, {"op": enroll.HELLO})
            bundle, td = enroll.check_hello(hello, peer_cert(writer), claims.ca_fingerprint)
            holders = [str(h) for h in hello.get("ca_holders", []) or []]  # type: ignore[attr-defined]
            if holders:
                return None, holders
            csr = make_csr(key, SpiffeId.node(td, self.node), self.names)
            reply = await _exchange(reader, writer, {
                "op": enroll.ENROLL, "token": self.join_token,
                "csr": csr.public_bytes(Encoding.DER)})
            if not reply.get("ok"):
                raise EnrollError(str(reply.get("reason")), str(reply.get("error")))
            return reply, []

    def _install_enrollment(self, key: Any, reply: dict[str, object]) -> None:
        chain = tuple(x509.load_der_x509_certificate(d) for d in reply["chain"])  # type: ignore[attr-defined]
        bundle = tuple(x509.load_der_x509_certificate(d) for d in reply["bundle"])  # type: ignore[attr-defined]
        ident = Identity(key, chain, bundle)
        ident.save(self.id_dir)
        self._adopt(ident)
        keys = [bytes(k) for k in reply.get("keys", []) or []]  # type: ignore[attr-defined]
        if keys:
            if self.keyring is None:
                self.keyring = Keyring(keys)
            else:
                for k in keys:
                    self.keyring.install(k)
            self.save_keyring()

    async def renew(self) -> bool:
        """A new certificate (and key) before the current one expires, with the host names
        the settings give now (the host's addresses may have changed)."""
        try:
            names = await asyncio.to_thread(self._derive_names)  # may resolve names
            self._check_names(self.identity.spiffe_id, names)
            self.names = names
        except SecurityError as exc:
            log.warning("certificate names unchanged", extra={
                "event": "cert_names_failed", "detail": str(exc)})
        now = time.time()
        if self.ca is not None:
            self._adopt(self._mint_own(now))
            self.renewals["ok"] += 1
            return True
        key = new_key()
        csr = make_csr(key, self.identity.spiffe_id, self.names).public_bytes(Encoding.DER)
        for target in self.ca_holders():
            try:
                async with asyncio.timeout(10.0), _enrollment_stream(
                        target, tls.client_context(self.id_dir)) as (reader, writer):
                    reply = await _exchange(reader, writer, {"op": enroll.RENEW, "csr": csr})
            except (OSError, TimeoutError, asyncio.IncompleteReadError, EnrollError,
                    ssl.SSLError) as exc:
                log.warning("renewal attempt failed", extra={
                    "event": "renew_failed", "via": target, "detail": repr(exc)})
                continue
            if not reply.get("ok"):
                log.warning("renewal refused", extra={
                    "event": "renew_refused", "via": target, "reason": reply.get("reason"),
                    "detail": reply.get("error")})
                continue
            self._install_enrollment(key, reply)
            self.renewals["ok"] += 1
            log.info("certificate renewed", extra={
                "event": "renewed", "via": target,
                "not_after": self.identity.not_after.isoformat()})
            return True
        self.renewals["failed"] += 1
        return False

    def _names_pending(self) -> bool:
        """The certificate lacks the names asked for, and no early renewal was tried yet."""
        return not self._names_renewal_tried and self.names_stale(self.identity)

    def _early_renewal(self) -> bool:
        """Renew now, once per run: the names changed (a new ``--cert-san``, a certificate
        from before nodes asked for names) and a CA holder is known to ask."""
        return self._names_pending() and (self.ca is not None or bool(self.ca_holders()))

    async def renew_loop(self) -> None:
        while True:
            wait = self.identity.renew_at() - time.time()
            if wait > 0 and self._early_renewal():
                self._names_renewal_tried = True
                log.info("renewing early: the certificate's host names are not the ones the "
                         "settings ask for", extra={
                             "event": "renew_for_names",
                             "have": sorted(self.identity.host_names),
                             "want": sorted(host_names(self.names))})
                wait = 0.0
            if wait > 0:
                await asyncio.sleep(min(wait, 3600.0, NAMES_CHECK if self._names_pending()
                                        else 3600.0))
                continue
            if not await self.renew():
                await asyncio.sleep(min(RENEW_RETRY, max(1.0, self.cert_lifetime / 20)))



@contextlib.asynccontextmanager
async def _enrollment_stream(target: str, ctx: ssl.SSLContext
                             ) -> AsyncIterator[tuple[asyncio.StreamReader, asyncio.StreamWriter]]:
    """A TLS stream to a member's gossip port (``host:port``), opened as an enrollment one."""
    host, _, port = target.rpartition(":")
    reader, writer = await asyncio.open_connection(host.strip("[]"), int(port))
    try:
        await writer.start_tls(ctx)
        writer.write(MAGIC)
        yield reader, writer
    finally:
        writer.close()


async def _read_msg(reader: asyncio.StreamReader) -> bytes:
    (length,) = _LEN.unpack(await reader.readexactly(_LEN.size))
    if length > enroll.MAX_MESSAGE:
        raise EnrollError("malformed", f"message of {length} bytes")
    return await reader.readexactly(length)


def _write_msg(writer: asyncio.StreamWriter, data: bytes) -> None:
    writer.write(_LEN.pack(len(data)) + data)


async def _exchange(reader: asyncio.StreamReader, writer: asyncio.StreamWriter,
                    msg: dict[str, object]) -> dict[str, object]:
    _write_msg(writer, enroll.pack(msg))
    await writer.drain()
    return enroll.unpack(await _read_msg(reader))
