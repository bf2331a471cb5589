"""A node's (or person's) identity: its private key, its certificate chain and the CA bundle.

The private key is made where it is used and never leaves that machine: enrollment sends a CSR,
not a key.  Access roles travel inside the certificate in a small extension of ours, so a
verifier reads them from the same signed object it already checked.
"""

from __future__ import annotations

import datetime as dt
import os
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from certs.names import cert_host_names, to_names
from certs.spiffe import SpiffeId

ROLES_OID = x509.ObjectIdentifier("1.3.6.1.4.1.58986.7946.1")
MESH_OID = x509.ObjectIdentifier("1.3.6.1.4.1.58986.7946.2")
"""The mesh (cluster) id a certificate belongs to: minted by ``meshctl ca init`` (or a dev
CA), stamped on every certificate that CA signs, so two meshes whose CAs share a root, or
that share a trust domain, still tell each other's nodes apart."""
"""``meshdAccessRoles``: a DER SEQUENCE OF UTF8String naming the holder's access roles
(``admin``, ``operator``, ``viewer``, ``node``).  Non-critical, so other TLS stacks ignore it."""

CLOCK_SKEW = dt.timedelta(minutes=5)
"""Leaves are valid from five minutes before issue, so a peer whose clock lags a little does not
refuse a certificate that was just made."""
KEY_FILE, CERT_FILE, BUNDLE_FILE = "key.pem", "cert.pem", "bundle.pem"
NEXT_KEY_FILE = "key.next.pem"
"""Where :meth:`Identity.save` stages a new key until the certificate for it is in place."""
LOAD_ATTEMPTS = 3
"""Reads of a directory that :meth:`Identity.load` makes before it calls a key and certificate
that do not match an error.  One read is enough against one save running meanwhile; a read
that spans two saves (back to back) is the case the others are for."""
RENEW_AT = 2 / 3
"""Renew once two thirds of a certificate's lifetime has passed (8 h left of a 24 h one), so a
CA holder that is down for hours does not let identities lapse."""


class IdentityError(ValueError):
    """Identity files that are missing, unreadable or do not belong together."""


def _der_len(n: int) -> bytes:
    if n < 0x80:
        return bytes([n])
    body = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return bytes([0x80 | len(body)]) + body


def encode_roles(roles: list[str] | tuple[str, ...]) -> bytes:
    """DER ``SEQUENCE OF UTF8String``."""
    items = b"".join(b"\x0c" + _der_len(len(r.encode())) + r.encode() for r in roles)
    return b"\x30" + _der_len(len(items)) + items


def _der_read(data: bytes, pos: int) -> tuple[int, int, int]:
    """(tag, start of value, end of value) of the TLV at ``pos``."""
    if pos + 2 > len(data):
        raise ValueError("truncated")
    tag, first = data[pos], data[pos + 1]
    pos += 2
    if first < 0x80:
        length = first
    else:
        n = first & 0x7F
        if n == 0 or n > 4 or pos + n > len(data):
            raise ValueError("bad length")
        length = int.from_bytes(data[pos:pos + n], "big")
        pos += n
    if pos + length > len(data):
        raise ValueError("truncated")
    return tag, pos, pos + length


def decode_roles(value: bytes) -> tuple[str, ...]:
    """Inverse of :func:`encode_roles`; ValueError on anything else."""
    tag, start, end = _der_read(value, 0)
    if tag != 0x30 or end != len(value):
        raise ValueError("roles extension is not a SEQUENCE")
    roles: list[str] = []
    pos = start
    while pos < end:
        tag, s, e = _der_read(value, pos)
        if tag != 0x0C:
            raise ValueError("roles extension holds a non-UTF8String")
        roles.append(value[s:e].decode("utf-8"))
        pos = e
    return tuple(roles)


def mesh_of(cert: x509.Certificate) -> str:
    """The mesh id ``cert`` names ("" for a certificate from a CA that predates mesh ids)."""
    try:
        ext = cert.extensions.get_extension_for_oid(MESH_OID)
    except x509.ExtensionNotFound:
        return ""
    value = ext.value
    raw = value.value if isinstance(value, x509.UnrecognizedExtension) else b""
    try:
        return raw.decode("ascii")
    except UnicodeDecodeError:
        return ""


