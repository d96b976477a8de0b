"""A page of jobs costs its page, not the table: `GET /v1/jobs?limit=100` looked up the
latest run of every job that passed its filters before it cut the page (the LIMIT came
after the LATERAL join), so a list of 100 among 16,000 jobs took 26 ms against 0.9 ms,
and bench-versus measured the list at 0.03-0.04 of the bare baseline. Counted in the
buffers PostgreSQL touches (EXPLAIN ANALYZE), which do not depend on the machine's
speed, beside 100 and then 1,100 jobs, each with a run, on a database never analyzed.
Before the fix a page of 10 by name touched 208 buffers and then 3,358 (by next tick 412
and then 6,662, of the jobs without a tick 208 and then 3,358); after it 22 and then 33
(the index a level deeper), 232 and then 107, 206 and then 75."""

import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta

import asyncpg

from service.domain.jobs import Job, JobSpec, create_job
from service.store import Store
from service.store.columns import Statement
from service.store.jobs_sql import jobs_after_ticks, jobs_by_next_tick, list_jobs
from tests.support.fire import EVERY_SECOND

PAGE = 10


async def _create(store: Store, names: Sequence[str]) -> None:
    now = datetime.now(UTC) - timedelta(hours=1)
    spec = JobSpec(schedule=EVERY_SECOND, task="log", args={})

    def plan(_: Mapping[str, Job]) -> list[Job]:
        return [create_job(name, spec, now) for name in names]

    await store.apply_jobs(names, plan, None)


async def _buffers(url: str, statement: Statement, **given: object) -> int:
    connection = await asyncpg.connect(url)
    try:
        # A run for every job, so each lookup of a latest run finds one.
        await connection.execute(
            """INSERT INTO tickgate_runs (id, job, scheduled_for, trigger, status, started_at,
                   runner, job_version, lock_key, locked, backend_pid)
               SELECT gen_random_uuid(), j.name, now() - interval '1 minute', 'schedule',
                   'succeeded', now(), 'r', j.version, j.lock_key, false, 0
               FROM tickgate_jobs j ON CONFLICT DO NOTHING"""
        )
        # And a booked next tick, as the overdue chore books one for every active job.
        await connection.execute(
            """INSERT INTO tickgate_next_ticks (job, tick)
               SELECT name, now() + interval '1 minute' FROM tickgate_jobs
               ON CONFLICT DO NOTHING"""
        )
        explained = await connection.fetchval(
            f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {statement.text}",
            *statement.arguments(**given),
        )
    finally:
        await connection.close()
    plan = json.loads(explained)[0]["Plan"]
    return int(plan["Shared Hit Blocks"] + plan["Shared Read Blocks"])


async def _growth(store: Store, url: str, statement: Statement, **given: object) -> tuple[int, int]:
    await _create(store, [f"few-{n:04d}" for n in range(100)])
    beside_few = await _buffers(url, statement, **given)
    await _create(store, [f"many-{n:04d}" for n in range(1000)])
    return beside_few, await _buffers(url, statement, **given)


async def test_a_page_by_name_reads_no_more_beside_ten_times_the_jobs(
    store: Store, database_url: str
) -> None:
    statement = list_jobs(frozenset({"limit"}))
    few, many = await _growth(store, database_url, statement, limit=PAGE)
    assert many < 2 * few, (few, many)


async def test_a_page_by_next_tick_reads_no_more_beside_ten_times_the_jobs(
    store: Store, database_url: str
) -> None:
    statement = jobs_by_next_tick(frozenset({"after", "tick", "limit"}))
    first = datetime(1970, 1, 1, tzinfo=UTC)
    few, many = await _growth(store, database_url, statement, after="", tick=first, limit=PAGE)
    assert many < 2 * few, (few, many)


async def test_a_page_of_jobs_without_a_tick_reads_no_more_beside_ten_times_the_jobs(
    store: Store, database_url: str
) -> None:
    statement = jobs_after_ticks(frozenset({"after", "limit"}))
    few, many = await _growth(store, database_url, statement, after="", limit=PAGE)
    assert many < 2 * few, (few, many)
