"""An OTLP/gRPC trace receiver for tests and benches: a real ``TraceService`` on a local port
that keeps every span it is sent, with its resource, so a test can assert spans and their parent
links."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent import futures
from dataclasses import dataclass
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc


@dataclass(frozen=True)
class ReceivedSpan:
    name: str
    trace_id: str
    span_id: str
    parent_id: str
    kind: int
    attributes: dict[str, Any]
    resource: dict[str, Any]
    status: int
    events: list[str]


def _value(v: Any) -> Any:
    which = v.WhichOneof("value")
    return getattr(v, which) if which else None


class Receiver(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self) -> None:
        self.spans: list[ReceivedSpan] = []
        self._lock = threading.Lock()
        self.server = grpc.server(futures.ThreadPoolExecutor(4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self.server)
        self.port = self.server.add_insecure_port("127.0.0.1:0")
        self.endpoint = f"http://127.0.0.1:{self.port}"

    def Export(self, request: Any, context: Any) -> Any:  # noqa: N802 - the gRPC name
        got = []
        for rs in request.resource_spans:
            resource = {a.key: _value(a.value) for a in rs.resource.attributes}
            for ss in rs.scope_spans:
                for s in ss.spans:
                    got.append(ReceivedSpan(
                        s.name, s.trace_id.hex(), s.span_id.hex(), s.parent_span_id.hex(),
                        s.kind, {a.key: _value(a.value) for a in s.attributes}, resource,
                        s.status.code, [e.name for e in s.events]))
        with self._lock:
            self.spans.extend(got)
        return trace_service_pb2.ExportTraceServiceResponse()

    def start(self) -> Receiver:
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.stop(0)

    def named(self, name: str) -> list[ReceivedSpan]:
        with self._lock:
            return [s for s in self.spans if s.name == name]

    def wait(self, check: Callable[[], Any], timeout: float, what: str) -> Any:
        end = time.monotonic() + timeout
        while True:
            got = check()
            if got:
                return got
            if time.monotonic() > end:
                with self._lock:
                    names = sorted({s.name for s in self.spans})
                raise AssertionError(f"timed out waiting for {what}; spans so far: {names}")
            time.sleep(0.1)
