"""The agent's ``/metrics`` endpoint: the Prometheus text format (0.0.4), rendered fast.

``prometheus_client.generate_latest`` checks and escapes every label name of every sample; an
agent with 64 models on 8 GPUs exports about 6,000 samples, and it took 70-110 ms to render
them (``bench/metrics_scrape.py``; the bar is 50 ms).  :func:`render` writes the same bytes
(a test compares the two) doing per family what can be done per family: label names are
checked once, label values are escaped only when they hold a character that needs it.

:class:`MetricsServer` serves it from a thread of its own (gzip when the scraper asks, at the
fastest level: a scrape is on a LAN, and CPU is what the agent is short of).
"""

from __future__ import annotations

import gzip
import threading
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector
from prometheus_client.utils import floatToGoString

from gossip.transport import family_of
from meshd.metrics.schema import Family, HistogramFamily

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _escape(value: str) -> str:
    if "\\" in value or "\n" in value or '"' in value:
        return value.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
    return value


def _help(doc: str) -> str:
    return doc.replace("\\", r"\\").replace("\n", r"\n")


MAX_HEADS = 100_000
"""Rendered series names (name and labels) kept between scrapes; past this, forgotten."""
_heads: dict[tuple[str, tuple[str, ...], tuple[Any, ...]], str] = {}


def _head(name: str, labels: tuple[str, ...], values: tuple[str, ...], le: str = "") -> str:
    """``name{k="v",...}`` with the labels (and a histogram bucket's ``le``) sorted by name,
    as generate_latest writes them: the same series on every scrape, so rendered once and
    looked up after."""
    key = (name, labels, (*values, le) if le else values)
    head = _heads.get(key)
    if head is None:
        pairs = sorted([*zip(labels, values, strict=True), *(("le", le),) * bool(le)])
        body = ",".join([f'{k}="{_escape(v)}"' for k, v in pairs])
        head = f"{name}{{{body}}}" if pairs else name
        if len(_heads) >= MAX_HEADS:
            _heads.clear()
        _heads[key] = head
    return head


def _family(metric: Family, out: list[str]) -> None:
    name, labels = metric.sample_name, metric.labels
    out.append(f"# HELP {name} {_help(metric.documentation)}\n# TYPE {name} {metric.type}\n")
    for values, value in metric.rows:
        out.append(f"{_head(name, labels, values)} {floatToGoString(value)}\n")


def _histogram(metric: HistogramFamily, out: list[str]) -> None:
    name, labels = metric.name, metric.labels
    out.append(f"# HELP {name} {_help(metric.documentation)}\n# TYPE {name} histogram\n")
    bucket, count, sums = name + "_bucket", name + "_count", name + "_sum"
    for values, counts, total in metric.rows:
        cumulative = metric.cumulative(counts)
        for le, n in cumulative:
            out.append(f"{_head(bucket, labels, values, le)} {floatToGoString(n)}\n")
        out.append(f"{_head(count, labels, values)} {floatToGoString(cumulative[-1][1])}\n")
        out.append(f"{_head(sums, labels, values)} {floatToGoString(total)}\n")


class _One(Collector):
    """One collected metric, as a registry ``generate_latest`` can render."""

    def __init__(self, metric: Metric) -> None:
        self.metric = metric

    def collect(self) -> Iterable[Metric]:
        return [self.metric]


def render(registry: Collector) -> bytes:
    """``registry``'s metrics in the Prometheus text format: what ``generate_latest`` writes
    for legacy-valid names (meshd's, by its metric table)."""
    out: list[str] = []
    for metric in registry.collect():
        if isinstance(metric, Family):
            _family(metric, out)
            continue
        if isinstance(metric, HistogramFamily):
            _histogram(metric, out)
            continue
        # The few metrics off the table (the library's own histograms, a handful of series):
        # the library renders them.
        out.append(generate_latest(_One(metric)).decode())
    return "".join(out).encode()


class MetricsServer:
    """``GET /metrics`` on ``host:port`` from a daemon thread."""

    def __init__(self, registry: Collector, host: str, port: int) -> None:
        self.registry = registry

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802 - the http.server name
                if self.path.split("?", 1)[0] not in ("/metrics", "/"):
                    self.send_error(404, "only /metrics is here")
                    return
                body = render(registry)
                gzipped = "gzip" in self.headers.get("Accept-Encoding", "")
                if gzipped:
                    body = gzip.compress(body, compresslevel=1)
                self.send_response(200)
                self.send_header("Content-Type", CONTENT_TYPE)
                self.send_header("Content-Length", str(len(body)))
                if gzipped:
                    self.send_header("Content-Encoding", "gzip")
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass  # scrapes are not news

        class Server(ThreadingHTTPServer):
            daemon_threads = True
            address_family = family_of(host)

        self.httpd = Server((host, port), Handler)
        self.address = self.httpd.server_address
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True,
                                       name="meshd-metrics")
        self.thread.start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
