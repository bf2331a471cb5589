"""The Triton runtime adapter: polls one Triton server and keeps its replicas' state fresh.

Three cadences, because the figures age at different speeds:

* **queue** (default every 100 ms): the ``nv_inference_pending_request_count`` gauge from the
  server's Prometheus endpoint.  ModelStatistics has only cumulative counters, so this gauge is
  the one live queue depth Triton offers.  It doubles as the liveness probe: two polls in a row
  that fail mark every replica not ready; the first answer after that triggers rediscovery.
* **stats** (default every 1 s): RepositoryIndex (loads and unloads), ModelConfig for new
  versions, and ModelStatistics, whose deltas give rates, mean queue/compute time and the SPU
  estimate (:mod:`adapters.triton_stats`).
* config is fetched once per model version, and again when it is reloaded.
* **HTTP** (with the stats poll, when ``http=`` names Triton's HTTP endpoint): a
  ``GET /v2/health/live`` probe.  Replicas carry the advertised HTTP address only while it
  answers, so routers forward HTTP requests there as they came rather than to a port that
  is not serving; without it they convert HTTP requests to gRPC.

All network calls have a timeout; a failure is counted by reason and never ends the loops.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import logging
import time
import urllib.parse
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from adapters.model import ReplicaState
from adapters.triton_stats import (
    StatsSample,
    StatsTracker,
    parse_pending,
    request_bytes,
    units_for,
)

log = logging.getLogger("meshd.adapters.triton")

DOWN_AFTER = 2
"""Failed queue polls in a row after which the server's replicas are not ready."""
BYTES_EWMA = 0.1
"""Weight of one observed request size in a model's mean request size."""


CHANNEL_ARGS = [
    ("grpc.max_receive_message_length", 2**31 - 1),  # statistics of a large repository
    ("grpc.max_send_message_length", 2**31 - 1),
    ("grpc.keepalive_time_ms", 10_000),
    ("grpc.keepalive_timeout_ms", 2_000),
    # gRPC's reconnect backoff grows to 120 s over an outage, which kept a Triton that was
    # back (its metrics answering in 0.1 s) not-ready for up to 40 s; cap it near one poll.
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.min_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 1000),
]
"""Options of the channel to Triton's gRPC endpoint (they replace tritonclient's defaults)."""


class EndpointError(ValueError):
    """A ``--triton`` value that cannot be used; the message says what is wrong."""


def _hostport(addr: str, what: str) -> tuple[str, str]:
    """``addr``'s host and port, or EndpointError saying it is not a ``HOST:PORT``."""
    host, sep, port = addr.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise EndpointError(f"{addr!r}: expected HOST:PORT of {what}")
    return host, port


@dataclass(frozen=True, slots=True)
class TritonEndpoint:
    """Where a Triton server is: its gRPC address, metrics URL, HTTP address (optional), and
    the addresses routers use."""

    grpc: str
    metrics: str
    advertise: str
    http: str = ""
    """Triton's HTTP/REST endpoint as this node reaches it (``host:port``); empty: none."""
    advertise_http: str = ""
    """The HTTP address routers use: ``http``'s port on the ``advertise`` host when that
    names another host than ``grpc`` (the node's address, not a loopback one)."""

    @classmethod
    def parse(cls, spec: str) -> TritonEndpoint:
        """``HOST:PORT[,metrics=URL][,http=HOST:PORT][,advertise=HOST:PORT]``; metrics default
        to ``http://HOST:8002/metrics``, Triton's default metrics port.  There is no default
        HTTP endpoint: a guessed one would have routers forward to a port Triton may not
        serve, so without ``http=`` routers convert HTTP requests to gRPC."""
        parts = [p.strip() for p in spec.split(",") if p.strip()]
        if not parts:
            raise EndpointError("empty Triton endpoint; expected HOST:PORT")
        grpc_addr = parts[0]
        host, _ = _hostport(grpc_addr, "Triton's gRPC endpoint")
        opts: dict[str, str] = {}
        for p in parts[1:]:
            key, eq, value = p.partition("=")
            if not eq or key not in ("metrics", "http", "advertise") or not value:
                raise EndpointError(
                    f"{p!r}: expected metrics=URL, http=HOST:PORT or advertise=HOST:PORT")
            opts[key] = value
        metrics = opts.get("metrics", f"http://{host}:8002/metrics")
        url = urllib.parse.urlsplit(metrics)
        if url.scheme != "http" or not url.hostname:
            raise EndpointError(f"metrics={metrics!r}: expected an http:// URL")
        advertise = opts.get("advertise", grpc_addr)
        adv_host, _ = _hostport(advertise, "the address routers use (advertise=)")
        http_addr = opts.get("http", "")
        advertise_http = http_addr
        if http_addr:
            _, http_port = _hostport(http_addr, "Triton's HTTP endpoint (http=)")
            if adv_host != host:
                advertise_http = f"{adv_host}:{http_port}"
        return cls(grpc_addr, metrics, advertise, http_addr, advertise_http)


