"""A backfill into a run of missed ticks (#41, finding 5): the misfire row at the run's end
counts the ticks before it that have no row, so a backfill that gives some of them runs
splits the run first; every tick before the cursor keeps exactly one outcome
(`judge_cursors`), and the backfilled ticks have their runs."""

import asyncio
from datetime import datetime, timedelta

import asyncpg
import pytest

from harness.accounting import CURSORS, OUTCOMES, judge_cursors
from harness.waiting import eventually_async
from service.domain.cursors import Takeover
from service.domain.errors import Conflict
from service.domain.gaps import Outcome, split_gaps
from service.domain.jobs import Job
from service.domain.runs import RunStatus, RunTrigger, SkipReason
from service.scheduler import Runner, on_demand
from service.store import Store, backfill_sql
from service.store.ports import Skip
from tests.support.db import blocks_someone
from tests.support.fire import Gates, add_job, finished_runs, runs_of

SECOND = timedelta(seconds=1)
TAKEOVER = Takeover.anytime(SECOND)  # no live member known: any tick


async def test_a_backfill_of_a_run_s_last_ticks_leaves_the_ticks_before_counted(
    runner: Runner, store: Store, gates: Gates, database_url: str
) -> None:
    """A misfire row at t5 counts t1..t5; a backfill of [t4, t5] runs both, and t1..t3
    stay counted (they were left with no outcome: the claim cleared the count)."""
    job, ticks = await _missed_five(store, gates, database_url, "tail")
    made = await runner.on_demand.backfill(job, ticks[3:5])
    assert [run.scheduled_for for run in made] == ticks[3:5]
    assert await _backfilled(store, "tail", 2) == ticks[3:5]
    assert await _problems(database_url, "tail") == []
    assert await _counts(store, "tail", ticks[:6]) == {
        ticks[2]: 3,
        ticks[3]: 1,
        ticks[4]: 1,
        ticks[5]: 1,
    }


async def test_a_backfill_inside_a_run_counts_its_tick_once(
    runner: Runner, store: Store, gates: Gates, database_url: str
) -> None:
    """A misfire row at t5 counts t1..t5; a backfill of t2 alone runs it, and t2 is not
    counted by the misfire row too (it was, twice)."""
    job, ticks = await _missed_five(store, gates, database_url, "middle")
    [made] = await runner.on_demand.backfill(job, ticks[1:2])
    assert made.scheduled_for == ticks[1]
    assert await _backfilled(store, "middle", 1) == ticks[1:2]
    assert await _problems(database_url, "middle") == []
    assert await _counts(store, "middle", ticks[:6]) == {
        ticks[0]: 1,
        ticks[1]: 1,
        ticks[4]: 3,
        ticks[5]: 1,
    }


async def _missed_five(
    store: Store, gates: Gates, database_url: str, name: str
) -> tuple[Job, list[datetime]]:
    """A 1 s job made an hour ago, with no replica up since: its 6th tick skipped, so
    the audit records the five before it as one misfire row at t5 counting 5 (and the
    ticks after, up to its walk, in another). Its first ticks, t1 first."""
    gates["default"].set()
    job = await add_job(store, name, misfire_grace_seconds=0)
    assert job.first_tick is not None
    ticks = [job.first_tick + n * SECOND for n in range(8)]
    skip = Skip(job, ticks[5], RunTrigger.SCHEDULE, SkipReason.OVERLAP, "a run was in progress")
    assert await store.record_skips([skip], "r")
    await store.audit_cursors(10, "auditor", TAKEOVER)
    assert await _counts(store, name, ticks[:6]) == {ticks[4]: 5, ticks[5]: 1}
    assert await _problems(database_url, name) == []
    return job, ticks


async def _counts(store: Store, job: str, ticks: list[datetime]) -> dict[datetime, int]:
    """How many ticks each row among `ticks` counts (its own alone, or a run's)."""
    return {
        run.scheduled_for: run.missed_ticks or 1
        for run in await runs_of(store, job)
        if run.scheduled_for in ticks
    }


