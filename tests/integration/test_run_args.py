"""Run now with other arguments (#24): `POST /v1/jobs/{name}/trigger` with `args` runs
that run, and that run only, with them; they are checked as a job's are, kept on the
run with the caller's note, and secret header values stay secret."""

import json
import logging
from typing import Any

import httpx
import pytest

from harness.receiver import Receiver
from harness.waiting import eventually_async
from service.config import Settings
from tests.support.inprocess import served

NEVER = {"kind": "cron", "expression": "0 0 1 1 *"}
SECRET = "s3cret-value"


async def ended(client: httpx.AsyncClient, run_id: str) -> dict[str, Any]:
    async def done() -> dict[str, Any] | None:
        run: dict[str, Any] = (await client.get(f"/v1/runs/{run_id}")).json()
        return run if run["status"] != "running" else None

    found = await eventually_async(done, 30, f"run {run_id} to end")
    assert found is not None
    return found


async def test_a_trigger_with_args_runs_with_them_once_and_the_job_keeps_its_own(
    settings: Settings, receiver: Receiver, caplog: pytest.LogCaptureFixture
) -> None:
    """The run sends the override body, with the job's secret header kept where the
    override names it "***"; the run shows its args (secret masked) and note; the job's
    args are unchanged, and its next manual run uses them again."""
    caplog.set_level(logging.DEBUG)
    job_args = {
        "url": f"{receiver.url}/hook",
        "body": {"v": 1},
        "headers": {"X-Token": SECRET},
        "secret_headers": ["X-Token"],
    }
    async with served(settings) as client:
        made = await client.post(
            "/v1/jobs", json={"name": "hook", "schedule": NEVER, "task": "http", "args": job_args}
        )
        assert made.status_code == 201, made.text
        override = job_args | {"body": {"v": 2}, "headers": {"X-Token": "***"}}
        started = await client.post(
            "/v1/jobs/hook/trigger", json={"args": override, "note": "after the fix"}
        )
        assert started.status_code == 202, started.text
        run = await ended(client, started.json()["id"])
        again = await client.post("/v1/jobs/hook/trigger")
        assert again.status_code == 202, again.text
        plain = await ended(client, again.json()["id"])
        shown = (await client.get("/v1/jobs/hook")).json()
        answers = started.text + json.dumps(run) + json.dumps(shown)
    assert (run["status"], run["note"]) == ("succeeded", "after the fix")
    assert run["args"]["body"] == {"v": 2}
    assert run["args"]["headers"] == {"X-Token": "***"}
    assert (plain["args"], plain["note"]) == (None, None)
    assert shown["args"]["body"] == {"v": 1}
    first, second = receiver.receipts()
    assert (json.loads(first.body), first.headers["x-token"]) == ({"v": 2}, SECRET)
    assert first.run_id == run["id"]
    assert json.loads(second.body) == {"v": 1}
    assert SECRET not in answers
    assert SECRET not in caplog.text


async def test_args_that_do_not_fit_the_task_are_a_422_naming_the_field(
    settings: Settings,
) -> None:
    async with served(settings) as client:
        made = await client.post(
            "/v1/jobs",
            json={"name": "say", "schedule": NEVER, "task": "log", "args": {"message": "hi"}},
        )
        assert made.status_code == 201, made.text
        refused = await client.post("/v1/jobs/say/trigger", json={"args": {"level": "loud"}})
        unknown = await client.post("/v1/jobs/say/trigger", json={"arguments": {}})
        runs = (await client.get("/v1/jobs/say/runs")).json()["items"]
    assert refused.status_code == 422, refused.text
    locations = [problem["loc"] for problem in refused.json()["errors"]]
    assert ["body", "args", "level"] in locations
    assert ["body", "args", "message"] in locations  # required, and the override lacks it
    assert unknown.status_code == 422, unknown.text
    assert runs == []
