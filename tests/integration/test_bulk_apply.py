"""PUT /v1/jobs: a whole set of jobs in one transaction, against a real PostgreSQL."""

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from typing import Any

import asyncpg
import httpx
import pytest

from harness.waiting import eventually_async
from service.app import create_app
from service.config import Settings
from service.domain.jobs import complete_job
from service.domain.names import lock_key
from service.store import Store

NEVER = {"kind": "cron", "expression": "0 0 1 1 *"}


def job(name: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "schedule": NEVER, "task": "log", "args": {"message": name}} | fields


async def apply(client: httpx.AsyncClient, *jobs: dict[str, Any], **params: str) -> dict[str, Any]:
    response = await client.put("/v1/jobs", json={"jobs": list(jobs)}, params=params)
    assert response.status_code == 200, response.text
    body: dict[str, Any] = response.json()
    return body


async def problems(client: httpx.AsyncClient, *jobs: dict[str, Any], **params: str) -> list[Any]:
    response = await client.put("/v1/jobs", json={"jobs": list(jobs)}, params=params)
    assert response.status_code == 422, response.text
    errors: list[Any] = response.json()["errors"]
    return errors


async def stored(client: httpx.AsyncClient) -> dict[str, dict[str, Any]]:
    page = (await client.get("/v1/jobs", params={"limit": 1000})).json()
    return {item["name"]: item for item in page["items"]}


def counts(result: dict[str, Any]) -> tuple[int, int, int, int]:
    return result["created"], result["updated"], result["unchanged"], result["deleted"]


async def test_counts_and_versions_of_created_updated_and_unchanged_jobs(
    client: httpx.AsyncClient,
) -> None:
    jobs = [job("a"), job("b"), job("c")]
    first = await apply(client, *jobs)
    assert counts(first) == (3, 0, 0, 0)
    assert first["outcomes"] == {"a": "created", "b": "created", "c": "created"}
    before = await stored(client)

    again = await apply(client, *jobs)
    assert counts(again) == (0, 0, 3, 0)
    assert await stored(client) == before  # versions and updated_at included

    jobs[1] = job("b", description="described")
    changed = await apply(client, job("d"), *jobs)
    assert counts(changed) == (1, 1, 2, 0)
    assert changed["outcomes"] == {
        "d": "created",
        "a": "unchanged",
        "b": "updated",
        "c": "unchanged",
    }
    after = await stored(client)
    assert {name: j["version"] for name, j in after.items()} == {"a": 1, "b": 2, "c": 1, "d": 1}
    assert after["b"]["description"] == "described"
    assert after["b"]["created_at"] == before["b"]["created_at"]
    assert after["b"]["updated_at"] != before["b"]["updated_at"]


async def test_a_set_is_applied_as_put_applies_each_job(client: httpx.AsyncClient) -> None:
    """The same rule as PUT /v1/jobs/{name}: a set job equal to a PUT one changes nothing."""
    declared = job("same", timezone="Europe/Kyiv", schedule={"kind": "daily", "at": ["03:00"]})
    put = await client.put("/v1/jobs/same", json=declared)
    assert put.status_code == 201
    assert counts(await apply(client, declared)) == (0, 0, 1, 0)
    assert (await client.get("/v1/jobs/same")).json() == put.json()


async def test_bad_jobs_are_one_422_naming_each_and_nothing_is_applied(
    client: httpx.AsyncClient,
) -> None:
    await apply(client, job("kept"))
    detail = await problems(
        client,
        job("fresh"),
        job("kept", description="would change"),
        job("bad-cron", schedule={"kind": "cron", "expression": "61 * * * *"}),
        job("bad-zone", timezone="Mars/Olympus"),
        job("bad-task", task="nope"),
        job("past", schedule={"kind": "once", "at": "2001-01-01T00:00:00Z"}),
        {"schedule": NEVER, "task": "log"},
    )
    named = {tuple(p["loc"][:3]): p["msg"] for p in detail}
    assert set(named) == {("body", "jobs", index) for index in (2, 3, 4, 5, 6)}
    for index, name in [(2, "bad-cron"), (3, "bad-zone"), (4, "bad-task"), (5, "past")]:
        assert named[("body", "jobs", index)].startswith(f"job {name!r}: "), named
    by_loc = {tuple(p["loc"]): p for p in detail}
    assert by_loc[("body", "jobs", 2, "schedule", "cron", "expression")]["input"] == "61 * * * *"
    assert by_loc[("body", "jobs", 3, "timezone")]["input"] == "Mars/Olympus"
    assert by_loc[("body", "jobs", 4, "task")]["input"] == "nope"
    assert ("body", "jobs", 5, "schedule", "at") in by_loc
    assert by_loc[("body", "jobs", 6, "name")]["type"] == "missing"
    jobs = await stored(client)
    assert list(jobs) == ["kept"]
    assert jobs["kept"]["version"] == 1


