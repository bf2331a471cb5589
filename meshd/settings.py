"""Agent settings from a TOML file, ``MESHD_*`` environment variables and the command line.

Later sources win: defaults < ``--config`` file < environment < flags.  Every value is checked
here, so a typo fails at start-up with a message naming the setting rather than later at run time.
"""

from __future__ import annotations

import argparse
import dataclasses
import ipaddress
import os
import socket
import sys
import tomllib
from dataclasses import dataclass, field
from typing import Any

from adapters.triton import EndpointError, TritonEndpoint
from certs.names import MAX_NAMES, SanError, parse_name
from gossip.keyring import KeyringError, decode_key
from gossip.state import MESH_TAG, ROLES, Addr

DEFAULT_GOSSIP_PORT = 7946
DEFAULT_ADMIN_PORT = 7960
DEFAULT_METRICS_PORT = 9464
DEFAULT_RAFT_PORT = 7950
DEFAULT_SCORE_PORT = 7961
DEFAULT_ROUTER_PORT = 9000
DEFAULT_ROUTER_HTTP_PORT = 9001
MAX_ROUTER_WORKERS = 64
DEFAULT_ROUTER_INFLIGHT_MIB = 256
DEFAULT_ROUTER_NICE = 5


class SettingsError(ValueError):
    """A setting that cannot be used; the message names it."""


