"""The v1 jobs API over httpx against a real, freshly cloned PostgreSQL."""

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import httpx
import pytest

from service.domain.names import lock_key
from service.store import Store

CRON_JOB: dict[str, Any] = {
    "name": "nightly-reindex",
    "schedule": {"kind": "cron", "expression": "0 3 * * *"},
    "timezone": "Europe/Kyiv",
    "task": "log",
    "args": {"message": "reindex"},
}


def problem_locs(response: httpx.Response) -> list[list[Any]]:
    assert response.status_code == 422, response.text
    return [problem["loc"] for problem in response.json()["errors"]]


async def create(client: httpx.AsyncClient, **overrides: Any) -> dict[str, Any]:
    response = await client.post("/v1/jobs", json=CRON_JOB | overrides)
    assert response.status_code == 201, response.text
    body: dict[str, Any] = response.json()
    return body


async def test_create_returns_job_with_defaults_and_location(client: httpx.AsyncClient) -> None:
    response = await client.post("/v1/jobs", json=CRON_JOB)
    assert response.status_code == 201
    assert response.headers["location"] == "/v1/jobs/nightly-reindex"
    job = response.json()
    assert job["lock_key"] == "2151323058446577676"
    assert job["state"] == "active"
    assert job["overlap"] == "skip"
    assert job["timeout_seconds"] == 600
    assert job["misfire_grace_seconds"] == 60
    assert job["description"] == ""
    assert job["version"] == 1
    assert job["last_run"] is None
    next_run = datetime.fromisoformat(job["next_run_at"])
    assert next_run > datetime.now(UTC)
    # 03:00 in Kyiv is 00:00 or 01:00 UTC depending on the season.
    assert next_run.astimezone(UTC).hour in {0, 1}
    assert (await client.get("/v1/jobs/nightly-reindex")).json() == job


async def test_duplicate_name_is_409_and_changes_nothing(client: httpx.AsyncClient) -> None:
    first = await create(client)
    again = await client.post("/v1/jobs", json=CRON_JOB | {"description": "other"})
    assert again.status_code == 409
    assert "already exists" in again.json()["detail"]
    assert (await client.get("/v1/jobs/nightly-reindex")).json() == first


async def test_lock_key_collision_is_409(client: httpx.AsyncClient, database_url: str) -> None:
    # FNV-1a collisions are rare; plant a row that already holds the key of "b".
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
    response = await client.post("/v1/jobs", json=CRON_JOB | {"name": "b"})
    assert response.status_code == 409
    assert "lock_key" in response.json()["detail"]
    assert (await client.get("/v1/jobs/b")).status_code == 404


async def test_unknown_job_is_404(client: httpx.AsyncClient) -> None:
    for method, path in [
        ("GET", "/v1/jobs/missing"),
        ("DELETE", "/v1/jobs/missing"),
        ("PATCH", "/v1/jobs/missing"),
        ("POST", "/v1/jobs/missing/pause"),
        ("POST", "/v1/jobs/missing/resume"),
    ]:
        response = await client.request(method, path, json={} if method == "PATCH" else None)
        assert response.status_code == 404, (method, path, response.text)
        assert "missing" in response.json()["detail"]


async def test_delete_removes_the_job(client: httpx.AsyncClient) -> None:
    await create(client)
    assert (await client.delete("/v1/jobs/nightly-reindex")).status_code == 204
    assert (await client.get("/v1/jobs/nightly-reindex")).status_code == 404
    assert (await client.delete("/v1/jobs/nightly-reindex")).status_code == 404


HIDDEN = object()  # the 422 leaves the value out


