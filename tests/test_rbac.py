"""RBAC for the admin API: policy, bearer-token verification and the audit log."""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import re
import stat
import threading
import time
from pathlib import Path
from typing import Any

import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from hypothesis import given, settings
from hypothesis import strategies as st

from meshd.admin.rbac import (
    ACCESS_ROLES,
    AUTH_REASONS,
    MAX_TOKEN_LENGTH,
    AuditLog,
    AuthError,
    JwtVerifier,
    KeyLoadError,
    Policy,
    PolicyError,
    Principal,
)

READ_ONLY = ("Members", "Rtt", "KeysList")
OPERATIONAL = ("Leave", "ForceLeave")
ADMIN_ONLY = ("KeysInstall", "TokenCreate", "Revoke")
KNOWN = READ_ONLY + OPERATIONAL + ADMIN_ONLY

AUD = "meshd-admin"
ISS = "https://idp.example.com"
NOW = 1_800_000_000.0

# Generated once: RSA key generation is the slow part of this file.
EC_KEY = ec.generate_private_key(ec.SECP256R1())
OTHER_EC_KEY = ec.generate_private_key(ec.SECP256R1())
RSA_KEY = rsa.generate_private_key(public_exponent=65537, key_size=2048)
ED_KEY = ed25519.Ed25519PrivateKey.generate()


def principal(*roles: str, kind: str = "user") -> Principal:
    return Principal(kind=kind, name="alice", roles=frozenset(roles),
                     spiffe_id=f"spiffe://mesh.test/{kind}/alice")


def pem(key: Any) -> bytes:
    return key.public_key().public_bytes(serialization.Encoding.PEM,
                                         serialization.PublicFormat.SubjectPublicKeyInfo)


def claims(**override: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"iss": ISS, "aud": AUD, "sub": "alice", "iat": int(NOW),
                            "exp": int(NOW) + 300, "roles": ["viewer"]}
    base.update(override)
    return {k: v for k, v in base.items() if v is not None}


def sign(payload: dict[str, Any], key: Any = EC_KEY, alg: str = "ES256",
         kid: str | None = "ec1") -> str:
    return jwt.encode(payload, key, algorithm=alg, headers={"kid": kid} if kid else None)


def b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def handmade(header: dict[str, Any], payload: dict[str, Any], sig: bytes = b"") -> str:
    """A token PyJWT would refuse to produce (alg none, HMAC keyed with a PEM key)."""
    return f"{b64(json.dumps(header).encode())}.{b64(json.dumps(payload).encode())}.{b64(sig)}"


@pytest.fixture(scope="module")
def jwks_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    keys = [
        {**jwt.algorithms.ECAlgorithm.to_jwk(EC_KEY.public_key(), as_dict=True),
         "kid": "ec1", "use": "sig"},
        {**jwt.algorithms.RSAAlgorithm.to_jwk(RSA_KEY.public_key(), as_dict=True),
         "kid": "rsa1"},
    ]
    path = tmp_path_factory.mktemp("jwks") / "jwks.json"
    path.write_text(json.dumps({"keys": keys}))
    return path


@pytest.fixture(scope="module")
def verifier(jwks_file: Path) -> JwtVerifier:
    return JwtVerifier.from_jwks_file(jwks_file, audience=AUD, issuer=ISS)


def pem_verifier(tmp_path: Path, key: Any, **kwargs: Any) -> JwtVerifier:
    path = tmp_path / "key.pem"
    path.write_bytes(pem(key))
    return JwtVerifier.from_public_key_file(path, audience=AUD, issuer=ISS, **kwargs)


def refused(v: JwtVerifier, token: str, reason: str, now: float | None = NOW) -> AuthError:
    with pytest.raises(AuthError) as info:
        v.verify(token, now=now)
    assert info.value.reason == reason, str(info.value)
    message = str(info.value)
    assert message
    for part in token.split("."):  # no piece of the token leaks into the message
        assert len(part) < 8 or part not in message
    return info.value


# --- policy ------------------------------------------------------------------------------------


DEFAULT_CASES = [
    ("viewer", "Members", True), ("viewer", "Rtt", True), ("viewer", "Leave", False),
    ("viewer", "KeysInstall", False), ("node", "Members", True), ("node", "KeysList", True),
    ("node", "ForceLeave", False), ("node", "Revoke", False), ("operator", "Rtt", True),
    ("operator", "Leave", True), ("operator", "ForceLeave", True),
    ("operator", "KeysInstall", False), ("operator", "TokenCreate", False),
    ("admin", "Members", True), ("admin", "KeysInstall", True), ("admin", "Revoke", True),
    ("admin", "SomethingAddedLater", True),
]