@dataclass(slots=True)
class Settings:
    node: str = field(default_factory=socket.gethostname)
    """Node name, unique in the mesh (default: the host name)."""
    bind: str = ""
    """Gossip address ``ADDR:PORT`` (UDP and TCP); empty binds 0.0.0.0 and :: on 7946."""
    advertise: str = ""
    """Address (``ADDR`` or ``ADDR:PORT``) others reach us at; default: the bind address, or the
    address of the interface that routes to the first seed."""
    join: list[str] = field(default_factory=list)
    """Seeds ``HOST:PORT`` to join through."""
    retry_join: bool = False
    """Keep retrying the join with exponential backoff until a seed answers."""
    retry_max: int = 0
    """Give up after this many join attempts (0: never)."""
    retry_interval: float = 1.0
    """First retry delay; doubles up to 30 s."""
    roles: list[str] = field(default_factory=list)
    zone: str = ""
    region: str = ""
    tags: dict[str, str] = field(default_factory=dict)
    encrypt: str = dataclasses.field(default="", repr=False)
    """Base64 AES-256 gossip key (secret: never logged)."""
    profile: str = "lan"
    """Protocol timings: lan, wan or local."""
    data_dir: str = ""
    """Where the agent keeps its identity, keyring, incarnation and last known members;
    default ``~/.meshd/<node>``."""
    admin: str = ""
    """Admin gRPC address (mTLS, RBAC); default: bind host if loopback, else 127.0.0.1, port
    7960."""
    metrics: str = ""
    """Prometheus ``/metrics`` address, or ``off``; default: bind host (or 0.0.0.0), port 9464."""
    log_level: str = "info"
    dev: bool = False
    """One-machine development: make a dev CA, this node's identity, a gossip key and an admin
    client identity (``<data-dir>/meshctl``) in the data dir.  Security stays on."""
    ca_dir: str = ""
    """This node holds the mesh CA in this directory (``meshctl ca init``): it signs
    enrollments, renewals and revocations."""
    join_token: str = dataclasses.field(default="", repr=False)
    """Token from ``meshctl token create`` to enroll through a seed (secret: never logged)."""
    trust_domain: str = ""
    """Trust domain of a ``--dev`` CA (default mesh.local); otherwise it comes from the CA."""
    cert_lifetime: float = 86400.0
    """Seconds a certificate issued by this node's CA is valid; renewed at two thirds."""
    rbac_policy: str = ""
    """TOML file mapping access roles to admin methods (default: the built-in policy)."""
    jwt_jwks: str = ""
    """JWKS file with the keys that sign people's bearer tokens (OIDC)."""
    jwt_key: str = ""
    """PEM public key that signs people's bearer tokens (instead of a JWKS file)."""
    jwt_audience: str = "meshd"
    jwt_issuer: str = ""
    audit_log: str = ""
    """JSON-lines audit log of admin calls; default ``<data-dir>/audit.log``, ``off`` for none."""
    bootstrap_expect: int = 0
    """Coordinators only: form the Raft groups once this many coordinators see each other
    (like Consul's ``-bootstrap-expect``); 0 joins an existing group only."""
    raft: str = ""
    """Raft address ``ADDR:PORT`` of the first group (coordinators; group *i* uses port +i);
    default: the advertise address, port 7950."""
    raft_timing: str = ""
    """Raft timings: lan (default for lan/local profiles) or wan (default for the wan profile)."""
    triton: list[str] = field(default_factory=list)
    """Triton servers to poll: ``HOST:PORT[,metrics=URL][,advertise=HOST:PORT]`` each (gRPC
    address; metrics default to port 8002 of the same host; advertise is what routers dial)."""
    gpu: str = "auto"
    """``auto``: read GPUs through NVML (CPU-only mode without a driver); ``off``: never."""
    queue_interval: float = 0.1
    """Seconds between polls of each runtime's queue depth."""
    stats_interval: float = 1.0
    """Seconds between polls of each runtime's statistics and model repository."""
    subscribe: list[str] = field(default_factory=list)
    """Peers whose telemetry to receive pushed (fresher than gossip): node names, or ``*`` for
    every peer that serves models."""
    score: str = ""
    """Score API address: ``HOST:PORT``, ``unix:PATH`` or ``off``; default 127.0.0.1:7961.
    Plaintext on loopback and Unix sockets, mTLS (client certificates) anywhere else."""
    router: str = ""
    """Router ingress (``--role router``), KServe v2 gRPC: ``HOST:PORT``; default: the bind
    host if loopback, else 0.0.0.0 (127.0.0.1 with ``--dev``), port 9000.  With ``--dev`` the
    router is plaintext, so it may listen on loopback only."""
    router_http: str = ""
    """Router ingress, KServe v2 HTTP/REST: ``HOST:PORT``, or ``off``; default: the gRPC
    ingress's host and the port after its (9001 beside the default 9000).  Same
    authentication and transport security as the gRPC ingress (plaintext, on loopback only,
    in ``--dev``)."""
    router_tokens: str = ""
    """File of per-tenant bearer tokens for router clients (``tenant token-sha256`` lines);
    without it (and outside ``--dev``) clients must present a mesh client certificate."""
    router_tls_front: bool = False
    """Terminate the router gRPC port's TLS in a TLS front (:mod:`meshd.security.front`)
    instead of in gRPC, so refused handshakes are counted and audited; it costs CPU per
    request (``bench/tls_front.py``).  The HTTP port counts them always."""
    cert_san: list[str] = field(default_factory=list)
    """Extra DNS names and IP addresses for this node's certificate (a load balancer's name,
    say), besides those :meth:`cert_names` derives from the addresses above."""
    router_workers: int = 1
    """Router worker processes serving the router's ports (``--role router``); the agent
    serves none itself, so no request shares a thread with gossip, Raft or the admin API.
    More than one shares the ports with SO_REUSEPORT (Linux), each on its own core: the
    kernel spreads client connections over them, one connection staying with one process.
    0 serves the router in the agent's own event loop, as before workers were the default
    (a request can then delay the control plane: for comparison only)."""
    router_inflight_mib: int = DEFAULT_ROUTER_INFLIGHT_MIB
    """MiB of request messages each router process holds in flight (received and not yet
    answered) at most; a request beyond it is shed (RESOURCE_EXHAUSTED, HTTP 429, reason
    ``memory``) before it is parsed."""
    router_nice: int = DEFAULT_ROUTER_NICE
    """How far below the agent's the router workers' CPU priority is (POSIX ``nice``, 0..19):
    where requests take every core, gossip, Raft and the admin API run first."""
    model_control: bool = False
    """This node's Triton runs ``--model-control-mode=explicit`` and takes the placement
    controller's replicas: meshd loads and unloads its models (meshd/models); without it
    nothing here loads or unloads a model."""
    model_slots: int = 1
    """CPU-only model replicas the node has room for (``--model-control`` without GPUs: NVML
    has no memory to size them by)."""
    model_target_utilisation: float = 0.7
    """On coordinators (the placement controller): the share of its time a model replica
    should be busy; demand of ``d`` seconds of work per second wants ``ceil(d / this)``."""
    model_cool_down: float = 120.0
    """On coordinators: seconds a model's demand must stay low before a replica is removed
    (adding one is immediate)."""

    # --- derived ---------------------------------------------------------------------------

    def gossip_binds(self) -> list[Addr]:
        if not self.bind:
            return [("0.0.0.0", DEFAULT_GOSSIP_PORT), ("::", DEFAULT_GOSSIP_PORT)]
        return [parse_hostport(self.bind, DEFAULT_GOSSIP_PORT, "bind")]

    def admin_addr(self) -> Addr:
        if self.admin:
            return parse_hostport(self.admin, DEFAULT_ADMIN_PORT, "admin")
        host = self.gossip_binds()[0][0]
        return (host if is_loopback(host) else "127.0.0.1", DEFAULT_ADMIN_PORT)

    def score_addr(self) -> Addr | str | None:
        """``(host, port)``, a Unix socket path, or None (``off``)."""
        if self.score == "off":
            return None
        if self.score.startswith("unix:"):
            path = self.score[5:]
            if not path:
                raise SettingsError("score: unix: needs a socket path")
            return path
        if self.score:
            return parse_hostport(self.score, DEFAULT_SCORE_PORT, "score")
        return ("127.0.0.1", DEFAULT_SCORE_PORT)

    def router_addr(self) -> Addr:
        if self.router:
            addr = parse_hostport(self.router, DEFAULT_ROUTER_PORT, "router")
            if self.dev and not is_loopback(addr[0]):
                raise SettingsError(
                    f"router: {addr[0]} is not a loopback address, and with --dev the router "
                    "is plaintext, so it listens on loopback only (127.0.0.0/8, ::1, "
                    "localhost); outside one-machine development run without --dev: the "
                    "router then speaks TLS with the node's certificate and clients present a "
                    "mesh client certificate or a --router-tokens bearer token")
            return addr
        host = self.gossip_binds()[0][0]
        if is_loopback(host):
            return (host, DEFAULT_ROUTER_PORT)
        return ("127.0.0.1" if self.dev else "0.0.0.0", DEFAULT_ROUTER_PORT)

    def router_http_addr(self) -> Addr | None:
        if self.router_http == "off":
            return None
        if self.router_http:
            addr = parse_hostport(self.router_http, DEFAULT_ROUTER_HTTP_PORT, "router_http")
            if self.dev and not is_loopback(addr[0]):
                raise SettingsError(
                    f"router_http: {addr[0]} is not a loopback address, and with --dev the "
                    "router is plaintext, so it listens on loopback only; outside one-machine "
                    "development run without --dev (HTTPS with the node's certificate)")
            return addr
        host, port = self.router_addr()
        return (host, port + 1 if self.router and port else DEFAULT_ROUTER_HTTP_PORT)

    def metrics_addr(self) -> Addr | None:
        if self.metrics == "off":
            return None
        if self.metrics:
            return parse_hostport(self.metrics, DEFAULT_METRICS_PORT, "metrics")
        host = self.gossip_binds()[0][0]
        return (host, DEFAULT_METRICS_PORT)

    def cert_names(self) -> list[str]:
        """DNS names and IP addresses for this node's certificate besides its SPIFFE ones, so
        that clients checking host names (tritonclient) accept it at any address it listens on.

        In order: ``cert_san``; the gossip bind, advertise and (``--role router``) router
        hosts that are specific addresses or names; for a loopback or wildcard listener
        127.0.0.1, ::1 and ``localhost``; the host name; for a wildcard listener (0.0.0.0, ::)
        the host's other addresses (:func:`host_addresses`).  Names a certificate may not carry
        (a host name with '_', say) are left out; at most ``MAX_NAMES``.  Read anew at each
        renewal: the host's addresses may have changed.
        """
        hosts = [self.gossip_binds()[0][0]]
        if self.advertise:
            hosts.append(parse_hostport(self.advertise, 0, "advertise")[0])
        if "router" in self.roles:
            hosts.append(self.router_addr()[0])
        names = list(self.cert_san)
        wildcard = loopback = False
        for host in hosts:
            if host in ("0.0.0.0", "::"):
                wildcard = True
                continue
            loopback = loopback or is_loopback(host)
            names.append(host)
        if wildcard or loopback:
            names += ["127.0.0.1", "::1", "localhost"]
        names.append(socket.gethostname())
        if wildcard:
            names += host_addresses()
        out: list[str] = []
        seen: set[str] = set()
        for text in names:
            try:
                name = parse_name(text)
            except SanError:
                continue
            key = str(name.value)
            if key not in seen:
                seen.add(key)
                out.append(key)
        return out[:MAX_NAMES]

    def data_path(self) -> str:
        return self.data_dir or os.path.join(os.path.expanduser("~"), ".meshd", self.node)

    def seeds(self) -> list[Addr]:
        return [parse_hostport(s, DEFAULT_GOSSIP_PORT, "join") for s in self.join]

    def validate(self) -> None:
        if not 0 < len(self.node) <= 128:
            raise SettingsError("node: name must be 1..128 characters")
        if self.profile not in ("lan", "wan", "local"):
            raise SettingsError(f"profile: {self.profile!r} is not one of lan, wan, local")
        for role in self.roles:
            if role not in ROLES:
                raise SettingsError(f"role: {role!r} is not one of {', '.join(ROLES)}")
        for k, v in self.tags.items():
            if not k or len(k) > 64 or len(v) > 256:
                raise SettingsError(f"tag: {k!r} must be 1..64 characters with a value of at "
                                    "most 256")
            if k == MESH_TAG:
                raise SettingsError(f"tag: {k!r} is reserved: it carries the mesh id of this "
                                    "node's certificate")
        if len(self.zone) > 64 or len(self.region) > 64:
            raise SettingsError("zone/region: at most 64 characters")
        if self.encrypt:
            try:
                decode_key(self.encrypt)
            except KeyringError as exc:
                raise SettingsError(f"encrypt: {exc}") from None
        self.gossip_binds()
        self.seeds()
        if self.advertise:
            parse_hostport(self.advertise, 0, "advertise")
        self.admin_addr()
        self.metrics_addr()
        self.score_addr()
        self.router_addr()
        self.router_http_addr()
        if not 10.0 <= self.cert_lifetime <= 30 * 86400.0:
            raise SettingsError("cert_lifetime: must be 10 s .. 30 days")
        if (self.jwt_jwks or self.jwt_key) and not self.jwt_issuer:
            raise SettingsError("jwt_issuer: required with jwt_jwks/jwt_key")
        if self.jwt_jwks and self.jwt_key:
            raise SettingsError("jwt_jwks, jwt_key: give one of them")
        if not 0 <= self.router_workers <= MAX_ROUTER_WORKERS:
            raise SettingsError(f"router_workers: must be 0..{MAX_ROUTER_WORKERS}")
        if self.router_workers > 1 and not sys.platform.startswith("linux"):
            raise SettingsError("router_workers: more than 1 needs Linux (the kernel's "
                                "SO_REUSEPORT balancing)")
        if not 64 <= self.router_inflight_mib <= 1 << 20:
            raise SettingsError("router_inflight_mib: must be 64..1048576 MiB (at least one "
                                "request of the largest size)")
        if not 0 <= self.model_slots <= 1024:
            raise SettingsError("model_slots: must be 0..1024 CPU-only replicas")
        if not 0 < self.model_target_utilisation <= 1:
            raise SettingsError("model_target_utilisation: must be in (0, 1]")
        if not 0 <= self.model_cool_down <= 86_400:
            raise SettingsError("model_cool_down: must be 0..86400 seconds")
        if not 0 <= self.router_nice <= 19:
            raise SettingsError("router_nice: must be 0..19 (POSIX niceness)")
        if not 0 <= self.bootstrap_expect <= 15:
            raise SettingsError("bootstrap_expect: must be 0..15 coordinators")
        if self.bootstrap_expect and "coordinator" not in self.roles:
            raise SettingsError("bootstrap_expect: only for nodes with --role coordinator")
        if self.raft:
            parse_hostport(self.raft, DEFAULT_RAFT_PORT, "raft")
        if self.raft_timing not in ("", "lan", "wan"):
            raise SettingsError(f"raft_timing: {self.raft_timing!r} is not one of lan, wan")
        for spec in self.triton:
            try:
                TritonEndpoint.parse(spec)
            except EndpointError as exc:
                raise SettingsError(f"triton: {exc}") from None
        if self.gpu not in ("auto", "off"):
            raise SettingsError(f"gpu: {self.gpu!r} is not one of auto, off")
        for name in ("queue_interval", "stats_interval"):
            if not 0.01 <= getattr(self, name) <= 60.0:
                raise SettingsError(f"{name}: must be 0.01 .. 60 seconds")
        if len(self.cert_san) > MAX_NAMES:
            raise SettingsError(f"cert_san: {len(self.cert_san)} names, at most {MAX_NAMES}")
        for name in self.cert_san:
            try:
                parse_name(name)
            except SanError as exc:
                raise SettingsError(f"cert_san: {exc}") from None
        if self.retry_max < 0 or self.retry_interval <= 0:
            raise SettingsError("retry: retry_max must be >= 0 and retry_interval > 0")


