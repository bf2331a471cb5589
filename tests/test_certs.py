"""The mesh PKI in ``certs/``: CA, SPIFFE leaves, peer verification, CSR checks, revocation
lists, join tokens and the sans-I/O enrollment Authority.

Everything here uses real keys and real signatures.  Several tests pin bugs these tests found
(forged revocation signers, overflowing token payloads, re-enrolling a revoked name, ...).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import datetime as dt
import ipaddress
import json
import os
import socket
import ssl
import stat
import threading
import time
from collections import Counter
from concurrent import futures
from dataclasses import dataclass
from pathlib import Path

import msgpack
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from certs import tls, tokens
from certs.ca import (
    DEFAULT_LEAF_LIFETIME,
    MAX_LEAF_LIFETIME,
    CaError,
    CertificateAuthority,
    CsrRejected,
    fingerprint,
)
from certs.enroll import (
    MAX_MESSAGE,
    REFUSAL_REASONS,
    Authority,
    EnrollError,
    check_hello,
    pack,
    unpack,
)
from certs.identity import (
    CLOCK_SKEW,
    ROLES_OID,
    Identity,
    IdentityError,
    decode_roles,
    encode_roles,
    make_csr,
    new_key,
    roles_of,
    spiffe_id_of,
)
from certs.names import MAX_NAMES, cert_host_names, host_names
from certs.revocation import MAX_BLOB, RevocationError, Revocations, issued_at, sign_list
from certs.spiffe import SpiffeError, SpiffeId
from certs.tokens import TokenError, TokenLedger
from certs.verify import REJECT_REASONS, Peer, PeerRejected, PeerVerifier
from meshd.security import plane as security_mod
from meshd.security.plane import Security, SecurityError
from meshd.settings import Settings

TD = "mesh.test"
OTHER_TD = "other.test"
KEYS = [b"k" * 32]
DER = serialization.Encoding.DER

# --- helpers --------------------------------------------------------------------------------


def der(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(DER)


def node(name: str, td: str = TD) -> SpiffeId:
    return SpiffeId.node(td, name)


def utc(ts: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(ts, dt.UTC)


def csr_der(sid: SpiffeId, key: ec.EllipticCurvePrivateKey | None = None) -> bytes:
    return make_csr(key or new_key(), sid).public_bytes(DER)


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def make_intermediate(root: CertificateAuthority, *, name: str = "meshd intermediate",
                      parent_key: ec.EllipticCurvePrivateKey | None = None,
                      parent_cert: x509.Certificate | None = None
                      ) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """An intermediate CA certificate (CA:TRUE, keyCertSign) signed by ``parent`` (or root)."""
    pkey = parent_key or root.key
    pcert = parent_cert or root.cert
    key = new_key()
    start = dt.datetime.now(dt.UTC) - dt.timedelta(hours=1)
    pski = pcert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)]))
            .issuer_name(pcert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(start).not_valid_after(start + dt.timedelta(days=365))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(
                digital_signature=True, content_commitment=False, key_encipherment=False,
                data_encipherment=False, key_agreement=False, key_cert_sign=True,
                crl_sign=True, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                           critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(pski),
                           critical=False)
            .sign(pkey, hashes.SHA256()))
    return key, cert


def make_leaf(ca: CertificateAuthority, san: list[x509.GeneralName] | None,
              roles_value: bytes | None = None) -> x509.Certificate:
    """A leaf signed by ``ca`` with a hand-made SAN (None: no SAN) and roles extension."""
    key = new_key()
    start = dt.datetime.now(dt.UTC) - dt.timedelta(minutes=5)
    ca_ski = ca.cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    b = (x509.CertificateBuilder()
         .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "hand-made")]))
         .issuer_name(ca.cert.subject)
         .public_key(key.public_key())
         .serial_number(x509.random_serial_number())
         .not_valid_before(start).not_valid_after(start + dt.timedelta(hours=1))
         .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
         .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH,
                                               ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
         .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                        critical=False)
         .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ca_ski),
                        critical=False))
    if san is not None:
        b = b.add_extension(x509.SubjectAlternativeName(san), critical=False)
    if roles_value is not None:
        b = b.add_extension(x509.UnrecognizedExtension(ROLES_OID, roles_value), critical=False)
    return b.sign(ca.key, hashes.SHA256())


def csr_with_san(key: object, san: list[x509.GeneralName] | None
                 ) -> x509.CertificateSigningRequest:
    b = x509.CertificateSigningRequestBuilder().subject_name(
        x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "x")]))
    if san is not None:
        b = b.add_extension(x509.SubjectAlternativeName(san), critical=False)
    return b.sign(key, hashes.SHA256())  # type: ignore[arg-type]


def assert_refused(verifier: PeerVerifier, leaf: bytes | None, reason: str,
                   intermediates: list[bytes] | None = None,
                   now: dt.datetime | None = None) -> PeerRejected:
    before = Counter(verifier.rejected)
    with pytest.raises(PeerRejected) as info:
        verifier.verify_der(leaf, intermediates, now=now)
    assert info.value.reason == reason
    assert reason in REJECT_REASONS
    expected = before + Counter({reason: 1})
    assert verifier.rejected == expected
    return info.value


# --- fixtures ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ca() -> CertificateAuthority:
    return CertificateAuthority.create(TD)


@pytest.fixture(scope="module")
def other_ca() -> CertificateAuthority:
    """Another CA of the same trust domain: a different mesh."""
    return CertificateAuthority.create(TD)


@pytest.fixture(scope="module")
def foreign_ca() -> CertificateAuthority:
    return CertificateAuthority.create(OTHER_TD)


@pytest.fixture(scope="module")
def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture(scope="module")
def intermediate(ca: CertificateAuthority) -> CertificateAuthority:
    key, cert = make_intermediate(ca)
    return CertificateAuthority.from_parts(TD, key, cert, [], [ca.cert])


@pytest.fixture(scope="module")
def seed(ca: CertificateAuthority) -> Identity:
    return ca.mint(node("seed"), ["node"])


# --- CA -------------------------------------------------------------------------------------


def test_create_makes_a_self_signed_p256_root(ca: CertificateAuthority) -> None:
    assert isinstance(ca.key.curve, ec.SECP256R1)
    assert ca.cert.subject == ca.cert.issuer
    ca.cert.verify_directly_issued_by(ca.cert)
    assert ca.cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert ca.cert.extensions.get_extension_for_class(x509.KeyUsage).value.key_cert_sign
    assert ca.chain == () and ca.bundle == (ca.cert,) and ca.root == ca.cert
    assert ca.fingerprint() == fingerprint(ca.cert) == tokens.der_fingerprint(der(ca.cert))
    assert ca.cert.public_key() == ca.key.public_key()


def test_create_rejects_bad_trust_domain() -> None:
    with pytest.raises(SpiffeError):
        CertificateAuthority.create("Bad_Domain")


def test_ca_save_load_round_trip(tmp_path: Path, ca: CertificateAuthority) -> None:
    d = tmp_path / "ca"
    ca.save(d)
    assert CertificateAuthority.exists(d)
    assert stat.S_IMODE(os.stat(d / "ca.key").st_mode) == 0o600
    assert not (d / "chain.pem").exists()
    loaded = CertificateAuthority.load(d)
    assert loaded.trust_domain == TD
    assert loaded.cert == ca.cert and loaded.bundle == ca.bundle and loaded.chain == ()
    assert loaded.key.private_numbers() == ca.key.private_numbers()
    # the loaded CA is the same CA: tokens made by one check with the other
    token, claims = tokens.create(ca, uses=1, ttl=60, now=1000.0)
    assert tokens.check(loaded, token, 1001.0) == claims


def test_ca_load_refuses_missing_or_incomplete_directory(tmp_path: Path,
                                                          ca: CertificateAuthority) -> None:
    with pytest.raises(CaError, match="cannot read"):
        CertificateAuthority.load(tmp_path / "nothing")
    d = tmp_path / "ca"
    ca.save(d)
    (d / "ca.json").write_text(json.dumps({"other": 1}))
    with pytest.raises(CaError, match="trust_domain"):
        CertificateAuthority.load(d)
    ca.save(d)
    (d / "ca.pem").write_bytes(b"not pem")
    with pytest.raises(CaError):
        CertificateAuthority.load(d)


def test_ca_load_encrypted_key_is_a_ca_error(tmp_path: Path, ca: CertificateAuthority) -> None:
    d = tmp_path / "ca"
    ca.save(d)
    (d / "ca.key").write_bytes(ca.key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"secret")))
    with pytest.raises(CaError):
        CertificateAuthority.load(d)


def test_intermediate_ca_issues_leaves_that_verify_against_the_root(
        ca: CertificateAuthority, intermediate: CertificateAuthority) -> None:
    assert intermediate.root == ca.cert
    assert intermediate.fingerprint() == ca.fingerprint()
    ident = intermediate.mint(node("via-inter"), ["node"])
    assert ident.chain == (ident.cert, intermediate.cert)
    assert ident.bundle == (ca.cert,)
    verifier = PeerVerifier([ca.cert], TD, intermediates=[intermediate.cert])
    peer = verifier.verify_der(der(ident.cert))
    assert peer.spiffe_id == node("via-inter") and peer.roles == frozenset({"node"})
    # intermediates sent by the peer work as well
    assert PeerVerifier([ca.cert], TD).verify_der(
        der(ident.cert), [der(intermediate.cert)]).name == "via-inter"
    # without the intermediate the leaf does not chain to the root
    assert_refused(PeerVerifier([ca.cert], TD), der(ident.cert), "untrusted")


def test_intermediate_ca_save_load_round_trip(tmp_path: Path, ca: CertificateAuthority,
                                              intermediate: CertificateAuthority) -> None:
    intermediate.save(tmp_path)
    loaded = CertificateAuthority.load(tmp_path)
    assert loaded.cert == intermediate.cert and loaded.bundle == (ca.cert,)
    assert stat.S_IMODE(os.stat(tmp_path / "ca.key").st_mode) == 0o600


def test_two_level_intermediate_chain(tmp_path: Path, ca: CertificateAuthority) -> None:
    k1, c1 = make_intermediate(ca, name="inter one")
    k2, c2 = make_intermediate(ca, name="inter two", parent_key=k1, parent_cert=c1)
    inter = CertificateAuthority.from_parts(TD, k2, c2, [c1], [ca.cert])
    ident = inter.mint(node("deep"), ["node"])
    assert ident.chain == (ident.cert, c2, c1)
    verifier = PeerVerifier([ca.cert], TD, intermediates=[c2, c1])
    assert verifier.verify_der(der(ident.cert)).name == "deep"
    with pytest.raises(CaError, match="chain"):
        CertificateAuthority.from_parts(TD, k2, c2, [ca.cert], [ca.cert])
    inter.save(tmp_path)
    assert (tmp_path / "chain.pem").exists()
    assert CertificateAuthority.load(tmp_path).chain == (c1,)


def test_from_parts_rejects_unusable_parts(ca: CertificateAuthority,
                                           other_ca: CertificateAuthority,
                                           rsa_key: rsa.RSAPrivateKey) -> None:
    key, cert = make_intermediate(ca)
    with pytest.raises(CaError, match="does not match"):
        CertificateAuthority.from_parts(TD, new_key(), cert, [], [ca.cert])
    leaf = ca.mint(node("not-a-ca"), ["node"])
    with pytest.raises(CaError, match="not a CA"):
        CertificateAuthority.from_parts(TD, leaf.key, leaf.cert, [], [ca.cert])
    with pytest.raises(CaError, match="no root"):
        CertificateAuthority.from_parts(TD, key, cert, [], [other_ca.cert])
    with pytest.raises(CaError, match="empty"):
        CertificateAuthority.from_parts(TD, key, cert, [], [])
    with pytest.raises(CaError, match="EC"):
        CertificateAuthority.from_parts(TD, rsa_key, cert, [], [ca.cert])
    with pytest.raises(SpiffeError):
        CertificateAuthority.from_parts("Not A Domain", key, cert, [], [ca.cert])
    # and the good combination is accepted
    assert CertificateAuthority.from_parts(TD, key, cert, [], [ca.cert]).cert == cert


# --- leaf contents ----------------------------------------------------------------------------


def test_leaf_carries_spiffe_id_dns_names_roles_and_eku(ca: CertificateAuthority) -> None:
    ident = ca.mint(node("Web-1"), ["node", "admin"])
    cert = ident.cert
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.UniformResourceIdentifier) == [
        "spiffe://mesh.test/node/Web-1"]
    assert san.get_values_for_type(x509.DNSName) == ["web-1.node.mesh.test", "node.mesh.test"]
    assert spiffe_id_of(cert) == node("Web-1") == ident.spiffe_id
    assert roles_of(cert) == ("node", "admin") == ident.roles
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(eku) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    assert cert.issuer == ca.cert.subject
    cert.verify_directly_issued_by(ca.cert)
    assert cert.public_key() == ident.key.public_key()


def test_user_identity_has_no_any_node_dns_name(ca: CertificateAuthority) -> None:
    ident = ca.mint(SpiffeId(TD, "user", "alice"), ["viewer"])
    san = ident.cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["alice.user.mesh.test"]


def test_leaf_lifetime_defaults_to_24h(ca: CertificateAuthority) -> None:
    now = float(int(time.time()))
    ident = ca.mint(node("life"), ["node"], now=now)
    cert = ident.cert
    assert DEFAULT_LEAF_LIFETIME == dt.timedelta(hours=24)
    assert cert.not_valid_before_utc == utc(now) - CLOCK_SKEW
    assert cert.not_valid_after_utc == utc(now) + dt.timedelta(hours=24)
    assert issued_at(cert) == now
    assert ident.renew_at() == now + 16 * 3600
    csr = make_csr(new_key(), node("life2"))
    issued = ca.issue(csr, ["node"], now=now)
    assert issued.not_valid_after_utc - issued.not_valid_before_utc == (
        dt.timedelta(hours=24) + CLOCK_SKEW)


def test_leaf_lifetime_is_capped_by_ca_expiry() -> None:
    now = float(int(time.time()))
    short = CertificateAuthority.create(TD, lifetime=dt.timedelta(hours=2), now=now)
    cert = short.mint(node("capped"), ["node"], now=now).cert
    assert cert.not_valid_after_utc == short.cert.not_valid_after_utc
    assert cert.not_valid_after_utc < utc(now) + dt.timedelta(hours=3)


def test_sign_refuses_bad_lifetime_and_foreign_identity(ca: CertificateAuthority) -> None:
    pub = new_key().public_key()
    with pytest.raises(CaError):
        ca.sign(pub, node("x"), ["node"], lifetime=dt.timedelta(0))
    with pytest.raises(CaError):
        ca.sign(pub, node("x"), ["node"], lifetime=MAX_LEAF_LIFETIME + dt.timedelta(seconds=1))
    with pytest.raises(CaError):
        ca.sign(pub, node("x", OTHER_TD), ["node"])
    assert ca.sign(pub, node("x"), ["node"], lifetime=MAX_LEAF_LIFETIME).public_key() == pub


ROLE = st.text(st.characters(blacklist_categories=("Cs",)), max_size=200)


@settings(max_examples=200, deadline=None)
@given(roles=st.lists(ROLE, max_size=20))
def test_roles_encoding_round_trips(roles: list[str]) -> None:
    assert decode_roles(encode_roles(roles)) == tuple(roles)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(roles=st.lists(ROLE, max_size=6))
def test_roles_round_trip_through_a_signed_certificate(roles: list[str]) -> None:
    ca = _shared_ca()
    cert = ca.sign(new_key().public_key(), node("r"), roles)
    assert roles_of(cert) == tuple(roles)


_SHARED: dict[str, CertificateAuthority] = {}


def _shared_ca() -> CertificateAuthority:
    if "ca" not in _SHARED:
        _SHARED["ca"] = CertificateAuthority.create(TD)
    return _SHARED["ca"]


@settings(max_examples=300)
@given(data=st.binary(max_size=64))
def test_decode_roles_raises_only_value_error(data: bytes) -> None:
    try:
        roles = decode_roles(data)
    except ValueError:
        return
    assert encode_roles(roles) == data


# --- PeerVerifier -----------------------------------------------------------------------------


def test_verifier_accepts_a_good_leaf(ca: CertificateAuthority) -> None:
    ident = ca.mint(node("good"), ["node", "operator"])
    verifier = PeerVerifier([ca.cert], TD)
    peer = verifier.verify_der(der(ident.cert))
    assert peer == Peer(node("good"), frozenset({"node", "operator"}), ident.cert.serial_number,
                        ident.cert.not_valid_after_utc, issued_at(ident.cert))
    assert peer.name == "good"
    assert not verifier.rejected
    pem = ident.cert.public_bytes(serialization.Encoding.PEM)
    assert verifier.verify_pem(pem) == peer


def test_verifier_refusals_have_reasons_and_are_counted(
        ca: CertificateAuthority, other_ca: CertificateAuthority,
        foreign_ca: CertificateAuthority) -> None:
    verifier = PeerVerifier([ca.cert, foreign_ca.cert], TD)
    now = time.time()
    assert_refused(verifier, None, "no_certificate")
    assert_refused(verifier, b"", "no_certificate")
    assert_refused(verifier, b"\x30\x03\x02\x01\x01", "malformed")
    assert_refused(verifier, b"garbage" * 10, "malformed")
    good = der(ca.mint(node("ok"), ["node"]).cert)
    assert_refused(verifier, good, "malformed", intermediates=[b"junk"])
    assert_refused(verifier, der(other_ca.mint(node("stranger"), ["node"]).cert), "untrusted")
    old = ca.mint(node("old"), ["node"], now=now - 2 * 86400).cert
    assert_refused(verifier, der(old), "expired")
    fresh = ca.mint(node("fresh"), ["node"], now=now).cert
    assert_refused(verifier, der(fresh), "expired",
                   now=fresh.not_valid_after_utc + dt.timedelta(seconds=1))
    future = ca.mint(node("future"), ["node"], now=now + 3600).cert
    assert_refused(verifier, der(future), "not_yet_valid")
    assert_refused(verifier, der(foreign_ca.mint(node("alien", OTHER_TD), ["node"]).cert),
                   "wrong_trust_domain")
    no_san = make_leaf(ca, None)
    assert_refused(verifier, der(no_san), "bad_identity")
    dns_only = make_leaf(ca, [x509.DNSName("ok.node.mesh.test")])
    assert_refused(verifier, der(dns_only), "bad_identity")
    two = make_leaf(ca, [x509.UniformResourceIdentifier("spiffe://mesh.test/node/a"),
                         x509.UniformResourceIdentifier("spiffe://mesh.test/node/b")])
    assert_refused(verifier, der(two), "bad_identity")
    bad_roles = make_leaf(ca, [x509.UniformResourceIdentifier("spiffe://mesh.test/node/r")],
                          roles_value=b"\x30\x05\x02\x01\x01")
    assert_refused(verifier, der(bad_roles), "bad_identity")
    revoked = ca.mint(node("revoked"), ["node"], now=now - 60).cert
    verifier.revocations.revoke(node("revoked"), now - 30)
    assert_refused(verifier, der(revoked), "revoked")
    assert sum(verifier.rejected.values()) == 15
    assert verifier.verify_der(good).name == "ok"


def test_verify_pem_refusals(ca: CertificateAuthority, other_ca: CertificateAuthority) -> None:
    verifier = PeerVerifier([ca.cert], TD)
    with pytest.raises(PeerRejected) as info:
        verifier.verify_pem(None)
    assert info.value.reason == "no_certificate"
    with pytest.raises(PeerRejected) as info:
        verifier.verify_pem(b"-----BEGIN CERTIFICATE-----\nnope\n-----END CERTIFICATE-----\n")
    assert info.value.reason == "malformed"
    stranger = other_ca.mint(node("s"), ["node"]).cert.public_bytes(serialization.Encoding.PEM)
    with pytest.raises(PeerRejected) as info:
        verifier.verify_pem(stranger)
    assert info.value.reason == "untrusted"
    assert verifier.rejected == Counter({"no_certificate": 1, "malformed": 1, "untrusted": 1})


def test_cache_serves_repeat_but_later_revocation_still_refuses(
        ca: CertificateAuthority) -> None:
    now = time.time()
    ident = ca.mint(node("cached"), ["node"], now=now - 10)
    leaf = der(ident.cert)
    verifier = PeerVerifier([ca.cert], TD)
    first = verifier.verify_der(leaf)
    assert verifier.verify_der(leaf) is first  # the cached Peer object
    verifier.revocations.revoke(node("cached"), now)
    with pytest.raises(PeerRejected) as info:
        verifier.verify_der(leaf)
    assert info.value.reason == "revoked"
    assert verifier.rejected["revoked"] >= 1
    # PEM path, cached as well
    pem_verifier = PeerVerifier([ca.cert], TD)
    pem = ident.cert.public_bytes(serialization.Encoding.PEM)
    assert pem_verifier.verify_pem(pem) is pem_verifier.verify_pem(pem)
    pem_verifier.revocations.revoke(node("cached"), now)
    with pytest.raises(PeerRejected) as info:
        pem_verifier.verify_pem(pem)
    assert info.value.reason == "revoked"
    assert pem_verifier.rejected == Counter({"revoked": 1})


def test_cached_revocation_is_counted_once(ca: CertificateAuthority) -> None:
    now = time.time()
    leaf = der(ca.mint(node("count-once"), ["node"], now=now - 10).cert)
    verifier = PeerVerifier([ca.cert], TD)
    verifier.verify_der(leaf)
    verifier.revocations.revoke(node("count-once"), now)
    assert_refused(verifier, leaf, "revoked")


def test_cache_does_not_outlive_expiry_or_bundle_change(
        ca: CertificateAuthority, other_ca: CertificateAuthority) -> None:
    cert = ca.mint(node("short"), ["node"]).cert
    verifier = PeerVerifier([ca.cert], TD)
    verifier.verify_der(der(cert))
    assert_refused(verifier, der(cert), "expired",
                   now=cert.not_valid_after_utc + dt.timedelta(seconds=1))
    verifier.set_bundle([other_ca.cert])
    assert_refused(verifier, der(cert), "untrusted")


# --- CSR checks -------------------------------------------------------------------------------


def _tampered_name(ca: CertificateAuthority) -> x509.CertificateSigningRequest:
    data = csr_der(node("tamperme"))
    bad = data.replace(b"tamperme", b"tamperm3", 1)
    assert bad != data
    return x509.load_der_x509_csr(bad)


def _swapped_key(ca: CertificateAuthority) -> x509.CertificateSigningRequest:
    """Signed by one key, then the public key in the request replaced with another's."""
    key, other = new_key(), new_key()
    spki = key.public_key().public_bytes(DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    spki2 = other.public_key().public_bytes(DER,
                                            serialization.PublicFormat.SubjectPublicKeyInfo)
    data = csr_der(node("swapped"), key)
    assert data.count(spki) == 1 and len(spki) == len(spki2)
    return x509.load_der_x509_csr(data.replace(spki, spki2))


@pytest.mark.parametrize("make", [_tampered_name, _swapped_key])
def test_tampered_csr_is_refused(ca: CertificateAuthority, make: object) -> None:
    csr = make(ca)  # type: ignore[operator]
    assert csr.is_signature_valid is False
    assert spiffe_id_of_csr(csr).trust_domain == TD  # still parses; only the signature is off
    with pytest.raises(CsrRejected) as info:
        ca.issue(csr, ["node"])
    assert info.value.reason == "bad_signature"


def spiffe_id_of_csr(csr: x509.CertificateSigningRequest) -> SpiffeId:
    san = csr.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return SpiffeId.parse(san.get_values_for_type(x509.UniformResourceIdentifier)[0])


def test_csr_checks(ca: CertificateAuthority, rsa_key: rsa.RSAPrivateKey) -> None:
    def reason(csr: x509.CertificateSigningRequest, expect: SpiffeId | None = None) -> str:
        with pytest.raises(CsrRejected) as info:
            ca.check_csr(csr, expect)
        return info.value.reason

    good = make_csr(new_key(), node("good"))
    assert ca.check_csr(good) == node("good")
    assert ca.check_csr(good, expect=node("good")) == node("good")
    assert reason(good, expect=node("other")) == "wrong_identity"
    assert reason(make_csr(new_key(), node("x", OTHER_TD))) == "wrong_trust_domain"
    two = csr_with_san(new_key(), [x509.UniformResourceIdentifier("spiffe://mesh.test/node/a"),
                                   x509.UniformResourceIdentifier("spiffe://mesh.test/node/b")])
    assert reason(two) == "bad_identity"
    assert reason(csr_with_san(new_key(), None)) == "bad_identity"
    assert reason(csr_with_san(new_key(), [x509.DNSName("a.node.mesh.test")])) == "bad_identity"
    assert reason(csr_with_san(
        new_key(), [x509.UniformResourceIdentifier("https://mesh.test/node/a")])) == "bad_identity"
    assert reason(csr_with_san(
        new_key(), [x509.UniformResourceIdentifier("spiffe://mesh.test/robot/a")])
    ) == "bad_identity"
    rsa_csr = csr_with_san(rsa_key, [x509.UniformResourceIdentifier(str(node("rsa")))])
    assert rsa_csr.is_signature_valid
    assert reason(rsa_csr) == "bad_key"
    p521 = make_csr(ec.generate_private_key(ec.SECP521R1()), node("p521"))
    assert reason(p521) == "bad_key"
    p384_key = ec.generate_private_key(ec.SECP384R1())
    cert = ca.issue(make_csr(p384_key, node("p384")), ["node"])
    assert cert.public_key() == p384_key.public_key()
    with pytest.raises(CsrRejected) as info:
        ca.issue(good, ["node"], expect=node("bad"))
    assert info.value.reason == "wrong_identity"


# --- revocation lists -------------------------------------------------------------------------


def test_signed_list_round_trip(ca: CertificateAuthority) -> None:
    entries = {str(node("a")): 100.0, str(node("b")): 200.5}
    blob = sign_list(ca, entries, now=300.0)
    revs = Revocations([ca.cert], TD)
    assert revs.open(blob) == entries
    assert revs.update(blob) is True
    assert revs.cutoffs == entries and revs.version == 1
    assert revs.update(blob) is False and revs.version == 1
    assert revs.is_revoked(node("a"), 100.0) and revs.is_revoked(str(node("a")), 50.0)
    assert not revs.is_revoked(node("a"), 100.5)
    assert not revs.is_revoked(node("c"), 0.0)


def test_signed_list_from_an_intermediate(ca: CertificateAuthority,
                                          intermediate: CertificateAuthority,
                                          other_ca: CertificateAuthority) -> None:
    blob = sign_list(intermediate, {str(node("x")): 5.0}, now=6.0)
    body, sig, signers = msgpack.unpackb(blob)
    assert signers == [der(intermediate.cert)]
    assert Revocations([ca.cert], TD).open(blob) == {str(node("x")): 5.0}
    with pytest.raises(RevocationError, match="not signed by a mesh CA"):
        Revocations([other_ca.cert], TD).open(blob)
    broken = msgpack.packb([body, sig, [der(intermediate.cert), der(other_ca.cert)]])
    with pytest.raises(RevocationError, match="broken"):
        Revocations([ca.cert], TD).open(broken)
    wrong_signer = msgpack.packb([body, sig, [der(other_ca.cert)]])
    with pytest.raises(RevocationError, match="does not verify"):
        Revocations([ca.cert], TD).open(wrong_signer)


def test_list_signed_by_another_ca_is_refused(ca: CertificateAuthority,
                                              other_ca: CertificateAuthority) -> None:
    revs = Revocations([ca.cert], TD)
    with pytest.raises(RevocationError):
        revs.update(sign_list(other_ca, {str(node("victim")): 1.0}, now=2.0))
    assert revs.cutoffs == {} and revs.version == 0


def test_tampered_list_is_refused(ca: CertificateAuthority) -> None:
    blob = sign_list(ca, {str(node("a")): 1.0}, now=2.0)
    body, sig, signers = msgpack.unpackb(blob)
    doc = msgpack.unpackb(body)
    doc["e"].append([str(node("victim")), 1.0])
    revs = Revocations([ca.cert], TD)
    with pytest.raises(RevocationError):
        revs.update(msgpack.packb([msgpack.packb(doc), sig, signers]))
    bad_sig = bytearray(sig)
    bad_sig[-1] ^= 1
    with pytest.raises(RevocationError):
        revs.update(msgpack.packb([body, bytes(bad_sig), signers]))
    assert revs.cutoffs == {}
    assert revs.update(blob)  # the untouched list is fine


def test_list_for_another_trust_domain_is_refused(ca: CertificateAuthority,
                                                  foreign_ca: CertificateAuthority) -> None:
    with pytest.raises(RevocationError, match="trust domain"):
        Revocations([ca.cert], OTHER_TD).update(sign_list(ca, {str(node("a")): 1.0}, 2.0))
    foreign = sign_list(foreign_ca, {str(node("a")): 1.0}, 2.0)
    with pytest.raises(RevocationError, match="trust domain"):
        Revocations([ca.cert, foreign_ca.cert], TD).update(foreign)


def test_list_signed_by_a_node_leaf_is_refused(ca: CertificateAuthority) -> None:
    ident = ca.mint(node("mallory"), ["node"])
    as_ca = CertificateAuthority(TD, ident.key, ident.cert, (), (ca.cert,))  # not a real CA
    forged = sign_list(as_ca, {str(node("victim")): time.time() + 3600}, time.time())
    revs = Revocations([ca.cert], TD)
    with pytest.raises(RevocationError):
        revs.update(forged)


def test_merge_keeps_latest_cutoff(ca: CertificateAuthority) -> None:
    revs = Revocations([ca.cert], TD)
    sid = str(node("a"))
    assert revs.update(sign_list(ca, {sid: 100.0}, 1.0))
    assert not revs.update(sign_list(ca, {sid: 50.0}, 2.0))
    assert revs.cutoffs[sid] == 100.0 and revs.version == 1
    assert revs.update(sign_list(ca, {sid: 200.0, str(node("b")): 10.0}, 3.0))
    assert revs.cutoffs == {sid: 200.0, str(node("b")): 10.0} and revs.version == 2
    assert not revs.revoke(node("a"), 150.0)
    assert revs.revoke(node("a"), 250.0) and revs.cutoffs[sid] == 250.0


def test_certificates_issued_after_cutoff_are_not_revoked(ca: CertificateAuthority) -> None:
    now = float(int(time.time()))
    before = ca.mint(node("re"), ["node"], now=now - 60).cert
    at = ca.mint(node("re"), ["node"], now=now - 30).cert
    after = ca.mint(node("re"), ["node"], now=now).cert
    verifier = PeerVerifier([ca.cert], TD)
    verifier.revocations.update(sign_list(ca, {str(node("re")): now - 30}, now))
    assert_refused(verifier, der(before), "revoked")
    assert_refused(verifier, der(at), "revoked")
    assert verifier.verify_der(der(after)).issued_at == now


def test_revocations_persist_and_prune(tmp_path: Path, ca: CertificateAuthority) -> None:
    path = tmp_path / "revoked.json"
    revs = Revocations([ca.cert], TD, path)
    now = 10_000_000.0
    limit = (MAX_LEAF_LIFETIME + CLOCK_SKEW).total_seconds()
    assert revs.update(sign_list(ca, {str(node("old")): now - limit - 1,
                                      str(node("new")): now - 10}, now))
    again = Revocations([ca.cert], TD, path)
    assert again.cutoffs == revs.cutoffs
    again.prune(now)
    assert again.cutoffs == {str(node("new")): now - 10} and again.version == 1
    assert Revocations([ca.cert], TD, path).cutoffs == {str(node("new")): now - 10}
    again.prune(now)
    assert again.version == 1  # nothing pruned, nothing changed
    path.write_text("not json")
    assert Revocations([ca.cert], TD, path).cutoffs == {}


def test_corrupt_revocation_file_is_ignored(tmp_path: Path, ca: CertificateAuthority) -> None:
    path = tmp_path / "revoked.json"
    path.write_text(json.dumps({str(node("x")): None}))
    assert Revocations([ca.cert], TD, path).cutoffs == {}


def test_oversized_list_is_refused(ca: CertificateAuthority) -> None:
    with pytest.raises(RevocationError, match="limit"):
        Revocations([ca.cert], TD).open(b"\x00" * (MAX_BLOB + 1))


@settings(max_examples=300, deadline=None)
@given(blob=st.binary(max_size=512))
def test_open_arbitrary_bytes_raises_only_revocation_error(blob: bytes) -> None:
    revs = Revocations([_shared_ca().cert], TD)
    with pytest.raises(RevocationError):
        revs.open(blob)


MSGPACK_SCALARS = (st.none() | st.booleans() | st.integers(-(2 ** 63), 2 ** 64 - 1)
                   | st.floats() | st.text(max_size=20) | st.binary(max_size=20))
MSGPACK_VALUES = st.recursive(
    MSGPACK_SCALARS,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner,
                                                                max_size=4),
    max_leaves=10)