@pytest.mark.parametrize(("role", "method", "allowed"), DEFAULT_CASES)
def test_default_policy(role: str, method: str, allowed: bool) -> None:
    policy = Policy.default(READ_ONLY, OPERATIONAL)
    assert policy.allows(principal(role), method) is allowed


def test_default_policy_roles_for() -> None:
    policy = Policy.default(READ_ONLY, OPERATIONAL)
    assert policy.roles_for("Members") == ("admin", "operator", "viewer", "node")
    assert policy.roles_for("Leave") == ("admin", "operator")
    assert policy.roles_for("Revoke") == ("admin",)


def test_roles_combine_and_unknown_roles_are_ignored() -> None:
    policy = Policy.default(READ_ONLY, OPERATIONAL)
    assert not policy.allows(principal(), "Members")
    assert not policy.allows(principal("gpu", "root", "ADMIN"), "Members")
    assert policy.allows(principal("gpu", "viewer"), "Members")
    assert policy.allows(principal("viewer", "operator"), "Leave")
    assert not policy.allows(principal("viewer", "node"), "Leave")


def test_policy_constructor_checks() -> None:
    with pytest.raises(PolicyError, match="role 'root' is not one of admin, operator"):
        Policy({"root": ["*"]})
    with pytest.raises(PolicyError, match="role 'viewer': unknown method 'Membres'"):
        Policy({"viewer": ["Membres"]}, known_methods=KNOWN)
    with pytest.raises(PolicyError, match="role 'viewer': methods must be a list"):
        Policy({"viewer": "Members"})
    # Without known methods any name goes; "*" is always fine.
    assert Policy({"viewer": ["Whatever"]}).allows(principal("viewer"), "Whatever")
    assert Policy({"node": ["*"]}, known_methods=KNOWN).allows(principal("node"), "Revoke")


def test_policy_load(tmp_path: Path) -> None:
    path = tmp_path / "policy.toml"
    path.write_text('[roles]\nviewer = ["Members", "Rtt"]\nadmin = ["*"]\noperator = []\n')
    policy = Policy.load(path, KNOWN)
    assert policy.allows(principal("viewer"), "Rtt")
    assert not policy.allows(principal("viewer"), "KeysList")
    assert policy.allows(principal("admin"), "Revoke")
    assert not policy.allows(principal("operator"), "Members")
    assert not policy.allows(principal("node"), "Members")  # left out: nothing
    assert policy.roles_for("Members") == ("admin", "viewer")


@pytest.mark.parametrize(("text", "problem"), [
    ('[roles]\nroot = ["*"]\n', r"role 'root' is not one of admin, operator, viewer, node"),
    ('[roles]\nviewer = ["Members", "Membres"]\n', r"role 'viewer': unknown method 'Membres'"),
    ('[roles]\nviewer = "Members"\n', r"role 'viewer': methods must be a list.*got str"),
    ('[roles]\nviewer = [1]\n', r"role 'viewer': method 1 is not a method name"),
    ('[roles]\nviewer = [""]\n', r"role 'viewer': method '' is not a method name"),
    ('[roles]\nviewer = [{a = 1}]\n', r"role 'viewer': method \{'a': 1\} is not a method"),
    ('roles = ["viewer"]\n', r"needs a \[roles\] table"),
    ('[other]\nx = 1\n', r"unknown key 'other'"),
    ("", r"needs a \[roles\] table"),
    ('[roles\nviewer = ["Members"]\n', r"not valid TOML"),
])
def test_policy_load_errors(tmp_path: Path, text: str, problem: str) -> None:
    path = tmp_path / "bad-policy.toml"
    path.write_text(text)
    with pytest.raises(PolicyError, match=problem) as info:
        Policy.load(path, KNOWN)
    assert str(path) in str(info.value)


def test_policy_load_missing_file(tmp_path: Path) -> None:
    path = tmp_path / "nope.toml"
    with pytest.raises(PolicyError, match=f"policy {re.escape(str(path))}: cannot read"):
        Policy.load(path, KNOWN)


# --- principals --------------------------------------------------------------------------------