def host_addresses() -> list[str]:
    """This host's addresses other than loopback and link-local ones, for the certificate of a
    node listening on a wildcard address: those its host name resolves to, and those of the
    interfaces that route to the internet (a UDP socket "connected" to a documentation
    address: nothing is sent).  Standard library only; whatever fails is left out."""
    found: list[str] = []
    try:
        infos = socket.getaddrinfo(socket.gethostname(), None, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        infos = []
    found += [str(info[4][0]) for info in infos]
    for family, probe in ((socket.AF_INET, "192.0.2.1"), (socket.AF_INET6, "2001:db8::1")):
        try:
            with socket.socket(family, socket.SOCK_DGRAM) as s:
                s.connect((probe, 9))
                found.append(str(s.getsockname()[0]))
        except OSError:
            pass
    out: list[str] = []
    for text in found:
        try:
            addr = ipaddress.ip_address(text)
        except ValueError:
            continue
        if addr.is_loopback or addr.is_link_local or addr.is_unspecified or addr.is_multicast:
            continue
        if str(addr) not in out:
            out.append(str(addr))
    return out


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


def parse_hostport(text: str, default_port: int, what: str) -> Addr:
    """``host``, ``host:port``, ``[v6]:port`` or a bare IPv6 literal."""
    text = text.strip()
    host, port_text = text, ""
    if text.startswith("["):
        end = text.find("]")
        if end < 0:
            raise SettingsError(f"{what}: {text!r} has an unclosed '['")
        host, rest = text[1:end], text[end + 1:]
        if rest:
            if not rest.startswith(":"):
                raise SettingsError(f"{what}: {text!r} is not [ADDR]:PORT")
            port_text = rest[1:]
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    if not host:
        raise SettingsError(f"{what}: {text!r} has no host")
    port = default_port
    if port_text:
        if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
            raise SettingsError(f"{what}: port {port_text!r} is not 0..65535")
        port = int(port_text)
    return host, port


def _split_list(value: str | list[str]) -> list[str]:
    items = value if isinstance(value, list) else [value]
    return [p.strip() for item in items for p in str(item).split(",") if p.strip()]


def _parse_tags(items: list[str]) -> dict[str, str]:
    tags: dict[str, str] = {}
    for item in items:
        if "=" not in item:
            raise SettingsError(f"tag: {item!r} is not key=value")
        k, v = item.split("=", 1)
        tags[k.strip()] = v.strip()
    return tags


_LISTS = {"join", "roles", "subscribe", "cert_san"}
_BOOLS = {"retry_join", "dev", "router_tls_front", "model_control"}
_INTS = {"retry_max", "bootstrap_expect", "router_workers", "router_inflight_mib",
         "router_nice", "model_slots"}
_FLOATS = {"retry_interval", "cert_lifetime", "queue_interval", "stats_interval",
           "model_target_utilisation", "model_cool_down"}


def _coerce(name: str, value: Any, source: str) -> Any:
    try:
        if name in _LISTS:
            return _split_list(value)
        if name == "triton":  # its items hold commas: a list, or whitespace-separated
            return [str(v) for v in value] if isinstance(value, list) else str(value).split()
        if name == "tags":
            if isinstance(value, dict):
                return {str(k): str(v) for k, v in value.items()}
            return _parse_tags(_split_list(value))
        if name in _BOOLS:
            if isinstance(value, bool):
                return value
            if str(value).lower() in ("1", "true", "yes", "on"):
                return True
            if str(value).lower() in ("0", "false", "no", "off", ""):
                return False
            raise ValueError(value)
        if name in _INTS:
            return int(value)
        if name in _FLOATS:
            return float(value)
        return str(value)
    except (TypeError, ValueError):
        raise SettingsError(f"{name} (from {source}): {value!r} is not valid") from None


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="meshd", description="meshd: peer-to-peer mesh agent")
    a = p.add_argument
    a("--config", metavar="FILE", help="TOML settings file")
    a("--node", help="node name (default: host name)")
    a("--bind", metavar="ADDR:PORT", help="gossip address (default 0.0.0.0 and :: on 7946)")
    a("--advertise", metavar="ADDR[:PORT]", help="address others reach us at")
    a("--join", action="append", metavar="HOST:PORT", help="seed to join (repeatable)")
    a("--retry-join", action="store_true", default=None, help="retry the join with backoff")
    a("--retry-max", type=int, help="give up after N join attempts (0: never)")
    a("--retry-interval", type=float, help="first retry delay in seconds")
    a("--role", dest="roles", action="append", help=f"role: {', '.join(ROLES)} (repeatable)")
    a("--zone")
    a("--region")
    a("--tag", dest="tags", action="append", metavar="K=V", help="free-form tag (repeatable)")
    a("--encrypt", metavar="KEY", help="base64 AES-256 gossip key")
    a("--profile", choices=["lan", "wan", "local"], help="protocol timings")
    a("--data-dir", metavar="DIR")
    a("--admin", metavar="ADDR:PORT", help="admin gRPC address (mTLS)")
    a("--metrics", metavar="ADDR:PORT", help="Prometheus address, or 'off'")
    a("--log-level", choices=["debug", "info", "warning", "error"])
    a("--dev", action="store_true", default=None,
      help="one-machine development: dev CA and identities in the data dir (security on)")
    a("--ca-dir", metavar="DIR", help="this node holds the mesh CA in DIR")
    a("--join-token", metavar="TOKEN", help="enroll with this token (or $MESHD_JOIN_TOKEN)")
    a("--trust-domain", metavar="DOMAIN", help="trust domain of a --dev CA")
    a("--cert-lifetime", type=float, metavar="SECONDS", help="lifetime of issued certificates")
    a("--cert-san", action="append", metavar="NAME|IP",
      help="extra DNS name or IP address for this node's certificate, e.g. a load balancer's "
           "(repeatable, or comma-separated)")
    a("--rbac-policy", metavar="FILE", help="TOML role -> admin methods policy")
    a("--jwt-jwks", metavar="FILE", help="JWKS file for people's bearer tokens")
    a("--jwt-key", metavar="FILE", help="PEM public key for people's bearer tokens")
    a("--jwt-audience", metavar="AUD", help="required 'aud' of bearer tokens (default meshd)")
    a("--jwt-issuer", metavar="ISS", help="required 'iss' of bearer tokens")
    a("--audit-log", metavar="FILE", help="admin audit log (JSON lines), or 'off'")
    a("--bootstrap-expect", type=int, metavar="N",
      help="coordinators: form the Raft groups once N coordinators see each other")
    a("--raft", metavar="ADDR:PORT", help="Raft address of the first group (default port 7950)")
    a("--raft-timing", choices=["lan", "wan"], help="Raft timings (default: from --profile)")
    a("--triton", action="append",
      metavar="HOST:PORT[,metrics=URL][,http=HOST:PORT][,advertise=HOST:PORT]",
      help="a Triton server to poll (repeatable); http= names its HTTP endpoint, which "
           "routers then forward HTTP requests to (without it they convert them to gRPC)")
    a("--gpu", choices=["auto", "off"], help="GPU telemetry through NVML (default auto)")
    a("--queue-interval", type=float, metavar="SECONDS", help="runtime queue poll (0.1)")
    a("--stats-interval", type=float, metavar="SECONDS", help="runtime statistics poll (1.0)")
    a("--subscribe", action="append", metavar="NODE|*",
      help="receive these peers' telemetry pushed, not only by gossip (repeatable)")
    a("--score", metavar="HOST:PORT|unix:PATH|off",
      help="score API address (default 127.0.0.1:7961; mTLS unless loopback or unix)")
    a("--router", metavar="ADDR:PORT", help="router ingress, KServe v2 gRPC (default port 9000)")
    a("--router-http", metavar="ADDR:PORT|off",
      help="router ingress, KServe v2 HTTP/REST (default: the gRPC ingress's host and next "
           "port, 9001)")
    a("--router-tokens", metavar="FILE", help="per-tenant bearer tokens for router clients")
    a("--router-tls-front", action=argparse.BooleanOptionalAction, default=None,
      help="terminate the router gRPC port's TLS in meshd's TLS front, which counts and "
           "audits refused handshakes (default: off; costs CPU per request)")
    a("--router-workers", type=int, metavar="N",
      help="router worker processes serving the router's ports (default 1; more than 1: "
           "Linux; 0: this process serves them, in the control plane's event loop)")
    a("--router-inflight-mib", type=int, metavar="MIB",
      help="request bytes each router process holds in flight at most, in MiB (default "
           f"{DEFAULT_ROUTER_INFLIGHT_MIB}); beyond it requests are shed")
    a("--router-nice", type=int, metavar="N",
      help=f"niceness of the router workers below the agent (default {DEFAULT_ROUTER_NICE}; "
           "0..19): under saturation the control plane runs first")
    a("--model-control", action=argparse.BooleanOptionalAction, default=None,
      help="this node's Triton runs --model-control-mode=explicit: the placement controller "
           "loads and unloads its models (ModelPin policies)")
    a("--model-slots", type=int, metavar="N",
      help="CPU-only model replicas this node has room for (default 1; GPU nodes are sized "
           "by free GPU memory)")
    a("--model-target-utilisation", type=float, metavar="U",
      help="coordinators: the busy share a model replica is sized for (default 0.7)")
    a("--model-cool-down", type=float, metavar="S",
      help="coordinators: seconds of low demand before a model replica is removed "
           "(default 120)")
    return p


