"""The meshd agent process: it builds every plane, wires them to gossip and to each other, serves
their APIs, and leaves the mesh gracefully on SIGTERM/Ctrl-C.

The planes know nothing above themselves; what one needs of another is handed in here (the
control plane's group stores, the scorer's view and policies, the training plane's GPUs and
RTTs), and members' node state reaches them through :mod:`meshd.signals.readers`.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import json
import logging
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING

from adapters.model import CommStats, GpuState
from adapters.triton import TritonEndpoint
from certs.ca import CaError
from consensus.group import WAN_TIMING, ConsensusError, Timing
from gossip.config import Config
from gossip.events import EventKind, MemberEvent
from gossip.keyring import Keyring
from gossip.protocol import Swim
from gossip.state import MESH_TAG, Addr, NodeMeta
from gossip.transport import GossipTransport, family_of
from meshd import collector, tracing
from meshd.admin import server as admin
from meshd.admin.authz import Authorizer, Refused
from meshd.admin.rbac import KeyLoadError, PolicyError
from meshd.control.plane import RAFT_SECTION, ControlPlane, Credential, GroupStore
from meshd.control.quarantine import AutoQuarantine
from meshd.coordinates import CoordinatePlane
from meshd.metrics.agent import AgentMetrics
from meshd.metrics.models import ModelMetrics, ModelsCollector
from meshd.metrics.routing import RoutingCollector
from meshd.metrics.train import CollectiveMetrics, TrainCollector
from meshd.models.config import PlacementConfig
from meshd.models.service import SLOTS_TAG, ModelService
from meshd.models.store import STAMPED_OPS as MODEL_OPS
from meshd.models.store import ModelStore
from meshd.models.wants import SECTION as WANT_SECTION
from meshd.router.auth import TokenFileError
from meshd.router.counters import RouterCounters, WorkerCounters
from meshd.router.pool import SHM_DIR, WorkerPool
from meshd.score import link as score_link
from meshd.score import service as score_api
from meshd.score.scorer import RepositoryRefused, Scorer
from meshd.security.plane import EnrollmentRefused, Security, SecurityError
from meshd.settings import DEFAULT_RAFT_PORT, Settings, parse_hostport
from meshd.signals import nodestate
from meshd.signals.plane import SignalPlane
from meshd.signals.readers import NodeStateReaders, Reader
from meshd.signals.wire import SECTION as SIGNALS_SECTION
from meshd.signals.wire import NodeSignals
from meshd.train.board import STAMPED_OPS, PlacementStore
from meshd.train.service import TrainService
from topology.zones import Place

if TYPE_CHECKING:
    from meshd.router.gateway import Gateway

log = logging.getLogger("meshd.agent")

_LEVELS = {EventKind.CONFLICT: logging.WARNING, EventKind.FAILED: logging.WARNING,
           EventKind.SUSPECT: logging.INFO, EventKind.STATE: logging.DEBUG}
MAX_RETRY_DELAY = 30.0
STATE_PUBLISH_PERIOD = 1.0
"""How often the agent checks whether its node state (e.g. its coordinate) needs republishing."""
REPOSITORY_WRITE_TIMEOUT = 8.0
"""Seconds a repository call through the router may take to write its ModelPin."""
ADMIN_GRACE = 1.0
"""Seconds admin calls in flight get to finish on shutdown."""
ROUTER_GRACE = 10.0
"""Seconds requests in flight through the router get to finish on shutdown."""
REUSE_PORT = sys.platform.startswith("linux")
"""The router's workers share its ports with SO_REUSEPORT (see :mod:`meshd.router.worker`)."""
UNIX_SOCKETS = hasattr(socket, "AF_UNIX") and sys.platform != "win32"
"""The workers' score link and score API are on Unix sockets (else loopback TCP)."""


def _reserve(addr: Addr) -> socket.socket:
    """A TCP socket bound to ``addr`` (not listening): OSError naming the address if it is
    in use by a listener that does not share it."""
    host, port = addr
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        if os.name != "nt":  # on Windows SO_REUSEADDR would let this bind over a listener
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if REUSE_PORT:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if family == socket.AF_INET6 and host in ("::", ""):
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        where = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        raise OSError(f"cannot bind the router on {where} (address in use?): "
                      f"{exc.strerror or exc}") from None
    return sock


def _bracketed(where: str) -> str:
    """``HOST:PORT`` as a worker's flag takes it (an IPv6 host in brackets)."""
    host, _, port = where.rpartition(":")
    return f"[{host}]:{port}" if ":" in host else where