@settings(max_examples=200, deadline=None)
@given(entries=st.lists(st.tuples(st.text(max_size=40), MSGPACK_SCALARS), max_size=4),
       td=MSGPACK_SCALARS | st.just(TD), sig=MSGPACK_VALUES,
       signers=st.lists(st.binary(max_size=30), max_size=2) | MSGPACK_VALUES)
def test_open_structured_garbage_raises_only_revocation_error(
        entries: list[tuple[str, object]], td: object, sig: object, signers: object) -> None:
    """Well-formed msgpack shaped like a list."""
    body = msgpack.packb({"v": 1, "td": td, "at": 0, "e": entries})
    revs = Revocations([_shared_ca().cert], TD)
    with pytest.raises(RevocationError):
        revs.open(msgpack.packb([body, sig, signers]))


def test_open_non_string_identity_raises_revocation_error(ca: CertificateAuthority) -> None:
    body = msgpack.packb({"v": 1, "td": TD, "at": 0, "e": [[1, 2.0]]})
    with pytest.raises(RevocationError):
        Revocations([ca.cert], TD).open(msgpack.packb([body, b"", []]))


# --- join tokens ------------------------------------------------------------------------------


def _edit_payload(token: str, **changes: object) -> str:
    prefix, payload, mac = token.split(".")
    tid, expires, uses, fp = msgpack.unpackb(unb64(payload))
    fields = {"tid": tid, "expires": expires, "uses": uses, "fp": fp, **changes}
    new = b64(msgpack.packb([fields["tid"], fields["expires"], fields["uses"], fields["fp"]]))
    return f"{prefix}.{new}.{mac}"


