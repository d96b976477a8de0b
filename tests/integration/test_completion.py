"""The completion chore (#41): jobs with nothing left to fire are completed in the background, each
statement within its deadline, and the look for them reads only jobs that may end."""

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta

import asyncpg
import httpx

from harness.waiting import eventually_async
from service.app import create_app
from service.config import Settings
from service.domain.jobs import JobSpec, create_job
from service.domain.schedules import CronSchedule, OnceSchedule
from service.store import Store
from service.store.jobs_sql import ENDED_JOBS
from service.store.rows import JOB_COLUMNS


@asynccontextmanager
async def scheduling(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    """The app with its scheduler on, in-process."""
    app = create_app(settings.model_copy(update={"scheduler": True, "reconcile_seconds": 1}))
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://localhost") as http,
    ):
        yield http


@asynccontextmanager
async def _row_locked(database_url: str, job: str) -> AsyncIterator[None]:
    """Another transaction holds the job's row, as an edit does, while this lasts."""
    connection = await asyncpg.connect(database_url)
    try:
        transaction = connection.transaction()
        await transaction.start()
        await connection.execute(
            "SELECT 1 FROM tickgate_jobs WHERE name = $1 FOR NO KEY UPDATE", job
        )
        try:
            yield
        finally:
            await transaction.rollback()
    finally:
        await connection.close()


async def test_a_job_s_first_tick_fires_while_the_completion_chore_waits_for_a_lock(
    settings: Settings, store: Store, database_url: str
) -> None:
    """A one-time job nobody ran is the completion chore's to record and complete, but another
    transaction holds its row. The scheduler starts anyway, and a new job's first tick
    runs; once the row is free, the completion chore completes the job. Before, startup waited for
    the completion chore, and no tick fired while the row stayed held."""
    at = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=10)
    spec = JobSpec(
        schedule=OnceSchedule(kind="once", at=at),
        task="log",
        args={"message": "missed"},
        misfire_grace_seconds=5,
    )
    await store.mutate_job("ended", lambda _: create_job("ended", spec, at - timedelta(hours=1)))
    first = {
        "name": "first",
        "schedule": {"kind": "cron", "expression": "* * * * * *"},
        "task": "log",
        "args": {"message": "first"},
    }
    async with (
        _row_locked(database_url, "ended"),
        asyncio.timeout(40),
        scheduling(settings) as client,
    ):
        assert (await client.post("/v1/jobs", json=first)).status_code == 201

        async def ran() -> bool:
            runs = (await client.get("/v1/jobs/first/runs")).json()["items"]
            return any(run["status"] == "succeeded" for run in runs)

        await eventually_async(ran, 20, "the new job's first tick")
    async with scheduling(settings) as client:

        async def completed() -> bool:
            job = (await client.get("/v1/jobs/ended")).json()
            return bool(job["state"] == "completed")

        await eventually_async(completed, 30, "the completion chore to complete the job")


async def test_the_look_for_ended_jobs_reads_no_job_that_cannot_end(
    store: Store, database_url: str
) -> None:
    """10,000 jobs, a third of them with a window's end, 100 with a run cap: the completion chore's
    look reads indexes that hold only active jobs that may end, never the whole table."""
    now = datetime.now(UTC)
    seed = create_job(
        "seed", JobSpec(schedule=CronSchedule(kind="cron", expression="0 * * * *"), task="log"), now
    )
    await store.mutate_job("seed", lambda _: seed)
    columns = JOB_COLUMNS.split(", ")
    chosen = {
        "name": "'job-' || n",
        "lock_key": "n",
        "max_runs": "CASE WHEN n % 100 = 0 THEN 5 END",
        "end_at": "CASE WHEN n % 3 = 0 THEN now() + interval '1 day' END",
    }
    values = ", ".join(chosen.get(column, column) for column in columns)
    connection = await asyncpg.connect(database_url)
    try:
        await connection.execute(
            f"""INSERT INTO tickgate_jobs ({JOB_COLUMNS})
            SELECT {values} FROM tickgate_jobs, generate_series(1, 9999) AS n
            WHERE name = 'seed'"""
        )
        await connection.execute("ANALYZE tickgate_jobs")
        explained = await connection.fetch(f"EXPLAIN ANALYZE {ENDED_JOBS}")
        plan = "\n".join(row[0] for row in explained)
        assert await connection.fetchval("SELECT count(*) FROM tickgate_jobs") == 10_000
    finally:
        await connection.close()
    assert "Seq Scan" not in plan, plan
    assert await store.ended_jobs() == []