async def _backfilled(store: Store, job: str, count: int) -> list[datetime]:
    """The ticks of the job's backfill runs, once `count` of them have ended, all
    succeeded."""
    runs = await finished_runs(store, job, count)
    backfilled = [run for run in runs if run.trigger is RunTrigger.BACKFILL]
    assert {run.status for run in backfilled} == {RunStatus.SUCCEEDED}
    return sorted(run.scheduled_for for run in backfilled)


async def _problems(database_url: str, job: str) -> list[str]:
    connection = await asyncpg.connect(database_url)
    try:
        cursors = await connection.fetch(CURSORS, [job])
        return judge_cursors(cursors, await connection.fetch(OUTCOMES, [job]), {job: 1})
    finally:
        await connection.close()


async def test_two_backfills_into_one_run_at_once_split_it_once(
    runner: Runner, store: Store, gates: Gates, database_url: str
) -> None:
    """Two backfills of overlapping ranges in the same run at once: one splits it, the
    other finds it changed (its compare-and-set misses), reads again and splits what is
    left; every tick is run once and counted once."""
    job, ticks = await _missed_five(store, gates, database_url, "raced")
    made = await asyncio.gather(
        runner.on_demand.backfill(job, ticks[1:3]), runner.on_demand.backfill(job, ticks[2:4])
    )
    assert sorted(run.scheduled_for for runs in made for run in runs) == ticks[1:4]
    assert await _backfilled(store, "raced", 3) == ticks[1:4]
    assert await _problems(database_url, "raced") == []
    assert await _counts(store, "raced", ticks[:6]) == {
        ticks[0]: 1,
        ticks[1]: 1,
        ticks[2]: 1,
        ticks[3]: 1,
        ticks[4]: 1,
        ticks[5]: 1,
    }


async def test_a_backfill_waits_for_the_lock_of_a_tick_with_a_skip_row(
    runner: Runner, store: Store, gates: Gates, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A backfilled tick whose row is a skip (its own, once split off), while the job's
    lock is held elsewhere (another backfill running the tick before it): the backfill
    waits for the lock, and gives up with a 409 if it stays held. It took the skip for
    the tick's outcome and returned at once without running it, so of two overlapping
    backfills at once neither ran the tick they shared."""
    monkeypatch.setattr(on_demand, "BACKFILL_WAIT_SECONDS", 1.0)
    job, ticks = await _missed_five(store, gates, database_url, "waits")
    holder = await asyncpg.connect(database_url)
    try:
        await holder.execute("SELECT pg_advisory_lock($1)", job.lock_key)
        with pytest.raises(Conflict, match="lock stayed held"):
            await runner.on_demand.backfill(job, ticks[1:2])
    finally:
        await holder.close()
    [made] = await runner.on_demand.backfill(job, ticks[1:2])
    assert made.scheduled_for == ticks[1]
    assert await _backfilled(store, "waits", 1) == ticks[1:2]
    assert await _problems(database_url, "waits") == []


async def test_a_split_that_meets_another_one_changes_nothing_and_reads_again(
    store: Store, gates: Gates, database_url: str
) -> None:
    """A backfill of t2 splits the run while another backfill's split of it (t1) holds
    its row: the row's count changed meanwhile, so this split writes nothing (its
    compare-and-set misses) and says so; asked again, it splits what is left."""
    job, ticks = await _missed_five(store, gates, database_url, "cas")
    rows = [Outcome(ticks[4], 5)]
    other = await asyncpg.connect(database_url)
    try:
        splitting = other.transaction()
        await splitting.start()
        first = backfill_sql.split_arguments("cas", split_gaps(job, ticks[:1], rows))
        assert await other.fetchval(backfill_sql.SPLIT_GAPS.text, *first) == 1
        meanwhile = asyncio.create_task(store.split_missed(job, ticks[1:2]))
        await eventually_async(lambda: blocks_someone(other), 30, "the split to wait on the row")
        await splitting.commit()
        assert not await meanwhile
    finally:
        await other.close()
    assert await _counts(store, "cas", ticks[:6]) == {ticks[0]: 1, ticks[4]: 4, ticks[5]: 1}
    assert await store.split_missed(job, ticks[1:2])
    assert await _counts(store, "cas", ticks[:6]) == {
        ticks[0]: 1,
        ticks[1]: 1,
        ticks[4]: 3,
        ticks[5]: 1,
    }
    assert await _problems(database_url, "cas") == []