def test_token_round_trip(ca: CertificateAuthority) -> None:
    token, claims = tokens.create(ca, uses=3, ttl=600, now=1000.0)
    assert token.startswith("mjt1.") and token.count(".") == 2
    assert len(token) <= tokens.MAX_TOKEN_CHARS
    assert claims.uses == 3 and claims.expires == 1600.0
    assert claims.ca_fingerprint == ca.fingerprint()
    assert tokens.read(token) == claims
    assert tokens.check(ca, token, 1599.0) == claims
    assert tokens.check(ca, f"  {token}\n", 1000.0) == claims
    other, other_claims = tokens.create(ca, uses=3, ttl=600, now=1000.0)
    assert other != token and other_claims.id != claims.id


def test_token_create_refuses_bad_arguments(ca: CertificateAuthority) -> None:
    for uses, ttl in ((0, 10), (tokens.MAX_USES + 1, 10), (1, 0), (1, tokens.MAX_TTL + 1)):
        with pytest.raises(ValueError):
            tokens.create(ca, uses=uses, ttl=ttl, now=0.0)


def _token_error(ca: CertificateAuthority, token: str, now: float) -> TokenError:
    with pytest.raises(TokenError) as info:
        tokens.check(ca, token, now)
    assert info.value.reason in tokens.REASONS
    assert token not in str(info.value)
    for part in token.split(".")[1:]:
        if len(part) >= 8:
            assert part not in str(info.value)
    return info.value