@pytest.mark.parametrize(
    ("overrides", "loc", "bad_value"),
    [
        ({"schedule": {"kind": "cron", "expression": "61 * * * *"}}, "expression", "61 * * * *"),
        ({"schedule": {"kind": "cron", "expression": "@reboot"}}, "expression", "@reboot"),
        ({"timezone": "Mars/Olympus"}, "timezone", "Mars/Olympus"),
        ({"task": "teleport"}, "task", "teleport"),
        ({"args": {"level": "info"}}, "message", None),
        ({"args": {"message": "x", "level": "loud"}}, "level", HIDDEN),
        ({"args": {"message": "x", "colour": "red"}}, "colour", HIDDEN),
        ({"surprise": True}, "surprise", True),
        ({"name": "-bad-start"}, "name", "-bad-start"),
        ({"name": "x" * 129}, "name", "x" * 129),
        ({"timeout_seconds": 0}, "timeout_seconds", 0),
        ({"timeout_seconds": 86401}, "timeout_seconds", 86401),
        ({"misfire_grace_seconds": -1}, "misfire_grace_seconds", -1),
        ({"overlap": "sometimes"}, "overlap", "sometimes"),
        ({"schedule": {"kind": "interval", "every_seconds": 0}}, "every_seconds", 0),
        ({"schedule": {"kind": "daily", "at": []}}, "at", HIDDEN),
        ({"schedule": {"kind": "weekly"}}, "schedule", None),
    ],
)
async def test_bad_input_is_422_naming_field_and_value(
    client: httpx.AsyncClient, overrides: dict[str, Any], loc: str, bad_value: Any
) -> None:
    """The value is echoed where it cannot hold a secret; never under a task's args (or
    a hook's), nor a whole object or list, which may hold one (#42)."""
    response = await client.post("/v1/jobs", json=CRON_JOB | overrides)
    problems = response.json()["errors"] if response.status_code == 422 else []
    assert response.status_code == 422, response.text
    matching = [p for p in problems if loc in p["loc"]]
    assert matching, problems
    if bad_value is HIDDEN:
        assert not any("input" in p for p in matching), matching
    elif bad_value is not None:
        assert any(p.get("input") == bad_value for p in matching), matching
    listed = await client.get("/v1/jobs")
    assert listed.json()["items"] == []


async def test_one_time_in_the_past_is_422(client: httpx.AsyncClient) -> None:
    past = (datetime.now(UTC) - timedelta(minutes=1)).isoformat()
    response = await client.post(
        "/v1/jobs", json=CRON_JOB | {"schedule": {"kind": "once", "at": past}}
    )
    assert ["body", "schedule", "at"] in problem_locs(response)


async def test_naive_one_time_means_the_job_zone(client: httpx.AsyncClient) -> None:
    job = await create(
        client,
        timezone="Europe/Kyiv",
        schedule={"kind": "once", "at": "2099-07-01T10:00:00"},
    )
    assert datetime.fromisoformat(job["schedule"]["at"]) == datetime(2099, 7, 1, 7, tzinfo=UTC)
    assert datetime.fromisoformat(job["next_run_at"]) == datetime(2099, 7, 1, 7, tzinfo=UTC)


async def test_args_over_64_kib_are_422(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/v1/jobs", json=CRON_JOB | {"args": {"message": "x" * 10, "pad": "y" * 70_000}}
    )
    assert ["body", "args"] in problem_locs(response)


async def test_more_than_100_daily_times_are_422(client: httpx.AsyncClient) -> None:
    times = [f"{h:02d}:{m:02d}" for h in range(3) for m in range(60)][:101]
    response = await client.post(
        "/v1/jobs", json=CRON_JOB | {"schedule": {"kind": "daily", "at": times}}
    )
    assert any("at" in loc for loc in problem_locs(response))


async def test_http_args_are_validated_at_create(client: httpx.AsyncClient) -> None:
    bad = await client.post(
        "/v1/jobs",
        json=CRON_JOB | {"task": "http", "args": {"url": "not a url", "method": "BREW"}},
    )
    locs = problem_locs(bad)
    assert ["body", "args", "url"] in locs
    assert ["body", "args", "method"] in locs
    good = await create(client, task="http", args={"url": "http://127.0.0.1:9/hook"})
    assert good["args"] == {"url": "http://127.0.0.1:9/hook"}


async def test_interval_anchor_defaults_to_creation_second(client: httpx.AsyncClient) -> None:
    before = datetime.now(UTC).replace(microsecond=0)
    job = await create(client, schedule={"kind": "interval", "every_seconds": 300})
    anchor = datetime.fromisoformat(job["schedule"]["anchor"])
    assert before <= anchor <= datetime.now(UTC)
    assert anchor.microsecond == 0
    next_run = datetime.fromisoformat(job["next_run_at"])
    assert (next_run - anchor).total_seconds() % 300 == 0


