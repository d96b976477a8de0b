"""Output you can read (#24): a run of the `http` task keeps what its target answered
(status, chosen headers, the body up to the job's `output_bytes`), shown by
`GET /v1/runs/{id}`, with the job's secret header values masked wherever the target
echoes them."""

import base64
import json
from collections.abc import Iterator
from http.server import ThreadingHTTPServer
from typing import Any

import httpx
import pytest

from harness.threaded import serving
from service.config import Settings
from tests.support.answers import BIG, BINARY, Target
from tests.support.inprocess import served, triggered_run

NEVER = {"kind": "cron", "expression": "0 0 1 1 *"}
SECRET = "tok-5ecret-value"


@pytest.fixture
def target() -> Iterator[str]:
    with serving(ThreadingHTTPServer(("127.0.0.1", 0), Target), "output-target") as url:
        yield url


async def run_of(client: httpx.AsyncClient, name: str, url: str, **args: Any) -> dict[str, Any]:
    job = {"name": name, "schedule": NEVER, "task": "http", "args": {"url": url, **args}}
    made = await client.post("/v1/jobs", json=job)
    assert made.status_code == 201, made.text
    run_id = (await triggered_run(client, name))["id"]
    shown: dict[str, Any] = (await client.get(f"/v1/runs/{run_id}")).json()
    return shown


async def test_a_failed_webhook_s_answer_is_kept_with_its_secret_masked(
    settings: Settings, target: str
) -> None:
    secret = {"headers": {"X-Token": SECRET}, "secret_headers": ["X-Token"]}
    async with served(settings) as client:
        run = await run_of(client, "fails", f"{target}/fail", **secret)
        listed = (await client.get("/v1/jobs/fails/runs")).json()["items"]
    output = run["output"]
    assert (run["status"], output["status"]) == ("failed", 500)
    assert json.loads(output["body"]) == {"error": "token rejected", "token": "***"}
    assert (output["encoding"], output["content_type"]) == ("text", "application/json")
    assert output["headers"]["x-request-id"] == "req-***"
    assert output["truncated"] is False
    assert SECRET not in json.dumps(run)
    assert "output" not in listed[0]  # lists never carry outputs


async def test_a_2_mib_body_is_kept_up_to_the_cap_and_marked_truncated(
    settings: Settings, target: str
) -> None:
    async with served(settings) as client:
        default = await run_of(client, "big", f"{target}/big")
        most = await run_of(client, "bigger", f"{target}/big", output_bytes=1024 * 1024)
    for run, cap in ((default, 16 * 1024), (most, 1024 * 1024)):
        output = run["output"]
        assert run["status"] == "succeeded"
        assert output["body"] == "x" * cap
        assert output["truncated"] is True
        assert output["headers"]["content-length"] == str(BIG)
    assert default["result"] == {"status": 200, "bytes": 1024 * 1024, "truncated": True}


async def test_a_body_that_is_no_text_is_kept_as_base64(settings: Settings, target: str) -> None:
    async with served(settings) as client:
        run = await run_of(client, "bytes", f"{target}/binary")
        nothing = await run_of(client, "none", f"{target}/binary", output_bytes=0)
    output = run["output"]
    assert output["encoding"] == "base64"
    assert base64.b64decode(output["body"]) == BINARY
    assert (output["bytes"], output["truncated"]) == (len(BINARY), False)
    assert (nothing["output"]["body"], nothing["output"]["truncated"]) == ("", True)


async def test_a_job_with_capture_false_keeps_neither_output_nor_log(
    settings: Settings, target: str
) -> None:
    async with served(settings) as client:
        job = {"name": "quiet", "schedule": NEVER, "task": "http", "capture": False}
        made = await client.post("/v1/jobs", json=job | {"args": {"url": f"{target}/fail"}})
        assert made.status_code == 201, made.text
        assert made.json()["capture"] is False
        run_id = (await triggered_run(client, "quiet"))["id"]
        shown = (await client.get(f"/v1/runs/{run_id}")).json()
        log = (await client.get(f"/v1/runs/{run_id}/log")).json()
        kept = await run_of(client, "loud", f"{target}/fail")
    assert shown["status"] == "failed"
    assert shown["error"].endswith("answered HTTP 500")
    assert shown["output"] is None
    assert log["lines"] == []
    assert kept["output"]["status"] == 500  # the default keeps it