def test_token_refusals(ca: CertificateAuthority, other_ca: CertificateAuthority) -> None:
    token, claims = tokens.create(ca, uses=1, ttl=600, now=1000.0)
    foreign, _ = tokens.create(other_ca, uses=1, ttl=600, now=1000.0)
    assert _token_error(ca, foreign, 1000.0).reason == "wrong_mesh"
    # another CA's token claiming our fingerprint: its MAC is not ours
    pinned = _edit_payload(foreign, fp=bytes.fromhex(ca.fingerprint()))
    assert tokens.read(pinned).ca_fingerprint == ca.fingerprint()
    assert _token_error(ca, pinned, 1000.0).reason == "bad_mac"
    # our token with more uses or a later expiry written into it
    assert _token_error(ca, _edit_payload(token, uses=1000), 1000.0).reason == "bad_mac"
    assert _token_error(ca, _edit_payload(token, expires=10.0 ** 12), 1000.0).reason == "bad_mac"
    prefix, payload, mac = token.split(".")
    assert _token_error(ca, f"{prefix}.{payload}.{mac[:-2]}AA", 1000.0).reason == "bad_mac"
    assert _token_error(ca, f"{prefix}.{payload}", 1000.0).reason == "malformed"
    assert _token_error(ca, f"mjt2.{payload}.{mac}", 1000.0).reason == "malformed"
    assert _token_error(ca, f"{prefix}.{payload}.{mac}!", 1000.0).reason in (
        "malformed", "bad_mac")
    assert _token_error(ca, token, claims.expires).reason == "expired"
    assert _token_error(ca, token + "x" * 600, 1000.0).reason == "malformed"
    assert tokens.check(ca, token, claims.expires - 0.001) == claims


def test_ledger_counts_uses(ca: CertificateAuthority) -> None:
    _, single = tokens.create(ca, uses=1, ttl=600, now=1000.0)
    ledger = TokenLedger()
    assert ledger.consume(single) == 0
    with pytest.raises(TokenError) as info:
        ledger.consume(single)
    assert info.value.reason == "exhausted"
    _, three = tokens.create(ca, uses=3, ttl=600, now=1000.0)
    assert [ledger.consume(three) for _ in range(3)] == [2, 1, 0]
    with pytest.raises(TokenError):
        ledger.consume(three)
    assert ledger.used(three.id) == 3
    assert ledger.counts(1000.0) == {single.id: 1, three.id: 3}
    assert ledger.counts(1600.0) == {}


def test_ledger_remote_counts_count_toward_exhaustion(ca: CertificateAuthority) -> None:
    _, claims = tokens.create(ca, uses=3, ttl=600, now=1000.0)
    ledger = TokenLedger()
    ledger.learn("holder-b", {claims.id: 1})
    ledger.learn("holder-c", {claims.id: 1})
    assert ledger.used(claims.id) == 2
    assert ledger.consume(claims) == 0
    with pytest.raises(TokenError) as info:
        ledger.consume(claims)
    assert info.value.reason == "exhausted"
    ledger.learn("holder-b", {})  # replaced, not added to
    assert ledger.used(claims.id) == 2
    assert ledger.counts(1000.0) == {claims.id: 1}  # only local uses are gossiped


def test_ledger_persists_and_prunes(tmp_path: Path, ca: CertificateAuthority) -> None:
    path = tmp_path / "tokens.json"
    _, claims = tokens.create(ca, uses=2, ttl=600, now=1000.0)
    ledger = TokenLedger(path)
    ledger.consume(claims)
    again = TokenLedger(path)
    assert again.used(claims.id) == 1
    assert again.consume(claims) == 0
    with pytest.raises(TokenError):
        TokenLedger(path).consume(claims)
    again.prune(1600.0)
    assert TokenLedger(path).used(claims.id) == 0
    path.write_text("[1, 2]")
    assert TokenLedger(path).local == {}


def test_corrupt_ledger_file_is_ignored(tmp_path: Path) -> None:
    path = tmp_path / "tokens.json"
    path.write_text(json.dumps({"abc": {"a": 1}}))
    assert TokenLedger(path).local == {}


def _check_text(token: str) -> None:
    ca = _shared_ca()
    try:
        claims = tokens.read(token)
    except TokenError as exc:
        assert exc.reason == "malformed"
        if len(token.strip()) >= 20:
            assert token.strip() not in str(exc)
    else:
        assert len(claims.ca_fingerprint) == 64
    with pytest.raises(TokenError) as info:
        tokens.check(ca, token, 0.0)
    assert info.value.reason in tokens.REASONS
    if len(token.strip()) >= 20:
        assert token.strip() not in str(info.value)


@settings(max_examples=300, deadline=None)
@given(token=st.text(max_size=600)
       | st.builds(lambda a, b: f"mjt1.{a}.{b}", st.text(max_size=80), st.text(max_size=30)))
def test_arbitrary_text_raises_only_token_error(token: str) -> None:
    _check_text(token)


BOUNDED_SCALARS = (st.none() | st.booleans() | st.integers(-(2 ** 16), 2 ** 16)
                   | st.floats(allow_infinity=False) | st.text(max_size=12)
                   | st.binary(max_size=40))


