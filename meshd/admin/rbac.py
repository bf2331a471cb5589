"""Role-based access control for the admin gRPC API.

Callers are identified two ways: by their mTLS client certificate (a node or a person, named by
the certificate's SPIFFE ID, roles from the certificate's roles extension) or by an OIDC-style
bearer token (roles from a claim).  Either way they become a :class:`Principal`; a
:class:`Policy` then says which admin methods each access role may call, and an
:class:`AuditLog` records every decision.

Pure logic: no gRPC here, so the rules can be tested without a server, and the only I/O is
reading the policy / key files and appending to the audit log.
"""

from __future__ import annotations

import json
import math
import os
import time
import tomllib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import jwt
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa

from meshd.security.audit import AuditLog as AuditLog  # re-exported: its home is below us

ACCESS_ROLES = ("admin", "operator", "viewer", "node")
"""What a caller may be allowed to do (not to be confused with a node's gossip roles)."""

PRINCIPAL_KINDS = ("node", "user", "jwt")
"""``node``/``user``: mTLS certificate holders (the SPIFFE ID's kind); ``jwt``: bearer tokens."""

ALL_METHODS = "*"
"""A grant of every admin method, including ones added after the policy was written."""

AUTH_REASONS = (
    "missing",
    "malformed",
    "bad_algorithm",
    "bad_signature",
    "unknown_key",
    "expired",
    "not_yet_valid",
    "wrong_audience",
    "wrong_issuer",
    "no_subject",
    "no_roles",
)
"""Why authentication failed; small and fixed so it can be a metric label."""

ALLOWED_ALGORITHMS = ("ES256", "ES384", "RS256", "PS256", "EdDSA")
"""Asymmetric only: never ``none``, and never HS* so a public key can't double as an HMAC
secret (the classic algorithm-confusion forgery)."""

MAX_TOKEN_LENGTH = 16 * 1024
"""Longer tokens are refused before any parsing: real ones are a few KiB at most."""

MAX_KEY_FILE_BYTES = 1024 * 1024

PublicKey = rsa.RSAPublicKey | ec.EllipticCurvePublicKey | ed25519.Ed25519PublicKey
_PUBLIC_KEY_TYPES = (rsa.RSAPublicKey, ec.EllipticCurvePublicKey, ed25519.Ed25519PublicKey)

MIN_RSA_BITS = 2048

_DEFAULT_MESSAGES = {
    "missing": "no bearer token",
    "malformed": "bearer token is malformed",
    "bad_algorithm": "bearer token algorithm is not accepted "
                     f"(accepted: {', '.join(ALLOWED_ALGORITHMS)})",
    "bad_signature": "bearer token signature does not verify",
    "unknown_key": "bearer token is signed with a key this server does not know",
    "expired": "bearer token has expired",
    "not_yet_valid": "bearer token is not valid yet",
    "wrong_audience": "bearer token is for another audience",
    "wrong_issuer": "bearer token is from another issuer",
    "no_subject": "bearer token has no subject (sub)",
    "no_roles": "bearer token grants none of the access roles",
}


class AuthError(Exception):
    """The caller could not be authenticated.

    ``reason`` is one of :data:`AUTH_REASONS` (for metrics); the message is for humans and
    never contains the token, only what was wrong with it.
    """

    def __init__(self, reason: str, message: str = "") -> None:
        if reason not in AUTH_REASONS:
            raise ValueError(f"unknown auth failure reason {reason!r}")
        super().__init__(message or _DEFAULT_MESSAGES[reason])
        self.reason = reason


class PolicyError(ValueError):
    """A policy that cannot be used; the message names the file, role or method."""


class KeyLoadError(ValueError):
    """A JWKS or PEM file that cannot be used; the message names the file (never key bytes)."""


