"""Traces of the fire path over OTLP/HTTP: off unless an OTLP endpoint is configured.

Each run is one trace, `tickgate.run`, from the moment its tick was fired to the
loop until its end is recorded:
- `tickgate.wake_up`: from the hand-over until its claim was sent (jitter, waiting for
  room, rounds at a held lock);
- `tickgate.claim`: the statement that let it through the gate (one statement claims a
  batch: each run's trace shows it, with the batch's size);
- `tickgate.attempt`, one per attempt: what the task sends carries its W3C
  `traceparent`, and what it logs carries its trace id;
- `tickgate.record`: the statement that records the end and releases the job's lock.
A tick skipped is one span, `tickgate.skip`, with its reason.

Every span has the job, the tick, the trigger, the run id, the runner and, once known,
the outcome. Off, each hook is a shared no-op: the fire path builds no attribute, and
the SDK is never imported. On, the standard `OTEL_*` variables configure the SDK
(service name, resource attributes, sampler, batch processor, exporter headers,
timeout, compression, propagators).
"""

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from contextlib import AbstractContextManager, asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Protocol

from service.domain.runs import Run

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, Tracer

ENDPOINTS = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
PROTOCOLS = ("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", "OTEL_EXPORTER_OTLP_PROTOCOL")
SERVICE_NAME = "tickgate"
MAX_ERROR_CHARS = 1024
_NO_HEADERS: Mapping[str, str] = MappingProxyType({})


class TracingConfigError(ValueError):
    """The OTEL_* variables ask for something Tickgate cannot export."""


def now_ns() -> int:
    """The wall clock in nanoseconds, as spans are timed."""
    return time.time_ns()


@dataclass(frozen=True, slots=True)
class GateTimes:
    """How a claimed tick came through the loop (wall clock, nanoseconds): fired,
    its claim sent and answered; `batch` ticks went in that claim."""

    fired: int
    sent: int
    answered: int
    batch: int


class Traced(Protocol):
    """The span a block runs in."""

    @property
    def headers(self) -> Mapping[str, str]:
        """The headers that carry this span's context to a call (`traceparent`)."""
        ...

    def ended(self, outcome: str, error: str | None = None) -> None:
        """Note how the block ended (a run status)."""
        ...


class Tracing(Protocol):
    """The fire path's spans. Each hook costs a constant no-op when tracing is off."""

    def run(self, run: Run, claimed: GateTimes | None) -> AbstractContextManager[Traced]:
        """The run's trace, current for the block: attempts and the record nest in it."""
        ...

    def attempt(self, run: Run, attempt: int) -> AbstractContextManager[Traced]:
        """One attempt, current for the block: the task runs inside it."""
        ...

    def record(self, run: Run) -> AbstractContextManager[Traced]:
        """The record of the run's end; its outcome is the run's."""
        ...

    def skipped(self, run: Run) -> None:
        """A tick recorded as a skip."""
        ...


class _Untraced:
    """The span of a block nobody traces."""

    headers = _NO_HEADERS

    def ended(self, outcome: str, error: str | None = None) -> None:
        return None

    def __enter__(self) -> "_Untraced":
        return self

    def __exit__(self, *exc: object) -> None:
        return None


_UNTRACED = _Untraced()


class NoTracing:
    """Tracing off."""

    def run(self, run: Run, claimed: GateTimes | None) -> _Untraced:
        return _UNTRACED

    def attempt(self, run: Run, attempt: int) -> _Untraced:
        return _UNTRACED

    def record(self, run: Run) -> _Untraced:
        return _UNTRACED

    def skipped(self, run: Run) -> None:
        return None