@settings(max_examples=300, deadline=None)
@given(payload=st.lists(BOUNDED_SCALARS | st.lists(BOUNDED_SCALARS, max_size=40), max_size=5)
       | BOUNDED_SCALARS,
       mac=st.binary(max_size=20))
def test_structured_payload_raises_only_token_error(payload: object, mac: bytes) -> None:
    """Decodable payloads of every shape."""
    _check_text(f"mjt1.{b64(msgpack.packb(payload))}.{b64(mac)}")


@pytest.mark.parametrize("payload", [["id", 1.0, float("inf"), b"f" * 32],
                                     ["id", 1.0, 1, 2 ** 64 - 1]])
def test_overflowing_payload_is_a_token_error(payload: list[object]) -> None:
    with pytest.raises(TokenError):
        tokens.read(f"mjt1.{b64(msgpack.packb(payload))}.AAAA")


# --- enrollment Authority ---------------------------------------------------------------------


@dataclass
class Env:
    ca: CertificateAuthority
    seed: Identity
    authority: Authority
    verifier: PeerVerifier
    ledger: TokenLedger


def make_env(ca: CertificateAuthority, seed: Identity, *, holder: bool = True,
             lifetime_s: float = 24 * 3600.0) -> Env:
    verifier = PeerVerifier(list(ca.bundle), TD, intermediates=list(ca.chain) + (
        [ca.cert] if ca.cert not in ca.bundle else []))
    ledger = TokenLedger()
    authority = Authority(identity=lambda: seed, verifier=verifier,
                          ca=ca if holder else None, ledger=ledger,
                          gossip_keys=lambda: list(KEYS), ca_holders=lambda: ["10.0.0.9:7946"],
                          name_in_use=lambda n: n == "taken", lifetime_s=lifetime_s)
    return Env(ca, seed, authority, verifier, ledger)


@pytest.fixture
def env(ca: CertificateAuthority, seed: Identity) -> Env:
    return make_env(ca, seed)


def enroll_msg(token: str, name: str = "joiner", td: str = TD, kind: str = "node",
               key: ec.EllipticCurvePrivateKey | None = None) -> dict[str, object]:
    return {"op": "enroll", "token": token, "csr": csr_der(SpiffeId(td, kind, name), key)}


def refused(reply: dict[str, object], reason: str) -> None:
    assert reply["ok"] is False and reply["reason"] == reason, reply
    assert reason in REFUSAL_REASONS
    assert isinstance(reply["error"], str)


def test_hello_reply_passes_check_hello(env: Env, other_ca: CertificateAuthority) -> None:
    reply = unpack(pack(env.authority.handle({"op": "hello"}, None)))
    assert reply["ok"] is True and reply["ca_holders"] == []
    assert reply["chain"] == [der(env.seed.cert)] and reply["bundle"] == [der(env.ca.cert)]
    _, claims = tokens.create(env.ca, uses=1, ttl=60, now=time.time())
    seed_der = der(env.seed.cert)
    bundle, td = check_hello(reply, seed_der, claims.ca_fingerprint)
    assert bundle == [env.ca.cert] and td == TD
    with pytest.raises(EnrollError) as info:
        check_hello(reply, seed_der, other_ca.fingerprint())
    assert info.value.reason == "wrong_mesh"
    another = der(env.ca.mint(node("seed"), ["node"]).cert)
    for leaf in (another, None, b""):
        with pytest.raises(EnrollError) as info:
            check_hello(reply, leaf, claims.ca_fingerprint)
        assert info.value.reason == "wrong_mesh"
    for bad in ({}, {"chain": 5, "bundle": []}, {"chain": [b"x"], "bundle": []},
                {"chain": [seed_der], "bundle": "str"}):
        with pytest.raises(EnrollError) as info:
            check_hello(bad, seed_der, claims.ca_fingerprint)
        assert info.value.reason == "malformed"


def test_check_hello_refuses_a_seed_that_only_copies_the_root(
        ca: CertificateAuthority, other_ca: CertificateAuthority) -> None:
    """A man in the middle can send our (public) root, but not a leaf that chains to it."""
    impostor = other_ca.mint(node("seed"), ["node"])
    reply = {"ok": True, "chain": [der(impostor.cert)], "bundle": [der(ca.cert)],
             "ca_holders": []}
    with pytest.raises(EnrollError) as info:
        check_hello(reply, der(impostor.cert), ca.fingerprint())
    assert info.value.reason == "wrong_mesh"
    no_id = make_leaf(ca, [x509.DNSName("seed.node.mesh.test")])
    reply = {"chain": [der(no_id)], "bundle": [der(ca.cert)]}
    with pytest.raises(EnrollError) as info:
        check_hello(reply, der(no_id), ca.fingerprint())
    assert info.value.reason == "wrong_mesh"


def test_check_hello_with_an_intermediate_ca(ca: CertificateAuthority,
                                             intermediate: CertificateAuthority) -> None:
    seed = intermediate.mint(node("seed"), ["node"])
    env = make_env(intermediate, seed)
    reply = env.authority.handle({"op": "hello"}, None)
    assert reply["chain"] == [der(seed.cert), der(intermediate.cert)]
    bundle, td = check_hello(reply, der(seed.cert), ca.fingerprint())
    assert bundle == [ca.cert] and td == TD
    token, _ = tokens.create(intermediate, uses=1, ttl=60, now=time.time())
    granted = env.authority.handle(enroll_msg(token), None)
    assert granted["ok"] is True
    chain = granted["chain"]
    assert isinstance(chain, list) and chain[1] == der(intermediate.cert)
    assert PeerVerifier([ca.cert], TD).verify_der(chain[0], chain[1:]).name == "joiner"


def test_enroll_grants_a_node_certificate(env: Env) -> None:
    now = time.time()
    token, claims = tokens.create(env.ca, uses=1, ttl=600, now=now)
    key = new_key()
    reply = unpack(pack(env.authority.handle(enroll_msg(token, key=key), None, now)))
    assert reply["ok"] is True, reply
    assert reply["bundle"] == [der(env.ca.cert)] and reply["keys"] == KEYS
    chain = reply["chain"]
    assert isinstance(chain, list) and len(chain) == 1
    cert = x509.load_der_x509_certificate(chain[0])
    assert cert.public_key() == key.public_key()
    assert roles_of(cert) == ("node",)
    assert issued_at(cert) == pytest.approx(now, abs=1.0)
    assert cert.not_valid_after_utc - cert.not_valid_before_utc == (
        dt.timedelta(hours=24) + CLOCK_SKEW)
    peer = PeerVerifier([env.ca.cert], TD).verify_der(chain[0])
    assert peer.spiffe_id == node("joiner") and peer.roles == frozenset({"node"})
    assert env.authority.issued == 1 and env.ledger.used(claims.id) == 1
    assert not env.authority.refused
    # single use: a replay is refused
    refused(env.authority.handle(enroll_msg(token, name="joiner2"), None, now), "exhausted")
    assert env.authority.issued == 1 and env.authority.refused == Counter({"exhausted": 1})


def test_enroll_honours_lifetime(ca: CertificateAuthority, seed: Identity) -> None:
    env = make_env(ca, seed, lifetime_s=3600.0)
    now = float(int(time.time()))
    token, _ = tokens.create(ca, uses=1, ttl=600, now=now)
    chain = env.authority.handle(enroll_msg(token), None, now)["chain"]
    cert = x509.load_der_x509_certificate(chain[0])  # type: ignore[index]
    assert cert.not_valid_after_utc == utc(now + 3600)


def test_enroll_refusals_do_not_consume_the_token(env: Env,
                                                  other_ca: CertificateAuthority) -> None:
    now = time.time()
    token, claims = tokens.create(env.ca, uses=1, ttl=600, now=now)
    handle = env.authority.handle
    refused(handle(enroll_msg(token), None, claims.expires), "expired")
    refused(handle(enroll_msg(token), None, claims.expires + 100), "expired")
    foreign, _ = tokens.create(other_ca, uses=1, ttl=600, now=now)
    refused(handle(enroll_msg(foreign), None, now), "wrong_mesh")
    prefix, payload, mac = token.split(".")
    refused(handle(enroll_msg(f"{prefix}.{payload}.{mac[::-1]}"), None, now), "bad_mac")
    refused(handle(enroll_msg("not a token"), None, now), "malformed")
    tampered = csr_der(node("tamperme")).replace(b"tamperme", b"tamperm3", 1)
    refused(handle({"op": "enroll", "token": token, "csr": tampered}, None, now),
            "bad_signature")
    refused(handle(enroll_msg(token, name="taken"), None, now), "name_in_use")
    refused(handle(enroll_msg(token, kind="user"), None, now), "bad_identity")
    refused(handle(enroll_msg(token, td=OTHER_TD), None, now), "wrong_trust_domain")
    env.verifier.revocations.revoke(node("gone"), now + 60)
    refused(handle(enroll_msg(token, name="gone"), None, now), "revoked")
    assert env.ledger.used(claims.id) == 0 and env.authority.issued == 0
    assert env.authority.refused == Counter({
        "expired": 2, "wrong_mesh": 1, "bad_mac": 1, "malformed": 1, "bad_signature": 1,
        "name_in_use": 1, "bad_identity": 1, "wrong_trust_domain": 1, "revoked": 1})
    # the token still works for a good request
    assert handle(enroll_msg(token), None, now)["ok"] is True


def test_enroll_refuses_a_name_revoked_earlier(env: Env) -> None:
    now = time.time()
    token, _ = tokens.create(env.ca, uses=1, ttl=600, now=now)
    env.verifier.revocations.revoke(node("gone"), now - 60)
    refused(env.authority.handle(enroll_msg(token, name="gone"), None, now), "revoked")


def test_enroll_overflowing_token_is_refused(env: Env) -> None:
    evil = f"mjt1.{b64(msgpack.packb(['id', 1.0, float('inf'), b'f' * 32]))}.AAAA"
    refused(env.authority.handle({"op": "enroll", "token": evil, "csr": b""}, None), "malformed")


def test_enroll_with_an_expired_ca_is_refused_not_raised(seed: Identity) -> None:
    now = time.time()
    short = CertificateAuthority.create(TD, lifetime=dt.timedelta(hours=1), now=now)
    env = make_env(short, seed)
    later = now + 2 * 3600
    token, _ = tokens.create(short, uses=1, ttl=600, now=later)
    reply = env.authority.handle(enroll_msg(token), None, later)
    assert reply["ok"] is False