def roles_of(cert: x509.Certificate) -> tuple[str, ...]:
    try:
        ext = cert.extensions.get_extension_for_oid(ROLES_OID)
    except x509.ExtensionNotFound:
        return ()
    assert isinstance(ext.value, x509.UnrecognizedExtension)
    return decode_roles(ext.value.value)


def spiffe_id_of(cert: x509.Certificate) -> SpiffeId:
    """The single SPIFFE URI SAN (SpiffeError/ValueError when absent, repeated or malformed)."""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        raise ValueError("certificate has no subject alternative name") from None
    uris = san.get_values_for_type(x509.UniformResourceIdentifier)
    if len(uris) != 1:
        raise ValueError(f"certificate has {len(uris)} URI SANs; a SPIFFE identity needs one")
    return SpiffeId.parse(uris[0])


def new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def make_csr(key: ec.EllipticCurvePrivateKey, sid: SpiffeId,
             names: Sequence[str | x509.GeneralName] = ()) -> x509.CertificateSigningRequest:
    """A CSR naming the identity it asks for and, for a node, the host names and IP addresses
    clients may dial it by (:func:`certs.names.to_names`); the CA decides the roles and the
    lifetime, and checks the names."""
    san: list[x509.GeneralName] = [x509.UniformResourceIdentifier(str(sid))]
    san += to_names(names)
    return (x509.CertificateSigningRequestBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, sid.name)]))
            .add_extension(x509.SubjectAlternativeName(san), critical=False)
            .sign(key, hashes.SHA256()))


def pem_certs(certs: list[x509.Certificate]) -> bytes:
    return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certs)


def load_pem_certs(data: bytes, what: str) -> list[x509.Certificate]:
    try:
        certs = x509.load_pem_x509_certificates(data)
    except ValueError as exc:
        raise IdentityError(f"{what}: not PEM certificates ({exc})") from None
    return certs


def key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                             serialization.NoEncryption())


def write_private(path: Path, data: bytes) -> None:
    """Write a secret file readable by its owner only, atomically."""
    _write_atomic(path, data, 0o600)


def write_public(path: Path, data: bytes) -> None:
    _write_atomic(path, data, 0o644)


def _read_if_there(path: Path) -> bytes | None:
    """A file's bytes, or None when it does not exist (a staged key comes and goes)."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise IdentityError(f"cannot read {path}: {exc.strerror}") from None


def _write_atomic(path: Path, data: bytes, mode: int) -> None:
    """Whole old contents or whole new ones, also after a power cut: the data reaches the disk
    before the rename that makes it the file."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