TEST_SEND_DELAY_ENV = "MESHD_TEST_SEND_DELAY"
"""Test-only: ``HOST:PORT=SECONDS,...`` holds gossip datagrams to each listed peer for that long,
so loopback tests can give pairs of agents WAN-like RTTs.  Logged loudly when set."""


def parse_send_delays(text: str) -> dict[Addr, float]:
    """``"127.0.0.2:7946=0.01,..."`` -> ``{("127.0.0.2", 7946): 0.01}`` (ValueError if bad)."""
    delays: dict[Addr, float] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        target, sep, seconds = item.rpartition("=")
        if not sep:
            raise ValueError(f"{item!r} is not HOST:PORT=SECONDS")
        value = float(seconds)
        if not 0 <= value <= 5:
            raise ValueError(f"{item!r}: delay must be in [0, 5] seconds")
        delays[parse_hostport(target, 0, TEST_SEND_DELAY_ENV)] = value
    return delays


class JoinFailed(RuntimeError):
    """No seed answered and ``--retry-join`` was not given (or retries ran out)."""


def detect_advertise(bind_host: str, seeds: list[Addr]) -> str:
    """The address peers should use to reach us when we bound a wildcard address.

    Asks the OS which local address routes to the first seed (a UDP ``connect`` sends
    nothing); without seeds, the first non-loopback address of the host name.
    """
    if bind_host not in ("0.0.0.0", "::", ""):
        return bind_host
    for host, port in seeds:
        with contextlib.suppress(OSError), socket.socket(family_of(host), socket.SOCK_DGRAM) as s:
            s.connect((host, port))
            return str(s.getsockname()[0])
    with contextlib.suppress(OSError):
        for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET):
            ip = str(info[4][0])
            if not ipaddress.ip_address(ip).is_loopback:
                return ip
    return "127.0.0.1"


class DataDir:
    """What survives a restart: our last incarnation and the members we last saw alive.

    Restarting at a higher incarnation means our new ``alive`` wins at once instead of after a
    refutation round trip; the member list lets a restarted node rejoin when its seeds are gone.
    """

    def __init__(self, path: str) -> None:
        self.path = Path(path) if path else None
        if self.path is not None:
            self.path.mkdir(parents=True, exist_ok=True)

    def load(self) -> dict[str, object]:
        if self.path is None:
            return {}
        try:
            data = json.loads((self.path / "gossip.json").read_text())
            return data if isinstance(data, dict) else {}
        except (OSError, ValueError):
            return {}

    def save(self, incarnation: int, peers: list[list[object]]) -> None:
        if self.path is None:
            return
        tmp = self.path / "gossip.json.tmp"
        tmp.write_text(json.dumps({"incarnation": incarnation, "peers": peers}))
        os.replace(tmp, self.path / "gossip.json")