def test_principal_labels() -> None:
    assert principal("admin").label == "spiffe://mesh.test/user/alice"
    assert principal("node", kind="node").label == "spiffe://mesh.test/node/alice"
    bearer = Principal(kind="jwt", name="bob", roles=frozenset({"viewer"}), issuer=ISS)
    assert bearer.label == f"jwt:{ISS}/bob"
    assert bearer.spiffe_id == ""
    with pytest.raises(ValueError, match="kind 'robot'"):
        Principal(kind="robot", name="x", roles=frozenset())


def test_auth_error_reasons() -> None:
    assert AuthError("expired").reason == "expired"
    assert str(AuthError("no_roles", "custom")) == "custom"
    with pytest.raises(ValueError):
        AuthError("nope")


# --- bearer tokens: accepted -------------------------------------------------------------------


def test_valid_es256_via_jwks(verifier: JwtVerifier) -> None:
    p = verifier.verify(sign(claims(roles=["operator", "viewer"])), now=NOW)
    assert p == Principal(kind="jwt", name="alice", roles=frozenset({"operator", "viewer"}),
                          spiffe_id="", issuer=ISS)
    assert p.label == f"jwt:{ISS}/alice"


def test_valid_rs256_and_ps256_via_jwks(verifier: JwtVerifier) -> None:
    for alg in ("RS256", "PS256"):
        p = verifier.verify(sign(claims(sub="bob"), RSA_KEY, alg, "rsa1"), now=NOW)
        assert (p.name, p.roles) == ("bob", frozenset({"viewer"}))


def test_valid_via_pem_key_file(tmp_path: Path) -> None:
    for key, alg in ((EC_KEY, "ES256"), (RSA_KEY, "RS256"), (ED_KEY, "EdDSA")):
        v = pem_verifier(tmp_path, key)
        # A single PEM key has no id: it verifies tokens with any kid, or none.
        assert v.verify(sign(claims(), key, alg, kid=None), now=NOW).name == "alice"
        assert v.verify(sign(claims(), key, alg, kid="whatever"), now=NOW).name == "alice"


def test_roles_claim_forms(tmp_path: Path, verifier: JwtVerifier) -> None:
    assert verifier.verify(sign(claims(roles="viewer  admin other")), now=NOW).roles == \
        frozenset({"viewer", "admin"})
    assert verifier.verify(sign(claims(roles=["gpu", 3, None, "node"])), now=NOW).roles == \
        frozenset({"node"})
    v = pem_verifier(tmp_path, EC_KEY, roles_claim="https://mesh.example/roles")
    token = sign(claims(roles=None, **{"https://mesh.example/roles": ["admin"]}))
    assert v.verify(token, now=NOW).roles == frozenset({"admin"})


def test_audience_list_and_leeway(verifier: JwtVerifier) -> None:
    assert verifier.verify(sign(claims(aud=["other", AUD])), now=NOW).name == "alice"
    # 30 s leeway either side.
    assert verifier.verify(sign(claims(exp=int(NOW) - 20)), now=NOW).name == "alice"
    assert verifier.verify(sign(claims(nbf=int(NOW) + 20)), now=NOW).name == "alice"


def test_wall_clock_is_used_without_now(verifier: JwtVerifier) -> None:
    t = time.time()
    token = sign(claims(iat=int(t), nbf=int(t) + 3600, exp=int(t) + 7200))
    refused(verifier, token, "not_yet_valid", now=None)
    assert verifier.verify(token, now=t + 3601).name == "alice"
    assert verifier.verify(sign(claims(iat=int(t), exp=int(t) + 60))).name == "alice"


# --- bearer tokens: refused --------------------------------------------------------------------


def test_bad_signature(verifier: JwtVerifier) -> None:
    refused(verifier, sign(claims(), OTHER_EC_KEY, "ES256", "ec1"), "bad_signature")
    header, payload, sig = sign(claims()).split(".")
    forged = b64(json.dumps(claims(roles=["admin"])).encode())
    refused(verifier, f"{header}.{forged}.{sig}", "bad_signature")


