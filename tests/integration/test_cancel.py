"""Cancel a run (#24), in-process on real PostgreSQL with the scheduler on: the answers
of POST /v1/runs/{id}/cancel, and the tick a queue_one job keeps waiting, dropped."""

from typing import Any

import httpx

from harness.receiver import Receiver
from harness.waiting import eventually_async
from service.config import Settings
from tests.support.inprocess import ended_run, served

NEVER = {"kind": "cron", "expression": "0 0 1 1 *"}


async def running_run(client: httpx.AsyncClient, name: str) -> dict[str, Any]:
    found: list[dict[str, Any]] = []

    async def one() -> bool:
        items = (await client.get(f"/v1/jobs/{name}/runs", params={"status": "running"})).json()
        found[:] = items["items"]
        return bool(found)

    await eventually_async(one, 30, f"a run of {name}")
    return found[0]


async def test_cancel_stops_a_running_run_and_answers_409_once_it_ended(
    settings: Settings, receiver: Receiver
) -> None:
    job = {
        "name": "slow",
        "schedule": NEVER,
        "task": "http",
        "args": {"url": receiver.url_for("/slow", seconds=30)},
    }
    async with served(settings.model_copy(update={"scheduler": True})) as client:
        assert (await client.post("/v1/jobs", json=job)).status_code == 201
        started = (await client.post("/v1/jobs/slow/trigger")).json()
        asked = await client.post(f"/v1/runs/{started['id']}/cancel")
        cancelled = await ended_run(client, started["id"])
        again = await client.post(f"/v1/runs/{started['id']}/cancel", json={"reason": "x"})
        unknown = await client.post("/v1/runs/00000000-0000-4000-8000-000000000000/cancel")
        bad = await client.post(f"/v1/runs/{started['id']}/cancel", json={"reason": "r" * 501})
    assert asked.status_code == 202, asked.text
    assert (asked.json()["state"], asked.json()["run"]["id"]) == ("cancelling", started["id"])
    assert cancelled["status"] == "cancelled", cancelled
    assert cancelled["error"] == "cancelled by 127.0.0.1", cancelled
    assert again.status_code == 409, again.text
    assert again.json()["detail"] == "the run has ended already: cancelled"
    assert unknown.status_code == 404, unknown.text
    assert bad.status_code == 422, bad.text
    assert bad.json()["errors"][0]["loc"] == ["body", "reason"]


async def test_the_tick_a_queue_one_job_keeps_waiting_is_dropped_as_a_cancelled_skip(
    settings: Settings, receiver: Receiver
) -> None:
    job = {
        "name": "queued",
        "schedule": {"kind": "interval", "every_seconds": 1},
        "task": "http",
        "args": {"url": receiver.url_for("/queued", seconds=30)},
        "overlap": "queue_one",
    }
    async with served(settings.model_copy(update={"scheduler": True})) as client:
        assert (await client.post("/v1/jobs", json=job)).status_code == 201
        run = await running_run(client, "queued")
        dropped: list[httpx.Response] = []
        body = {"reason": "not needed today", "by": "ops"}

        async def drop() -> bool:
            dropped[:] = [await client.post("/v1/jobs/queued/queued/cancel", json=body)]
            return dropped[0].status_code != 404

        await eventually_async(drop, 30, "a tick waiting for the run in progress")
        skipped = dropped[0].json()
        rows = (await client.get("/v1/jobs/queued/runs?status=skipped&limit=1000")).json()
        await client.post(f"/v1/runs/{run['id']}/cancel")
        await client.delete("/v1/jobs/queued")
        none_waits = await client.post("/v1/jobs/nope/queued/cancel")
    assert dropped[0].status_code == 200, dropped[0].text
    assert (skipped["status"], skipped["skip_reason"]) == ("skipped", "cancelled")
    assert skipped["error"] == "cancelled by ops (127.0.0.1): not needed today"
    assert skipped["scheduled_for"] > run["scheduled_for"]
    assert skipped["id"] in [row["id"] for row in rows["items"]]
    assert none_waits.status_code == 404