# --- principals --------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling, as far as access control cares.

    ``roles`` may hold strings that are not access roles (a certificate can carry anything);
    the policy simply ignores them.
    """

    kind: str
    name: str
    roles: frozenset[str]
    spiffe_id: str = ""
    issuer: str = ""
    """The token issuer for ``jwt`` principals: the same ``sub`` from two issuers is two people."""

    def __post_init__(self) -> None:
        if self.kind not in PRINCIPAL_KINDS:
            raise ValueError(f"principal kind {self.kind!r} is not one of "
                             f"{', '.join(PRINCIPAL_KINDS)}")

    @property
    def label(self) -> str:
        """A stable, unique name for logs and audit records."""
        if self.kind == "jwt":
            return f"jwt:{self.issuer}/{self.name}"
        return self.spiffe_id or f"{self.kind}:{self.name}"

    def access_roles(self) -> tuple[str, ...]:
        """The roles the policy looks at, in :data:`ACCESS_ROLES` order."""
        return tuple(r for r in ACCESS_ROLES if r in self.roles)


# --- policy ------------------------------------------------------------------------------------


class Policy:
    """Which admin methods (by short name, e.g. ``"Members"``) each access role may call.

    The method lists come from the caller (the admin service knows its methods; this module
    does not), so adding an RPC never silently changes who may call it: it is admin-only
    until listed.  A role missing from ``grants`` may call nothing.
    """

    def __init__(self, grants: Mapping[str, Iterable[str]],
                 known_methods: Iterable[str] | None = None) -> None:
        self.known_methods = None if known_methods is None else frozenset(known_methods)
        checked: dict[str, frozenset[str]] = {}
        for role, methods in grants.items():
            if role not in ACCESS_ROLES:
                raise PolicyError(f"role {role!r} is not one of {', '.join(ACCESS_ROLES)}")
            if isinstance(methods, str) or not isinstance(methods, Iterable):
                # (a bare string would be iterated character by character)
                raise PolicyError(f"role {role!r}: methods must be a list of strings, "
                                  f"got {type(methods).__name__}")
            names = list(methods)
            for method in names:
                self._check_method(role, method)
            checked[role] = frozenset(names)
        self.grants: Mapping[str, frozenset[str]] = checked

    def _check_method(self, role: str, method: object) -> None:
        if not isinstance(method, str) or not method:
            raise PolicyError(f"role {role!r}: method {method!r} is not a method name")
        if method == ALL_METHODS or self.known_methods is None:
            return
        if method not in self.known_methods:
            raise PolicyError(f"role {role!r}: unknown method {method!r}; known: "
                              f"{', '.join(sorted(self.known_methods))}")

    @classmethod
    def default(cls, read_only: Iterable[str], operational: Iterable[str],
                node_only: Iterable[str] = ()) -> Policy:
        """The built-in policy: viewers and nodes read, operators also operate, admins do all.

        Nodes get the read-only methods plus ``node_only`` (the Consensus service: following
        the log and forwarding writes).  A forwarded write a person made is judged again by
        the coordinator, on the person's own credential and for the method they called (see
        :meth:`meshd.admin.authz.Authorizer.forwarded`), so a node certificate alone writes
        only what the agent writes by itself (training leases, its own automatic quarantine).
        """
        ro = frozenset(read_only)
        ops = frozenset(operational)
        nodes = frozenset(node_only)
        return cls({"viewer": ro, "node": ro | nodes, "operator": ro | ops,
                    "admin": frozenset({ALL_METHODS})},
                   known_methods=ro | ops | nodes)

    @classmethod
    def load(cls, path: str | os.PathLike[str], known_methods: Iterable[str] | None) -> Policy:
        """Read a TOML policy (``[roles]`` table of role -> method list).

        The file replaces the default entirely, so a role it leaves out may call nothing.
        Every error names the file and what is wrong, so a typo fails at start-up.
        """
        where = f"policy {os.fspath(path)}"
        try:
            with open(path, "rb") as fh:
                doc = tomllib.load(fh)
        except OSError as exc:
            raise PolicyError(f"{where}: cannot read: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise PolicyError(f"{where}: not valid TOML: {exc}") from None
        extra = sorted(set(doc) - {"roles"})
        if extra:
            raise PolicyError(f"{where}: unknown key {extra[0]!r} (expected only [roles])")
        roles = doc.get("roles")
        if not isinstance(roles, dict):
            raise PolicyError(f"{where}: needs a [roles] table mapping role -> method list")
        for role, methods in roles.items():
            if not isinstance(methods, list):
                raise PolicyError(f"{where}: role {role!r}: methods must be a list of strings, "
                                  f"got {type(methods).__name__}")
        try:
            return cls(roles, known_methods)
        except PolicyError as exc:
            raise PolicyError(f"{where}: {exc}") from None

    def _grants(self, role: str, method: str) -> bool:
        granted = self.grants.get(role, frozenset())
        return ALL_METHODS in granted or method in granted

    def allows(self, principal: Principal, method: str) -> bool:
        """True if any of the principal's access roles grants ``method``."""
        return any(self._grants(role, method) for role in principal.access_roles())

    def roles_for(self, method: str) -> tuple[str, ...]:
        """The roles that may call ``method`` (for "requires one of: ..." messages)."""
        return tuple(role for role in ACCESS_ROLES if self._grants(role, method))


