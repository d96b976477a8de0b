"""Probes, metrics, overdue jobs, and jobs applied from a file at startup."""

from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import httpx
import pytest
import yaml

from harness.waiting import eventually_async
from service.api.declarative import JobFileError
from service.app import create_app
from service.config import Settings
from service.domain.jobs import JobSpec, create_job, pause_job
from service.domain.schedules import IntervalSchedule
from service.scheduler.overdue import CHECK_PAGE, check_overdue, overdue_jobs
from service.store import Store
from service.tzdb import tz_database


def metric(text: str, name: str) -> float | None:
    """The value of one sample line `name value` (labels included in `name`)."""
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.rsplit(" ", 1)[1])
    return None


async def test_healthz_needs_no_database(client: httpx.AsyncClient) -> None:
    response = await client.get("/healthz")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


async def test_readyz_reports_each_check(client: httpx.AsyncClient) -> None:
    response = await client.get("/readyz")
    assert response.status_code == 200, response.text
    assert response.json() == {
        "status": "ready",
        "checks": {"shutdown": "ok", "database": "ok", "migrations": "ok", "scheduler": "off"},
        "tzdata": str(tz_database()),
    }


async def test_the_time_zone_database_is_reported(client: httpx.AsyncClient) -> None:
    """Where ticks' instants come from, so that replicas on different releases show."""
    database = tz_database()
    assert database.version[:2] == "20", database  # an IANA release such as 2025b
    text = (await client.get("/metrics")).text
    sample = f'tickgate_tzdata_info{{source="{database.source}",version="{database.version}"}}'
    assert metric(text, sample) == 1


async def test_readyz_fails_at_once_when_shutdown_begins(settings: Settings) -> None:
    app = create_app(settings)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://localhost") as http,
    ):
        app.state.services.begin_shutdown()
        response = await http.get("/readyz")
        assert response.status_code == 503
        assert response.json()["checks"]["shutdown"] == "shutting down"
        assert (await http.get("/healthz")).status_code == 200


async def test_readyz_waits_for_migrations_at_head(
    client: httpx.AsyncClient, database_url: str
) -> None:
    connection = await asyncpg.connect(database_url)
    try:
        await connection.execute("INSERT INTO tickgate_schema_migrations VALUES (9999, 'future')")
    finally:
        await connection.close()
    response = await client.get("/readyz")
    assert response.status_code == 503
    assert response.json()["checks"]["migrations"].startswith("at version 9999")


async def plant_missed_job(store: Store, name: str) -> datetime:
    """An hourly job whose only tick passed 30 minutes ago, beyond its 60 s grace."""
    anchor = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=30)
    spec = JobSpec(
        schedule=IntervalSchedule(kind="interval", every_seconds=3600, anchor=anchor),
        task="log",
        args={"message": "late"},
    )
    made = anchor - timedelta(hours=1)
    await store.mutate_job(name, lambda _: create_job(name, spec, made))
    return anchor


async def test_overdue_jobs_are_listed_and_counted(
    client: httpx.AsyncClient, store: Store, database_url: str
) -> None:
    tick = await plant_missed_job(store, "missed")
    await client.post(
        "/v1/jobs",
        json={
            "name": "fine",
            "schedule": {"kind": "cron", "expression": "0 0 1 1 *"},
            "task": "log",
            "args": {"message": "x"},
        },
    )
    text = (await client.get("/metrics")).text
    assert metric(text, "tickgate_jobs_overdue") == 0, "nothing is known before a check"
    assert metric(text, "tickgate_overdue_checked_timestamp_seconds") == 0
    assert await check_overdue(store, 60)
    assert not await check_overdue(store, 60), "one check per round, cluster-wide"
    overdue = (await client.get("/v1/jobs", params={"overdue": "true"})).json()
    assert [job["name"] for job in overdue["items"]] == ["missed"]
    text = (await client.get("/metrics")).text
    assert metric(text, "tickgate_jobs_overdue") == 1
    checked = metric(text, "tickgate_overdue_checked_timestamp_seconds")
    assert checked is not None
    assert abs(checked - datetime.now(UTC).timestamp()) < 600
    assert metric(text, 'tickgate_jobs{state="active"}') == 2
    assert metric(text, 'tickgate_jobs{state="paused"}') == 0

    connection = await asyncpg.connect(database_url)
    try:
        await connection.execute(
            """INSERT INTO tickgate_runs (id, job, scheduled_for, trigger, status, started_at,
               runner, job_version, lock_key, locked, backend_pid)
               VALUES (gen_random_uuid(), 'missed', $1, 'schedule', 'succeeded', now(), 'x', 1,
                       0, true, 0)""",
            tick,
        )
    finally:
        await connection.close()
    # The list leaves out at once a job run since; the count follows at the next check.
    assert (await client.get("/v1/jobs", params={"overdue": "true"})).json()["items"] == []
    assert await check_overdue(store, 0)
    assert metric((await client.get("/metrics")).text, "tickgate_jobs_overdue") == 0


