"""Traces from the tick to the target: the spans a loopback OTLP/HTTP collector gets
from a replica whose OTEL_EXPORTER_OTLP_ENDPOINT names it, and the `traceparent` the
webhook target sees."""

import json
import logging
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from harness.otlp import Collector, ReceivedSpan, collecting
from harness.receiver import Receipt, Receiver
from harness.waiting import eventually_async
from service.config import Settings
from service.logs import JsonFormatter
from service.tracing import TracingConfigError, wanted
from tests.support.inprocess import served, triggered_run

EVERY_SECOND = {"kind": "interval", "every_seconds": 1}
NEVER = {"kind": "cron", "expression": "0 0 1 1 *"}
SPANS = (
    "tickgate.run",
    "tickgate.wake_up",
    "tickgate.claim",
    "tickgate.attempt",
    "tickgate.record",
)


@pytest.fixture
def collector(monkeypatch: pytest.MonkeyPatch) -> Iterator[Collector]:
    with collecting() as started:
        monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", started.url)
        monkeypatch.setenv("OTEL_BSP_SCHEDULE_DELAY", "100")
        monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
        yield started


async def create_http_job(
    client: httpx.AsyncClient, name: str, receiver: Receiver, schedule: dict[str, Any], **extra: Any
) -> None:
    """A job whose http task calls the receiver at /<name>."""
    job = {"name": name, "schedule": schedule, "task": "http"}
    job["args"] = {"url": f"{receiver.url}/{name}"}
    made = await client.post("/v1/jobs", json=job | extra)
    assert made.status_code == 201, made.text


def parent_of(receipt: Receipt) -> tuple[str, str]:
    """The trace id and parent span id a delivery's `traceparent` names."""
    version, trace_id, span_id, flags = receipt.headers["traceparent"].split("-")
    assert version == "00"
    assert int(flags, 16) & 1, "sampled"
    return trace_id, span_id


async def whole_trace(collector: Collector, trace_id: str) -> dict[str, list[ReceivedSpan]]:
    def exported() -> dict[str, list[ReceivedSpan]] | None:
        named = collector.of_trace(trace_id)
        return named if all(name in named for name in SPANS) else None

    found = await eventually_async(exported, 30, f"the spans of trace {trace_id}")
    assert found is not None
    return found