# --- bearer tokens -----------------------------------------------------------------------------


def _algorithms_for(key: PublicKey) -> frozenset[str]:
    """The algorithms a key can verify; ES curves are fixed by the algorithm."""
    if isinstance(key, rsa.RSAPublicKey):
        return frozenset({"RS256", "PS256"})
    if isinstance(key, ec.EllipticCurvePublicKey):
        return frozenset({"ES256"} if isinstance(key.curve, ec.SECP256R1) else
                         {"ES384"} if isinstance(key.curve, ec.SECP384R1) else set())
    return frozenset({"EdDSA"})


def _check_key(kid: str | None, key: object) -> None:
    what = f"key {kid!r}" if kid is not None else "key"
    if isinstance(key, rsa.RSAPublicKey):
        if key.key_size < MIN_RSA_BITS:
            raise ValueError(f"{what}: RSA keys must have at least {MIN_RSA_BITS} bits, "
                             f"got {key.key_size}")
    elif isinstance(key, ec.EllipticCurvePublicKey):
        if not isinstance(key.curve, ec.SECP256R1 | ec.SECP384R1):
            raise ValueError(f"{what}: EC curve {key.curve.name} is not P-256 or P-384")
    elif not isinstance(key, _PUBLIC_KEY_TYPES):
        raise ValueError(f"{what}: {type(key).__name__} is not an RSA, EC or Ed25519 public key")


def _read_key_file(path: str | os.PathLike[str]) -> bytes:
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_KEY_FILE_BYTES + 1)
    except OSError as exc:
        raise KeyLoadError(f"cannot read {os.fspath(path)}: {exc.strerror}") from None
    if len(data) > MAX_KEY_FILE_BYTES:
        raise KeyLoadError(f"{os.fspath(path)} is larger than {MAX_KEY_FILE_BYTES} bytes")
    return data


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


