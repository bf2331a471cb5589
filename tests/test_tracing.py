"""OTLP traces (meshd/tracing.py): switched on by the OTEL_* variables, a request's trace from
the client through the router and its score decision to the Triton call (W3C traceparent over
gRPC metadata), training attempts and their steps, trace ids in the JSON logs; received by a
real OTLP/gRPC receiver in the test (testbed/otlp.py)."""

from __future__ import annotations

import io
import json
import logging
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from meshd import logs, tracing
from testbed.cluster import TRUST_DOMAIN
from testbed.otlp import ReceivedSpan, Receiver
from tests.test_consensus_integration import Mesh, meshes  # noqa: F401 - fixture
from tests.test_train_integration import submit, wait_job
from tests.triton import add_sub_inputs


@pytest.mark.parametrize(("env", "on"), [
    ({}, False),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317"}, True),
    ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://c:4317"}, True),
    ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
    ({"OTEL_TRACES_EXPORTER": "console,otlp"}, True),
    ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317"}, False),
    ({"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317"}, False),
    ({"OTEL_EXPORTER_OTLP_ENDPOINT": "  "}, False),
])
def test_the_standard_variables_switch_tracing(env: dict[str, str], on: bool) -> None:
    assert tracing.enabled(env) is on


def test_an_unknown_protocol_is_named_and_tracing_stays_off() -> None:
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317",
           "OTEL_EXPORTER_OTLP_PROTOCOL": "carrier-pigeon"}
    with pytest.raises(ValueError, match="OTEL_EXPORTER_OTLP_PROTOCOL.*carrier-pigeon"):
        tracing.exporter(env)
    assert tracing.setup("meshd", "n", env) is None
    assert tracing.setup("meshd", "n", {}) is None


def test_trace_context_round_trips_and_replaces_the_clients() -> None:
    provider = TracerProvider()
    tracer = provider.get_tracer("t")
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    ctx = tracing.extract([("traceparent", parent), ("x-other", "1"), ("tracestate", "a=b")])
    span = tracer.start_span("child", ctx)
    assert format(span.get_span_context().trace_id, "032x") == parent.split("-")[1]
    md = tracing.inject(span, [("traceparent", parent), ("x-meshd-slo", "gold")])
    headers = dict(md)
    assert headers["x-meshd-slo"] == "gold" and len(md) == 3  # one traceparent, ours
    assert headers["traceparent"].split("-")[2] == format(span.get_span_context().span_id, "016x")
    assert headers["tracestate"] == "a=b"
    assert set(tracing.environment(span)) == {"TRACEPARENT", "TRACESTATE"}
    garbage = tracing.extract([("traceparent", "garbage")])
    assert not trace.get_current_span(garbage).get_span_context().is_valid


def test_a_log_line_inside_a_span_carries_its_trace_and_span_id() -> None:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(logs.JsonFormatter("n1"))
    logger = logging.getLogger("meshd.test_tracing")
    logger.addHandler(handler)
    try:
        logger.warning("outside")
        tracer = TracerProvider().get_tracer("t")
        with tracer.start_as_current_span("s") as span:
            logger.warning("inside", extra={"event": "x"})
    finally:
        logger.removeHandler(handler)
    outside, inside = (json.loads(line) for line in stream.getvalue().splitlines())
    assert "trace_id" not in outside
    ctx = span.get_span_context()
    assert inside["trace_id"] == format(ctx.trace_id, "032x")
    assert inside["span_id"] == format(ctx.span_id, "016x")


# --- a live node ------------------------------------------------------------------------------


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    r = Receiver().start()
    try:
        yield r
    finally:
        r.stop()


def by_id(spans: list[ReceivedSpan]) -> dict[str, ReceivedSpan]:
    return {s.span_id: s for s in spans}


@pytest.mark.slow
@pytest.mark.skipif(not sys.platform.startswith("linux"),
                    reason="needs Linux (one loopback address per node)")