def test_malformed_messages_are_refused_without_raising(env: Env) -> None:
    now = time.time()
    token, claims = tokens.create(env.ca, uses=1, ttl=600, now=now)
    peer = env.verifier.verify_der(der(env.seed.cert))
    bad: list[tuple[dict[str, object], Peer | None]] = [
        ({}, None), ({"op": "bogus"}, None), ({"op": 5}, None), ({"op": None}, peer),
        ({"op": b"hello"}, None), ({"op": "enroll"}, None),
        ({"op": "enroll", "token": 5, "csr": csr_der(node("x"))}, None),
        ({"op": "enroll", "token": [token], "csr": csr_der(node("x"))}, None),
        ({"op": "enroll", "token": token}, None),
        ({"op": "enroll", "token": token, "csr": "not bytes"}, None),
        ({"op": "enroll", "token": token, "csr": b"not DER"}, None),
        ({"op": "enroll", "token": token, "csr": None}, None),
        ({"op": "renew"}, peer), ({"op": "renew", "csr": b"\x30\x00"}, peer),
        ({"op": "renew", "csr": 12}, peer),
    ]
    for msg, who in bad:
        reply = env.authority.handle(msg, who, now)
        assert {k: reply[k] for k in ("ok", "reason")} == {"ok": False, "reason": "malformed"}
    assert env.authority.refused == Counter({"malformed": len(bad)})
    assert env.ledger.used(claims.id) == 0 and env.authority.issued == 0


def test_non_holder_answers_hello_but_not_enroll(ca: CertificateAuthority,
                                                 seed: Identity) -> None:
    env = make_env(ca, seed, holder=False)
    now = time.time()
    hello = env.authority.handle({"op": "hello"}, None, now)
    assert hello["ok"] is True and hello["ca_holders"] == ["10.0.0.9:7946"]
    token, claims = tokens.create(ca, uses=1, ttl=600, now=now)
    reply = env.authority.handle(enroll_msg(token), None, now)
    refused(reply, "not_ca_holder")
    assert "10.0.0.9:7946" in str(reply["error"])
    peer = env.verifier.verify_der(der(seed.cert))
    refused(env.authority.handle({"op": "renew", "csr": csr_der(node("seed"))}, peer, now),
            "not_ca_holder")
    assert env.authority.refused == Counter({"not_ca_holder": 2})
    assert env.ledger.used(claims.id) == 0


def test_renew(env: Env) -> None:
    now = time.time()
    admin = env.ca.mint(node("ops-1"), ["node", "admin"])
    peer = env.verifier.verify_der(der(admin.cert))
    handle = env.authority.handle
    refused(handle({"op": "renew", "csr": csr_der(node("ops-1"))}, None, now),
            "not_authenticated")
    refused(handle({"op": "renew", "csr": csr_der(node("someone-else"))}, peer, now),
            "wrong_identity")
    tampered = csr_der(node("ops-1")).replace(b"ops-1", b"ops-2", 1)
    refused(handle({"op": "renew", "csr": tampered}, peer, now), "bad_signature")
    key = new_key()
    reply = handle({"op": "renew", "csr": csr_der(node("ops-1"), key)}, peer, now)
    assert reply["ok"] is True and reply["keys"] == KEYS
    cert = x509.load_der_x509_certificate(reply["chain"][0])  # type: ignore[index]
    assert cert.public_key() == key.public_key()
    assert roles_of(cert) == ("admin", "node")
    renewed = env.verifier.verify_der(der(cert))
    assert renewed.spiffe_id == node("ops-1") and renewed.roles == peer.roles
    assert renewed.serial != peer.serial
    assert env.authority.refused == Counter({"not_authenticated": 1, "wrong_identity": 1,
                                             "bad_signature": 1})
    assert env.authority.issued == 1


_AUTH_CACHE: dict[str, object] = {}


def _fuzz_env() -> tuple[Env, str, bytes, Peer]:
    if "env" not in _AUTH_CACHE:
        ca = _shared_ca()
        seed = ca.mint(node("seed"), ["node"])
        env = make_env(ca, seed)
        token, _ = tokens.create(ca, uses=tokens.MAX_USES, ttl=tokens.MAX_TTL,
                                 now=time.time())
        peer = env.verifier.verify_der(der(seed.cert))
        _AUTH_CACHE.update(env=env, token=token, csr=csr_der(node("fuzz")), peer=peer)
    return (_AUTH_CACHE["env"], _AUTH_CACHE["token"], _AUTH_CACHE["csr"],  # type: ignore[return-value]
            _AUTH_CACHE["peer"])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), with_peer=st.booleans())
def test_handle_never_raises(data: st.DataObject, with_peer: bool) -> None:
    env, token, good_csr, peer = _fuzz_env()
    op = data.draw(st.sampled_from(["hello", "enroll", "renew"]) | MSGPACK_SCALARS, label="op")
    msg: dict[str, object] = data.draw(st.dictionaries(st.text(max_size=6), MSGPACK_VALUES,
                                                       max_size=3), label="extra")
    if data.draw(st.booleans()):
        msg["op"] = op
    if data.draw(st.booleans()):
        msg["token"] = data.draw(st.sampled_from([token, token[:-3]]) | MSGPACK_VALUES)
    if data.draw(st.booleans()):
        msg["csr"] = data.draw(
            st.sampled_from([good_csr, good_csr[:-1], good_csr.replace(b"fuzz", b"fuzZ", 1)])
            | st.binary(max_size=64) | MSGPACK_VALUES)
    msg = unpack(pack(msg))  # what arrives over the wire
    reply = env.authority.handle(msg, peer if with_peer else None)
    assert isinstance(reply, dict) and isinstance(reply["ok"], bool)
    if not reply["ok"]:
        assert reply["reason"] in REFUSAL_REASONS
    else:
        assert msg.get("op") in ("hello", "enroll", "renew")


# --- wire format ------------------------------------------------------------------------------


@settings(max_examples=400)
@given(data=st.binary(max_size=256))
def test_unpack_arbitrary_bytes_raises_only_enroll_error(data: bytes) -> None:
    try:
        msg = unpack(data)
    except EnrollError as exc:
        assert exc.reason == "malformed"
    else:
        assert isinstance(msg, dict)


def test_unpack_limits_and_types() -> None:
    assert unpack(pack({"op": "hello", "x": [1, b"2"]})) == {"op": "hello", "x": [1, b"2"]}
    for data in (msgpack.packb([1, 2]), msgpack.packb("str"), b"\xc1",
                 b"\x00" * (MAX_MESSAGE + 1), msgpack.packb({"a": 1}) + b"\x00"):
        with pytest.raises(EnrollError) as info:
            unpack(data)
        assert info.value.reason == "malformed"


# --- identity files and TLS -------------------------------------------------------------------


def test_identity_save_load_round_trip(tmp_path: Path, ca: CertificateAuthority,
                                       intermediate: CertificateAuthority) -> None:
    ident = intermediate.mint(node("disk"), ["node"])
    ident.save(tmp_path)
    assert Identity.exists(tmp_path)
    assert stat.S_IMODE(os.stat(tmp_path / "key.pem").st_mode) == 0o600
    loaded = Identity.load(tmp_path)
    assert loaded.chain == ident.chain and loaded.bundle == (ca.cert,)
    assert loaded.key.private_numbers() == ident.key.private_numbers()
    assert loaded.spiffe_id == node("disk")
    other = ca.mint(node("other"), ["node"])
    (tmp_path / "key.pem").write_bytes(other.key_pem())
    with pytest.raises(IdentityError, match="does not match"):
        Identity.load(tmp_path)


def _files(directory: Path) -> dict[str, bytes]:
    return {f.name: f.read_bytes() for f in directory.iterdir()}


def _restore(directory: Path, files: dict[str, bytes]) -> None:
    for f in directory.iterdir():
        f.unlink()
    for name, data in files.items():
        (directory / name).write_bytes(data)


@pytest.mark.parametrize("first", [True, False], ids=["first-save", "renewal"])
def test_identity_save_is_whole_at_every_step_and_after_a_crash_at_any_step(
        tmp_path: Path, ca: CertificateAuthority, monkeypatch: pytest.MonkeyPatch,
        first: bool) -> None:
    """Every file operation of a save is a moment a reader (the router worker) can look and a
    crash can stop the writer.  At each one, load gives the old identity or the new one, and
    after settle the files alone (what TLS contexts load) are a matching pair."""
    directory = tmp_path / "identity"
    old = ca.mint(node("n2"), ["node"])
    new = ca.mint(node("n2"), ["node"])
    if not first:
        old.save(directory)
    snapshots: list[dict[str, bytes]] = []
    real_replace = os.replace

    def replace(src: object, dst: object) -> None:
        real_replace(src, dst)  # type: ignore[arg-type]
        snapshots.append(_files(directory))
        if (directory / "cert.pem").exists():  # else: no identity yet, as before the save
            seen = Identity.load(directory)
            assert seen.chain in ((new.cert,), () if first else (old.cert,))

    monkeypatch.setattr(os, "replace", replace)
    new.save(directory)
    monkeypatch.undo()
    assert len(snapshots) == 4 and sorted(_files(directory)) == ["bundle.pem", "cert.pem",
                                                                 "key.pem"]
    for files in snapshots:  # the writer crashed right after this step
        _restore(directory, files)
        Identity.settle(directory)
        assert "key.next.pem" not in _files(directory)
        if not Identity.exists(directory):
            assert first  # crashed before the first certificate was in place: no identity
            continue
        ident = Identity.load(directory)
        assert ident.chain in ((new.cert,), (old.cert,))
        assert (directory / "key.pem").read_bytes() == ident.key_pem()
        tls.server_context(directory)  # the files match without load's help


def test_identity_load_ignores_a_leftover_staged_key(tmp_path: Path,
                                                     ca: CertificateAuthority) -> None:
    ident = ca.mint(node("n2"), ["node"])
    ident.save(tmp_path)
    for leftover in (ca.mint(node("n2"), ["node"]).key_pem(), b"half a key"):
        (tmp_path / "key.next.pem").write_bytes(leftover)
        assert Identity.load(tmp_path).key_pem() == ident.key_pem()
        Identity.settle(tmp_path)
        assert not (tmp_path / "key.next.pem").exists()
        assert Identity.load(tmp_path).key_pem() == ident.key_pem()


