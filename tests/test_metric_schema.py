"""The metric table (meshd/metrics/schema.py): names, units and labels follow the schema, and the
reference page is what the table generates.  Live agents are checked against the table in
tests/test_prometheus.py (every series a scraped mesh exports)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from meshd.metrics import schema as metric_schema
from meshd.metrics.schema import LABELS, LAYERS, METRICS, SHARED_LABELS, UNITS, Spec

ROOT = Path(__file__).resolve().parent.parent
NAME = re.compile(r"^meshd_([a-z]+)_[a-z0-9_]+[a-z0-9]$")


@pytest.mark.parametrize("spec", METRICS.values(), ids=lambda s: s.name)
def test_each_name_is_meshd_layer_what_unit(spec: Spec) -> None:
    m = NAME.match(spec.name)
    assert m is not None, spec.name
    assert m.group(1) in LAYERS, f"{spec.name}: layer {m.group(1)!r} is not in LAYERS"
    assert not spec.name.endswith(("_total", "_count", "_sum", "_bucket", "_created")), \
        "the exposition adds these suffixes"
    if spec.unit:
        assert spec.unit in UNITS and spec.name.endswith("_" + spec.unit), spec.name
    else:  # a name ending in a unit must say so, so the page lists it
        assert not any(spec.name.endswith("_" + u) for u in UNITS), spec.name
    if spec.kind == "histogram":
        assert spec.unit and spec.buckets, "a histogram measures something, in buckets"
        assert list(spec.buckets) == sorted(set(spec.buckets))
    assert spec.help[:1].isupper() or spec.help[:1].isdigit()
    assert not spec.help.endswith(".")


@pytest.mark.parametrize("spec", METRICS.values(), ids=lambda s: s.name)
def test_labels_come_from_the_bounded_schema(spec: Spec) -> None:
    assert spec.labels[0] == "node", "every series says which node exported it"
    assert len(set(spec.labels)) == len(spec.labels)
    unknown = set(spec.labels) - set(LABELS)
    assert not unknown, f"{spec.name}: labels {unknown} are not in LABELS"


def test_the_shared_label_schema_is_documented_and_request_ids_are_not_labels() -> None:
    assert set(SHARED_LABELS) <= set(LABELS)
    assert not {"request_id", "decision_id", "trace_id", "job_id", "id"} & set(LABELS)


def test_the_reference_page_is_generated_from_the_table() -> None:
    page = (ROOT / "docs" / "metrics.md").read_text()
    assert page == metric_schema.reference(), \
        "docs/metrics.md is stale: python -m meshd.metrics.schema > docs/metrics.md"
    for spec in METRICS.values():
        shown = spec.name + ("_total" if spec.kind == "counter" else "")
        assert f"`{shown}`" in page


def test_families_built_from_the_table_expose_its_type_help_and_labels() -> None:
    """family/histogram/counter give what Prometheus then parses back: the same type, help
    and label names as the table (so the table cannot disagree with an exporter)."""

    class One:
        def collect(self):  # type: ignore[no-untyped-def]
            for spec in METRICS.values():
                if spec.kind == "histogram":
                    fam = metric_schema.histogram_family(spec.name)
                    fam.add(["v"] * len(spec.labels), [0] * len(spec.buckets) + [1], 0.5)
                else:
                    fam = metric_schema.family(spec.name)
                    fam.add_metric(["v"] * len(spec.labels), 1.0)
                yield fam

    registry = CollectorRegistry()
    registry.register(One())  # type: ignore[arg-type]
    seen = {}
    for fam in text_string_to_metric_families(generate_latest(registry).decode()):
        seen[fam.name] = fam
        spec = METRICS[fam.name]
        assert fam.type == spec.kind and fam.documentation == spec.help
        for sample in fam.samples:
            assert set(sample.labels) - {"le"} == set(spec.labels)
    assert set(seen) == set(METRICS)


def test_the_live_helpers_refuse_the_wrong_kind() -> None:
    registry = CollectorRegistry()
    with pytest.raises(AssertionError):
        metric_schema.histogram("meshd_router_requests", registry)
    with pytest.raises(AssertionError):
        metric_schema.family("meshd_score_request_seconds")
    with pytest.raises(KeyError):
        metric_schema.family("meshd_not_in_the_table")
