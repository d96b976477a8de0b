"""A loopback OTLP/HTTP trace receiver: what a collector would get from Tickgate.

`collecting()` serves `POST /v1/traces` (protobuf, gzip or not) on a thread and keeps
each span it is sent, decoded as the OpenTelemetry protobuf defines it; anything else
is a 404. The tests read the spans; the benchmarks only need their count.
"""

import gzip
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from harness.threaded import serving

PATH = "/v1/traces"


@dataclass(frozen=True)
class ReceivedSpan:
    name: str
    trace_id: str  # 32 hex digits, as in a traceparent
    span_id: str  # 16 hex digits
    parent_span_id: str  # "" for a trace's root
    attributes: dict[str, Any]
    start_ns: int
    end_ns: int
    service: str


class Collector:
    """The spans received so far, in arrival order."""

    def __init__(self) -> None:
        self._spans: list[ReceivedSpan] = []
        self._lock = threading.Lock()
        self.url = ""

    def spans(self) -> list[ReceivedSpan]:
        with self._lock:
            return list(self._spans)

    def of_trace(self, trace_id: str) -> dict[str, list[ReceivedSpan]]:
        """The trace's spans by name."""
        named: dict[str, list[ReceivedSpan]] = {}
        for span in self.spans():
            if span.trace_id == trace_id:
                named.setdefault(span.name, []).append(span)
        return named

    def receive(self, body: bytes) -> None:
        request = ExportTraceServiceRequest.FromString(body)
        received = []
        for resource_spans in request.resource_spans:
            resource = _attributes(resource_spans.resource.attributes)
            service = str(resource.get("service.name", ""))
            for scope_spans in resource_spans.scope_spans:
                received += [_span(span, service) for span in scope_spans.spans]
        with self._lock:
            self._spans += received


def _span(span: Any, service: str) -> ReceivedSpan:
    return ReceivedSpan(
        name=span.name,
        trace_id=span.trace_id.hex(),
        span_id=span.span_id.hex(),
        parent_span_id=span.parent_span_id.hex(),
        attributes=_attributes(span.attributes),
        start_ns=span.start_time_unix_nano,
        end_ns=span.end_time_unix_nano,
        service=service,
    )


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs}


def _value(value: AnyValue) -> Any:
    kind = value.WhichOneof("value")
    return getattr(value, kind) if kind else None


def _handler(collector: Collector) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.path != PATH:
                self.send_error(404)
                return
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            collector.receive(body)
            answer = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, format: str, *args: Any) -> None:
            return None

    return Handler


@contextmanager
def collecting() -> Iterator[Collector]:
    """A collector on 127.0.0.1; `url` is what OTEL_EXPORTER_OTLP_ENDPOINT takes."""
    collector = Collector()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(collector))
    with serving(server, "otlp") as collector.url:
        yield collector