def test_a_request_is_one_trace_from_client_to_triton_and_a_job_is_traced(
        meshes: Callable[..., Mesh], triton_factory: Any, receiver: Receiver,  # noqa: F811
        tmp_path: Path) -> None:
    """One node (coordinator, router with a worker process, trainer) exporting to the
    receiver: a client span's traceparent becomes the parent of the router's span, which is
    the parent of the score decision and of each Triton call (whose own metadata carries the
    call's span); a training attempt is a span with spans of its steps."""
    import tritonclient.grpc as tc

    from certs.spiffe import any_node_dns

    (server,) = triton_factory(1, timeout=120)
    env = {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_EXPORTER_OTLP_INSECURE":
           "true", "OTEL_TRACES_SAMPLER": "parentbased_always_on", "OTEL_BSP_SCHEDULE_DELAY":
           "200", "OTEL_SERVICE_NAME": "meshd-test"}
    mesh = meshes(1, 0, extra={1: [
        "--role", "router", "--router-workers", "2", "--role", "trainer", "--gpu", "off",
        "--triton", server.meshd_spec]},
        node_env=lambda i: env)
    n1 = mesh.c.seed
    creds = mesh.c.admin_creds
    client_provider = TracerProvider(resource=Resource.create({"service.name": "client"}))
    client_provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(
        endpoint=receiver.endpoint, insecure=True)))
    tracer = client_provider.get_tracer("test-client")
    a = np.arange(8, dtype=np.float32).reshape(1, 8)
    client = tc.InferenceServerClient(
        n1.router, ssl=True, root_certificates=str(creds / "bundle.pem"),
        private_key=str(creds / "key.pem"), certificate_chain=str(creds / "cert.pem"),
        channel_args=[("grpc.ssl_target_name_override", any_node_dns(TRUST_DOMAIN))])
    end = time.monotonic() + 60
    while True:  # until the replica has reached the router's view
        try:
            client.infer("add_sub", add_sub_inputs(a, a, tc), client_timeout=5)
            break
        except Exception:  # noqa: BLE001 - not routable yet
            assert time.monotonic() < end, "the router never routed add_sub"
            time.sleep(0.5)
    roots = []
    for _ in range(6):  # the kernel spreads connections over the agent and its worker
        c = tc.InferenceServerClient(
            n1.router, ssl=True, root_certificates=str(creds / "bundle.pem"),
            private_key=str(creds / "key.pem"), certificate_chain=str(creds / "cert.pem"),
            channel_args=[("grpc.ssl_target_name_override", any_node_dns(TRUST_DOMAIN))])
        with tracer.start_as_current_span("client infer", kind=trace.SpanKind.CLIENT) as root:
            headers: dict[str, str] = {}
            tracing.PROPAGATOR.inject(headers)
            got = c.infer("add_sub", add_sub_inputs(a, a, tc), headers=headers)
            np.testing.assert_array_equal(got.as_numpy("OUTPUT0"), a + a)
        roots.append(root.get_span_context())
    # A stream: one span for it, its score decision and the Triton stream.
    got_stream: list[Any] = []
    with tracer.start_as_current_span("client stream", kind=trace.SpanKind.CLIENT) as root:
        headers = {}
        tracing.PROPAGATOR.inject(headers)
        client.start_stream(callback=lambda result, error: got_stream.append(error or result),
                            headers=headers)
        client.async_stream_infer("add_sub", add_sub_inputs(a, a, tc))
        receiver.wait(lambda: got_stream, 10, "the stream's answer")
        client.stop_stream()
    assert not isinstance(got_stream[0], Exception), got_stream[0]
    stream_ctx = root.get_span_context()
    client_provider.shutdown()

    def stream_trace() -> list[ReceivedSpan] | None:
        spans = [s for s in receiver.spans if s.trace_id == format(stream_ctx.trace_id, "032x")]
        names = {s.name for s in spans}
        ok = {"router ModelStreamInfer", "score", "triton ModelStreamInfer"} <= names
        return spans if ok else None

    streamed = by_id(receiver.wait(stream_trace, 20, "the stream's trace"))
    (srv,) = [s for s in streamed.values() if s.name == "router ModelStreamInfer"]
    assert srv.parent_id == format(stream_ctx.span_id, "016x") and srv.status != 2
    assert {s.name for s in streamed.values() if s.parent_id == srv.span_id} == {
        "score", "triton ModelStreamInfer"}
    for ctx in roots:
        trace_id = format(ctx.trace_id, "032x")

        def whole(trace_id: str = trace_id) -> list[ReceivedSpan] | None:
            spans = [s for s in receiver.spans if s.trace_id == trace_id]
            names = {s.name for s in spans}
            ok = {"client infer", "router ModelInfer", "score", "triton ModelInfer"} <= names
            return spans if ok else None

        spans = by_id(receiver.wait(whole, 20, f"the whole trace {trace_id}"))
        (router,) = [s for s in spans.values() if s.name == "router ModelInfer"]
        (score,) = [s for s in spans.values() if s.name == "score"]
        calls = [s for s in spans.values() if s.name == "triton ModelInfer"]
        assert router.parent_id == format(ctx.span_id, "016x"), "client -> router"
        assert router.kind == 2  # SERVER
        assert score.parent_id == router.span_id, "router -> score decision"
        assert score.attributes["meshd.model"] == "add_sub" and score.attributes["meshd.targets"]
        assert "meshd.shed" not in score.attributes
        assert all(c.parent_id == router.span_id and c.kind == 3 for c in calls)  # CLIENT
        assert any(c.status == 0 and c.attributes["server.address"] == server.grpc_url
                   for c in calls)  # unset: OK
        assert router.resource["service.name"] == "meshd-test"
        assert router.resource["service.instance.id"] == n1.name
    # A training attempt and its steps.
    spec = {"id": "traced", "model": "logreg", "entry": "meshd.train.sample:main",
            "checkpoints": str(tmp_path / "traced"), "gpus": {"count": 0},
            "hyperparameters": {"steps": 30, "checkpoint_every": 10, "step_seconds": 0.01}}
    submit(mesh, n1, json.dumps(spec))
    wait_job(mesh, n1, "traced", lambda s: s.state == "done", 60, "the job done")
    (attempt,) = receiver.wait(lambda: receiver.named("train attempt"), 20, "the attempt span")
    assert attempt.attributes["meshd.job"] == "traced" and attempt.attributes["meshd.rank"] == 0
    assert attempt.attributes["meshd.outcome"] == "done"
    steps = receiver.wait(lambda: [s for s in receiver.named("train steps")
                                   if s.parent_id == attempt.span_id], 10, "step spans")
    assert len(steps) >= 3 and {s.trace_id for s in steps} == {attempt.trace_id}
    assert max(s.attributes["meshd.last_step"] for s in steps) >= 29