async def test_the_overdue_check_pages_through_every_active_job(store: Store) -> None:
    names = [f"missed-{n:03}" for n in range(CHECK_PAGE * 2 + 7)]
    for name in names:
        await plant_missed_job(store, name)
    await store.mutate_job("missed-004", lambda job: job and pause_job(job, job.updated_at, None))
    assert await check_overdue(store, 0)
    assert [job.name for job in await overdue_jobs(store)] == [
        name for name in names if name != "missed-004"
    ]


async def test_run_metrics_count_this_replicas_runs(client: httpx.AsyncClient) -> None:
    await client.post(
        "/v1/jobs",
        json={
            "name": "counted",
            "schedule": {"kind": "cron", "expression": "0 0 1 1 *"},
            "task": "log",
            "args": {"message": "x"},
        },
    )
    run_id = (await client.post("/v1/jobs/counted/trigger")).json()["id"]

    async def finished() -> bool:
        return bool((await client.get(f"/v1/runs/{run_id}")).json()["status"] == "succeeded")

    await eventually_async(finished, 30, "the manual run to succeed")
    text = (await client.get("/metrics")).text
    assert metric(text, 'tickgate_runs_total{job="counted",status="succeeded"}') == 1
    last = metric(text, 'tickgate_job_last_success_timestamp_seconds{job="counted"}')
    assert last is not None
    assert abs(last - datetime.now(UTC).timestamp()) < 600
    assert metric(text, "tickgate_runs_in_flight") == 0
    for name in ("tickgate_fire_lag_seconds_count", "tickgate_scheduler_sync_age_seconds"):
        assert name in text

    assert (await client.delete("/v1/jobs/counted")).status_code == 204
    text = (await client.get("/metrics")).text
    assert 'job="counted"' not in text, "a deleted job's series go with it"


def jobs_file(tmp_path: Path, jobs: list[dict[str, Any]]) -> Path:
    path = tmp_path / "jobs.yaml"
    path.write_text(yaml.safe_dump({"jobs": jobs}))
    return path


DECLARED = [
    {
        "name": "declared-a",
        "schedule": {"kind": "cron", "expression": "0 3 * * *"},
        "task": "log",
        "args": {"message": "a"},
    },
    {
        "name": "declared-b",
        "schedule": {"kind": "interval", "every_seconds": 60},
        "task": "log",
        "args": {"message": "b"},
    },
]


async def test_jobs_file_is_applied_at_startup_like_put(settings: Settings, tmp_path: Path) -> None:
    declared = settings.model_copy(update={"apply_jobs": jobs_file(tmp_path, DECLARED)})
    for _ in range(2):  # a restart applies the same file again and changes nothing
        app = create_app(declared)
        async with (
            app.router.lifespan_context(app),
            httpx.AsyncClient(
                transport=httpx.ASGITransport(app), base_url="http://localhost"
            ) as http,
        ):
            page = (await http.get("/v1/jobs")).json()["items"]
    assert [job["name"] for job in page] == ["declared-a", "declared-b"]
    assert [job["version"] for job in page] == [1, 1]


async def test_a_bad_jobs_file_stops_startup_naming_each_bad_job_and_applies_none(
    settings: Settings, store: Store, tmp_path: Path
) -> None:
    bad = [
        DECLARED[0],
        DECLARED[1] | {"schedule": {"kind": "cron", "expression": "61 * * * *"}},
        DECLARED[1] | {"name": "declared-c", "timezone": "Mars/Olympus"},
    ]
    app = create_app(settings.model_copy(update={"apply_jobs": jobs_file(tmp_path, bad)}))
    with pytest.raises(JobFileError) as raised:
        async with app.router.lifespan_context(app):
            pass
    message = str(raised.value)
    assert "jobs.1.schedule" in message
    assert "job 'declared-b'" in message
    assert "61" in message
    assert "jobs.2.timezone" in message
    assert "job 'declared-c'" in message
    assert await store.get_job("declared-a") is None


async def test_jobs_file_reads_unquoted_wall_times_as_times(
    settings: Settings, tmp_path: Path
) -> None:
    """YAML 1.1 reads `15:30` as the number 930; the jobs file must not."""
    path = tmp_path / "jobs.yaml"
    path.write_text(
        "- name: twice-daily\n"
        "  schedule: {kind: daily, at: [15:30, 03:00:15]}\n"
        "  task: log\n"
        "  args: {message: hi}\n"
    )
    app = create_app(settings.model_copy(update={"apply_jobs": path}))
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://localhost") as http,
    ):
        job = (await http.get("/v1/jobs/twice-daily")).json()
    assert job["schedule"]["at"] == ["03:00:15", "15:30:00"]