class Agent:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.tracing = tracing.setup("meshd", settings.node)
        self.stopping = asyncio.Event()
        self.swim: Swim | None = None
        self.transport: GossipTransport | None = None
        self.metrics: AgentMetrics | None = None
        self.coordinates = CoordinatePlane(settings.node, place_of=self._place_of)
        self._state = nodestate.Publisher()
        self._admin: object | None = None
        self._authorizer: Authorizer | None = None
        self._data = DataDir(settings.data_path())
        self.security = Security(Path(settings.data_path()), settings.node, dev=settings.dev,
                                 ca_dir=settings.ca_dir, join_token=settings.join_token,
                                 trust_domain=settings.trust_domain, encrypt=settings.encrypt,
                                 cert_lifetime=settings.cert_lifetime,
                                 cert_names=settings.cert_names)
        self._publish_now = asyncio.Event()
        self.signals = SignalPlane(
            settings.node, triton=[TritonEndpoint.parse(t) for t in settings.triton],
            gpu=settings.gpu != "off", queue_interval=settings.queue_interval,
            stats_interval=settings.stats_interval, flags_of=self._flags_of)
        self.control = ControlPlane(
            settings.node, Path(settings.data_path()), self.security,
            coordinator="coordinator" in settings.roles, expect=settings.bootstrap_expect,
            timing=WAN_TIMING if (settings.raft_timing or (
                "wan" if settings.profile == "wan" else "lan")) == "wan" else Timing(),
            stores={"policy": GroupStore(ModelStore, MODEL_OPS),
                    "placements": GroupStore(PlacementStore, STAMPED_OPS)})
        self.health = AutoQuarantine(settings.node, self.control, lambda: self.signals.current,
                                     self._data.path)
        self.train = TrainService(settings.node, self.control, lambda: self.swim,
                                  self._gpus_of, trainer="trainer" in settings.roles,
                                  data_dir=Path(settings.data_path()),
                                  rtt=lambda a, b: self.coordinates.estimate(a, b).rtt,
                                  rtt_rows=self.coordinates.rtt_rows,
                                  comm_of=self._comm_stats, report_comm=self.signals.report_comm)
        self.train.tracer = tracing.tracer(self.tracing, "meshd.train")
        self.models = ModelService(
            settings.node, self.control, lambda: self.swim, self._signals_of,
            runtime=self.signals.triton[0] if settings.model_control and self.signals.triton
            else None, config=PlacementConfig(target_utilisation=settings.model_target_utilisation,
                                              cool_down_s=settings.model_cool_down))
        self.scorer = Scorer(self.signals.fused, zone=settings.zone, policy=self._policy_spec,
                             policy_version=lambda: self._policy_store.version,
                             rtt_of=self._rtt_of, zone_of=self._zone_of,
                             quota_share=self._quota_share)
        self.scorer.wanted = self.models.want
        self.scorer.repository = self._repository
        self.scorer.placed = lambda: [d.document.name
                                      for d in self._policy_store.list("ModelPin")]
        self.models.gpu_used = self._gpu_used
        self.models.changed = lambda: self._publish_now.set()
        self._score: object | None = None
        self._router: object | None = None
        self._router_http: object | None = None
        self.router: Gateway | None = None
        """The KServe router in this process (``--role router --router-workers 0``)."""
        self.router_workers: WorkerPool | None = None
        """The router worker processes serving its ports (``--role router``, the default)."""
        self._router_ports: list[socket.socket] = []
        """The router's ports, held bound (not listening) for the workers (Linux)."""
        self.worker_counters = WorkerCounters()
        self._workers_score: object | None = None
        self._workers_link: asyncio.Server | None = None
        self.link_counts: Counter[str] = Counter()
        """The score link's calls and malformed frames (``--router-workers``)."""
        self._workers_dir = ""
        coords = self.coordinates
        self.node_states = NodeStateReaders([
            Reader(lambda n, sections: coords.learned(n, sections[nodestate.COORDINATE]),
                   section=nodestate.COORDINATE, forget=coords.forget),
            Reader(self.security.learn, forget=self.security.forget),
            Reader(self.control.learn),
            Reader(self.signals.learn, section=SIGNALS_SECTION, patch=self.signals.learn_patch,
                   forget=self.signals.forget),
            Reader(self.models.learn_wants, section=WANT_SECTION,
                   forget=self.models.wants.forget)],
            malformed=lambda: coords.rejected.update(malformed=1))
        """Members' node state, each section to the layer that reads it."""

    @property
    def _policy_store(self):  # type: ignore[no-untyped-def]
        return self.control.views["policy"].store

    def _policy_spec(self, kind: str, name: str) -> dict[str, object] | None:
        stored = self._policy_store.get(kind, name)
        return stored.document.spec if stored is not None else None

    def _rtt_of(self, node: str) -> float | None:
        return self.coordinates.estimate(self.settings.node, node).rtt

    def _zone_of(self, node: str) -> str:
        m = self.swim.member(node) if self.swim is not None else None
        return m.meta.zone if m is not None else ""

    def _quota_share(self) -> float:
        """Tenant quotas are split evenly between the agents that route (at least this one)."""
        if self.swim is None:
            return 1.0
        routers = sum(1 for m in self.swim.members() if m.live and "router" in m.meta.roles)
        return 1.0 / max(1, routers)

    async def _secure(self, seeds: list[Addr]) -> bool:
        """Identity first: load or make it, or enroll through the seeds (retrying with
        ``--retry-join``, since the seeds may not be up yet)."""
        sec = self.security
        try:
            sec.prepare()
        except (SecurityError, CaError, OSError) as exc:
            log.error("cannot start", extra={"event": "start_failed", "detail": str(exc)})
            return False
        delay = self.settings.retry_interval
        attempt = 0
        while sec.needs_enrollment:
            attempt += 1
            try:
                await sec.enroll(seeds)
            except SecurityError as exc:
                retry = self.settings.retry_join and not isinstance(exc, EnrollmentRefused) and (
                    not self.settings.retry_max or attempt < self.settings.retry_max)
                if not retry:
                    log.error("cannot start", extra={"event": "start_failed",
                                                     "detail": str(exc)})
                    return False
                log.warning("enrollment failed; retrying", extra={
                    "event": "enroll_retry", "attempt": attempt, "detail": str(exc)})
                await asyncio.sleep(delay)
                delay = min(delay * 2, MAX_RETRY_DELAY)
        return True

    async def run(self) -> int:
        s = self.settings
        saved = self._data.load()
        config = Config.profile_named(s.profile)
        loop = asyncio.get_running_loop()
        try:
            seeds = [await self._resolve(a) for a in s.seeds()]
        except JoinFailed as exc:
            log.error("cannot start", extra={"event": "start_failed", "detail": str(exc)})
            return 1
        if not await self._secure(seeds):
            return 1
        sec = self.security
        keyring: Keyring | None = sec.keyring

        transport = GossipTransport(s.gossip_binds(), tcp_timeout=config.tcp_timeout,
                                    max_stream_bytes=config.max_stream_bytes,
                                    required=bool(s.bind), on_events=self._on_events,
                                    security=sec.build_stream_security())
        if os.environ.get(TEST_SEND_DELAY_ENV):
            try:
                delays = parse_send_delays(os.environ[TEST_SEND_DELAY_ENV])
            except ValueError as exc:
                log.error("cannot start", extra={"event": "start_failed",
                                                 "detail": f"{TEST_SEND_DELAY_ENV}: {exc}"})
                return 1
            log.warning("TEST ONLY: delaying gossip datagrams to some peers", extra={
                "event": "test_send_delay", "peers": len(delays)})
            transport.send_delay = lambda addr: delays.get(addr, 0.0)
        try:
            port = await transport.bind()
        except OSError as exc:
            log.error("cannot start", extra={"event": "start_failed", "detail": str(exc)})
            return 1
        self.transport = transport
        adv_host, adv_port = detect_advertise(s.gossip_binds()[0][0], seeds), port
        if s.advertise:
            adv_host, adv_port = parse_hostport(s.advertise, port, "advertise")
        admin_host, admin_port = s.admin_addr()
        metrics_addr = s.metrics_addr()
        ports = {"gossip": adv_port, "admin": admin_port}
        if metrics_addr:
            ports["metrics"] = metrics_addr[1]
        if sec.ca is not None:
            ports["ca"] = adv_port  # enrollment and renewal, on the gossip TCP port
        raft: Addr | None = None
        if self.control.coordinator:
            if s.raft:
                raft_host, raft_port = parse_hostport(s.raft, DEFAULT_RAFT_PORT, "raft")
                raft = (adv_host if raft_host in ("0.0.0.0", "::") else raft_host, raft_port)
                raft_bind = raft_host
            else:
                raft, raft_bind = (adv_host, DEFAULT_RAFT_PORT), s.gossip_binds()[0][0]
            ports["raft"] = raft[1]
        tags = dict(s.tags)
        if s.model_control:  # the placement controller may put replicas here
            tags[SLOTS_TAG] = str(s.model_slots)
        if sec.identity.mesh:  # members of another mesh are refused by it (gossip.state)
            tags[MESH_TAG] = sec.identity.mesh
        meta = NodeMeta.build(s.roles, s.zone, s.region, ports, tags)
        incarnation = int(saved.get("incarnation", -1)) + 1  # type: ignore[call-overload]
        swim = Swim(config, s.node, (adv_host, adv_port), meta, now=loop.time(),
                    keyring=keyring, incarnation=incarnation, probe_hook=self.coordinates)
        self.swim = swim
        self._state.delta_limit = config.max_state_delta_bytes
        sec.members = lambda: [(m.name, m.addr, m.meta.ports_dict) for m in swim.members()
                               if m.live]
        sec.changed = self._publish_now.set
        self.control.attach(swim, raft, raft_bind if raft is not None else "")
        self.control.changed = self._publish_now.set
        self.signals.changed = self._publish_now.set
        sec.build_authority(name_in_use=lambda n: n != swim.name and (
            (m := swim.member(n)) is not None and m.live))
        self.metrics = AgentMetrics(swim, self.coordinates, sec, self.control,
                                    self.signals, self.health,
                                    RoutingCollector(s.node, self.scorer,
                                                     self._router_counters, self._link_counts),
                                    TrainCollector(s.node, self.train))
        self.signals.on_comm = CollectiveMetrics(s.node, self.metrics.registry).observe
        self.metrics.registry.register(ModelsCollector(s.node, self.models))
        model_metrics = ModelMetrics(s.node, self.metrics.registry)
        self.models.on_decision, self.models.on_load = model_metrics.decided, model_metrics.loaded
        transport.on_rtts = self.metrics.observe_rtts
        transport.attach(swim)
        self._data.save(swim.incarnation, list(saved.get("peers", []) or []))  # type: ignore[call-overload]
        try:
            authorizer = admin.build_authorizer(
                sec, policy_file=s.rbac_policy, jwt_jwks=s.jwt_jwks, jwt_key=s.jwt_key,
                jwt_audience=s.jwt_audience, jwt_issuer=s.jwt_issuer, audit_log=s.audit_log)
        except (PolicyError, KeyLoadError, OSError) as exc:
            log.error("cannot start", extra={"event": "start_failed", "detail": str(exc)})
            await self._shutdown(leave=False)
            return 1
        self._authorizer = authorizer
        try:
            self._admin = await admin.serve(swim, loop.time, admin_host, admin_port,
                                            coordinates=self.coordinates, security=sec,
                                            authorizer=authorizer, control=self.control,
                                            signals=self.signals, train=self.train,
                                            models=self.models)
            if metrics_addr:
                self.metrics.serve(*metrics_addr)
            score_addr = s.score_addr()
            score_where = "off"
            if score_addr is not None:
                self._score, score_where = await score_api.serve(
                    self.scorer, loop.time, score_addr, lambda: sec.identity,
                    self.worker_counters)
            router_where = router_http_where = "off"
            if "router" in s.roles:
                # regions die with the router
                shutil.rmtree(Path(s.data_path()) / SHM_DIR, ignore_errors=True)
                if s.router_workers:
                    # The ports are the workers': this process checks they are free (and
                    # what a port 0 is), then serves only their score link and score API.
                    router_where, router_http_where = self._reserve_router_ports()
                    await self._start_router_workers(router_where, router_http_where)
                else:  # --router-workers 0: in this event loop, beside the control plane
                    router_where, router_http_where = await self._serve_router_here()
        except (OSError, TokenFileError) as exc:
            log.error("cannot start", extra={"event": "start_failed", "detail": str(exc)})
            await self._shutdown(leave=False)
            return 1
        log.info("agent started", extra={
            "event": "agent_started", "addr": f"{adv_host}:{adv_port}", "profile": s.profile,
            "encrypted": keyring is not None, "admin": f"{admin_host}:{admin_port}",
            "identity": str(sec.identity.spiffe_id), "ca_holder": sec.ca is not None,
            "cert_not_after": sec.identity.not_after.isoformat(),
            "metrics": f"{metrics_addr[0]}:{metrics_addr[1]}" if metrics_addr else "off",
            "score": score_where, "router": router_where, "router_http": router_http_where,
            "incarnation": swim.incarnation, "roles": list(meta.roles)})
        # What exists now lives as long as the agent: out of the collector's full passes,
        # which otherwise walk it all and hold every thread (a scrape of a large node's
        # metrics among them) for tens of milliseconds each time (meshd.collector).
        collector.settle()
        self._install_signals()
        joiner = asyncio.create_task(self._join(seeds, saved))
        stopper = asyncio.create_task(self.stopping.wait())
        publisher = asyncio.create_task(self._publish_loop())
        renewer = asyncio.create_task(sec.renew_loop())
        controller = asyncio.create_task(self.control.run())
        trainer = asyncio.create_task(self.train.run())
        models = asyncio.create_task(self.models.run())
        await self.signals.start()
        follower = asyncio.create_task(self._follow_signals())
        health = asyncio.create_task(self.health.run())
        await asyncio.wait({joiner, stopper}, return_when=asyncio.FIRST_COMPLETED)
        code = 0
        if joiner.done() and joiner.exception() is not None:
            log.error("join failed", extra={"event": "join_failed",
                                            "detail": str(joiner.exception())})
            code = 1
            self.stopping.set()
        await self.stopping.wait()
        joiner.cancel()
        stopper.cancel()
        publisher.cancel()
        renewer.cancel()
        controller.cancel()
        trainer.cancel()
        await self.train.close()
        models.cancel()
        await self.models.close()
        follower.cancel()
        health.cancel()
        await self._shutdown(leave=code == 0)
        return code

    async def _resolve(self, addr: Addr) -> Addr:
        host, port = addr
        loop = asyncio.get_running_loop()
        try:
            infos = await loop.getaddrinfo(host, port, type=socket.SOCK_DGRAM)
        except OSError as exc:
            raise JoinFailed(f"cannot resolve seed {host}: {exc}") from None
        return str(infos[0][4][0]), port

    async def _join(self, seeds: list[Addr], saved: dict[str, object]) -> None:
        assert self.transport is not None
        s = self.settings
        peers: list[Addr] = [(str(p[0]), int(p[1]))
                             for p in saved.get("peers", []) or []  # type: ignore[attr-defined]
                             if isinstance(p, list) and len(p) == 2]
        candidates = seeds or peers
        if not candidates:
            return
        delay = s.retry_interval
        attempt = 0
        while True:
            attempt += 1
            ok = await self.transport.join(candidates)
            if ok:
                log.info("joined", extra={"event": "joined", "seeds_answered": ok,
                                          "attempt": attempt})
                return
            if seeds and peers and candidates is seeds:
                candidates = seeds + peers
            if not s.retry_join or (s.retry_max and attempt >= s.retry_max):
                if not seeds:
                    # Only members saved by a previous life were tried.  Without --join this
                    # node may be the first of a restarting mesh: run alone and let the others
                    # join it, rather than exit.
                    log.warning("no saved peer answered; running alone", extra={
                        "event": "rejoin_failed", "peers_tried": len(candidates)})
                    return
                raise JoinFailed("no seed answered: " + ", ".join(f"{h}:{p}" for h, p in seeds))
            log.warning("join attempt failed; retrying", extra={
                "event": "join_retry", "attempt": attempt, "retry_in": round(delay, 2)})
            await asyncio.sleep(delay)
            delay = min(delay * 2, MAX_RETRY_DELAY)

    def _on_events(self, events: list[MemberEvent]) -> None:
        persist = False
        for ev in events:
            m = ev.member
            level = _LEVELS.get(ev.kind, logging.INFO)
            if log.isEnabledFor(level):
                log.log(level, f"member {ev.kind.value}: {m.name}", extra={
                    "event": f"member_{ev.kind.value}", "member": m.name,
                    "member_addr": f"{m.addr[0]}:{m.addr[1]}", "incarnation": m.incarnation,
                    "status": m.status.label, "detail": ev.detail})
            persist |= ev.kind in (EventKind.JOIN, EventKind.FAILED, EventKind.LEFT,
                                   EventKind.REFUTE)
            if ev.kind not in (EventKind.STATE, EventKind.DELTA):
                self.control.member_event(ev.kind.value, m.name)
            self.node_states.event(ev)
        if persist:
            self._save_state()

    async def _repository(self, model: str, load: bool, certificate_pem: bytes, bearer: str,
                          peer: str, config: str = "") -> str:
        """Triton's repository control through this node's router (the score API's
        ``ScaleModel``): the caller's credential is checked as the admin API would check a
        ``PolicyApply`` (RBAC; refusals counted and audited), then the model's ModelPin is
        patched for them (:meth:`ModelService.repository_command`)."""
        authz = self._authorizer
        if authz is None:
            raise RepositoryRefused("UNAVAILABLE", "the agent's admin plane is not up yet")
        credential = Credential("PolicyApply", certificate_pem, bearer)
        try:
            principal = authz.forwarded(credential, claimed="", via=self.settings.node,
                                        peer=peer)
        except Refused as exc:
            raise RepositoryRefused(exc.code.name, str(exc)) from None
        author = f"{principal.label} via router {self.settings.node}"[:256]
        cmd = {**self.models.repository_command(model, load, config), "at": time.time(),
               "author": author}
        try:
            result = await self.control.write("policy", cmd, REPOSITORY_WRITE_TIMEOUT, author,
                                              credential=credential)
        except ConsensusError as exc:
            raise RepositoryRefused("UNAVAILABLE", str(exc)) from None
        if not result.get("ok"):
            raise RepositoryRefused("INVALID_ARGUMENT", str(result.get("message", result)))
        return principal.label

    async def _gpu_used(self) -> dict[str, int] | None:
        """NVML's used memory per GPU, read now (None without GPU telemetry)."""
        gpu = self.signals.gpu
        if gpu is None or gpu.cpu_only:
            return None
        await gpu.poll()
        return {uuid: g.memory_total - g.memory_free for uuid, g in gpu.gpus.items()}

    def _signals_of(self, name: str) -> NodeSignals | None:
        entry = self.signals.fused.nodes.get(name)
        return entry.signals if entry is not None else None

    def _gpus_of(self, name: str) -> list[GpuState]:
        entry = self.signals.fused.nodes.get(name)
        return list(entry.signals.gpus) if entry is not None else []

    def _comm_stats(self) -> list[CommStats]:
        """Every node's recent collective timings (this node's included), as gossiped."""
        return [c for e in self.signals.fused.nodes.values() for c in e.signals.comm]

    def _flags_of(self, name: str) -> list[str]:
        return self.control.flags_of(name)

    async def _follow_signals(self) -> None:
        """Keep Subscribe streams to the peers ``--subscribe`` names (``*``: every peer whose
        gossiped telemetry lists replicas)."""
        wanted = set(self.settings.subscribe)
        if not wanted or self.swim is None:
            return

        def want(name: str) -> bool:
            if name in wanted:
                return True
            entry = self.signals.fused.nodes.get(name)
            return "*" in wanted and entry is not None and bool(entry.signals.replicas)

        while True:
            self.signals.follow(self.swim, self.security, want)
            await asyncio.sleep(1.0)

    def _place_of(self, name: str) -> Place | None:
        m = self.swim.member(name) if self.swim is not None else None
        return Place(m.meta.zone, m.meta.region) if m is not None else None

    async def _publish_loop(self) -> None:
        """Republish our node state when a section changed (rate-limited by each section)."""
        assert self.swim is not None and self.transport is not None
        while True:
            now = self.transport.now()
            coord = self.coordinates.to_publish(now)
            if coord is not None:
                self._state.set(nodestate.COORDINATE, coord)
            for name, data in self.security.sections(time.time()).items():
                self._state.set(name, data)
            raft = self.control.section()
            if raft is not None:
                self._state.set(RAFT_SECTION, raft)
            sig = self.signals.section()
            if sig is not None:
                self._state.set(SIGNALS_SECTION, sig, self.signals.patch())
            self._state.set(WANT_SECTION, self.models.want_section())
            published = self._state.take()
            if published is not None:
                blob, delta = published
                self.swim.publish_state(blob, now, delta)
                self.transport.poke()
            errors = self.coordinates.estimate_errors
            if self.metrics is not None:
                self.metrics.observe_estimate_errors(errors)
            errors.clear()
            # Revocations and key operations go out at once; the rest waits for the period.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._publish_now.wait(), STATE_PUBLISH_PERIOD)
            self._publish_now.clear()

    def _save_state(self) -> None:
        """Persist our incarnation and the members we currently see alive."""
        if self.swim is not None:
            self._data.save(self.swim.incarnation, [list(m.addr) for m in self.swim.members()
                                                    if m.live and m.name != self.swim.name])

    def _install_signals(self) -> None:
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                loop.add_signal_handler(sig, self.stop)
            except (NotImplementedError, RuntimeError):  # Windows: no loop signal handlers
                signal.signal(sig, lambda *_: loop.call_soon_threadsafe(self.stop))

    def stop(self) -> None:
        self.stopping.set()
        if self.router_workers is not None:
            # A signal to the process group (Ctrl-C, systemd, timeout) reaches the workers too:
            # their exits from now on are the shutdown, not crashes to restart.
            self.router_workers.closing()

    def _router_counters(self) -> dict[str, RouterCounters] | None:
        """The router's counters by process: its workers' (and this one's, with
        ``--router-workers 0``); None: no router here."""
        if "router" not in self.settings.roles:
            return None
        return self.worker_counters.processes(
            self.router.counters if self.router is not None else None)

    def _link_counts(self) -> dict[str, int] | None:
        """The score link's message counts (None: no worker processes here)."""
        return self.link_counts if self.router_workers is not None else None

    async def _serve_router_here(self) -> tuple[str, str]:
        """Serve the router's ports in this event loop (``--router-workers 0``); returns where.

        Imported here, not at the top: the router's ingress (tritonclient, numpy, aiohttp)
        is most of an agent's memory, and by default it runs in the workers instead."""
        from meshd.router import server as router_server
        from meshd.router.scoring import LocalScoring
        from meshd.router.traces import request_tracer

        s, sec = self.settings, self.security
        loop = asyncio.get_running_loop()
        inflight = router_server.Inflight(s.router_inflight_mib << 20)
        audit = self._authorizer.audit if self._authorizer is not None else None
        front = None
        if s.router_tls_front and not s.dev:
            front = router_server.front_context(sec.id_dir, tokens=bool(s.router_tokens))
            sec.tls_contexts.append(front)
        self._router, self.router, router_where = await router_server.serve(
            LocalScoring(self.scorer, loop.time), loop.time, s.router_addr(),
            dev=s.dev, identity=lambda: sec.identity, tokens_file=s.router_tokens,
            verifier=sec.verifier, shm_dir=Path(s.data_path()) / SHM_DIR, inflight=inflight,
            tls_front=front, audit=audit)
        self.router.tracer = request_tracer(self.tracing)
        router_http_where = "off"
        http_addr = s.router_http_addr()
        if http_addr is not None:
            ctx = None if s.dev else sec.server_tls()
            self._router_http, router_http_where = await router_server.serve_http(
                self.router, http_addr, ssl_context=ctx, inflight=inflight, audit=audit)
        return router_where, router_http_where

    def _reserve_router_ports(self) -> tuple[str, str]:
        """The router's gRPC and HTTP addresses as the workers will bind them (``"off"``: no
        HTTP ingress), checked free now so that a port in use fails the start as it would
        for this process's own listener, and a port 0 is chosen.  On Linux the sockets stay
        bound, not listening, until the agent stops (SO_REUSEPORT: the workers bind beside
        them, and the port stays this node's while a worker restarts); elsewhere they are
        closed at once for the one worker to bind."""
        s = self.settings
        out = []
        for addr, name in ((s.router_addr(), "router"), (s.router_http_addr(), "router_http")):
            if addr is None:
                out.append("off")
                continue
            sock = _reserve(addr)
            port = sock.getsockname()[1]
            if REUSE_PORT:
                self._router_ports.append(sock)
            else:
                sock.close()
            out.append(f"{addr[0]}:{port}")
            log.debug("router port reserved", extra={"event": "router_port_reserved",
                                                     "ingress": name, "port": port})
        return out[0], out[1]

    async def _start_router_workers(self, router_where: str, router_http_where: str) -> None:
        """``--router-workers N``: N processes serving the router's ports, scoring through a
        score API and a score link on Unix sockets of their own, in the data directory (on
        loopback TCP ports where asyncio has no Unix sockets)."""
        s = self.settings
        clock = asyncio.get_running_loop().time
        api_at: str | tuple[str, int] = ("127.0.0.1", 0)
        if UNIX_SOCKETS:
            where = Path(s.data_path())
            if len(str(where)) > 80:  # sun_path holds 108 bytes
                self._workers_dir = tempfile.mkdtemp(prefix="meshd-")
                where = Path(self._workers_dir)
            api_path = where / "router-score.sock"
            api_path.unlink(missing_ok=True)
            api_at = str(api_path)
        self._workers_score, api = await score_api.serve(
            self.scorer, clock, api_at, lambda: self.security.identity, self.worker_counters)
        if UNIX_SOCKETS:
            link = str(where / "router-link.sock")
            self._workers_link, self.link_counts = await score_link.serve(
                self.scorer, clock, link)
        else:
            self._workers_link, self.link_counts, link = await score_link.serve_loopback(
                self.scorer, clock)
        argv = ["--score", api, "--link", link, "--router", _bracketed(router_where),
                "--data", s.data_path(), "--node", s.node, "--log-level", s.log_level,
                "--inflight-mib", str(s.router_inflight_mib), "--nice", str(s.router_nice)]
        if router_http_where != "off":
            argv += ["--router-http", _bracketed(router_http_where)]
        if s.router_tokens:
            argv += ["--tokens", os.path.abspath(s.router_tokens)]
        if s.dev:
            argv.append("--dev")
        if s.audit_log:
            argv += ["--audit-log", s.audit_log if s.audit_log == "off"
                     else os.path.abspath(s.audit_log)]
        if s.router_tls_front:
            argv.append("--tls-front")
        self.router_workers = WorkerPool(s.router_workers, argv)
        await self.router_workers.start()

    async def _shutdown(self, leave: bool) -> None:
        if leave and self.transport is not None and self.swim is not None:
            log.info("leaving", extra={"event": "leaving"})
            await self.transport.leave()
            self._save_state()
        if self._admin is not None:
            # Calls in flight (forwarded writes above all) finish before the Raft groups
            # close under them; streams (Follow, SubscribeEvents) are cut after the grace.
            await self._admin.stop(ADMIN_GRACE)  # type: ignore[attr-defined]
            if self._authorizer is not None:
                self._authorizer.audit.close()
        # In-flight requests finish (drain); new ones are refused once stop() begins.  The
        # workers drain theirs, still scoring through this agent.
        stops = []
        if self._router is not None:
            stops.append(self._router.stop(ROUTER_GRACE))  # type: ignore[attr-defined]
        if self._router_http is not None:
            stops.append(self._router_http.cleanup())  # type: ignore[attr-defined]
        if self.router_workers is not None:
            stops.append(self.router_workers.stop(ROUTER_GRACE))
        await asyncio.gather(*stops)
        if self.router is not None:
            await self.router.close()
        for sock in self._router_ports:
            sock.close()
        if self._workers_link is not None:
            self._workers_link.close()
        if self._workers_score is not None:
            await self._workers_score.stop(0)  # type: ignore[attr-defined]
            if self._workers_dir:
                shutil.rmtree(self._workers_dir, ignore_errors=True)
        if self._score is not None:
            await self._score.stop(ADMIN_GRACE)  # type: ignore[attr-defined]
        await self.control.close(leave=leave)
        await self.signals.close()
        if self.metrics is not None:
            self.metrics.close()
        if self.transport is not None:
            await self.transport.close()
        if self.tracing is not None:  # flushes what is queued (bounded by the export timeout)
            await asyncio.get_running_loop().run_in_executor(None, self.tracing.shutdown)
        log.info("agent stopped", extra={"event": "agent_stopped"})


def main(settings: Settings) -> int:
    return asyncio.run(Agent(settings).run())