class _MetricsScraper:
    """GET of the metrics page (or another page: the HTTP health probe) over one kept-alive
    connection, in a worker thread (stdlib ``http.client``: Triton's endpoints are plain
    HTTP/1.1 and need nothing more)."""

    def __init__(self, url: str, timeout: float, what: str = "metrics") -> None:
        parts = urllib.parse.urlsplit(url)
        self.host = parts.hostname or "127.0.0.1"
        self.port = parts.port or 80
        self.path = parts.path or "/metrics"
        self.timeout = timeout
        self.what = what
        self._conn: http.client.HTTPConnection | None = None

    def get(self) -> str:
        for attempt in (0, 1):
            if self._conn is None:
                self._conn = http.client.HTTPConnection(self.host, self.port,
                                                        timeout=self.timeout)
            try:
                self._conn.request("GET", self.path)
                resp = self._conn.getresponse()
                body = resp.read()
                if resp.status != 200:
                    raise OSError(f"{self.what}: HTTP {resp.status}")
                return body.decode("utf-8", "replace")
            except (http.client.HTTPException, ConnectionError):
                self.close()  # a kept-alive connection the server closed: retry once
                if attempt:
                    raise
        raise AssertionError("unreachable")

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


@dataclass(slots=True)
class _Model:
    """What the adapter remembers of one model version beyond its public state."""

    tracker: StatsTracker
    request_bytes: int | None = None
    config_seen: bool = False


