"""A claim's work follows its batch, not the cluster: nothing per tick costs O(total
jobs). Counted in buffers PostgreSQL touches (EXPLAIN ANALYZE), which do not depend on
the machine's speed, for the same batch beside 100 and then 1,100 jobs with a run each
in progress, on a database never analyzed: a burst outpaces autovacuum, so the plan
must not need fresh statistics.

Found by bench-versus (#41): a 10,000-job burst took 1.66-1.95 s against 1.35-1.58 s
before, because each tick whose lock was taken read every running run of the cluster
(the probe for runs of a deleted incarnation, planned from `tickgate_runs`), and each
batch hashed every job's cursor. Without the fix this test counts about 2,200 and then
22,600 buffers; with it about 160 and 210.
"""

import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, timedelta
from uuid import uuid4

import asyncpg

from service.domain.jobs import Job, JobSpec, create_job
from service.domain.runs import RunTrigger
from service.store import Store
from service.store.fire_sql import CLAIM, claim_arguments
from service.store.moves import claimed_ticks
from service.store.ports import TickClaim
from service.store.sessions import LockSessions
from tests.support.fire import EVERY_SECOND, lock_pool

BATCH = 10  # ticks per measured claim: half of them find their job's lock taken


async def _create(store: Store, names: Sequence[str]) -> list[Job]:
    now = datetime.now(UTC) - timedelta(hours=1)
    spec = JobSpec(schedule=EVERY_SECOND, task="log", args={})

    def plan(_: Mapping[str, Job]) -> list[Job]:
        return [create_job(name, spec, now) for name in names]

    await store.apply_jobs(names, plan, None)
    return await store.get_jobs(names)


def _ticks(jobs: Sequence[Job], at: datetime) -> list[TickClaim]:
    return [TickClaim(job, at, RunTrigger.SCHEDULE, "r", uuid4(), True, False) for job in jobs]


async def _run_all(sessions: LockSessions, jobs: Sequence[Job], at: datetime) -> None:
    """A run in progress for each job, held by the session that claimed it."""
    async with sessions.session(10) as session:
        for start in range(0, len(jobs), 200):
            claims = await session.claim(_ticks(jobs[start : start + 200], at))
            assert all(claim.run is not None for claim in claims)


async def _buffers(url: str, jobs: Sequence[Job], at: datetime) -> int:
    """Buffers the claim of one tick of each job touches, half of the jobs' locks taken
    by another session (their ticks are asked whether a run is in progress)."""
    holder, claimer = await asyncpg.connect(url), await asyncpg.connect(url)
    try:
        for job in jobs[: BATCH // 2]:
            await holder.execute("SELECT pg_advisory_lock($1)", job.lock_key)
        explained = await claimer.fetchval(
            f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) {CLAIM.text}",
            *claim_arguments(claimed_ticks(_ticks(jobs, at))),
        )
    finally:
        await holder.close()
        await claimer.close()
    plan = json.loads(explained)[0]["Plan"]
    return int(plan["Shared Hit Blocks"] + plan["Shared Read Blocks"])


async def test_a_claim_reads_no_more_beside_ten_times_the_jobs(
    store: Store, database_url: str
) -> None:
    at = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=1)
    measured = await _create(store, [f"measured-{n:02d}" for n in range(2 * BATCH)])
    crowd = await _create(store, [f"crowd-{n:04d}" for n in range(1100)])
    async with lock_pool(database_url, 1) as sessions:
        await _run_all(sessions, crowd[:100], at)
        beside_few = await _buffers(database_url, measured[:BATCH], at)
        await _run_all(sessions, crowd[100:], at)
        beside_many = await _buffers(database_url, measured[BATCH:], at)
    # Index pages deepen and the ledger grows by a batch: a little more, never in
    # proportion to the 11 times as many jobs and runs.
    assert beside_many < 1.5 * beside_few, (beside_few, beside_many)
