"""The traces of routed requests, recorded on the hot path as plain values.

A routed request is three or more spans: the router's (a child of the client's
``traceparent``), its score decision, and one per Triton call.  The SDK's ``Span`` objects cost
about 30 us each to start and end (locks, attribute checks, processors): at 10% sampling that
alone was most of the 5% the router may spend on tracing (``bench/tracing.py``).  Here a
sampled request keeps its spans as a few fields each and hands them, finished, to the SDK's
span processor as ``ReadableSpan``s, which batches and exports them like any other (the OTLP
exporter, the ``OTEL_*`` settings and the sampler are the SDK's).  An unsampled request costs
a scan of its metadata and, for a new trace under a ratio sampler (``traceidratio``, parent
based or not: the usual production setting), one random number: a new trace is sampled when its
id's low 64 bits are under the ratio's bound, the rule of the SDK's ``TraceIdRatioBased``; any
other sampler, or a client's trace context, goes through the SDK's sampler.  (In the router's
process the SDK's decision cost about 20 us of CPU a request, mostly cold-cache calls.)
"""

from __future__ import annotations

import random
import time
from collections.abc import Sequence
from typing import Any

from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, sampling
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import SpanContext, SpanKind, TraceFlags, TraceState
from opentelemetry.trace.status import Status, StatusCode

from meshd import tracing

_OK = Status(StatusCode.UNSET)
_SAMPLED = TraceFlags(TraceFlags.SAMPLED)


_LOW64 = sampling.TraceIdRatioBased.TRACE_ID_LIMIT


def _new_trace_bound(sampler: sampling.Sampler) -> int | None:
    """The bound under which a new trace's id (low 64 bits) is sampled, for the samplers that
    decide a new trace by its id alone; None for any other (ask it)."""
    root: object = sampler
    if isinstance(sampler, sampling.ParentBased):
        root = getattr(sampler, "_root", None)  # the SDK keeps it private; None: ask
    if isinstance(root, sampling.TraceIdRatioBased):
        return root.bound
    if root is sampling.ALWAYS_ON:
        return _LOW64 + 1
    if root is sampling.ALWAYS_OFF:
        return 0
    return None


class RequestTracer:
    """Starts the trace of each request, when the sampler keeps it."""

    def __init__(self, setup: tracing.Tracing, scope: str = "meshd.router") -> None:
        provider = setup.provider
        self.sampler = provider.sampler
        self.resource = provider.resource
        self.ids = provider.id_generator
        self.processor = setup.processor
        self.scope = InstrumentationScope(scope)
        self.bound = _new_trace_bound(self.sampler)

    def start(self, name: str, metadata: Sequence[tuple[str, Any]]) -> RequestTrace | None:
        """The request's trace, continuing the client's ``traceparent`` if it sent one; None
        when the sampler drops it."""
        bound = self.bound
        if bound is not None and not any(k == "traceparent" for k, _ in metadata):
            trace_id = random.getrandbits(128)
            if (trace_id & _LOW64) >= bound or not trace_id:
                return None
            return RequestTrace(self, name, trace_id, None, None)
        parent_ctx = tracing.extract(metadata)
        remote = trace.get_current_span(parent_ctx).get_span_context()
        parent = remote if remote.is_valid else None
        trace_id = parent.trace_id if parent is not None else self.ids.generate_trace_id()
        result = self.sampler.should_sample(parent_ctx, trace_id, name, SpanKind.SERVER)
        if not result.decision.is_sampled():
            return None
        return RequestTrace(self, name, trace_id, parent, result.trace_state)


class SpanRecord:
    """One span of a request: what ``ReadableSpan`` needs, filled in as the request goes."""

    __slots__ = ("attributes", "end_time", "kind", "name", "parent", "span_id", "start_time",
                 "status")

    def __init__(self, name: str, span_id: int, parent: int, kind: SpanKind,
                 attributes: dict[str, Any]) -> None:
        self.name = name
        self.span_id = span_id
        self.parent = parent
        self.kind = kind
        self.attributes = attributes
        self.start_time = time.time_ns()
        self.end_time = 0
        self.status = _OK

    def end(self, error: str = "") -> None:
        if not self.end_time:
            self.end_time = time.time_ns()
            if error:
                self.status = Status(StatusCode.ERROR, error)


class RequestTrace:
    """The spans of one sampled request; :meth:`finish` hands them to the exporter."""

    def __init__(self, tracer: RequestTracer, name: str, trace_id: int,
                 parent: SpanContext | None, state: TraceState | None) -> None:
        self.tracer = tracer
        self.trace_id = trace_id
        self.parent = parent
        self.state = state or TraceState()
        self.root = SpanRecord(name, tracer.ids.generate_span_id(),
                               parent.span_id if parent is not None else 0,
                               SpanKind.SERVER, {})
        self.spans = [self.root]

    def child(self, name: str, kind: SpanKind = SpanKind.INTERNAL,
              attributes: dict[str, Any] | None = None) -> SpanRecord:
        span = SpanRecord(name, self.tracer.ids.generate_span_id(), self.root.span_id, kind,
                          attributes or {})
        self.spans.append(span)
        return span

    def context(self, span: SpanRecord) -> SpanContext:
        return SpanContext(self.trace_id, span.span_id, False, _SAMPLED, self.state)

    def metadata(self, span: SpanRecord,
                 passed: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
        """``passed`` with ``span``'s W3C trace context in place of the client's."""
        out = [(k, v) for k, v in passed if k not in tracing.HEADERS]
        out.append(("traceparent", f"00-{self.trace_id:032x}-{span.span_id:016x}-01"))
        if self.state:
            out.append(("tracestate", self.state.to_header()))
        return out

    def finish(self, error: str = "", attributes: dict[str, Any] | None = None) -> None:
        """End the request's span (and any child left open) and export them all."""
        if attributes:
            self.root.attributes.update(attributes)
        self.root.end(error)
        t = self.tracer
        root = self.context(self.root)
        for span in self.spans:
            span.end()
            ctx, parent = (root, self.parent) if span is self.root else (self.context(span), root)
            t.processor.on_end(ReadableSpan(
                span.name, ctx, parent, t.resource, span.attributes, (), (),
                span.kind, None, span.status, span.start_time, span.end_time, t.scope))


def request_tracer(setup: tracing.Tracing | None) -> RequestTracer | None:
    """The router's request tracer when tracing is on."""
    return RequestTracer(setup) if setup is not None else None
