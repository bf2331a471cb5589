"""The mesh CA: it signs node and user certificates and the revocation lists.

A directory holds it (``meshctl ca init`` writes one)::

    ca.key      the signing key (0600)         ca.pem      the signing certificate
    bundle.pem  the roots everyone trusts      chain.pem   intermediates above ca.pem (optional)
    ca.json     {"trust_domain": ...}

For a CA of our own ``bundle.pem`` is ``ca.pem``.  An enterprise that already runs a PKI gives
an intermediate (its certificate and key, the chain up to the root, and the root) instead; the
mesh then trusts that root and every leaf carries the chain.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import re
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from certs.identity import (
    CLOCK_SKEW,
    MESH_OID,
    ROLES_OID,
    Identity,
    encode_roles,
    key_pem,
    load_pem_certs,
    new_key,
    pem_certs,
    write_private,
    write_public,
)
from certs.names import HostName, SanError, check_requested
from certs.spiffe import SpiffeError, SpiffeId, check_trust_domain

CA_KEY, CA_CERT, CA_CHAIN, CA_BUNDLE, CA_META = "ca.key", "ca.pem", "chain.pem", "bundle.pem", \
    "ca.json"
DEFAULT_LEAF_LIFETIME = dt.timedelta(hours=24)
DEFAULT_CA_LIFETIME = dt.timedelta(days=3650)
MAX_LEAF_LIFETIME = dt.timedelta(days=30)


class CaError(ValueError):
    """A CA directory or request the CA cannot use; the message names the problem."""


class CsrRejected(CaError):
    """A CSR that is tampered with, asks for the wrong identity or uses an unsupported key.
    ``reason`` is a short metric label."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


_MESH_ID = re.compile(r"[0-9a-f]{32}")


def new_mesh_id() -> str:
    """A fresh mesh id: 128 random bits, hex."""
    return secrets.token_hex(16)


def fingerprint(cert: x509.Certificate) -> str:
    """SHA-256 of the DER certificate, hex: what a join token pins."""
    return hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).hexdigest()


def _utc(now: float | dt.datetime | None) -> dt.datetime:
    if now is None:
        return dt.datetime.now(dt.UTC)
    if isinstance(now, dt.datetime):
        return now
    return dt.datetime.fromtimestamp(now, dt.UTC)


