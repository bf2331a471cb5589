"""Why the admin API could not be reached: a refused certificate told apart from a dead node.

gRPC reports every failed TLS handshake as UNAVAILABLE "Socket closed" or "failed to connect",
which is also what a node that is down looks like, so an operator holding the wrong
certificate goes looking for a crash.  When a call ends UNAVAILABLE, meshctl looks for itself:
its own certificate's dates, then a plain TCP connection, then a TLS handshake of its own with
the same identity and the first bytes a gRPC client sends.  A gRPC server answers those with
its SETTINGS; one that refused our certificate sends an alert or (gRPC's own TLS, 1.3) just
closes the connection, and then the issuers of its certificate and ours say which refusal it
most likely was.  Each step answers in words, or says nothing when TLS was not the problem.
"""

from __future__ import annotations

import datetime as dt
import socket
import ssl
from pathlib import Path

from cryptography import x509

from certs import tls
from certs.identity import Identity

H2_PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + bytes((0, 0, 0, 4, 0, 0, 0, 0, 0))
"""What a gRPC client sends first (the HTTP/2 preface and an empty SETTINGS frame): a server
that refuses our certificate after a TLS 1.3 handshake says so in reply to it."""

ALERTS = {
    "TLSV1_ALERT_UNKNOWN_CA": "it is not from a CA the server trusts (a certificate of "
                              "another mesh?)",
    "SSLV3_ALERT_CERTIFICATE_EXPIRED": "it has expired, by the server's clock",
    "SSLV3_ALERT_CERTIFICATE_REVOKED": "it has been revoked",
    "SSLV3_ALERT_BAD_CERTIFICATE": "the server rejected it (bad certificate)",
    "SSLV3_ALERT_UNSUPPORTED_CERTIFICATE": "the server does not accept its kind",
    "TLSV13_ALERT_CERTIFICATE_REQUIRED": "the server requires one and got none",
    "SSLV3_ALERT_HANDSHAKE_FAILURE": "the handshake failed",
}
"""The TLS alerts a server sends about a client's certificate, in an operator's words."""


def explain(target: str, creds: Path, *, timeout: float = 3.0,
            now: dt.datetime | None = None) -> str | None:
    """Why ``target``'s admin API did not answer meshctl presenting the identity in ``creds``,
    or None when the certificates are not the reason."""
    ident = Identity.load(creds)
    now = now or dt.datetime.now(dt.UTC)
    cert = ident.cert
    start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
    if now < start:
        return (f"our certificate ({creds}) is not valid until {start:%Y-%m-%d %H:%M:%S} UTC: "
                "is this machine's clock right?")
    if now > end:
        return (f"our certificate ({creds}) expired at {end:%Y-%m-%d %H:%M:%S} UTC: get a new "
                "one (`meshctl cert issue` on the CA holder)")
    host, _, port = target.rpartition(":")
    host = host.strip("[]")
    try:
        raw = socket.create_connection((host, int(port)), timeout=timeout)
    except ConnectionRefusedError:
        return (f"nothing accepts connections at {target}: is the agent running, and is "
                "--admin its admin address?")
    except (OSError, ValueError) as exc:
        return f"cannot reach {target}: {exc}"
    ctx = tls.client_context(creds)
    ctx.set_alpn_protocols(["h2"])  # a gRPC server closes a connection offering no HTTP/2
    try:
        with raw, ctx.wrap_socket(raw, server_hostname=host or None) as conn:
            conn.settimeout(timeout)
            peer = conn.getpeercert(binary_form=True)
            server_cert = x509.load_der_x509_certificate(peer) if peer else None
            conn.sendall(H2_PREFACE)
            if conn.recv(9):  # the server's SETTINGS: TLS is not the problem
                return None
    except ssl.SSLCertVerificationError as exc:
        return (f"the server's certificate is not from this mesh's CA ({exc.verify_message}): "
                f"is {target} a node of trust domain {ident.spiffe_id.trust_domain}?")
    except ssl.SSLError as exc:
        reason = str(exc.reason or exc)
        if "ALERT" in reason:
            why = ALERTS.get(reason, reason.lower().replace("_", " "))
            return f"the server refused our certificate ({creds}): {why}"
        return f"TLS with {target} failed: {reason}"
    except ConnectionResetError:
        pass  # refused, as a close is
    except (TimeoutError, OSError):
        return None  # TLS went through; the failure was elsewhere
    if server_cert is not None and server_cert.issuer != cert.issuer:
        why = ("it is not from the CA that issued the server's certificate (a certificate of "
               "another mesh?)")
    else:
        why = ("it is from the server's own CA, so the server holds it revoked, or expired by "
               "its clock")
    return (f"the server refused our certificate ({creds}): it closed the connection right "
            f"after the TLS handshake; {why}")