async def test_a_name_given_twice_is_a_422_at_each_place(client: httpx.AsyncClient) -> None:
    detail = await problems(client, job("twice"), job("once"), job("twice", description="x"))
    assert [p["loc"] for p in detail] == [["body", "jobs", 0, "name"], ["body", "jobs", 2, "name"]]
    assert all(p["msg"].startswith("job 'twice': ") for p in detail)
    assert await stored(client) == {}


async def test_prune_deletes_only_the_managers_active_and_paused_jobs_it_omits(
    client: httpx.AsyncClient, store: Store
) -> None:
    team_a = [job("a-keep"), job("a-drop"), job("a-paused"), job("a-done")]
    assert counts(await apply(client, *team_a, managed_by="team-a")) == (4, 0, 0, 0)
    await apply(client, job("b-other"), managed_by="team-b")
    await apply(client, job("unmanaged"))
    assert (await client.post("/v1/jobs/a-paused/pause")).status_code == 200
    await store.mutate_job("a-done", lambda current: current and complete_job(current, now()))

    result = await apply(client, job("a-keep"), job("a-new"), managed_by="team-a", prune="true")
    assert counts(result) == (1, 0, 1, 2)
    assert result["outcomes"] == {
        "a-keep": "unchanged",
        "a-new": "created",
        "a-drop": "deleted",
        "a-paused": "deleted",
    }
    jobs = await stored(client)
    assert sorted(jobs) == ["a-done", "a-keep", "a-new", "b-other", "unmanaged"]
    assert jobs["a-new"]["managed_by"] == "team-a"
    assert jobs["b-other"]["managed_by"] == "team-b"
    assert jobs["unmanaged"]["managed_by"] is None


async def test_prune_without_a_manager_is_refused(client: httpx.AsyncClient) -> None:
    await apply(client, job("x"), job("y"))
    detail = await problems(client, job("x"), prune="true")
    assert [p["loc"] for p in detail] == [["query", "prune"]]
    assert "managed_by" in detail[0]["msg"]
    assert sorted(await stored(client)) == ["x", "y"]


async def test_the_request_manager_is_set_on_each_job_and_another_is_refused(
    client: httpx.AsyncClient,
) -> None:
    await apply(client, job("adopted"))
    result = await apply(client, job("adopted"), job("fresh"), managed_by="gitops")
    assert result["outcomes"] == {"adopted": "updated", "fresh": "created"}
    jobs = await stored(client)
    assert {j["managed_by"] for j in jobs.values()} == {"gitops"}
    assert jobs["adopted"]["version"] == 2
    detail = await problems(client, job("fresh", managed_by="helm"), managed_by="gitops")
    assert [p["loc"] for p in detail] == [["body", "jobs", 0, "managed_by"]]
    assert detail[0]["msg"].startswith("job 'fresh': ")


async def test_a_taken_lock_key_is_a_409_naming_the_job(
    client: httpx.AsyncClient, database_url: str
) -> None:
    connection = await asyncpg.connect(database_url)
    try:
        await connection.execute(
            """INSERT INTO tickgate_jobs (name, lock_key, description, schedule, timezone, task,
               args, state, overlap, timeout_seconds, misfire_grace_seconds, created_at,
               updated_at, fire_after, version)
               VALUES ('planted', $1, '', '{"kind":"cron","expression":"* * * * *"}', 'UTC',
               'log', '{"message":"x"}', 'active', 'skip', 600, 60, now(), now(), now(), 1)""",
            lock_key("b"),
        )
    finally:
        await connection.close()
    dry = await client.put(
        "/v1/jobs", json={"jobs": [job("a"), job("b")]}, params={"dry_run": "true"}
    )
    assert dry.status_code == 409  # found by the same statements, in the rolled-back write
    response = await client.put("/v1/jobs", json={"jobs": [job("a"), job("b")]})
    assert response.status_code == 409
    assert response.json() == dry.json()
    assert "'b'" in response.json()["detail"]
    assert "'planted'" in response.json()["detail"]
    assert sorted(await stored(client)) == ["planted"]