class JwtVerifier:
    """Verifies OIDC-style bearer tokens and turns them into :class:`Principal` objects.

    ``keys`` maps a key id (``kid``) to a public key; the ``None`` entry, if any, is used for
    tokens whose ``kid`` matches no other key (a single PEM key has no id).  Claims are checked
    only once the signature verifies, so a forger cannot use the failure reasons to probe them.
    """

    def __init__(self, *, audience: str, issuer: str, keys: Mapping[str | None, PublicKey],
                 leeway: float = 30.0, roles_claim: str = "roles",
                 algorithms: Iterable[str] = ALLOWED_ALGORITHMS) -> None:
        if not audience or not issuer:
            raise ValueError("audience and issuer must be non-empty")
        if not math.isfinite(leeway) or leeway < 0:
            raise ValueError(f"leeway must be a finite number >= 0, got {leeway}")
        if not roles_claim:
            raise ValueError("roles_claim must be non-empty")
        algs = frozenset(algorithms)
        bad = sorted(algs - set(ALLOWED_ALGORITHMS))
        if bad:
            raise ValueError(f"algorithm {bad[0]!r} is not allowed; use some of "
                             f"{', '.join(ALLOWED_ALGORITHMS)}")
        if not algs:
            raise ValueError("at least one algorithm is needed")
        if not keys:
            raise ValueError("at least one key is needed")
        for kid, key in keys.items():
            _check_key(kid, key)
        self.audience = audience
        self.issuer = issuer
        self.leeway = float(leeway)
        self.roles_claim = roles_claim
        self.algorithms = algs
        self._keys = dict(keys)

    @classmethod
    def from_jwks_file(cls, path: str | os.PathLike[str], *, audience: str, issuer: str,
                       leeway: float = 30.0, roles_claim: str = "roles",
                       algorithms: Iterable[str] = ALLOWED_ALGORITHMS) -> JwtVerifier:
        """Keys from a JWKS document (``{"keys": [...]}``, as an IdP publishes it).

        Keys marked for encryption (``"use": "enc"``) and keys PyJWT cannot use are skipped;
        symmetric or private keys are refused: a public key set holding them is a mistake.
        """
        name = os.fspath(path)
        try:
            doc = json.loads(_read_key_file(path))
        except (ValueError, RecursionError):
            raise KeyLoadError(f"{name} is not valid JSON") from None
        if not isinstance(doc, dict) or not isinstance(doc.get("keys"), list):
            raise KeyLoadError(f"{name} is not a JWKS document ({{\"keys\": [...]}})")
        try:
            jwks = jwt.PyJWKSet.from_dict(doc)
        except jwt.PyJWTError as exc:
            raise KeyLoadError(f"{name}: {exc}") from None
        keys: dict[str | None, PublicKey] = {}
        for jwk in jwks:
            if jwk.public_key_use not in (None, "sig"):
                continue
            kid = jwk.key_id
            what = f"{name}: key {kid!r}" if kid is not None else f"{name}: a key without kid"
            if jwk.key_type == "oct":
                raise KeyLoadError(f"{what} is a symmetric key; only public keys belong here")
            if not isinstance(jwk.key, _PUBLIC_KEY_TYPES):
                raise KeyLoadError(f"{what} is not a supported public key "
                                   "(private keys do not belong in a JWKS file)")
            if kid in keys:
                raise KeyLoadError(f"{what} appears twice")
            keys[kid] = jwk.key
        if not keys:
            raise KeyLoadError(f"{name} has no signing keys")
        try:
            return cls(audience=audience, issuer=issuer, keys=keys, leeway=leeway,
                       roles_claim=roles_claim, algorithms=algorithms)
        except ValueError as exc:
            raise KeyLoadError(f"{name}: {exc}") from None

    @classmethod
    def from_public_key_file(cls, path: str | os.PathLike[str], *, audience: str, issuer: str,
                             leeway: float = 30.0, roles_claim: str = "roles",
                             algorithms: Iterable[str] = ALLOWED_ALGORITHMS) -> JwtVerifier:
        """One PEM public key (``-----BEGIN PUBLIC KEY-----``), for issuers without a JWKS."""
        name = os.fspath(path)
        data = _read_key_file(path)
        if b"PRIVATE KEY" in data:
            raise KeyLoadError(f"{name} holds a private key; give the verifier the public key")
        try:
            key = serialization.load_pem_public_key(data)
        except (ValueError, TypeError):
            raise KeyLoadError(f"{name} is not a PEM public key") from None
        if not isinstance(key, _PUBLIC_KEY_TYPES):
            raise KeyLoadError(f"{name}: {type(key).__name__} is not an RSA, EC or Ed25519 "
                               "public key")
        try:
            return cls(audience=audience, issuer=issuer, keys={None: key},
                       leeway=leeway, roles_claim=roles_claim, algorithms=algorithms)
        except ValueError as exc:
            raise KeyLoadError(f"{name}: {exc}") from None

    def verify(self, token: str, now: float | None = None) -> Principal:
        """The principal a bearer token names, or :class:`AuthError` (and nothing else).

        ``now`` (Unix seconds) is for tests and replays; PyJWT only knows the wall clock, so
        it verifies signature, audience, issuer and presence of claims, and the time checks
        are done here.
        """
        if not isinstance(token, str) or not token:
            raise AuthError("missing")
        if len(token) > MAX_TOKEN_LENGTH:
            raise AuthError("malformed", f"bearer token is longer than {MAX_TOKEN_LENGTH} "
                            "characters")
        if not token.isascii():  # base64url and dots only: refuse anything else before parsing
            raise AuthError("malformed")
        try:
            claims = self._decode(token)
        except jwt.PyJWTError as exc:
            raise _auth_error(exc, self) from None
        except (ValueError, TypeError, KeyError, OverflowError, RecursionError):
            raise AuthError("malformed") from None
        return self._principal(claims, time.time() if now is None else now)

    def _decode(self, token: str) -> dict[str, Any]:
        header = jwt.get_unverified_header(token)
        alg = header.get("alg")
        if not isinstance(alg, str) or alg not in self.algorithms:
            raise AuthError("bad_algorithm", "bearer token algorithm is not accepted "
                            f"(accepted: {', '.join(sorted(self.algorithms))})")
        kid = header.get("kid")  # PyJWT has checked it is a string if present
        if kid is not None and kid in self._keys:
            key = self._keys[kid]
        elif None in self._keys:
            key = self._keys[None]
        elif kid is None and len(self._keys) == 1:
            key = next(iter(self._keys.values()))
        elif kid is not None:
            raise AuthError("unknown_key")
        else:
            raise AuthError("unknown_key", "bearer token names no key (kid) and this server "
                            "has several")
        if alg not in _algorithms_for(key):
            raise AuthError("bad_algorithm", f"bearer token algorithm {alg} does not fit "
                            "its signing key")
        return jwt.decode(
            token, key=key, algorithms=[alg], audience=self.audience, issuer=self.issuer,
            options={"require": ["exp", "sub", "iss", "aud"], "verify_exp": False,
                     "verify_nbf": False, "verify_iat": False},
        )

    def _principal(self, claims: dict[str, Any], now: float) -> Principal:
        for claim in ("exp", "nbf", "iat"):
            if claim in claims and not _is_number(claims[claim]):
                raise AuthError("malformed", f"bearer token claim {claim} is not a number")
        exp = float(claims["exp"])
        if exp <= now - self.leeway:
            raise AuthError("expired", f"bearer token expired {now - exp:.0f} s ago")
        for claim in ("nbf", "iat"):
            if claim in claims and float(claims[claim]) > now + self.leeway:
                raise AuthError("not_yet_valid", f"bearer token is not valid for another "
                                f"{float(claims[claim]) - now:.0f} s ({claim})")
        sub = claims["sub"]
        if not isinstance(sub, str) or not sub.strip():
            raise AuthError("no_subject")
        raw = claims.get(self.roles_claim)
        names = raw.split() if isinstance(raw, str) else raw if isinstance(raw, list) else []
        roles = frozenset(r for r in names if isinstance(r, str) and r in ACCESS_ROLES)
        if not roles:
            raise AuthError("no_roles", f"bearer token claim {self.roles_claim!r} grants none "
                            f"of the access roles ({', '.join(ACCESS_ROLES)})")
        return Principal(kind="jwt", name=sub, roles=roles, issuer=self.issuer)


