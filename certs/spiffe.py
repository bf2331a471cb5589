"""SPIFFE IDs: ``spiffe://<trust domain>/<kind>/<name>``.

A node's certificate carries ``spiffe://D/node/<name>`` as its only URI SAN, and people's
client certificates ``spiffe://D/user/<name>``.  Parsing is strict because the ID is what RBAC
and the trust-domain check read; anything not exactly of this shape is refused.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

KINDS = ("node", "user")
_TRUST_DOMAIN = re.compile(r"^[a-z0-9]([a-z0-9.\-_]{0,253}[a-z0-9])?$")
_NAME = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9.\-_]{0,126}[A-Za-z0-9])?$")


class SpiffeError(ValueError):
    """A trust domain, name or SPIFFE ID that does not follow the rules above."""


def check_trust_domain(td: str) -> str:
    """SPIFFE trust domains are lower-case DNS-like labels (``[a-z0-9.-_]``)."""
    if not _TRUST_DOMAIN.match(td) or ".." in td:
        raise SpiffeError(f"trust domain {td!r} must be lower-case letters, digits, '.', '-' "
                          "or '_' (at most 255 characters)")
    return td


def check_name(name: str) -> str:
    """Names become a path segment and a DNS label, so only ``[A-Za-z0-9.-_]`` is allowed."""
    if not _NAME.match(name):
        raise SpiffeError(f"name {name!r} must be 1..128 letters, digits, '.', '-' or '_', "
                          "starting and ending with a letter or digit")
    return name


@dataclass(frozen=True, slots=True)
class SpiffeId:
    trust_domain: str
    kind: str
    name: str

    def __post_init__(self) -> None:
        check_trust_domain(self.trust_domain)
        if self.kind not in KINDS:
            raise SpiffeError(f"kind {self.kind!r} is not one of {', '.join(KINDS)}")
        check_name(self.name)

    @classmethod
    def node(cls, trust_domain: str, name: str) -> SpiffeId:
        return cls(trust_domain, "node", name)

    @classmethod
    def parse(cls, uri: str) -> SpiffeId:
        prefix = "spiffe://"
        if not uri.startswith(prefix):
            raise SpiffeError(f"{uri!r} is not a spiffe:// URI")
        parts = uri[len(prefix):].split("/")
        if len(parts) != 3:
            raise SpiffeError(f"{uri!r} is not spiffe://DOMAIN/KIND/NAME")
        return cls(*parts)

    def __str__(self) -> str:
        return f"spiffe://{self.trust_domain}/{self.kind}/{self.name}"

    def dns_names(self) -> list[str]:
        """``<name>.<kind>.<D>`` for exact hostname checks, and for nodes ``node.<D>``: the name
        a client uses when any mesh node will do (as Consul's ``server.<dc>.consul``)."""
        names = [f"{self.name.lower()}.{self.kind}.{self.trust_domain}"]
        if self.kind == "node":
            names.append(any_node_dns(self.trust_domain))
        return names


def any_node_dns(trust_domain: str) -> str:
    """The DNS SAN every node certificate carries; clients that only know an address check it."""
    return f"node.{trust_domain}"