# --- the router's sampling fast path ----------------------------------------------------------


def _request_tracer(sampler: Any) -> Any:
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from meshd.router.traces import RequestTracer

    provider = TracerProvider(sampler=sampler)
    processor = SimpleSpanProcessor(InMemorySpanExporter())
    provider.add_span_processor(processor)
    return RequestTracer(tracing.Tracing(provider, processor))


@pytest.mark.parametrize("rate", [0.0, 0.1, 0.5, 1.0])
def test_new_traces_are_sampled_as_the_sdk_would_at_the_configured_ratio(rate: float) -> None:
    """The fast path (no client context) keeps a new trace exactly when the SDK's
    TraceIdRatioBased would keep its id, parent based or not, at about the ratio."""
    from opentelemetry.sdk.trace import sampling

    for sampler in (sampling.ParentBasedTraceIdRatio(rate), sampling.TraceIdRatioBased(rate)):
        rt = _request_tracer(sampler)
        assert rt.bound is not None
        kept = [rt.start("r", [("user-agent", "x")]) for _ in range(4000)]
        sampled = [t for t in kept if t is not None]
        for t in sampled[:200]:
            assert sampling.TraceIdRatioBased(rate).should_sample(
                None, t.trace_id, "r").decision.is_sampled()
        share = len(sampled) / len(kept)
        assert abs(share - rate) < 0.03, (sampler, share)


def test_a_clients_context_decides_under_the_parent_based_sampler() -> None:
    from opentelemetry.sdk.trace import sampling

    rt = _request_tracer(sampling.ParentBasedTraceIdRatio(0.0))  # new traces: never
    sampled = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    t = rt.start("r", [("traceparent", sampled)])
    assert t is not None and format(t.trace_id, "032x") == "0af7651916cd43dd8448eb211c80319c"
    assert t.root.parent == 0xB7AD6B7169203331
    assert rt.start("r", [("traceparent", sampled[:-2] + "00")]) is None
    assert rt.start("r", [("traceparent", "not-a-traceparent")]) is None  # a new trace, 0%
    always = _request_tracer(sampling.ParentBased(sampling.ALWAYS_ON))
    assert always.start("r", []) is not None


def test_a_sampled_request_exports_its_spans_with_their_links() -> None:
    from opentelemetry.sdk.trace import sampling
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from meshd.router.traces import RequestTracer

    provider = TracerProvider(sampler=sampling.ALWAYS_ON)
    memory = InMemorySpanExporter()
    processor = SimpleSpanProcessor(memory)
    rt = RequestTracer(tracing.Tracing(provider, processor))
    parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    t = rt.start("router ModelInfer", [("traceparent", parent), ("tracestate", "k=v")])
    assert t is not None
    score = t.child("score", attributes={"meshd.model": "m"})
    score.end()
    call = t.child("triton ModelInfer", trace.SpanKind.CLIENT, {"meshd.target": "n2"})
    md = dict(t.metadata(call, [("traceparent", parent), ("x-meshd-slo", "gold")]))
    assert md["traceparent"] == f"00-{t.trace_id:032x}-{call.span_id:016x}-01"
    assert md["tracestate"] == "k=v" and md["x-meshd-slo"] == "gold"
    call.end("UNAVAILABLE: gone")
    t.finish()
    spans = {s.name: s for s in memory.get_finished_spans()}
    root = spans["router ModelInfer"]
    assert root.parent is not None and root.parent.span_id == 0xB7AD6B7169203331
    assert root.kind == trace.SpanKind.SERVER and root.status.status_code.name == "UNSET"
    for name in ("score", "triton ModelInfer"):
        assert spans[name].parent.span_id == root.context.span_id
        assert spans[name].context.trace_id == root.context.trace_id
    assert spans["triton ModelInfer"].status.status_code.name == "ERROR"
    assert spans["triton ModelInfer"].status.description == "UNAVAILABLE: gone"
    assert spans["score"].end_time >= spans["score"].start_time > 0