async def test_only_changes_notify_the_schedulers(
    client: httpx.AsyncClient, database_url: str
) -> None:
    received: asyncio.Queue[str] = asyncio.Queue()
    listener = await asyncpg.connect(database_url)
    try:
        await listener.add_listener("tickgate_jobs", lambda *args: received.put_nowait(args[3]))
        await apply(client, job("n1"), job("n2"), managed_by="m")
        assert sorted([await asyncio.wait_for(received.get(), 10) for _ in range(2)]) == [
            "n1",
            "n2",
        ]
        await apply(client, job("n1"), job("n2", description="new"), managed_by="m")
        assert await asyncio.wait_for(received.get(), 10) == "n2"
        await apply(client, job("n2", description="new"), managed_by="m", prune="true")
        assert await asyncio.wait_for(received.get(), 10) == "n1"
        await apply(client, job("n2", description="new"), managed_by="m", prune="true")
        await client.delete("/v1/jobs/n2")
        # Notifications arrive in commit order: the unchanged apply sent none.
        assert await asyncio.wait_for(received.get(), 10) == "n2"
        assert received.empty()
    finally:
        await listener.close()


@pytest.fixture
async def scheduling(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings.model_copy(update={"scheduler": True}))
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app), base_url="http://localhost"
        ) as client,
    ):
        yield client


async def test_a_job_created_by_a_set_fires(scheduling: httpx.AsyncClient) -> None:
    every_second = {"kind": "cron", "expression": "* * * * * *"}
    await apply(scheduling, job("quiet"), job("bulk-fires", schedule=every_second))

    async def ran() -> bool:
        runs = (await scheduling.get("/v1/jobs/bulk-fires/runs")).json()["items"]
        return any(run["status"] == "succeeded" for run in runs)

    await eventually_async(ran, 30, "a run of the job the set created")


async def test_the_bulk_body_limit_is_its_own(settings: Settings) -> None:
    small = settings.model_copy(update={"max_body_bytes": 2048, "max_bulk_body_bytes": 1 << 20})
    app = create_app(small)
    jobs = [job(f"many-{index:03d}") for index in range(100)]
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app), base_url="http://localhost"
        ) as client,
    ):
        assert counts(await apply(client, *jobs)) == (100, 0, 0, 0)
        huge = job("huge", description="x" * 4000)
        assert (await client.put("/v1/jobs/huge", json=huge)).status_code == 413


def now() -> datetime:
    return datetime.now(UTC)


async def test_a_dry_run_answers_what_the_apply_then_does_and_changes_nothing(
    client: httpx.AsyncClient, database_url: str
) -> None:
    await apply(client, job("dry-kept"), job("dry-changed"), job("dry-pruned"), managed_by="m")
    before = await stored(client)
    received: asyncio.Queue[str] = asyncio.Queue()
    listener = await asyncpg.connect(database_url)
    try:
        await listener.add_listener("tickgate_jobs", lambda *args: received.put_nowait(args[3]))
        wanted = [job("dry-kept"), job("dry-changed", description="new"), job("dry-new")]
        planned = await apply(client, *wanted, managed_by="m", prune="true", dry_run="true")
        assert counts(planned) == (1, 1, 1, 1)
        assert await stored(client) == before  # versions and updated_at included
        await asyncio.sleep(0.5)
        assert received.empty()  # a rolled-back transaction notifies nobody

        applied = await apply(client, *wanted, managed_by="m", prune="true")
        assert applied == planned
        assert await asyncio.wait_for(received.get(), 10) in {"dry-changed", "dry-new"}
    finally:
        await listener.close()
    after = await stored(client)
    assert sorted(after) == ["dry-changed", "dry-kept", "dry-new"]
    assert after["dry-changed"]["version"] == 2


async def test_a_dry_run_refuses_what_the_apply_refuses(client: httpx.AsyncClient) -> None:
    bad = job("dry-bad", schedule={"kind": "cron", "expression": "nope"})
    detail = await problems(client, job("dry-good"), bad, dry_run="true")
    assert [p["loc"][:3] for p in detail] == [["body", "jobs", 1]]
    assert await stored(client) == {}
