"""Traces of training jobs: one span per rank per attempt, and a child span per stretch of
steps (from one checkpoint, or ``STEP_SPAN`` seconds, to the next).

The ranks of one attempt run on different nodes with no request to carry a trace context
between them, so their spans share a trace id made from the job and its lease token: a trace
backend shows the whole gang's attempt as one trace.  The job's own process is handed the
rank's span as ``TRACEPARENT`` so a traced training loop continues it.
"""

from __future__ import annotations

import hashlib
import time
from typing import Any

from opentelemetry import trace
from opentelemetry.trace import NonRecordingSpan, Span, SpanContext, StatusCode, TraceFlags, Tracer

from meshd import tracing

STEP_SPAN = 5.0
"""Seconds after which a stretch of steps is closed even without a checkpoint."""


def attempt_context(job: str, token: int) -> Any:
    """The (remote, sampled) parent every rank of attempt ``token`` of ``job`` shares."""
    digest = hashlib.sha256(f"{job}/{token}".encode()).digest()
    trace_id = int.from_bytes(digest[:16], "big") or 1
    span_id = int.from_bytes(digest[16:24], "big") or 1
    parent = SpanContext(trace_id, span_id, is_remote=True,
                         trace_flags=TraceFlags(TraceFlags.SAMPLED))
    return trace.set_span_in_context(NonRecordingSpan(parent))


class JobSpans:
    """The spans of one rank's attempt."""

    def __init__(self, tracer: Tracer, job: str, token: int, attempt: int, rank: int,
                 ring: list[str], node: str) -> None:
        self.tracer = tracer
        self.span: Span = tracer.start_span(
            "train attempt", attempt_context(job, token), attributes={
                "meshd.job": job, "meshd.attempt": attempt, "meshd.rank": rank,
                "meshd.nnodes": len(ring), "meshd.ring": ",".join(ring), "meshd.node": node})
        self._since = time.time_ns()
        self._first_step: int | None = None

    def environment(self) -> dict[str, str]:
        return tracing.environment(self.span)

    def report(self, doc: dict[str, Any]) -> None:
        """A line the job printed: closes a stretch of steps at a checkpoint or after
        ``STEP_SPAN`` seconds."""
        step = doc.get("step")
        if not isinstance(step, int):
            return
        if self._first_step is None:
            self._first_step = step
        now = time.time_ns()
        if "checkpoint" not in doc and now - self._since < STEP_SPAN * 1e9:
            return
        attributes: dict[str, Any] = {"meshd.first_step": self._first_step,
                                      "meshd.last_step": step}
        for key in ("loss", "progress"):
            if isinstance(doc.get(key), int | float):
                attributes[f"meshd.{key}"] = float(doc[key])
        if isinstance(doc.get("checkpoint"), str):
            attributes["meshd.checkpoint"] = doc["checkpoint"]
        self.tracer.start_span("train steps", trace.set_span_in_context(self.span),
                               attributes=attributes, start_time=self._since).end(end_time=now)
        self._since, self._first_step = now, None

    def collective(self, op: str, seconds: float, nbytes: int) -> None:
        self.span.add_event("collective", {"meshd.op": op, "meshd.seconds": seconds,
                                           "meshd.bytes": nbytes})

    def end(self, outcome: str) -> None:
        self.span.set_attribute("meshd.outcome", outcome)
        if outcome not in ("done", "moved", "cancelled", "retry"):
            self.span.set_status(StatusCode.ERROR, outcome)
        self.span.end()