def test_identity_reader_never_sees_a_mismatch_while_renewals_are_written(
        tmp_path: Path, ca: CertificateAuthority) -> None:
    """A reader in another thread, as the router worker is another process.  With the files
    written one by one (before the staged key) most reads made among back-to-back saves got a
    key that did not match the certificate; CI once hit that with a single renewal."""
    idents = [ca.mint(node("n2"), ["node"]) for _ in range(4)]
    idents[0].save(tmp_path)
    stop = threading.Event()
    errors: list[str] = []
    reads = [0]

    def read() -> None:
        while not stop.is_set():
            try:
                Identity.load(tmp_path)
            except IdentityError as exc:
                errors.append(str(exc))
            reads[0] += 1

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for i in range(300):
            idents[i % len(idents)].save(tmp_path)
    finally:
        stop.set()
        reader.join()
    assert reads[0] > 50 and errors == []


def _handshake(server: ssl.SSLContext, client: ssl.SSLContext, server_hostname: str | None = None
               ) -> tuple[ssl.SSLObject, ssl.SSLObject]:
    s_in, s_out, c_in, c_out = (ssl.MemoryBIO() for _ in range(4))
    srv = server.wrap_bio(s_in, s_out, server_side=True)
    cli = client.wrap_bio(c_in, c_out, server_side=False, server_hostname=server_hostname)
    done = {"s": False, "c": False}
    for _ in range(20):
        for name, obj in (("c", cli), ("s", srv)):
            if not done[name]:
                try:
                    obj.do_handshake()
                    done[name] = True
                except ssl.SSLWantReadError:
                    pass
        s_in.write(c_out.read())
        c_in.write(s_out.read())
        if all(done.values()):
            return srv, cli
    raise AssertionError("handshake did not finish")


def test_tls_contexts_do_mutual_tls_with_mesh_certificates(
        tmp_path: Path, ca: CertificateAuthority, other_ca: CertificateAuthority) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    ca.mint(node("a"), ["node"]).save(a)
    ca.mint(node("b"), ["node"]).save(b)
    srv, cli = _handshake(tls.server_context(a), tls.client_context(b))
    verifier = PeerVerifier([ca.cert], TD)
    assert verifier.verify_der(srv.getpeercert(binary_form=True)).name == "b"
    assert verifier.verify_der(cli.getpeercert(binary_form=True)).name == "a"
    # an enrolling node: no client certificate, accepted only when not required
    bundle = Identity.load(a).bundle_pem()
    srv, _ = _handshake(tls.server_context(a, require_client_cert=False),
                        tls.client_context(None, bundle_pem=bundle))
    assert srv.getpeercert(binary_form=True) is None
    # a client of another mesh is refused by the handshake itself
    c = tmp_path / "c"
    other_ca.mint(node("c"), ["node"]).save(c)
    with pytest.raises(ssl.SSLError):
        _handshake(tls.server_context(a), tls.client_context(c))


# --- host names (DNS and IP SANs) for clients that check them ---------------------------------


LOOPBACK_NAMES = ["127.0.0.1", "::1", "localhost"]


def san_of(cert: x509.Certificate) -> x509.SubjectAlternativeName:
    return cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value


def test_node_certificate_carries_host_names_beside_its_spiffe_names(
        ca: CertificateAuthority) -> None:
    ident = ca.mint(node("r1"), ["node"],
                    names=[*LOOPBACK_NAMES, "GPU1.Example.com.", "10.0.0.7", "10.0.0.7",
                           "r1.node.mesh.test"])
    san = san_of(ident.cert)
    assert san.get_values_for_type(x509.UniformResourceIdentifier) == [str(node("r1"))]
    assert san.get_values_for_type(x509.DNSName) == [
        "r1.node.mesh.test", "node.mesh.test", "localhost", "gpu1.example.com"]
    assert san.get_values_for_type(x509.IPAddress) == [
        ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1"),
        ipaddress.ip_address("10.0.0.7")]
    assert ident.host_names == {"127.0.0.1", "::1", "localhost", "gpu1.example.com",
                                "10.0.0.7"}
    assert ident.spiffe_id == node("r1")  # still exactly one URI SAN
    # without names: as before
    assert ca.mint(node("r2"), ["node"]).host_names == set()
    # people's certificates name no hosts
    with pytest.raises(CaError, match="only node certificates"):
        ca.mint(SpiffeId(TD, "user", "alice"), ["admin"], names=["10.0.0.7"])


def _python_client(bundle: Path) -> ssl.SSLContext:
    """What tritonclient (grpc) and most TLS clients do: the roots, and a host-name check."""
    ctx = ssl.create_default_context(cafile=str(bundle))
    assert ctx.check_hostname and ctx.verify_mode == ssl.CERT_REQUIRED
    return ctx