@pytest.mark.parametrize(("override", "reason", "message"), [
    ({"aud": "other"}, "wrong_audience", "not for audience 'meshd-admin'"),
    ({"aud": ["a", "b"]}, "wrong_audience", "not for audience"),
    ({"aud": None}, "wrong_audience", "no audience"),
    ({"iss": "https://evil.example.com"}, "wrong_issuer", "not from issuer"),
    ({"iss": None}, "wrong_issuer", "no issuer"),
    ({"exp": int(NOW) - 31}, "expired", "expired 31 s ago"),
    ({"exp": None}, "malformed", "no exp claim"),
    ({"exp": "1900000000"}, "malformed", "exp is not a number"),
    ({"nbf": int(NOW) + 60}, "not_yet_valid", r"another 60 s \(nbf\)"),
    ({"iat": int(NOW) + 600}, "not_yet_valid", r"\(iat\)"),
    ({"nbf": True}, "malformed", "nbf is not a number"),
    ({"sub": None}, "no_subject", "no subject"),
    ({"sub": ""}, "no_subject", "no subject"),
    ({"sub": 42}, "no_subject", "no subject"),
    ({"roles": None}, "no_roles", "claim 'roles' grants none"),
    ({"roles": ["root", "Admin"]}, "no_roles", "grants none of the access roles"),
    ({"roles": {"admin": True}}, "no_roles", "grants none"),
    ({"roles": ""}, "no_roles", "grants none"),
])
def test_claims_refused(verifier: JwtVerifier, override: dict[str, Any], reason: str,
                        message: str) -> None:
    err = refused(verifier, sign(claims(**override)), reason)
    assert re.search(message, str(err)), str(err)


def test_alg_none_refused(verifier: JwtVerifier, tmp_path: Path) -> None:
    for header in ({"alg": "none", "kid": "ec1"}, {"alg": "none"}, {"alg": "None"}, {},
                   {"alg": ["ES256"]}, {"alg": None}):
        token = handmade(header, claims(roles=["admin"]))
        refused(verifier, token, "bad_algorithm")
        refused(pem_verifier(tmp_path, EC_KEY), token, "bad_algorithm")


def test_hs256_keyed_with_public_key_refused(verifier: JwtVerifier, tmp_path: Path) -> None:
    for key in (EC_KEY, RSA_KEY):
        for kid in ("ec1", "rsa1", None):
            header = {"alg": "HS256", "typ": "JWT", **({"kid": kid} if kid else {})}
            unsigned = handmade(header, claims(roles=["admin"])).rsplit(".", 1)[0]
            mac = hmac.new(pem(key), unsigned.encode(), hashlib.sha256).digest()
            token = f"{unsigned}.{b64(mac)}"
            refused(verifier, token, "bad_algorithm")
            refused(pem_verifier(tmp_path, key), token, "bad_algorithm")


def test_algorithm_must_fit_the_key(verifier: JwtVerifier, tmp_path: Path) -> None:
    # An RSA-signed token claiming the EC key's kid, and the reverse.
    refused(verifier, sign(claims(), RSA_KEY, "RS256", "ec1"), "bad_algorithm")
    refused(verifier, sign(claims(), EC_KEY, "ES256", "rsa1"), "bad_algorithm")
    # The verifier's own allow-list narrows further.
    only_ec = pem_verifier(tmp_path, RSA_KEY, algorithms=["ES256"])
    refused(only_ec, sign(claims(), RSA_KEY, "RS256"), "bad_algorithm")


def test_unknown_kid(verifier: JwtVerifier) -> None:
    refused(verifier, sign(claims(), EC_KEY, "ES256", "ec2"), "unknown_key")
    # No kid while the JWKS has several keys: we will not guess.
    err = refused(verifier, sign(claims(), EC_KEY, "ES256", kid=None), "unknown_key")
    assert "several" in str(err)


@pytest.mark.parametrize("token", [
    "abc", "a.b", "a.b.c", "..", "....", "ey.ey.ey", "é.é.é", "\ud800.x.y", "a b.c d.e f",
    "x" * (MAX_TOKEN_LENGTH + 1), "a." * 100_000, handmade({"alg": "ES256", "kid": 5}, {}),
    handmade({"alg": "ES256", "crit": ["x"], "x": 1}, {}),
    b64(b"[1]") + "." + b64(b"{}") + ".",
    handmade({"alg": "ES256", "kid": "ec1"}, {}).replace(".", ".!", 1),
])
def test_garbage_is_malformed(verifier: JwtVerifier, token: str) -> None:
    refused(verifier, token, "malformed")


def test_empty_token_is_missing(verifier: JwtVerifier) -> None:
    refused(verifier, "", "missing")


def test_signed_but_non_object_payload(verifier: JwtVerifier) -> None:
    token = jwt.api_jws.encode(b"[1, 2]", EC_KEY, algorithm="ES256", headers={"kid": "ec1"})
    refused(verifier, token, "malformed")