class TritonAdapter:
    """Keeps :attr:`replicas` (by ``(model, version)``) for one Triton server."""

    def __init__(self, endpoint: TritonEndpoint, *, queue_interval: float = 0.1,
                 stats_interval: float = 1.0,
                 on_update: Callable[[], None] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 client: Any = None) -> None:
        self.endpoint = endpoint
        self.queue_interval = queue_interval
        self.stats_interval = stats_interval
        self.on_update = on_update or (lambda: None)
        self.clock = clock
        self.replicas: dict[tuple[str, str], ReplicaState] = {}
        self.errors: Counter[str] = Counter()
        self.polls: Counter[str] = Counter()
        self.up = False
        self.observed_bytes: dict[str, float] = {}
        """Mean request size per model as routers saw it (for variable-sized inputs)."""
        self._models: dict[tuple[str, str], _Model] = {}
        self._failed_polls = 0
        self._failed_stats = 0
        self._rediscover = asyncio.Event()
        self._scraper = _MetricsScraper(endpoint.metrics, timeout=max(0.25, queue_interval))
        self.http = ""
        """The HTTP address the replicas carry: the advertised one while the probe answers."""
        self._failed_probes = 0
        self._probe: _MetricsScraper | None = None
        if endpoint.http:
            self._probe = _MetricsScraper(f"http://{endpoint.http}/v2/health/live",
                                          timeout=max(1.0, stats_interval), what="http")
        self._client = client
        self._tasks: list[asyncio.Task[None]] = []
        self._logged: set[str] = set()

    # --- lifecycle ----------------------------------------------------------------------

    async def start(self) -> None:
        if self._client is None:
            import tritonclient.grpc.aio as triton_aio
            self._client = triton_aio.InferenceServerClient(
                self.endpoint.grpc, channel_args=CHANNEL_ARGS)
        loop = asyncio.get_running_loop()
        self._tasks = [loop.create_task(self._queue_loop()),
                       loop.create_task(self._stats_loop())]

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks = []
        if self._client is not None:
            await self._client.close()
        await asyncio.to_thread(self._scraper.close)
        if self._probe is not None:
            await asyncio.to_thread(self._probe.close)

    # --- the repository (servers in --model-control-mode=explicit) ---------------------

    async def load_model(self, model: str, timeout: float, config: str = "") -> None:
        """Load ``model`` (every version its config serves), with ``config`` (JSON) in place
        of the repository's when given (on a loaded model: reloaded with it); raises with
        Triton's reason.  The replica shows up ready at the next poll, asked for at once."""
        await self._client.load_model(model, config=config or None, client_timeout=timeout)
        self._rediscover.set()

    async def unload_model(self, model: str, timeout: float) -> None:
        """Unload ``model`` (Triton lets requests it holds finish first)."""
        await self._client.unload_model(model, client_timeout=timeout)
        self._rediscover.set()

    async def served(self, model: str, timeout: float) -> int | None:
        """Inferences ``model`` has answered (succeeded or failed) since it loaded, summed
        over its versions; None if Triton does not know it.  Between two reads with the
        same count and nothing queued, no request was running."""
        try:
            stats = await self._client.get_inference_statistics(model, client_timeout=timeout)
        except Exception:  # noqa: BLE001 - tritonclient raises its own and grpc errors
            return None
        return sum(int(m.inference_stats.success.count) + int(m.inference_stats.fail.count)
                   for m in stats.model_stats)

    def present(self, model: str) -> bool | None:
        """Whether Triton serves ``model`` (a version ready) as last polled; None while the
        server does not answer."""
        if not self.up:
            return None
        return any(r.ready for (name, _), r in self.replicas.items() if name == model)

    def queued(self, model: str) -> int:
        """Requests for ``model`` waiting in Triton's queue, as last polled."""
        return sum(r.queue or 0 for (name, _), r in self.replicas.items() if name == model)

    def observe_request(self, model: str, payload_bytes: int) -> None:
        """A router's report of a request's size: the SPU of variable-sized models uses it."""
        mean = self.observed_bytes.get(model)
        self.observed_bytes[model] = (float(payload_bytes) if mean is None
                                      else mean + BYTES_EWMA * (payload_bytes - mean))

    # --- queue poll (and liveness) ------------------------------------------------------

    async def _queue_loop(self) -> None:
        while True:
            started = self.clock()
            await self.poll_queue()
            await asyncio.sleep(max(0.0, self.queue_interval - (self.clock() - started)))

    async def poll_queue(self) -> None:
        try:
            text = await asyncio.to_thread(self._scraper.get)
        except (OSError, http.client.HTTPException) as exc:
            self._failure("metrics", exc)
            self._failed_polls += 1
            if self._failed_polls == DOWN_AFTER:
                self._mark_down(f"no answer from {self.endpoint.metrics}: {exc}")
            return
        self.polls["queue"] += 1
        if self._failed_polls >= DOWN_AFTER:
            self._rediscover.set()  # back: rediscover now rather than at the next stats poll
        self._failed_polls = 0
        scrape = parse_pending(text)
        if scrape.bad_lines:
            self.errors["metrics_bad_line"] += scrape.bad_lines
        now = self.clock()
        changed = False
        for key, rep in self.replicas.items():
            queue = scrape.pending.get(key)
            if queue is None and rep.ready:
                queue = 0  # a loaded model without pending requests may have no sample yet
            if queue != rep.queue:
                rep.queue = queue
                changed = True
            rep.at["queue"] = now
        if changed:
            self.on_update()

    def _mark_down(self, why: str) -> None:
        self.up = False
        now = self.clock()
        for rep in self.replicas.values():
            rep.ready = False
            rep.queue = None
            rep.at["ready"] = now
        log.warning("triton not answering; its replicas are not ready", extra={
            "event": "triton_down", "endpoint": self.endpoint.grpc, "detail": why})
        self.on_update()

    # --- discovery and statistics -------------------------------------------------------

    async def _stats_loop(self) -> None:
        while True:
            started = self.clock()
            await self.poll_stats()
            remaining = self.stats_interval - (self.clock() - started)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._rediscover.wait(), max(0.0, remaining))
            self._rediscover.clear()

    async def poll_stats(self) -> None:
        """One slow-cadence poll: discovery and statistics over gRPC and, alongside (so a
        slow HTTP port delays neither), the probe of Triton's HTTP endpoint."""
        if self._probe is None:
            await self._poll_grpc()
            return
        _, changed = await asyncio.gather(self._poll_grpc(), self.probe_http())
        if changed:
            self.on_update()

    async def probe_http(self) -> bool:
        """``GET /v2/health/live``: the replicas carry the advertised HTTP address from the
        first 200 on, and none after ``DOWN_AFTER`` failures in a row (one slow answer does
        not flap it on the wire).  Returns whether that changed."""
        assert self._probe is not None
        try:
            await asyncio.to_thread(self._probe.get)
        except (OSError, http.client.HTTPException) as exc:
            self.errors[f"http_{type(exc).__name__}"] += 1  # counted; logged just below
            self._failed_probes += 1
            if self.http and self._failed_probes < DOWN_AFTER:
                return False  # one slow answer does not flap the address on the wire
            if self.http or self._failed_probes == 1:
                log.warning("triton HTTP endpoint not answering; routers convert HTTP "
                            "requests to gRPC", extra={
                                "event": "triton_http_down", "endpoint": self.endpoint.grpc,
                                "http": self.endpoint.http, "detail": str(exc)})
            return self._set_http("")
        self.polls["http"] += 1
        self._failed_probes = 0
        if not self.http:
            log.info("triton HTTP endpoint answering", extra={
                "event": "triton_http_up", "endpoint": self.endpoint.grpc,
                "http": self.endpoint.advertise_http})
        return self._set_http(self.endpoint.advertise_http)

    def _set_http(self, addr: str) -> bool:
        if addr == self.http:
            return False
        self.http = addr
        for rep in self.replicas.values():
            rep.http = addr
        return True

    async def _poll_grpc(self) -> None:
        timeout = max(1.0, self.stats_interval)
        try:
            index = await self._client.get_model_repository_index(client_timeout=timeout)
            await self._discover(index, timeout)
            stats = await self._client.get_inference_statistics(client_timeout=timeout)
        except Exception as exc:  # noqa: BLE001 - tritonclient raises its own and grpc errors
            self._failure("grpc", exc)
            self._failed_stats += 1
            if self._failed_stats == DOWN_AFTER and self.up:
                self._mark_down(f"no answer from {self.endpoint.grpc}: {exc}")
            return
        self._failed_stats = 0
        self.polls["stats"] += 1
        if not self.up:
            self.up = True
            log.info("triton answering", extra={"event": "triton_up",
                                                "endpoint": self.endpoint.grpc})
        self._fold_stats(stats)
        self.on_update()

    async def _discover(self, index: Any, timeout: float) -> None:
        now = self.clock()
        seen: set[tuple[str, str]] = set()
        for entry in index.models:
            version = entry.version or "1"
            key = (entry.name, version)
            ready = entry.state == "READY"
            if not ready and key not in self.replicas:
                continue
            seen.add(key)
            rep = self.replicas.get(key)
            if rep is None:
                rep = self.replicas[key] = ReplicaState(
                    model=entry.name, version=version, endpoint=self.endpoint.advertise,
                    http=self.http)
                self._models[key] = _Model(StatsTracker())
            model = self._models[key]
            if ready and (not rep.ready or not model.config_seen):
                ready = await self._client.is_model_ready(entry.name, version,
                                                          client_timeout=timeout)
                if ready:
                    await self._read_config(rep, model, timeout)
            rep.ready = bool(ready)
            rep.at["ready"] = now
        for key in [k for k in self.replicas if k not in seen]:
            del self.replicas[key]  # unloaded and gone from the repository index
            self._models.pop(key, None)

    async def _read_config(self, rep: ReplicaState, model: _Model, timeout: float) -> None:
        resp = await self._client.get_model_config(rep.model, rep.version,
                                                   client_timeout=timeout)
        cfg = resp.config
        rep.max_batch = int(cfg.max_batch_size)
        rep.instances = max(1, sum(int(g.count) or 1 for g in cfg.instance_group))
        rep.dynamic_batching = cfg.HasField("dynamic_batching")
        from tritonclient.grpc import model_config_pb2 as mc
        inputs = [(mc.DataType.Name(i.data_type), list(i.dims)) for i in cfg.input]
        model.request_bytes = request_bytes(inputs)
        model.config_seen = True

    def _fold_stats(self, stats: Any) -> None:
        now = self.clock()
        for ms in stats.model_stats:
            key = (ms.name, ms.version or "1")
            rep, model = self.replicas.get(key), self._models.get(key)
            if rep is None or model is None:
                continue
            s = ms.inference_stats
            sample = StatsSample(
                success_count=s.success.count, success_ns=s.success.ns,
                fail_count=s.fail.count, queue_count=s.queue.count, queue_ns=s.queue.ns,
                compute_count=s.compute_infer.count,
                compute_ns=s.compute_input.ns + s.compute_infer.ns + s.compute_output.ns,
                execution_count=ms.execution_count)
            size = model.request_bytes
            if size is None and rep.model in self.observed_bytes:
                size = int(self.observed_bytes[rep.model])
            interval = model.tracker.update(sample, now, units_for(size))
            if interval is not None:
                rep.rate = interval.rate
                rep.failures = interval.failures
                if interval.queue_seconds is not None:
                    rep.queue_seconds = interval.queue_seconds
                if interval.compute_seconds is not None:
                    rep.compute_seconds = interval.compute_seconds
            rep.spu = model.tracker.spu
            rep.latency_ewma = model.tracker.latency
            rep.at["stats"] = now

    def _failure(self, where: str, exc: BaseException) -> None:
        reason = f"{where}_{type(exc).__name__}"
        self.errors[reason] += 1
        if reason not in self._logged:
            self._logged.add(reason)
            log.warning("triton poll failed", extra={
                "event": "triton_poll_failed", "endpoint": self.endpoint.grpc,
                "detail": f"{where}: {exc}"})