async def test_daily_anchor_date_is_creation_date_in_zone(client: httpx.AsyncClient) -> None:
    job = await create(
        client, timezone="Pacific/Kiritimati", schedule={"kind": "daily", "at": ["03:00"]}
    )
    today_there = datetime.now(UTC).astimezone(
        __import__("zoneinfo").ZoneInfo("Pacific/Kiritimati")
    )
    assert job["schedule"]["anchor_date"] == today_there.date().isoformat()
    assert job["schedule"]["at"] == ["03:00:00"]


async def test_put_creates_then_replaces_idempotently(client: httpx.AsyncClient) -> None:
    body = {k: v for k, v in CRON_JOB.items() if k != "name"} | {
        "schedule": {"kind": "interval", "every_seconds": 60}
    }
    created = await client.put("/v1/jobs/applied", json=body)
    assert created.status_code == 201
    assert created.headers["location"] == "/v1/jobs/applied"
    again = await client.put("/v1/jobs/applied", json=body)
    assert again.status_code == 200
    assert again.json() == created.json() | {"next_run_at": again.json()["next_run_at"]}
    assert again.json()["version"] == 1
    changed = await client.put("/v1/jobs/applied", json=body | {"description": "now described"})
    assert changed.status_code == 200
    assert changed.json()["version"] == 2
    assert changed.json()["schedule"]["anchor"] == created.json()["schedule"]["anchor"]
    assert changed.json()["created_at"] == created.json()["created_at"]


async def test_put_name_must_match_path(client: httpx.AsyncClient) -> None:
    body = CRON_JOB | {"name": "other"}
    response = await client.put("/v1/jobs/nightly-reindex", json=body)
    assert ["body", "name"] in problem_locs(response)
    assert (await client.put("/v1/jobs/nightly-reindex", json=CRON_JOB)).status_code == 201


async def test_put_keeps_a_past_one_time_job_it_already_has(client: httpx.AsyncClient) -> None:
    soon = datetime.now(UTC) + timedelta(hours=1)
    body = {
        "schedule": {"kind": "once", "at": soon.isoformat()},
        "task": "log",
        "args": {"message": "once"},
    }
    assert (await client.put("/v1/jobs/once", json=body)).status_code == 201
    assert (await client.put("/v1/jobs/once", json=body)).status_code == 200


async def test_patch_merges_declared_fields(client: httpx.AsyncClient) -> None:
    await create(client, args={"message": "hi", "level": "warning"})
    response = await client.patch(
        "/v1/jobs/nightly-reindex",
        json={
            "description": "patched",
            "args": {"level": None},
            "schedule": {"expression": "5 4 * * *"},
        },
        headers={"content-type": "application/merge-patch+json"},
    )
    assert response.status_code == 200, response.text
    job = response.json()
    assert job["description"] == "patched"
    assert job["args"] == {"message": "hi"}
    assert job["schedule"] == {"kind": "cron", "expression": "5 4 * * *"}
    assert job["version"] == 2
    assert job["timezone"] == "Europe/Kyiv"


async def test_patch_to_another_schedule_kind_replaces_it(client: httpx.AsyncClient) -> None:
    await create(client)
    response = await client.patch(
        "/v1/jobs/nightly-reindex", json={"schedule": {"kind": "interval", "every_seconds": 30}}
    )
    assert response.status_code == 200, response.text
    assert response.json()["schedule"]["kind"] == "interval"
    assert response.json()["schedule"]["every_seconds"] == 30