async def test_a_scheduled_run_is_one_trace_and_its_webhook_calls_carry_it(
    settings: Settings,
    receiver: Receiver,
    collector: Collector,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A tick whose first attempt fails: the collector gets the run's trace (wake-up,
    claim, two attempts, record) with the job, tick, trigger, run id and outcome; each
    call names its own attempt's span in `traceparent`; the run's log lines carry the
    trace id."""
    caplog.set_level(logging.INFO)
    receiver.fail_first("/traced", 1, status=500)
    scheduling = settings.model_copy(update={"scheduler": True})
    async with served(scheduling) as client:
        retry = {"max_attempts": 2, "min_backoff_seconds": 0.1}
        await create_http_job(client, "traced", receiver, EVERY_SECOND, retry=retry)
        await eventually_async(lambda: len(receiver.receipts("traced")) >= 2, 30, "two calls")
        first, second = receiver.receipts("traced")[:2]
        run_id = first.headers["x-tickgate-run-id"]
        assert second.headers["x-tickgate-run-id"] == run_id
        trace_id, first_parent = parent_of(first)
        assert parent_of(second)[0] == trace_id
        spans = await whole_trace(collector, trace_id)
    [run] = spans["tickgate.run"]
    attempts = sorted(spans["tickgate.attempt"], key=lambda span: span.start_ns)
    assert [span.span_id for span in attempts] == [first_parent, parent_of(second)[1]]
    assert [span.attributes["tickgate.attempt"] for span in attempts] == [1, 2]
    assert [span.attributes["tickgate.outcome"] for span in attempts] == ["failed", "succeeded"]
    for name in SPANS[1:]:
        for span in spans[name]:
            assert span.parent_span_id == run.span_id, name
            assert span.attributes["tickgate.run_id"] == run_id
    assert run.parent_span_id == ""
    assert run.service == "tickgate"
    assert run.attributes["tickgate.job"] == "traced"
    assert run.attributes["tickgate.trigger"] == "schedule"
    assert run.attributes["tickgate.tick"] == spans["tickgate.claim"][0].attributes["tickgate.tick"]
    assert run.attributes["tickgate.outcome"] == "succeeded"
    assert spans["tickgate.record"][0].attributes["tickgate.outcome"] == "succeeded"
    wake_up, claim = spans["tickgate.wake_up"][0], spans["tickgate.claim"][0]
    assert run.start_ns == wake_up.start_ns <= wake_up.end_ns == claim.start_ns
    assert claim.attributes["tickgate.claim.batch"] >= 1
    logged = [json.loads(JsonFormatter().format(r)) for r in caplog.records]
    about_the_run = [line for line in logged if line.get("run_id") == run_id]
    assert any(line["message"].startswith("attempt 1 failed") for line in about_the_run)
    assert any(line["message"].startswith("run succeeded") for line in about_the_run)
    assert {line.get("trace_id") for line in about_the_run} == {trace_id}


async def test_a_manual_run_is_traced(
    settings: Settings, receiver: Receiver, collector: Collector
) -> None:
    async with served(settings) as client:
        await create_http_job(client, "by-hand", receiver, NEVER)
        run = await triggered_run(client, "by-hand")
    [receipt] = receiver.receipts("by-hand")
    trace_id, parent = parent_of(receipt)
    spans = await whole_trace(collector, trace_id)
    assert spans["tickgate.attempt"][0].span_id == parent
    assert spans["tickgate.run"][0].attributes["tickgate.trigger"] == "manual"
    assert spans["tickgate.run"][0].attributes["tickgate.run_id"] == run["id"]


async def test_a_skipped_tick_is_a_span_with_its_reason(
    settings: Settings, receiver: Receiver, collector: Collector
) -> None:
    """A one-second job whose runs last 2.5 s, overlap `skip`: its skipped ticks are
    spans too, so a trace view shows every tick's outcome."""
    receiver.respond("/slow", delay=2.5)
    async with served(settings.model_copy(update={"scheduler": True})) as client:
        await create_http_job(client, "slow", receiver, EVERY_SECOND, overlap="skip")

        def skip_spans() -> list[ReceivedSpan]:
            return [span for span in collector.spans() if span.name == "tickgate.skip"]

        skipped = (await eventually_async(skip_spans, 30, "a skip span"))[0]
        runs = await client.get("/v1/jobs/slow/runs", params={"status": "skipped"})
    attributes = skipped.attributes
    assert (attributes["tickgate.job"], attributes["tickgate.trigger"]) == ("slow", "schedule")
    assert (attributes["tickgate.outcome"], attributes["tickgate.skip_reason"]) == (
        "skipped",
        "overlap",
    )
    assert attributes["tickgate.run_id"] in {run["id"] for run in runs.json()["items"]}


async def test_tracing_is_off_by_default_and_no_traceparent_is_sent(
    settings: Settings, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in ("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        monkeypatch.delenv(name, raising=False)
    async with served(settings) as client:
        made = await client.post(
            "/v1/jobs",
            json={
                "name": "plain",
                "schedule": NEVER,
                "task": "http",
                "args": {"url": receiver.url},
            },
        )
        assert made.status_code == 201, made.text
        assert (await triggered_run(client, "plain"))["status"] == "succeeded"
    [receipt] = receiver.receipts("plain")
    assert "traceparent" not in receipt.headers


def test_the_standard_variables_turn_tracing_on_and_off() -> None:
    endpoint = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"}
    assert not wanted({})
    assert wanted(endpoint)
    assert wanted({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:4318/v1/traces"})
    assert not wanted(endpoint | {"OTEL_SDK_DISABLED": "true"})
    assert not wanted(endpoint | {"OTEL_TRACES_EXPORTER": "none"})
    with pytest.raises(TracingConfigError, match="OTLP/HTTP"):
        wanted(endpoint | {"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"})
    with pytest.raises(TracingConfigError, match="OTEL_TRACES_EXPORTER=zipkin"):
        wanted(endpoint | {"OTEL_TRACES_EXPORTER": "zipkin"})
