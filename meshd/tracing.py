"""OTLP traces, switched on and configured by the standard ``OTEL_*`` variables.

Tracing is on when ``OTEL_EXPORTER_OTLP_ENDPOINT`` (or ``..._TRACES_ENDPOINT``) is set, or
``OTEL_TRACES_EXPORTER`` names ``otlp``; ``OTEL_SDK_DISABLED=true`` or
``OTEL_TRACES_EXPORTER=none`` keeps it off.  Everything else is the SDK's own reading of the
environment: the sampler (``OTEL_TRACES_SAMPLER=parentbased_traceidratio``,
``OTEL_TRACES_SAMPLER_ARG=0.1``), the exporter's endpoint, TLS and headers, the protocol
(``OTEL_EXPORTER_OTLP_PROTOCOL``: ``grpc``, the default, or ``http/protobuf``), the batch
processor's queue (``OTEL_BSP_*``), and ``OTEL_SERVICE_NAME``/``OTEL_RESOURCE_ATTRIBUTES``.

Spans are exported by the SDK's ``BatchSpanProcessor``: ending a span puts it on a bounded
queue that a thread of its own drains (a full queue drops spans, it never waits), so exporting
never blocks the event loop.  When tracing is off no tracer exists and the hot paths skip the
tracing calls altogether (one ``is None`` test).

Context crosses processes as W3C trace context (``traceparent``/``tracestate``) in gRPC
metadata, and in a training job's environment (``TRACEPARENT``/``TRACESTATE``).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter
from opentelemetry.trace import Span, Tracer
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

log = logging.getLogger("meshd.agent")

ENDPOINTS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
HEADERS = frozenset({"traceparent", "tracestate"})
PROPAGATOR = TraceContextTextMapPropagator()


def enabled(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the environment asks for traces (see the module's docstring)."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporters = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporters:
        return "otlp" in {e.strip() for e in exporters.split(",")}
    return any(environ.get(name, "").strip() for name in ENDPOINTS)


def exporter(environ: Mapping[str, str] = os.environ) -> SpanExporter:
    """The OTLP span exporter the environment's protocol names (it reads the rest itself)."""
    protocol = (environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                or environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "grpc").strip().lower()
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import (  # noqa: PLC0415
            OTLPSpanExporter,
        )
        return OTLPSpanExporter()
    if protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import (  # noqa: PLC0415
            OTLPSpanExporter as HttpExporter,
        )
        return HttpExporter()
    raise ValueError(f"OTEL_EXPORTER_OTLP_PROTOCOL: {protocol!r} is not grpc or http/protobuf")


@dataclass(frozen=True, slots=True)
class Tracing:
    """The process's tracer provider and the batch processor that exports its spans (the
    router hands its request spans to the processor directly: :mod:`meshd.router.traces`)."""

    provider: TracerProvider
    processor: SpanProcessor

    def tracer(self, name: str) -> Tracer:
        return self.provider.get_tracer(name)

    def shutdown(self) -> None:
        """Export what is queued (bounded by the export timeout) and stop."""
        self.provider.shutdown()


def setup(service: str, node: str,
          environ: Mapping[str, str] = os.environ) -> Tracing | None:
    """Tracing exporting over OTLP, its provider made the process's global one; None when the
    environment does not ask for traces (or names an unknown protocol, which is logged)."""
    if not enabled(environ):
        return None
    try:
        span_exporter = exporter(environ)
    except ValueError as exc:
        log.error("tracing off", extra={"event": "tracing_error", "detail": str(exc)})
        return None
    attributes: dict[str, str] = {"service.instance.id": node, "meshd.node": node}
    if not environ.get("OTEL_SERVICE_NAME"):
        attributes["service.name"] = service
    provider = TracerProvider(resource=Resource.create(attributes))
    processor = BatchSpanProcessor(span_exporter)
    provider.add_span_processor(processor)
    trace.set_tracer_provider(provider)
    endpoint = next((environ[name] for name in ENDPOINTS if environ.get(name)), "(default)")
    log.info("tracing on", extra={"event": "tracing_on", "endpoint": endpoint,
                                  "sampler": environ.get("OTEL_TRACES_SAMPLER",
                                                         "parentbased_always_on")})
    return Tracing(provider, processor)


def tracer(setup: Tracing | None, name: str) -> Tracer | None:
    return setup.tracer(name) if setup is not None else None


def extract(metadata: Iterable[tuple[str, object]]) -> Context:
    """The remote parent that W3C ``traceparent``/``tracestate`` metadata carries (an empty
    context when there is none, or it does not parse)."""
    carrier = {k: v for k, v in metadata if k in HEADERS and isinstance(v, str)}
    return PROPAGATOR.extract(carrier)


def inject(span: Span, metadata: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """``metadata`` with the trace context of ``span`` in place of any it carried."""
    carrier: dict[str, str] = {}
    PROPAGATOR.inject(carrier, context=trace.set_span_in_context(span))
    return [*((k, v) for k, v in metadata if k not in HEADERS), *carrier.items()]


def environment(span: Span) -> dict[str, str]:
    """``TRACEPARENT``/``TRACESTATE`` for a child process whose work continues ``span``."""
    return {k.upper(): v for k, v in inject(span, ())}


def ids() -> dict[str, str]:
    """The current span's trace and span id (hex), for a log line; {} outside a span."""
    ctx = trace.get_current_span().get_span_context()
    if not ctx.is_valid:
        return {}
    return {"trace_id": format(ctx.trace_id, "032x"), "span_id": format(ctx.span_id, "016x")}