async def test_patch_rejects_bad_values_and_changes_nothing(client: httpx.AsyncClient) -> None:
    original = await create(client)
    for patch, loc in [
        ({"name": "renamed"}, ["body", "name"]),
        ({"schedule": {"expression": "nope"}}, ["body", "schedule", "cron", "expression"]),
        ({"timezone": "Nowhere/Land"}, ["body", "timezone"]),
        ({"args": {"level": "loud"}}, ["body", "args", "level"]),
        ({"task": "http"}, ["body", "args", "url"]),
        ({"state": "paused"}, ["body", "state"]),
    ]:
        response = await client.patch("/v1/jobs/nightly-reindex", json=patch)
        assert loc in problem_locs(response), (patch, response.text)
    assert (await client.get("/v1/jobs/nightly-reindex")).json() == original


async def test_pause_and_resume(client: httpx.AsyncClient) -> None:
    await create(client)
    paused = (await client.post("/v1/jobs/nightly-reindex/pause")).json()
    assert paused["state"] == "paused"
    assert paused["next_run_at"] is None
    assert paused["version"] == 2
    again = (await client.post("/v1/jobs/nightly-reindex/pause")).json()
    assert again["version"] == 2
    resumed = (await client.post("/v1/jobs/nightly-reindex/resume")).json()
    assert resumed["state"] == "active"
    assert datetime.fromisoformat(resumed["next_run_at"]) > datetime.now(UTC)
    assert resumed["version"] == 3


async def test_list_pages_by_name_with_filters(client: httpx.AsyncClient) -> None:
    names = [f"job-{i:02d}" for i in range(7)] + ["other-1"]
    for name in names:
        await create(client, name=name)
    await create(client, name="web-1", task="http", args={"url": "http://127.0.0.1:9/"})
    await client.post("/v1/jobs/job-03/pause")

    seen, cursor = [], None
    while True:
        params = {"limit": 3, "prefix": "job-"} | ({"cursor": cursor} if cursor else {})
        page = (await client.get("/v1/jobs", params=params)).json()
        seen += [item["name"] for item in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
    assert seen == names[:7]

    paused = (await client.get("/v1/jobs", params={"state": "paused"})).json()
    assert [j["name"] for j in paused["items"]] == ["job-03"]
    web = (await client.get("/v1/jobs", params={"task": "http"})).json()
    assert [j["name"] for j in web["items"]] == ["web-1"]
    everything = (await client.get("/v1/jobs")).json()
    assert len(everything["items"]) == 9
    assert everything["next_cursor"] is None


@pytest.mark.parametrize(
    "params",
    [
        {"cursor": "%%%"},
        {"cursor": "!!"},
        {"cursor": "_w"},
        {"limit": 0},
        {"limit": 1001},
        {"state": "sleeping"},
        {"colour": "red"},
        {"prefix": "a\x00"},  # PostgreSQL text holds no NUL: refused, not a 500
        {"task": "http\x00"},
    ],
)
async def test_bad_list_parameters_are_422(
    client: httpx.AsyncClient, params: dict[str, Any]
) -> None:
    response = await client.get("/v1/jobs", params=params)
    assert response.status_code == 422, response.text


async def test_prefix_is_literal_not_a_pattern(client: httpx.AsyncClient) -> None:
    await create(client, name="a_b")
    await create(client, name="axb")
    page = (await client.get("/v1/jobs", params={"prefix": "a_"})).json()
    assert [j["name"] for j in page["items"]] == ["a_b"]


async def test_writes_notify_the_scheduler_channel(
    client: httpx.AsyncClient, database_url: str
) -> None:

    import asyncpg

    received: asyncio.Queue[str] = asyncio.Queue()
    listener = await asyncpg.connect(database_url)
    try:
        await listener.add_listener("tickgate_jobs", lambda *args: received.put_nowait(args[3]))
        await create(client)
        await client.post("/v1/jobs/nightly-reindex/pause")
        await client.delete("/v1/jobs/nightly-reindex")
        got = [await asyncio.wait_for(received.get(), 10) for _ in range(3)]
        assert got == ["nightly-reindex"] * 3
    finally:
        await listener.close()


async def test_store_round_trips_frozen_jobs(client: httpx.AsyncClient, store: Store) -> None:
    await create(client)
    job = await store.get_job("nightly-reindex")
    assert job is not None
    assert job.lock_key == lock_key("nightly-reindex")
    with pytest.raises(Exception, match="frozen"):
        job.description = "mutated"  # type: ignore[misc]