def wanted(environ: Mapping[str, str]) -> bool:
    """Tracing is on when an OTLP endpoint is set and the SDK is not disabled; what it
    cannot honour is refused."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = environ.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower()
    if exporter == "none" or not any(environ.get(name) for name in ENDPOINTS):
        return False
    if exporter != "otlp":
        raise TracingConfigError(f"OTEL_TRACES_EXPORTER={exporter}: Tickgate exports OTLP only")
    for name in PROTOCOLS:
        protocol = environ.get(name, "http/protobuf").strip().lower()
        if protocol != "http/protobuf":
            raise TracingConfigError(
                f"{name}={protocol}: Tickgate exports OTLP/HTTP (http/protobuf)"
            )
    return True


@asynccontextmanager
async def tracing_from(environ: Mapping[str, str], runner: str) -> AsyncIterator[Tracing]:
    """The replica's tracing for as long as it serves: on exit, what is left is exported
    (within OTEL_BSP_EXPORT_TIMEOUT) and log lines stop carrying trace ids."""
    if not wanted(environ):
        yield NoTracing()
        return
    provider = _provider(runner)
    ids = TraceIds()
    handlers = list(logging.getLogger().handlers)
    for handler in handlers:
        handler.addFilter(ids)
    try:
        yield OtelTracing(provider.get_tracer("tickgate"))
    finally:
        for handler in handlers:
            handler.removeFilter(ids)
        await asyncio.to_thread(provider.shutdown)


def _provider(runner: str) -> "TracerProvider":
    """A provider of its own (the process-wide one stays untouched), exporting in
    batches from a thread; the sampler and the batching follow OTEL_*."""
    from importlib.metadata import version

    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    resource = Resource.create(
        {"service.instance.id": runner, "service.version": version("tickgate")}
    )
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": SERVICE_NAME}))
    provider = TracerProvider(resource=resource)
    provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return provider


class TraceIds(logging.Filter):
    """Puts the current span's trace and span ids on each log record (JSON lines show
    them as `trace_id` and `span_id`)."""

    def filter(self, record: logging.LogRecord) -> bool:
        from opentelemetry import trace

        context = trace.get_current_span().get_span_context()
        if context.is_valid:
            record.trace_id = format(context.trace_id, "032x")
            record.span_id = format(context.span_id, "016x")
        return True


@dataclass(frozen=True)
class _Span:
    span: "Span"
    headers: Mapping[str, str] = field(default_factory=dict)
    # The run's span, which takes the record's outcome too.
    run: "Span | None" = None

    def ended(self, outcome: str, error: str | None = None) -> None:
        from opentelemetry.trace import StatusCode

        for span in (self.span, self.run):
            if span is not None:
                span.set_attribute("tickgate.outcome", outcome)
                if error:
                    span.set_status(StatusCode.ERROR, error[:MAX_ERROR_CHARS])


class OtelTracing:
    """Tracing on: spans through an OpenTelemetry tracer."""

    def __init__(self, tracer: "Tracer") -> None:
        self._tracer = tracer

    @contextmanager
    def run(self, run: Run, claimed: GateTimes | None) -> Iterator[Traced]:
        from opentelemetry import trace

        attributes = _attributes(run)
        start = claimed.fired if claimed else None
        span = self._tracer.start_span("tickgate.run", attributes=attributes, start_time=start)
        if claimed is not None:
            self._passed_the_gate(span, claimed, attributes)
        with trace.use_span(span, end_on_exit=True):
            yield _Span(span)

    def _passed_the_gate(self, run: "Span", claimed: GateTimes, attributes: dict[str, Any]) -> None:
        """The wake-up and the claim, timed already: spans with those times."""
        from opentelemetry import trace

        parent = trace.set_span_in_context(run)
        periods = (
            ("tickgate.wake_up", claimed.fired, claimed.sent, attributes),
            ("tickgate.claim", claimed.sent, claimed.answered, attributes | _batch(claimed)),
        )
        for name, start, end, shown in periods:
            span = self._tracer.start_span(name, parent, attributes=shown, start_time=start)
            span.end(end_time=end)

    @contextmanager
    def attempt(self, run: Run, attempt: int) -> Iterator[Traced]:
        from opentelemetry.propagate import inject

        attributes = _attributes(run) | {"tickgate.attempt": attempt}
        with self._tracer.start_as_current_span("tickgate.attempt", attributes=attributes) as span:
            headers: dict[str, str] = {}
            inject(headers)
            yield _Span(span, MappingProxyType(headers))

    @contextmanager
    def record(self, run: Run) -> Iterator[Traced]:
        from opentelemetry import trace

        traced = trace.get_current_span()
        with self._tracer.start_as_current_span(
            "tickgate.record", attributes=_attributes(run)
        ) as span:
            yield _Span(span, run=traced)

    def skipped(self, run: Run) -> None:
        reason = run.skip_reason.value if run.skip_reason else "skipped"
        attributes = _attributes(run) | {
            "tickgate.outcome": "skipped",
            "tickgate.skip_reason": reason,
        }
        self._tracer.start_span("tickgate.skip", attributes=attributes).end()


def _attributes(run: Run) -> dict[str, Any]:
    return {
        "tickgate.job": run.job,
        "tickgate.tick": run.scheduled_for.isoformat(),
        "tickgate.trigger": run.trigger.value,
        "tickgate.run_id": str(run.id),
        "tickgate.runner": run.runner,
    }


def _batch(claimed: GateTimes) -> dict[str, Any]:
    return {"tickgate.claim.batch": claimed.batch}