def test_verifier_refuses_unsafe_configuration(tmp_path: Path) -> None:
    pub = EC_KEY.public_key()
    for algs in (["HS256"], ["none"], ["ES256", "RS512"], []):
        with pytest.raises(ValueError, match="algorithm"):
            JwtVerifier(audience=AUD, issuer=ISS, keys={None: pub}, algorithms=algs)
    with pytest.raises(ValueError, match="at least 2048 bits"):
        small = rsa.generate_private_key(public_exponent=65537, key_size=1024)
        JwtVerifier(audience=AUD, issuer=ISS, keys={"k": small.public_key()})
    with pytest.raises(ValueError, match="not P-256 or P-384"):
        k = ec.generate_private_key(ec.SECP521R1()).public_key()
        JwtVerifier(audience=AUD, issuer=ISS, keys={"k": k})
    with pytest.raises(ValueError, match="not an RSA, EC or Ed25519 public key"):
        JwtVerifier(audience=AUD, issuer=ISS, keys={"k": EC_KEY})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="non-empty"):
        JwtVerifier(audience="", issuer=ISS, keys={None: pub})
    with pytest.raises(ValueError, match="at least one key"):
        JwtVerifier(audience=AUD, issuer=ISS, keys={})


def jwk_of(key: Any, **extra: Any) -> dict[str, Any]:
    return {**jwt.algorithms.ECAlgorithm.to_jwk(key, as_dict=True), **extra}


@pytest.mark.parametrize(("doc", "problem"), [
    ("not json", "is not valid JSON"),
    ("[]", "is not a JWKS document"),
    ('{"keys": []}', "did not contain any keys"),
    (json.dumps({"keys": [{"kty": "oct", "k": b64(b"s" * 32), "kid": "h"}]}),
     "key 'h' is a symmetric key"),
    (json.dumps({"keys": [jwk_of(EC_KEY, kid="p")]}), "key 'p' is not a supported public key"),
    (json.dumps({"keys": [jwk_of(EC_KEY.public_key(), kid="a"),
                          jwk_of(OTHER_EC_KEY.public_key(), kid="a")]}), "key 'a' appears twice"),
    (json.dumps({"keys": [jwk_of(EC_KEY.public_key(), kid="e", use="enc")]}), "no signing keys"),
])
def test_jwks_file_errors(tmp_path: Path, doc: str, problem: str) -> None:
    path = tmp_path / "bad.jwks"
    path.write_text(doc)
    with pytest.raises(KeyLoadError, match=problem) as info:
        JwtVerifier.from_jwks_file(path, audience=AUD, issuer=ISS)
    assert str(path) in str(info.value)
    assert '"d"' not in str(info.value) and "k': " not in str(info.value)


def test_pem_file_errors(tmp_path: Path) -> None:
    path = tmp_path / "key.pem"
    private = EC_KEY.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                   serialization.NoEncryption())
    path.write_bytes(private)
    with pytest.raises(KeyLoadError, match="holds a private key") as info:
        JwtVerifier.from_public_key_file(path, audience=AUD, issuer=ISS)
    assert private.decode().splitlines()[1] not in str(info.value)
    path.write_text("hello")
    with pytest.raises(KeyLoadError, match="is not a PEM public key"):
        JwtVerifier.from_public_key_file(path, audience=AUD, issuer=ISS)
    with pytest.raises(KeyLoadError, match="cannot read"):
        JwtVerifier.from_public_key_file(tmp_path / "nope", audience=AUD, issuer=ISS)


# --- bearer tokens: properties -----------------------------------------------------------------


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                                max_size=4),
    max_leaves=12,
)
claim_names = st.sampled_from(["iss", "aud", "sub", "exp", "nbf", "iat", "roles", "jti", "x"])


@settings(max_examples=300, deadline=None)
@given(st.text() | st.text(alphabet="abcXYZ019-_.=")
       | st.binary().map(lambda b: b.decode("latin-1")))
def test_arbitrary_text_only_raises_auth_error(verifier: JwtVerifier, text: str) -> None:
    with pytest.raises(AuthError) as info:
        verifier.verify(text, now=NOW)
    assert info.value.reason in AUTH_REASONS


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(["alg", "kid", "typ", "crit", "b64", "jku"]), json_values),
       st.dictionaries(claim_names, json_values), st.binary(max_size=80))
def test_arbitrary_structured_tokens_only_raise_auth_error(
        verifier: JwtVerifier, header: dict[str, Any], payload: dict[str, Any], sig: bytes) -> None:
    with pytest.raises(AuthError):
        verifier.verify(handmade(header, payload, sig), now=NOW)


