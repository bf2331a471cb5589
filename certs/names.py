"""Host names and IP addresses a node certificate carries besides its SPIFFE ID.

A client that checks host names the ordinary way (tritonclient, grpcurl, curl: the name or
address it dialled must be among the certificate's DNS or IP SANs) needs them.  The node asks
for them in its CSR (derived from its settings, plus ``--cert-san``), and the CA checks each:
DNS names (letters, digits and hyphens, no wildcards) and IP addresses only, at most
:data:`MAX_NAMES`, and none of the names the mesh derives from SPIFFE IDs (``node.<D>``,
``<name>.<kind>.<D>``) but the node's own: those say which mesh identity holds the
certificate (``certs.tls.grpc_channel`` checks them), so they are the CA's to give.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable, Sequence

from cryptography import x509

from certs.spiffe import KINDS, SpiffeId

MAX_NAMES = 32
"""DNS names and IP addresses one certificate may ask for (the SPIFFE URI not counted)."""
MAX_DNS = 253
_LABEL = re.compile(r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$")

HostName = x509.DNSName | x509.IPAddress


class SanError(ValueError):
    """A host name or address a certificate may not carry; the message says why."""


def check_dns(name: str) -> str:
    """``name`` lower-cased (one trailing dot dropped), once it is a plain DNS host name."""
    text = name.strip().lower()
    if text.endswith("."):
        text = text[:-1]
    if "*" in text:
        raise SanError(f"DNS name {name!r}: wildcard names are not issued")
    if not text or len(text) > MAX_DNS:
        raise SanError(f"DNS name {name!r} must be 1..{MAX_DNS} characters")
    labels = text.split(".")
    for label in labels:
        if not _LABEL.match(label):
            raise SanError(f"DNS name {name!r}: each label must be 1..63 letters, digits or "
                             "'-', not starting or ending with '-'")
    if labels[-1].isdigit():
        raise SanError(f"DNS name {name!r} looks like an IP address; give addresses as IP "
                         "addresses")
    return text


def check_ip(addr: object) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """One usable host address: not a network, unspecified, multicast or zone-scoped."""
    if not isinstance(addr, ipaddress.IPv4Address | ipaddress.IPv6Address):
        raise SanError(f"IP SAN {addr}: a single host address is required, not a network")
    if isinstance(addr, ipaddress.IPv6Address) and addr.scope_id:
        raise SanError(f"IP address {addr}: zone indexes (%...) cannot be certified")
    if addr.is_unspecified or addr.is_multicast:
        raise SanError(f"IP address {addr} is not a host address (unspecified or multicast)")
    return addr


def parse_name(text: str) -> HostName:
    """A ``--cert-san`` entry: an IP address (v6 with or without brackets) or a DNS name."""
    raw = text.strip()
    literal = raw[1:-1] if raw.startswith("[") and raw.endswith("]") else raw
    try:
        addr = ipaddress.ip_address(literal)
    except ValueError:
        return x509.DNSName(check_dns(raw))
    return x509.IPAddress(check_ip(addr))


def to_names(items: Iterable[str | x509.GeneralName]) -> list[HostName]:
    """Parsed and checked, duplicates dropped, order kept (no count limit: see
    :func:`check_requested`)."""
    out: list[HostName] = []
    for item in items:
        name = parse_name(item) if isinstance(item, str) else _checked(item)
        if name not in out:
            out.append(name)
    return out


def _checked(name: x509.GeneralName) -> HostName:
    if isinstance(name, x509.DNSName):
        return x509.DNSName(check_dns(name.value))
    if isinstance(name, x509.IPAddress):
        return x509.IPAddress(check_ip(name.value))
    kind = {x509.RFC822Name: "email address", x509.UniformResourceIdentifier: "URI",
            x509.DirectoryName: "directory name", x509.RegisteredID: "registered ID",
            x509.OtherName: "other name"}.get(type(name), type(name).__name__)
    raise SanError(f"{kind} SAN {getattr(name, 'value', name)!s}: only the SPIFFE URI, DNS "
                     "names and IP addresses are issued")


def check_requested(sid: SpiffeId, names: Sequence[x509.GeneralName | str]) -> list[HostName]:
    """The host names a certificate for ``sid`` may carry, in request order without
    duplicates and without ``sid``'s own SPIFFE DNS names (the CA adds those).

    Raises :class:`SanError` for anything else: a name that is not a DNS name or IP address,
    one that is malformed, a SPIFFE-derived name that is not ``sid``'s, or more than
    :data:`MAX_NAMES` of them."""
    own = set(sid.dns_names())
    reserved = [f"{kind}.{sid.trust_domain}" for kind in KINDS]
    out: list[HostName] = []
    for name in to_names(names):
        if isinstance(name, x509.DNSName):
            if name.value in own:
                continue
            if any(name.value == r or name.value.endswith("." + r) for r in reserved):
                raise SanError(f"DNS name {name.value!r} is one the mesh gives SPIFFE "
                               f"identities ({', '.join(reserved)} and names under them); "
                               f"{sid} has {', '.join(sorted(own))}")
        out.append(name)
    if len(out) > MAX_NAMES:
        raise SanError(f"{len(out)} DNS names and IP addresses asked for; at most {MAX_NAMES}")
    return out


def host_names(san: Iterable[x509.GeneralName], sid: SpiffeId | None = None) -> set[str]:
    """The DNS names (lower case) and IP addresses (as ``ipaddress`` writes them) in ``san``,
    without ``sid``'s SPIFFE DNS names: what :func:`check_requested` would give back."""
    own = set(sid.dns_names()) if sid is not None else set()
    out: set[str] = set()
    for name in san:
        if isinstance(name, x509.DNSName) and name.value.lower() not in own:
            out.add(name.value.lower())
        elif isinstance(name, x509.IPAddress):
            out.add(str(name.value))
    return out


def cert_host_names(cert: x509.Certificate, sid: SpiffeId | None = None) -> set[str]:
    """:func:`host_names` of a certificate's SAN (empty without one)."""
    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return set()
    return host_names(san, sid)
