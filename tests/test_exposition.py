"""meshd/metrics/exposition.py: the fast text renderer writes exactly what prometheus_client's
generate_latest writes, for every family in the metric table and for live counters and
histograms (with their _created samples), escaping included; the server serves it, gzipped
when asked."""

from __future__ import annotations

import gzip
import urllib.error
import urllib.request

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from meshd.metrics import schema as metric_schema
from meshd.metrics.exposition import MetricsServer, render
from meshd.metrics.schema import METRICS


def table_registry(value: str = "v") -> CollectorRegistry:
    class Every:
        def collect(self):  # type: ignore[no-untyped-def]
            for spec in METRICS.values():
                if spec.kind == "histogram":
                    fam = metric_schema.histogram_family(spec.name)
                    fam.add([value] * len(spec.labels),
                            [1] + [0] * (len(spec.buckets) - 1) + [2], 2.25)
                else:
                    fam = metric_schema.family(spec.name)
                    fam.add_metric([value] * len(spec.labels), 1.5)
                    fam.add_metric([value + "2"] * len(spec.labels), 7e22)
                yield fam

    registry = CollectorRegistry()
    registry.register(Every())  # type: ignore[arg-type]
    return registry


def test_render_is_generate_latest_for_every_family_of_the_table() -> None:
    registry = table_registry()
    assert render(registry) == generate_latest(registry)


def test_render_is_generate_latest_for_live_metrics_with_created_samples() -> None:
    registry = CollectorRegistry()
    c = Counter("meshd_x_things", "Things\\ counted\nhere", ["b", "a"], registry=registry)
    c.labels("1", "2").inc(3)
    c.labels('q"uote', "new\nline").inc()
    h = Histogram("meshd_x_seconds", "Time", ["op"], buckets=(0.1, 1.0), registry=registry)
    h.labels("all_reduce").observe(0.3)
    Gauge("meshd_x_up", "Up", registry=registry).set(float("nan"))
    out = render(registry)
    assert out == generate_latest(registry)
    assert b"meshd_x_things_created" in out


@settings(max_examples=60, deadline=None)
@given(st.text(max_size=20))
def test_any_label_value_is_escaped_as_generate_latest_does(value: str) -> None:
    registry = table_registry(value)
    assert render(registry) == generate_latest(registry)


def test_the_server_serves_metrics_gzipped_when_asked_and_nothing_else() -> None:
    registry = table_registry()
    server = MetricsServer(registry, "127.0.0.1", 0)
    host, port = server.address[:2]
    try:
        with urllib.request.urlopen(f"http://{host}:{port}/metrics") as r:
            plain = r.read()
            assert r.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        names = {f.name for f in text_string_to_metric_families(plain.decode())}
        assert names >= set(METRICS)
        req = urllib.request.Request(f"http://{host}:{port}/metrics",
                                     headers={"Accept-Encoding": "gzip"})
        with urllib.request.urlopen(req) as r:
            assert r.headers["Content-Encoding"] == "gzip"
            assert gzip.decompress(r.read()) == plain
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"http://{host}:{port}/admin")
        assert err.value.code == 404
    finally:
        server.close()