@st.composite
def spoiled_claims(draw: st.DrawFn) -> tuple[dict[str, Any], set[str]]:
    """Valid claims with up to three of them removed or replaced by arbitrary JSON."""
    payload = claims(nbf=int(NOW) - 60, roles=["viewer", "root"])
    spoiled = draw(st.sets(st.sampled_from(sorted(payload)), max_size=3))
    for name in spoiled:
        value = draw(st.none() | json_values)
        if value is None:
            del payload[name]
        else:
            payload[name] = value
    return payload, spoiled


@settings(max_examples=300, deadline=None)
@given(spoiled_claims())
def test_correctly_signed_arbitrary_claims(verifier: JwtVerifier,
                                           case: tuple[dict[str, Any], set[str]]) -> None:
    """Signed by the right key, any claims give a principal or an AuthError, nothing else."""
    payload, spoiled = case
    # PyJWT's encoder refuses some odd claims (e.g. a non-string iss): sign the JSON directly.
    token = jwt.api_jws.encode(json.dumps(payload).encode(), EC_KEY, algorithm="ES256",
                               headers={"kid": "ec1"})
    try:
        p = verifier.verify(token, now=NOW)
    except AuthError as exc:
        assert exc.reason in AUTH_REASONS
        assert spoiled, f"valid claims refused: {exc}"
    else:
        assert payload["iss"] == ISS and payload["sub"] == p.name
        assert p.roles and p.roles <= set(ACCESS_ROLES)
        assert payload["exp"] > NOW - 30


# --- audit log ---------------------------------------------------------------------------------


TS = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$")


def test_audit_log_records(tmp_path: Path, verifier: JwtVerifier) -> None:
    token = sign(claims(roles=["viewer", "operator"]))
    who = verifier.verify(token, now=NOW)
    path = tmp_path / "audit.log"
    with AuditLog(path, clock=lambda: 1_700_000_000.5) as log:
        assert log.enabled
        log.record(method="Members", principal=who, allowed=True, code="OK", peer="ipv4:1.2.3.4:5")
        log.record(method="KeysInstall", principal=who, allowed=False, code="PERMISSION_DENIED",
                   peer="ipv6:[::1]:9", detail="requires one of: admin\nsecond line")
        log.record(method="Rtt", principal=None, allowed=False, code="UNAUTHENTICATED",
                   peer="unix:", detail="bad_signature")
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    text = path.read_text()
    assert token not in text and token.split(".")[2] not in text
    lines = text.splitlines()
    assert len(lines) == 3
    records = [json.loads(line) for line in lines]
    fields = {"ts", "method", "principal", "roles", "allowed", "code", "peer", "detail"}
    assert all(set(r) == fields for r in records)
    assert all(TS.match(r["ts"]) for r in records)
    assert records[0]["ts"] == "2023-11-14T22:13:20.500Z"
    assert records[0] == {**records[0], "method": "Members", "principal": f"jwt:{ISS}/alice",
                          "roles": ["operator", "viewer"], "allowed": True, "code": "OK",
                          "detail": ""}
    assert records[1]["detail"] == "requires one of: admin\nsecond line"
    assert records[2]["principal"] is None and records[2]["roles"] == []


def test_audit_log_appends_and_drops_after_close(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    for _ in range(2):
        log = AuditLog(path)
        log.record(method="Members", principal=principal("viewer"), allowed=True, code="OK",
                   peer="p")
        log.close()
        log.record(method="Members", principal=None, allowed=True, code="OK", peer="p")
        log.close()
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["principal"] for r in records] == ["spiffe://mesh.test/user/alice"] * 2


def test_audit_log_disabled() -> None:
    log = AuditLog(None)
    assert not log.enabled
    log.record(method="Members", principal=None, allowed=False, code="X", peer="p")
    log.close()


def test_audit_log_is_thread_safe(tmp_path: Path) -> None:
    path = tmp_path / "audit.log"
    log = AuditLog(path)
    detail = "x" * 5000  # long lines would interleave without the lock

    def work(n: int) -> None:
        for i in range(100):
            log.record(method=f"M{n}", principal=principal("admin"), allowed=True, code="OK",
                       peer=str(i), detail=detail)

    threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    log.close()
    records = [json.loads(line) for line in path.read_text().splitlines()]
    assert len(records) == 800
    assert all(r["detail"] == detail for r in records)
