"""Manual triggers and the runs API, in-process against real PostgreSQL."""

from typing import Any

import asyncpg
import httpx

from harness.waiting import eventually_async

LOG_JOB: dict[str, Any] = {
    "name": "say",
    "schedule": {"kind": "cron", "expression": "0 0 1 1 *"},
    "task": "log",
    "args": {"message": "hello"},
}


async def finished(client: httpx.AsyncClient, run_id: str) -> dict[str, Any]:
    async def done() -> bool:
        run = (await client.get(f"/v1/runs/{run_id}")).json()
        return bool(run["status"] != "running")

    await eventually_async(done, 30, f"run {run_id} to finish")
    run: dict[str, Any] = (await client.get(f"/v1/runs/{run_id}")).json()
    return run


async def test_trigger_runs_now_and_is_recorded(client: httpx.AsyncClient) -> None:
    assert (await client.post("/v1/jobs", json=LOG_JOB)).status_code == 201
    response = await client.post("/v1/jobs/say/trigger")
    assert response.status_code == 202, response.text
    started = response.json()
    assert started["trigger"] == "manual"
    assert started["job"] == "say"
    assert started["runner"] == "test-runner"
    run = await finished(client, started["id"])
    assert run["status"] == "succeeded"
    assert run["finished_at"] is not None
    assert run["attempts"] == 1
    job = (await client.get("/v1/jobs/say")).json()
    assert job["last_run"]["id"] == started["id"]
    listed = (await client.get("/v1/jobs")).json()["items"][0]
    assert listed["last_run"]["id"] == started["id"]


async def test_runs_list_newest_first_with_paging_and_filter(client: httpx.AsyncClient) -> None:
    await client.post("/v1/jobs", json=LOG_JOB)
    ids = []
    for _ in range(5):
        ids.append((await client.post("/v1/jobs/say/trigger")).json()["id"])
        await finished(client, ids[-1])
    seen, cursor = [], None
    while True:
        params = {"limit": 2} | ({"cursor": cursor} if cursor else {})
        page = (await client.get("/v1/jobs/say/runs", params=params)).json()
        seen += [run["id"] for run in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == ids[::-1]
    failed = (await client.get("/v1/jobs/say/runs", params={"status": "failed"})).json()
    assert failed["items"] == []


async def test_trigger_of_a_running_skip_job_is_409(
    client: httpx.AsyncClient, database_url: str
) -> None:
    job = (await client.post("/v1/jobs", json=LOG_JOB)).json()
    elsewhere = await asyncpg.connect(database_url)
    try:
        await elsewhere.execute("SELECT pg_advisory_lock($1)", int(job["lock_key"]))
        response = await client.post("/v1/jobs/say/trigger")
        assert response.status_code == 409
        assert "running" in response.json()["detail"]
    finally:
        await elsewhere.close()
    assert (await client.get("/v1/jobs/say/runs")).json()["items"] == []


async def test_unknown_things_are_404_and_bad_queries_422(client: httpx.AsyncClient) -> None:
    assert (await client.post("/v1/jobs/nope/trigger")).status_code == 404
    assert (await client.get("/v1/jobs/nope/runs")).status_code == 404
    missing = "00000000-0000-0000-0000-000000000000"
    assert (await client.get(f"/v1/runs/{missing}")).status_code == 404
    assert (await client.get("/v1/runs/not-a-uuid")).status_code == 422
    await client.post("/v1/jobs", json=LOG_JOB)
    for params in [{"cursor": "garbage"}, {"status": "exploded"}, {"limit": 0}]:
        response = await client.get("/v1/jobs/say/runs", params=params)
        assert response.status_code == 422, (params, response.text)