def _auth_error(exc: jwt.PyJWTError, verifier: JwtVerifier) -> AuthError:
    """Our reason for a PyJWT failure.  PyJWT's own message is not reused: some quote header
    fields, and messages must never carry token text."""
    # Subclasses first: InvalidSignatureError is a DecodeError.
    if isinstance(exc, jwt.InvalidSignatureError):
        return AuthError("bad_signature")
    if isinstance(exc, jwt.ExpiredSignatureError):
        return AuthError("expired")
    if isinstance(exc, jwt.ImmatureSignatureError):
        return AuthError("not_yet_valid")
    if isinstance(exc, jwt.InvalidAudienceError):
        return AuthError("wrong_audience",
                         f"bearer token is not for audience {verifier.audience!r}")
    if isinstance(exc, jwt.InvalidIssuerError):
        return AuthError("wrong_issuer", f"bearer token is not from issuer {verifier.issuer!r}")
    if isinstance(exc, jwt.exceptions.InvalidSubjectError):
        return AuthError("no_subject")
    if isinstance(exc, jwt.MissingRequiredClaimError):
        if exc.claim == "aud":
            return AuthError("wrong_audience", "bearer token has no audience (aud)")
        if exc.claim == "iss":
            return AuthError("wrong_issuer", "bearer token has no issuer (iss)")
        if exc.claim == "sub":
            return AuthError("no_subject")
        return AuthError("malformed", f"bearer token has no {exc.claim} claim")
    if isinstance(exc, jwt.InvalidAlgorithmError):
        return AuthError("bad_algorithm")
    if isinstance(exc, jwt.InvalidKeyError):
        return AuthError("unknown_key", "bearer token does not fit the configured key")
    return AuthError("malformed")