def test_a_client_that_checks_host_names_accepts_the_node_at_its_addresses(
        tmp_path: Path, ca: CertificateAuthority, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(socket, "gethostname", lambda: "gpu17")
    settings = Settings(node="r1", bind="127.0.0.1:7946", roles=["router"], dev=True,
                        cert_san=["lb.example.com"])
    with_names, without = tmp_path / "names", tmp_path / "none"
    ca.mint(node("r1"), ["node"], names=settings.cert_names()).save(with_names)
    ca.mint(node("r1"), ["node"]).save(without)
    client = _python_client(with_names / "bundle.pem")
    server = tls.server_context(with_names, require_client_cert=False)
    for host in ("127.0.0.1", "::1", "localhost", "gpu17", "lb.example.com",
                 "node.mesh.test", "r1.node.mesh.test"):
        _, cli = _handshake(server, client, server_hostname=host)
        assert cli.getpeercert()["subject"] == ((("commonName", "r1"),),)
    # addresses the certificate does not name fail the check, as does a certificate of before
    for host in ("127.0.0.2", "10.0.0.7", "gpu18", "s1.node.mesh.test"):
        with pytest.raises(ssl.SSLCertVerificationError, match="mismatch"):
            _handshake(server, client, server_hostname=host)
    with pytest.raises(ssl.SSLCertVerificationError, match="IP address mismatch"):
        _handshake(tls.server_context(without, require_client_cert=False), client,
                   server_hostname="127.0.0.1")


def test_tritonclient_dials_a_node_by_address_with_only_the_mesh_bundle(
        tmp_path: Path, ca: CertificateAuthority) -> None:
    """tritonclient's ``ssl=True, root_certificates=`` (no target name override) against a
    gRPC server presenting the node certificate the way the router does."""
    import grpc
    import tritonclient.grpc as tc
    from tritonclient.grpc import service_pb2
    from tritonclient.utils import InferenceServerException

    def live(request: object, context: object) -> service_pb2.ServerLiveResponse:
        return service_pb2.ServerLiveResponse(live=True)

    handler = grpc.method_handlers_generic_handler("inference.GRPCInferenceService", {
        "ServerLive": grpc.unary_unary_rpc_method_handler(
            live, request_deserializer=service_pb2.ServerLiveRequest.FromString,
            response_serializer=service_pb2.ServerLiveResponse.SerializeToString)})
    ident = ca.mint(node("r1"), ["node"], names=LOOPBACK_NAMES)
    plain = ca.mint(node("r1"), ["node"])
    bundle = tmp_path / "bundle.pem"
    bundle.write_bytes(ident.bundle_pem())
    for current, ok in ((ident, True), (plain, False)):
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        server.add_generic_rpc_handlers((handler,))
        port = server.add_secure_port(
            "127.0.0.1:0", tls.grpc_server_credentials(lambda c=current: c,
                                                       require_client_auth=False))
        server.start()
        try:
            for host in ("127.0.0.1", "localhost"):
                client = tc.InferenceServerClient(f"{host}:{port}", ssl=True,
                                                  root_certificates=str(bundle))
                try:
                    if ok:
                        assert client.is_server_live(client_timeout=10) is True
                    else:
                        with pytest.raises(InferenceServerException, match="UNAVAILABLE"):
                            client.is_server_live(client_timeout=10)
                finally:
                    client.close()
        finally:
            server.stop(None)


def test_csr_host_names_are_checked(ca: CertificateAuthority) -> None:
    def reason(san: list[x509.GeneralName], sid: SpiffeId | None = None) -> str:
        uri: list[x509.GeneralName] = [x509.UniformResourceIdentifier(str(sid or node("r1")))]
        with pytest.raises(CsrRejected) as info:
            ca.check_request(csr_with_san(new_key(), uri + san))
        assert info.value.reason in REFUSAL_REASONS
        return f"{info.value.reason}: {info.value}"

    good = make_csr(new_key(), node("r1"), ["10.0.0.7", "gpu1.example.com", "::1",
                                            "node.mesh.test"])
    sid, names = ca.check_request(good)
    assert sid == node("r1") and names == [
        x509.IPAddress(ipaddress.ip_address("10.0.0.7")), x509.DNSName("gpu1.example.com"),
        x509.IPAddress(ipaddress.ip_address("::1"))]
    assert ca.check_csr(good) == node("r1")
    assert cert_host_names(ca.issue(good, ["node"]), node("r1")) == {
        "10.0.0.7", "gpu1.example.com", "::1"}
    most = [x509.DNSName(f"h{i}.example.com") for i in range(MAX_NAMES)]
    assert len(ca.check_request(csr_with_san(
        new_key(), [x509.UniformResourceIdentifier(str(node("r1"))), *most]))[1]) == MAX_NAMES

    # another node's SPIFFE ID beside ours: still one identity per certificate
    assert reason([x509.UniformResourceIdentifier(str(node("r2")))]).startswith(
        "bad_identity: CSR must name one SPIFFE ID (2 URI SANs)")
    assert reason([x509.RFC822Name("ops@example.com")]) == (
        "bad_name: CSR for spiffe://mesh.test/node/r1: email address SAN ops@example.com: "
        "only the SPIFFE URI, DNS names and IP addresses are issued")
    assert "100 DNS names and IP addresses asked for; at most 32" in reason(
        [x509.DNSName(f"h{i}.example.com") for i in range(100)])
    assert "at most 32" in reason([*most, x509.IPAddress(ipaddress.ip_address("10.0.0.1"))])
    refusals = {
        "wildcard": [x509.DNSName("*.example.com")],
        "label": [x509.DNSName("bad_host.example.com")],
        "-'": [x509.DNSName("-x.example.com")],
        "looks like an IP address": [x509.DNSName("10.0.0.1")],
        "s2.node.mesh.test' is one the mesh gives SPIFFE identities": [
            x509.DNSName("s2.node.mesh.test")],
        "alice.user.mesh.test": [x509.DNSName("alice.user.mesh.test")],
        "not a network": [x509.IPAddress(ipaddress.ip_network("10.0.0.0/8"))],
        "unspecified": [x509.IPAddress(ipaddress.ip_address("0.0.0.0"))],
        "multicast": [x509.IPAddress(ipaddress.ip_address("ff02::1"))],
        "directory name": [x509.DirectoryName(x509.Name(
            [x509.NameAttribute(NameOID.COMMON_NAME, "x")]))],
        "registered ID": [x509.RegisteredID(x509.ObjectIdentifier("1.2.3.4"))],
    }
    for why, san in refusals.items():
        got = reason(san)
        assert got.startswith("bad_name: ") and why in got, (why, got)
    assert "only node certificates carry them" in reason(
        [x509.DNSName("laptop.example.com")], SpiffeId(TD, "user", "alice"))
    # the CA refuses the same names when it mints for itself
    with pytest.raises(CaError, match="wildcard"):
        ca.mint(node("r1"), ["node"], names=["*.example.com"])


def test_enrollment_with_host_names_and_a_bad_one(env: Env) -> None:
    now = time.time()
    token, claims = tokens.create(env.ca, uses=1, ttl=600, now=now)
    uri = x509.UniformResourceIdentifier(str(node("joiner")))
    for bad in (x509.RFC822Name("a@b.example"), x509.DNSName("node.other.test.*")):
        msg = {"op": "enroll", "token": token,
               "csr": csr_with_san(new_key(), [uri, bad]).public_bytes(DER)}
        refused(env.authority.handle(msg, None, now), "bad_name")
    assert env.ledger.used(claims.id) == 0  # a refused CSR does not use the token
    msg = {"op": "enroll", "token": token,
           "csr": make_csr(new_key(), node("joiner"), ["10.1.2.3", "joiner.example"]
                           ).public_bytes(DER)}
    reply = env.authority.handle(msg, None, now)
    assert reply["ok"] is True, reply
    cert = x509.load_der_x509_certificate(reply["chain"][0])  # type: ignore[index]
    assert cert_host_names(cert, node("joiner")) == {"10.1.2.3", "joiner.example"}
    assert env.authority.refused == Counter({"bad_name": 2})


def test_renewal_through_the_authority_carries_the_names_of_the_csr(env: Env) -> None:
    now = time.time()
    old = env.ca.mint(node("r1"), ["node"], names=["10.0.0.7"])
    peer = env.verifier.verify_der(der(old.cert))
    reply = env.authority.handle(
        {"op": "renew", "csr": make_csr(new_key(), node("r1"), ["10.0.0.7", "10.0.0.8"]
                                        ).public_bytes(DER)}, peer, now)
    cert = x509.load_der_x509_certificate(reply["chain"][0])  # type: ignore[index]
    assert cert_host_names(cert, node("r1")) == {"10.0.0.7", "10.0.0.8"}
    bad = csr_with_san(new_key(), [x509.UniformResourceIdentifier(str(node("r1"))),
                                   x509.DNSName("r2.node.mesh.test")])
    refused(env.authority.handle({"op": "renew", "csr": bad.public_bytes(DER)}, peer, now),
            "bad_name")


def test_dev_node_mints_its_certificate_with_its_names_and_renews_with_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(socket, "gethostname", lambda: "devbox")
    settings = Settings(node="a", bind="127.0.0.1:7946", dev=True, roles=["router"])
    want = {"127.0.0.1", "::1", "localhost", "devbox"}
    assert set(settings.cert_names()) == want
    sec = Security(tmp_path, "a", dev=True, trust_domain=TD, cert_names=settings.cert_names)
    sec.prepare()
    first = sec.identity
    assert first.host_names == want
    assert Identity.load(tmp_path / "identity").cert == first.cert
    # a restart with the same settings keeps the certificate
    again = Security(tmp_path, "a", dev=True, trust_domain=TD, cert_names=settings.cert_names)
    again.prepare()
    assert again.identity.cert == first.cert
    # a renewal keeps the names, re-derived from the settings (now with one more)
    assert asyncio.run(sec.renew())
    assert sec.identity.cert.serial_number != first.cert.serial_number
    assert sec.identity.host_names == want
    settings.cert_san = ["lb.example.com"]
    assert asyncio.run(sec.renew())
    assert sec.identity.host_names == want | {"lb.example.com"}
    saved = Identity.load(tmp_path / "identity")
    assert saved.cert == sec.identity.cert and saved.key_pem() == sec.identity.key_pem()
    assert not (tmp_path / "identity" / "key.next.pem").exists()
    # a restart with other names re-mints at once
    settings.cert_san = ["10.9.9.9"]
    later = Security(tmp_path, "a", dev=True, trust_domain=TD, cert_names=settings.cert_names)
    later.prepare()
    assert later.identity.host_names == want | {"10.9.9.9"}
    # names the CA would refuse stop the start, not a renewal hours later
    settings.cert_san = ["b.node.mesh.test"]
    with pytest.raises(SecurityError, match="cert_san: DNS name 'b.node.mesh.test'"):
        Security(tmp_path, "a", dev=True, trust_domain=TD,
                 cert_names=settings.cert_names).prepare()


def test_enrolled_node_renews_early_once_for_names_it_lacks_then_keeps_them(
        tmp_path: Path, ca: CertificateAuthority, seed: Identity,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A node whose certificate predates the names (or a new --cert-san) renews through a CA
    holder as soon as it knows one, once; its CSRs carry the names its settings give."""
    env = make_env(ca, seed)
    old = ca.mint(node("n2"), ["node"])  # what a node enrolled before this change holds
    old.save(tmp_path / "identity")
    names = ["10.0.0.7", "n2.example.com"]
    sec = Security(tmp_path, "n2", cert_names=lambda: names)
    sec.prepare()
    assert sec.identity.cert == old.cert and sec.names_stale(sec.identity)
    csrs: list[set[str]] = []

    @contextlib.asynccontextmanager
    async def stream(target: str, ctx: ssl.SSLContext):  # type: ignore[no-untyped-def]
        yield None, None

    async def exchange(reader: object, writer: object, msg: dict[str, object]
                       ) -> dict[str, object]:
        csr = x509.load_der_x509_csr(msg["csr"])  # type: ignore[arg-type]
        csrs.append(host_names(csr.extensions.get_extension_for_class(
            x509.SubjectAlternativeName).value))
        peer = env.verifier.verify_der(der(sec.identity.cert))
        return unpack(pack(env.authority.handle(msg, peer)))

    monkeypatch.setattr(security_mod, "_enrollment_stream", stream)
    monkeypatch.setattr(security_mod, "_exchange", exchange)
    monkeypatch.setattr(security_mod, "NAMES_CHECK", 0.05)
    holders: list[tuple[str, tuple[str, int], dict[str, int]]] = []
    sec.members = lambda: holders

    async def run() -> None:
        loop = asyncio.create_task(sec.renew_loop())
        try:
            await asyncio.sleep(0.3)
            assert sec.renewals["ok"] == 0  # no CA holder known yet: nothing to ask
            holders.append(("ca1", ("127.0.0.1", 7946), {"ca": 7946}))
            for _ in range(100):
                if sec.renewals["ok"]:
                    break
                await asyncio.sleep(0.05)
            await asyncio.sleep(0.3)  # and no second early renewal
        finally:
            loop.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await loop

    asyncio.run(run())
    assert sec.renewals == Counter({"ok": 1})
    assert csrs == [{"10.0.0.7", "n2.example.com"}]
    assert sec.identity.host_names == {"10.0.0.7", "n2.example.com"}
    assert not sec.names_stale(sec.identity)
    assert Identity.load(tmp_path / "identity").cert == sec.identity.cert
    # the next renewal (due by time) asks for the names again
    names.append("10.0.0.8")
    assert asyncio.run(sec.renew())
    assert csrs[-1] == {"10.0.0.7", "n2.example.com", "10.0.0.8"}
    assert sec.identity.host_names == csrs[-1]
    # once a run: a CA holder that leaves names out (one of before) is not asked over and over
    names.append("10.0.0.9")
    sec.names = sec._derive_names()
    assert sec.names_stale(sec.identity) and sec.ca_holders() and not sec._early_renewal()


def test_every_certificate_names_its_mesh_and_another_meshs_is_refused(
        tmp_path: Path, ca: CertificateAuthority) -> None:
    """Two meshes whose CAs share a root (each `meshctl ca init --from-cert` mints its own
    mesh id) verify each other's chains, but refuse each other's nodes by the mesh id."""
    from certs.ca import new_mesh_id
    from certs.identity import mesh_of

    assert len(ca.mesh) == 32 and ca.mesh != CertificateAuthority.create(TD).mesh
    ours_ca = CertificateAuthority.from_parts(TD, *make_intermediate(ca, name="ours"), [],
                                              [ca.cert], mesh=new_mesh_id())
    theirs_ca = CertificateAuthority.from_parts(TD, *make_intermediate(ca, name="theirs"), [],
                                                [ca.cert], mesh=new_mesh_id())
    ours, theirs = (c.mint(node(n), ["node"]) for c, n in ((ours_ca, "a"), (theirs_ca, "b")))
    assert ours.mesh == ours_ca.mesh and mesh_of(theirs.cert) == theirs_ca.mesh
    verifier = PeerVerifier([ca.cert], TD, intermediates=[ours_ca.cert, theirs_ca.cert],
                            mesh=ours.mesh)
    assert verifier.verify_der(der(ours.cert)).name == "a"
    err = assert_refused(verifier, der(theirs.cert), "other_mesh")
    assert theirs_ca.mesh in str(err) and ours_ca.mesh in str(err)
    # a CA made before mesh ids (no "mesh" in its files) signs certificates without one,
    # which no mesh refuses for that
    ours_ca.save(tmp_path / "ca")
    assert CertificateAuthority.load(tmp_path / "ca").mesh == ours_ca.mesh
    meta = tmp_path / "ca" / "ca.json"
    meta.write_text(json.dumps({"trust_domain": TD}))
    old_ca = CertificateAuthority.load(tmp_path / "ca")
    old = old_ca.mint(node("c"), ["node"])
    assert old_ca.mesh == "" and old.mesh == ""
    assert verifier.verify_der(der(old.cert)).name == "c"
    with pytest.raises(CaError, match="mesh id"):
        CertificateAuthority.from_parts(TD, *make_intermediate(ca), [], [ca.cert], mesh="x")