@dataclass(frozen=True, slots=True)
class Identity:
    """Key, leaf + intermediates (leaf first) and the trusted roots."""

    key: ec.EllipticCurvePrivateKey
    chain: tuple[x509.Certificate, ...]
    bundle: tuple[x509.Certificate, ...]

    @property
    def cert(self) -> x509.Certificate:
        return self.chain[0]

    @property
    def spiffe_id(self) -> SpiffeId:
        return spiffe_id_of(self.cert)

    @property
    def roles(self) -> tuple[str, ...]:
        return roles_of(self.cert)

    @property
    def mesh(self) -> str:
        """The mesh id of this identity's certificate ("" when its CA predates mesh ids)."""
        return mesh_of(self.cert)

    @property
    def host_names(self) -> set[str]:
        """The DNS names and IP addresses the certificate carries besides its SPIFFE names."""
        return cert_host_names(self.cert, self.spiffe_id)

    @property
    def not_after(self) -> dt.datetime:
        return self.cert.not_valid_after_utc

    def renew_at(self) -> float:
        """Epoch seconds at which to renew (counted from issue, not the back-dated start)."""
        start = (self.cert.not_valid_before_utc + CLOCK_SKEW).timestamp()
        end = self.cert.not_valid_after_utc.timestamp()
        return start + max(0.0, end - start) * RENEW_AT

    def chain_pem(self) -> bytes:
        return pem_certs(list(self.chain))

    def bundle_pem(self) -> bytes:
        return pem_certs(list(self.bundle))

    def key_pem(self) -> bytes:
        return key_pem(self.key)

    def save(self, directory: Path) -> None:
        """``key.pem`` (0600), ``cert.pem`` (leaf then intermediates), ``bundle.pem``.

        A renewal replaces the key and the certificate, and no file system replaces two files
        at once.  So the new key is staged as ``key.next.pem`` and moved over ``key.pem`` only
        once ``cert.pem`` is the certificate for it.  At every moment one of the two key files
        matches ``cert.pem``: a process reading the directory meanwhile (the router worker) and
        a restart after a crash mid-save both find a whole identity.  The bundle goes first, so
        new roots are trusted before a certificate from them is shown.
        """
        directory.mkdir(parents=True, exist_ok=True)
        write_public(directory / BUNDLE_FILE, self.bundle_pem())
        write_private(directory / NEXT_KEY_FILE, self.key_pem())
        write_public(directory / CERT_FILE, self.chain_pem())
        os.replace(directory / NEXT_KEY_FILE, directory / KEY_FILE)

    @classmethod
    def load(cls, directory: Path) -> Identity:
        """The identity in ``directory``, with whichever key file matches ``cert.pem``."""
        for attempt in range(LOAD_ATTEMPTS):
            ident = cls._read(directory)
            if ident is not None:
                return ident
            if attempt + 1 < LOAD_ATTEMPTS:
                time.sleep(0.02)
        raise IdentityError(f"{directory}: {CERT_FILE} does not match {KEY_FILE}")

    @classmethod
    def _read(cls, directory: Path) -> Identity | None:
        """One read of the directory; None when no key file matches the certificate.

        The order is what makes one read enough against one save running meanwhile: key.pem
        before cert.pem (an old certificate then has its old key), then the staged key, then
        key.pem again (a new certificate has its key in one of the two, or in key.pem once the
        staged one is moved).  A read that spans two saves gets None and reads again.
        """
        key_path, staged = directory / KEY_FILE, directory / NEXT_KEY_FILE
        first = _read_if_there(key_path)
        try:
            chain = load_pem_certs((directory / CERT_FILE).read_bytes(), str(directory / CERT_FILE))
            bundle = load_pem_certs((directory / BUNDLE_FILE).read_bytes(),
                                    str(directory / BUNDLE_FILE))
        except OSError as exc:
            raise IdentityError(f"cannot read identity in {directory}: {exc.strerror}") from None
        if not chain or not bundle:
            raise IdentityError(f"{directory}: certificate chain or CA bundle is empty")

        def keys() -> Iterator[tuple[Path, bytes | None]]:  # read only when still needed
            yield key_path, first
            yield staged, _read_if_there(staged)
            yield key_path, _read_if_there(key_path)

        found = False
        for path, data in keys():
            if data is None:
                continue
            found = True
            try:
                key = serialization.load_pem_private_key(data, password=None)
            except (ValueError, TypeError) as exc:
                if path is staged:
                    continue  # a leftover of a save that never got to its certificate
                raise IdentityError(f"{path}: not a usable private key") from exc
            if not isinstance(key, ec.EllipticCurvePrivateKey):
                if path is staged:
                    continue
                raise IdentityError(f"{path}: expected an EC private key")
            if chain[0].public_key() != key.public_key():
                continue
            ident = cls(key, tuple(chain), tuple(bundle))
            try:
                ident.spiffe_id  # noqa: B018 - validates the SAN
            except ValueError as exc:
                raise IdentityError(f"{directory / CERT_FILE}: {exc}") from None
            return ident
        if not found:
            raise IdentityError(f"cannot read identity in {directory}: no {KEY_FILE}")
        return None

    @staticmethod
    def settle(directory: Path) -> None:
        """Finish or undo a :meth:`save` that a crash cut short, so that the files alone
        (which TLS contexts load) are a matching set again.  Only the directory's owner calls
        this, before it uses them."""
        staged = directory / NEXT_KEY_FILE
        if not staged.exists():
            return
        ident = Identity._read(directory) if (directory / CERT_FILE).exists() else None
        if ident is not None and ident.key_pem() == staged.read_bytes():
            os.replace(staged, directory / KEY_FILE)  # the certificate was in place: finish
        else:
            staged.unlink()  # the certificate never came: the old pair stands

    @staticmethod
    def exists(directory: Path) -> bool:
        return all((directory / f).exists() for f in (KEY_FILE, CERT_FILE, BUNDLE_FILE))