@dataclass(frozen=True, slots=True)
class CertificateAuthority:
    trust_domain: str
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate
    chain: tuple[x509.Certificate, ...]
    """Intermediates between ``cert`` and the root (empty for a root CA)."""
    bundle: tuple[x509.Certificate, ...]
    mesh: str = ""
    """The mesh id every certificate this CA signs carries (:data:`~certs.identity.MESH_OID`);
    "" for a CA made before mesh ids, whose certificates carry none."""

    # --- creation and files ---------------------------------------------------------------

    @classmethod
    def create(cls, trust_domain: str, *, lifetime: dt.timedelta = DEFAULT_CA_LIFETIME,
               now: float | dt.datetime | None = None) -> CertificateAuthority:
        """A new self-signed EC P-256 root for ``trust_domain``."""
        check_trust_domain(trust_domain)
        key = new_key()
        start = _utc(now) - CLOCK_SKEW
        name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "meshd"),
                          x509.NameAttribute(NameOID.COMMON_NAME, f"meshd CA {trust_domain}")])
        ski = x509.SubjectKeyIdentifier.from_public_key(key.public_key())
        cert = (x509.CertificateBuilder()
                .subject_name(name).issuer_name(name)
                .public_key(key.public_key())
                .serial_number(x509.random_serial_number())
                .not_valid_before(start).not_valid_after(start + lifetime)
                .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
                .add_extension(x509.KeyUsage(
                    digital_signature=True, content_commitment=False, key_encipherment=False,
                    data_encipherment=False, key_agreement=False, key_cert_sign=True,
                    crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
                .add_extension(ski, critical=False)
                .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski),
                               critical=False)
                .add_extension(x509.SubjectAlternativeName(
                    [x509.UniformResourceIdentifier(f"spiffe://{trust_domain}")]), critical=False)
                .sign(key, hashes.SHA256()))
        return cls(trust_domain, key, cert, (), (cert,), new_mesh_id())

    @classmethod
    def from_parts(cls, trust_domain: str, key: object, cert: x509.Certificate,
                   chain: list[x509.Certificate], bundle: list[x509.Certificate],
                   mesh: str = "") -> CertificateAuthority:
        """An existing (often intermediate) CA, checked to be usable before anything is signed."""
        check_trust_domain(trust_domain)
        if not isinstance(key, ec.EllipticCurvePrivateKey):
            raise CaError("CA key: only EC keys (P-256 recommended) are supported")
        if cert.public_key() != key.public_key():
            raise CaError("CA key does not match the CA certificate")
        try:
            bc = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
        except x509.ExtensionNotFound:
            bc = None
        if bc is None or not bc.ca:
            raise CaError("CA certificate is not a CA (basicConstraints CA:TRUE missing)")
        if not bundle:
            raise CaError("CA bundle is empty: give the root certificate(s) to trust")
        issuer = cert
        for parent in chain:
            if not issued_by(issuer, parent):
                raise CaError(f"chain: {issuer.subject.rfc4514_string()} is not issued by "
                              f"{parent.subject.rfc4514_string()}")
            issuer = parent
        if not any(issued_by(issuer, root) for root in bundle):
            raise CaError("CA bundle: no root in it issued the CA certificate (or its chain)")
        if mesh and not _MESH_ID.fullmatch(mesh):
            raise CaError(f"mesh id {mesh!r}: must be 32 lowercase hex digits")
        return cls(trust_domain, key, cert, tuple(chain), tuple(bundle), mesh)

    def save(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        write_private(directory / CA_KEY, key_pem(self.key))
        write_public(directory / CA_CERT, pem_certs([self.cert]))
        write_public(directory / CA_BUNDLE, pem_certs(list(self.bundle)))
        if self.chain:
            write_public(directory / CA_CHAIN, pem_certs(list(self.chain)))
        meta = {"trust_domain": self.trust_domain, **({"mesh": self.mesh} if self.mesh else {})}
        write_public(directory / CA_META, json.dumps(meta).encode())

    @classmethod
    def load(cls, directory: Path) -> CertificateAuthority:
        try:
            meta = json.loads((directory / CA_META).read_text())
            key = serialization.load_pem_private_key((directory / CA_KEY).read_bytes(), None)
            cert = load_pem_certs((directory / CA_CERT).read_bytes(), str(directory / CA_CERT))
            bundle = load_pem_certs((directory / CA_BUNDLE).read_bytes(),
                                    str(directory / CA_BUNDLE))
            chain_file = directory / CA_CHAIN
            chain = (load_pem_certs(chain_file.read_bytes(), str(chain_file))
                     if chain_file.exists() else [])
        except OSError as exc:
            raise CaError(f"cannot read CA in {directory}: {exc.strerror} ({exc.filename})"
                          ) from None
        except (ValueError, TypeError) as exc:
            raise CaError(f"CA in {directory}: {exc}") from None
        if not isinstance(meta, dict) or not isinstance(meta.get("trust_domain"), str):
            raise CaError(f"{directory / CA_META}: no trust_domain")
        mesh = meta.get("mesh", "")
        if not isinstance(mesh, str):
            raise CaError(f"{directory / CA_META}: mesh must be a string")
        return cls.from_parts(meta["trust_domain"], key, cert[0], chain, bundle, mesh)

    @staticmethod
    def exists(directory: Path) -> bool:
        return (directory / CA_KEY).exists() and (directory / CA_META).exists()

    @property
    def root(self) -> x509.Certificate:
        return self.bundle[0]

    def fingerprint(self) -> str:
        """What join tokens pin: the first root of the bundle."""
        return fingerprint(self.root)

    # --- signing --------------------------------------------------------------------------

    def check_csr(self, csr: x509.CertificateSigningRequest, expect: SpiffeId | None = None
                  ) -> SpiffeId:
        """The identity a CSR asks for, once its signature, key and names are acceptable."""
        return self.check_request(csr, expect)[0]

    def check_request(self, csr: x509.CertificateSigningRequest,
                      expect: SpiffeId | None = None) -> tuple[SpiffeId, list[HostName]]:
        """The identity a CSR asks for and the host names (DNS names, IP addresses) to put
        beside it, once its signature, key and every SAN are acceptable: one SPIFFE URI of this
        trust domain (``expect`` if given), and DNS names and IP addresses as
        :func:`certs.names.check_requested` allows."""
        if not csr.is_signature_valid:
            raise CsrRejected("bad_signature", "CSR signature does not verify (tampered CSR?)")
        pub = csr.public_key()
        if not isinstance(pub, ec.EllipticCurvePublicKey) or pub.curve.name not in (
                "secp256r1", "secp384r1"):
            raise CsrRejected("bad_key", "CSR key must be EC P-256 or P-384")
        try:
            san = csr.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
            uris = san.get_values_for_type(x509.UniformResourceIdentifier)
            if len(uris) != 1:
                raise ValueError(f"{len(uris)} URI SANs")
            sid = SpiffeId.parse(uris[0])
        except (x509.ExtensionNotFound, ValueError, SpiffeError) as exc:
            raise CsrRejected("bad_identity", f"CSR must name one SPIFFE ID ({exc})") from None
        if sid.trust_domain != self.trust_domain:
            raise CsrRejected("wrong_trust_domain", f"CSR asks for {sid}, but this CA signs "
                                                    f"trust domain {self.trust_domain}")
        if expect is not None and sid != expect:
            raise CsrRejected("wrong_identity", f"CSR asks for {sid}, expected {expect}")
        try:
            names = check_requested(
                sid, [n for n in san if not isinstance(n, x509.UniformResourceIdentifier)])
        except SanError as exc:
            raise CsrRejected("bad_name", f"CSR for {sid}: {exc}") from None
        if names and sid.kind != "node":
            raise CsrRejected("bad_name", f"CSR for {sid} asks for host names; only node "
                                          "certificates carry them")
        return sid, names

    def issue(self, csr: x509.CertificateSigningRequest, roles: tuple[str, ...] | list[str], *,
              lifetime: dt.timedelta = DEFAULT_LEAF_LIFETIME,
              now: float | dt.datetime | None = None,
              expect: SpiffeId | None = None) -> x509.Certificate:
        """Sign a checked CSR: SPIFFE URI SAN, DNS SANs (the identity's and those the CSR asks
        for), IP SANs, the access roles, ``lifetime``."""
        sid, names = self.check_request(csr, expect)
        return self.sign(csr.public_key(), sid, roles, lifetime=lifetime, now=now,  # type: ignore[arg-type]
                         names=names)

    def sign(self, public_key: ec.EllipticCurvePublicKey, sid: SpiffeId,
             roles: tuple[str, ...] | list[str], *,
             lifetime: dt.timedelta = DEFAULT_LEAF_LIFETIME,
             now: float | dt.datetime | None = None,
             names: Sequence[x509.GeneralName | str] = ()) -> x509.Certificate:
        """A leaf for ``sid``: its SPIFFE URI and DNS names, then ``names`` (host names and IP
        addresses, checked as in a CSR; see :mod:`certs.names`)."""
        if sid.trust_domain != self.trust_domain:
            raise CaError(f"{sid} is not in trust domain {self.trust_domain}")
        if not dt.timedelta(0) < lifetime <= MAX_LEAF_LIFETIME:
            raise CaError(f"lifetime must be in (0, {MAX_LEAF_LIFETIME.days} days]")
        start = _utc(now) - CLOCK_SKEW
        end = min(start + CLOCK_SKEW + lifetime, self.cert.not_valid_after_utc)
        if end <= start + CLOCK_SKEW:
            raise CaError(f"the CA certificate expired at {end.isoformat()}; renew the CA")
        try:
            hosts = check_requested(sid, names)
        except SanError as exc:
            raise CaError(f"{sid}: {exc}") from None
        if hosts and sid.kind != "node":
            raise CaError(f"{sid}: only node certificates carry host names")
        ca_ski = self.cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
        san: list[x509.GeneralName] = [x509.UniformResourceIdentifier(str(sid))]
        san += [x509.DNSName(n) for n in sid.dns_names()]
        san += hosts
        builder = (x509.CertificateBuilder()
                .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, sid.name)]))
                .issuer_name(self.cert.subject)
                .public_key(public_key)
                .serial_number(x509.random_serial_number())
                .not_valid_before(start).not_valid_after(end)
                .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                .add_extension(x509.KeyUsage(
                    digital_signature=True, content_commitment=False, key_encipherment=False,
                    data_encipherment=False, key_agreement=False, key_cert_sign=False,
                    crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
                .add_extension(x509.ExtendedKeyUsage(
                    [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                    critical=False)
                .add_extension(x509.SubjectKeyIdentifier.from_public_key(public_key),
                               critical=False)
                .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(
                    ca_ski), critical=False)
                .add_extension(x509.SubjectAlternativeName(san), critical=False)
                .add_extension(x509.UnrecognizedExtension(ROLES_OID, encode_roles(list(roles))),
                               critical=False))
        if self.mesh:
            builder = builder.add_extension(
                x509.UnrecognizedExtension(MESH_OID, self.mesh.encode("ascii")), critical=False)
        return builder.sign(self.key, hashes.SHA256())

    def chain_for(self, leaf: x509.Certificate) -> tuple[x509.Certificate, ...]:
        """Leaf first, then every CA certificate up to (not including) a bundle root."""
        out = [leaf]
        for c in (self.cert, *self.chain):
            if c not in self.bundle:
                out.append(c)
        return tuple(out)

    def mint(self, sid: SpiffeId, roles: tuple[str, ...] | list[str], *,
             lifetime: dt.timedelta = DEFAULT_LEAF_LIFETIME,
             now: float | dt.datetime | None = None,
             names: Sequence[x509.GeneralName | str] = ()) -> Identity:
        """A whole identity made here, for the CA holder itself, ``--dev`` and user certs
        (``meshctl cert issue``): the key is made on the machine that will use it.  ``names``:
        host names and IP addresses for a node certificate (:func:`certs.names.to_names`)."""
        key = new_key()
        leaf = self.sign(key.public_key(), sid, roles, lifetime=lifetime, now=now, names=names)
        return Identity(key, self.chain_for(leaf), self.bundle)

    def crl(self, revoked: dict[int, dt.datetime], number: int,
            now: float | dt.datetime | None = None,
            valid_for: dt.timedelta = dt.timedelta(days=7)) -> x509.CertificateRevocationList:
        """A CRL listing ``revoked`` (serial -> revocation time), signed by this CA."""
        start = _utc(now)
        ca_ski = self.cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
        b = (x509.CertificateRevocationListBuilder()
             .issuer_name(self.cert.subject)
             .last_update(start).next_update(start + valid_for)
             .add_extension(x509.CRLNumber(number), critical=False)
             .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(
                 ca_ski), critical=False))
        for serial, when in sorted(revoked.items()):
            b = b.add_revoked_certificate(
                x509.RevokedCertificateBuilder().serial_number(serial).revocation_date(when)
                .build())
        return b.sign(self.key, hashes.SHA256())


def issued_by(cert: x509.Certificate, issuer: x509.Certificate) -> bool:
    """Whether ``issuer`` signed ``cert`` (a signature and name check, no policy)."""
    try:
        cert.verify_directly_issued_by(issuer)
        return True
    except Exception:  # noqa: BLE001 - InvalidSignature, ValueError, TypeError all mean "no"
        return False