def load(argv: list[str] | None = None, environ: dict[str, str] | None = None) -> Settings:
    """Settings from defaults, the TOML file, ``MESHD_*`` variables and ``argv``."""
    args = build_parser().parse_args(argv)
    env = os.environ if environ is None else environ
    values: dict[str, Any] = {}
    names = [f.name for f in dataclasses.fields(Settings)]
    config_file = args.config or env.get("MESHD_CONFIG")
    if config_file:
        try:
            with open(config_file, "rb") as fh:
                doc = tomllib.load(fh)
        except OSError as exc:
            raise SettingsError(f"config: cannot read {config_file}: {exc.strerror}") from None
        except tomllib.TOMLDecodeError as exc:
            raise SettingsError(f"config: {config_file} is not valid TOML: {exc}") from None
        for key, value in doc.items():
            name = key.replace("-", "_")
            if name == "role":
                name = "roles"
            if name not in names:
                raise SettingsError(f"config: unknown setting {key!r} in {config_file}")
            values[name] = _coerce(name, value, config_file)
    for name in names:
        for var in (f"MESHD_{name.upper()}",) + (("MESHD_ROLE",) if name == "roles" else ()):
            if var in env:
                values[name] = _coerce(name, env[var], var)
    for name in names:
        value = getattr(args, name, None)
        if value is not None:
            values[name] = _coerce(name, value, "--" + name.replace("_", "-"))
    settings = Settings(**values)
    settings.validate()
    return settings
