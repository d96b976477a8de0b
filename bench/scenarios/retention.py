"""Scenario: retention, how fast one round prunes the ledger.

`retention_jobs` jobs are made (one through the API, the rest cloned in SQL), each with
`retention_rows_per_job` ledger rows a day old; one retention round
(`Store.prune_runs`, as a replica's sweep calls it) keeps the newest `KEEP` per job. The
round is timed from outside: rows deleted per second is the highest steady fire rate
retention keeps pace with (a round every `TICKGATE_RECONCILE_SECONDS` deletes what that
many seconds of firing added).
"""

import asyncio
import time
from typing import Any

import asyncpg

from bench.context import Context, api_only_replica
from bench.jobs import clone_jobs, put_jobs
from bench.scenarios.scale import idle_job
from service.store import Store

NAME = "retention"
KEEP = 100

_HISTORY = """INSERT INTO tickgate_runs (id, job, scheduled_for, trigger, status, started_at,
        runner, job_version, lock_key, locked, backend_pid)
    SELECT gen_random_uuid(), j.name,
        now() - interval '1 day' + make_interval(secs => n), 'schedule', 'succeeded',
        now() - interval '1 day', 'bench', 1, j.lock_key, true, 0
    FROM tickgate_jobs j CROSS JOIN generate_series(1, $1) AS n"""


async def _seed(url: str, rows_per_job: int) -> int:
    connection = await asyncpg.connect(url)
    try:
        await connection.execute(_HISTORY, rows_per_job)
        await connection.execute("VACUUM ANALYZE tickgate_runs")
        count: int = await connection.fetchval("SELECT count(*) FROM tickgate_runs")
        return count
    finally:
        await connection.close()


async def _one_round(url: str) -> tuple[int, float]:
    store = await Store.open(url, max_size=2)
    try:
        began = time.perf_counter()
        pruned = await store.prune_runs(KEEP)
        return pruned, time.perf_counter() - began
    finally:
        await store.close()


def run(ctx: Context) -> dict[str, Any]:
    jobs, per_job = ctx.sizes.retention_jobs, ctx.sizes.retention_rows_per_job
    url = ctx.postgres.fresh_database(NAME)
    names = [f"r-{index:06d}" for index in range(jobs)]
    with api_only_replica(ctx, url, label=NAME) as api:
        put_jobs([api.url], [idle_job(names[0])])
        clone_jobs(url, names[0], names[1:])
    rows = asyncio.run(_seed(url, per_job))
    ctx.say(f"retention: {rows:,} rows over {jobs:,} jobs; one round keeps {KEEP} per job")
    pruned, seconds = asyncio.run(_one_round(url))
    rate = pruned / seconds if seconds else 0.0
    ctx.say(f"retention: pruned {pruned:,} rows in {seconds:.2f} s: {rate:,.0f} rows/s")
    return {
        "status": "ok",
        "jobs": jobs,
        "rows_before": rows,
        "keep_per_job": KEEP,
        "pruned": pruned,
        "round_seconds": round(seconds, 3),
        "rows_per_second": round(rate),
        "repeats": 1,
    }
