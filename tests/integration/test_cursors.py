"""The tick cursor (migration 0014) on PostgreSQL: kept by every write of a job, moved by
claims and skips of the tick it stands at, and by the audit past every tick nobody
decided; the invariant read back from the database alone (`cursor_problems`)."""

import asyncio
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import uuid4

import asyncpg
import pytest

from harness.accounting import CURSORS, OUTCOMES, judge_cursors
from harness.postgres import with_database
from harness.waiting import eventually_async
from service.app import create_app
from service.config import Settings
from service.domain.cursors import OwedTick, Takeover
from service.domain.jobs import Job, JobSpec, create_job, pause_job, resume_job
from service.domain.ownership import bucket_of
from service.domain.runs import RunStatus, RunTrigger, SkipReason
from service.metrics import Metrics
from service.scheduler.audit import audit_cursors
from service.store import Store
from service.store.base import init_connection
from service.store.migrate import available_migrations
from service.store.ports import ClaimOutcome, RunEnd, Skip, TickClaim
from service.store.rows import JOB_COLUMNS, job_values
from service.store.sessions import LockSessions
from tests.support.db import TemplateDatabases
from tests.support.fire import EVERY_SECOND, runs_of

SECOND = timedelta(seconds=1)
TAKEOVER = Takeover.anytime(timedelta(seconds=1))  # no live member known: any tick
SUCCEEDED = RunEnd(RunStatus.SUCCEEDED, None, None, 1)


def _claim(job: Job, at: datetime) -> TickClaim:
    return TickClaim(job, at, RunTrigger.SCHEDULE, "r", uuid4(), True)


def _whole_second(moment: datetime) -> datetime:
    return moment.replace(microsecond=0)


async def test_a_new_job_s_cursor_is_its_first_tick_and_its_first_claim_moves_it(
    store: Store, sessions: LockSessions, database_url: str
) -> None:
    """The write that makes a job moves its cursor from the threshold to its first tick
    (no tick lies between), due then: no window reads it before, and no audit ever."""
    job = await _made(store, "fresh", timedelta(minutes=10))
    first = job.first_tick
    assert first is not None
    assert first > job.fire_after
    assert await _cursor_row(database_url, "fresh") == (first, first)
    async with sessions.session(5) as session:
        [claimed] = await session.claim([_claim(job, first)])
        assert claimed.run is not None
        await session.finish(claimed.run.id, SUCCEEDED, job.lock_key)
        assert await store.cursor("fresh") == first + SECOND
        # A later tick claimed while the one at the cursor is undecided leaves it there.
        [later] = await session.claim([_claim(job, first + 5 * SECOND)])
        assert later.run is not None
        await session.finish(later.run.id, SUCCEEDED, job.lock_key)
    assert await store.cursor("fresh") == first + SECOND


async def test_a_create_opens_its_cursor_in_its_one_statement(
    store: Store, database_url: str
) -> None:
    """`insert_job` (POST /v1/jobs) writes the job, its cursor at its first tick and its
    booked tick in one statement; a job made paused keeps its cursor at its threshold,
    read by no window or audit until it is resumed."""
    now = await store.clock()
    spec = JobSpec(schedule=EVERY_SECOND, task="log", args={})
    active = create_job("made", spec, now)
    paused = pause_job(create_job("made-paused", spec, now), now)
    for job in (active, paused):
        assert await store.insert_job(job, job.next_run_at(now))
    assert not await store.insert_job(active, active.next_run_at(now))
    first = active.first_tick
    assert first is not None
    assert await _cursor_row(database_url, "made") == (first, first)
    infinity = datetime.max  # asyncpg reads infinity as a naive datetime.max
    assert await _cursor_row(database_url, "made-paused") == (paused.fire_after, infinity)


async def test_a_claim_never_waits_for_a_job_whose_rows_another_statement_holds(
    store: Store, sessions: LockSessions, database_url: str
) -> None:
    """While another transaction (an audit, a skip, an edit) holds one job's cursor,
    a batch claim answers that tick CONTENDED at once, its lock given back, and claims
    the rest; once the row is free, the tick is claimed."""
    held, free = [await _made(store, name, timedelta(minutes=10)) for name in ("held", "free")]
    assert held.first_tick is not None
    assert free.first_tick is not None
    other = await asyncpg.connect(database_url)
    try:
        async with sessions.session(5) as session:
            async with other.transaction():
                await other.execute(
                    "SELECT 1 FROM tickgate_cursors WHERE job = 'held' FOR NO KEY UPDATE"
                )
                batch = [_claim(held, held.first_tick), _claim(free, free.first_tick)]
                contended, claimed = await asyncio.wait_for(session.claim(batch), 10)
                assert (contended.outcome, contended.holds_lock) == (ClaimOutcome.CONTENDED, False)
                assert claimed.run is not None
                assert await other.fetchval("SELECT pg_try_advisory_xact_lock($1)", held.lock_key)
            [again] = await session.claim([_claim(held, held.first_tick)])
            assert again.run is not None
    finally:
        await other.close()


async def test_a_skip_at_the_cursor_moves_it_and_one_before_it_is_not_recorded(
    store: Store,
) -> None:
    job = await _made(store, "skipping", timedelta(minutes=10))
    first = job.first_tick
    assert first is not None
    skips = [
        Skip(job, first + n * SECOND, RunTrigger.SCHEDULE, SkipReason.OVERLAP, "busy")
        for n in (0, 1)
    ]
    assert len(await store.record_skips(skips, "r")) == 2
    # Both rows went in; the cursor moved past the first, and on past the second once
    # the audit finds it decided (skips of one job in one statement move it once).
    assert await store.cursor("skipping") in {first + SECOND, first + 2 * SECOND}
    [again] = await store.record_skips([skips[0]], "r") or [None]
    assert again is None


async def test_the_audit_records_every_tick_nobody_decided_and_no_claim_passes_it(
    store: Store, sessions: LockSessions, database_url: str
) -> None:
    """Finding 1: a 1 s job whose ticks fell with no replica up, one of them skipped.
    The audit writes a misfire row per run of rowless ticks, counting them, and moves
    the cursor to the first tick still within reach; the ticks it passed are decided:
    a late claim of one finds it so."""
    job = await _made(store, "gap", timedelta(seconds=30), misfire_grace_seconds=2)
    first = job.first_tick
    assert first is not None
    skipped = first + 10 * SECOND
    await store.record_skips(
        [Skip(job, skipped, RunTrigger.SCHEDULE, SkipReason.OVERLAP, "x")], "r"
    )
    audited = await store.audit_cursors(100, "auditor", TAKEOVER)
    assert [a.job.name for a in audited] == ["gap"]
    cursor = await store.cursor("gap")
    assert cursor is not None
    now = datetime.now(UTC)
    assert now - 4 * SECOND <= cursor <= now  # the first tick within the grace
    assert await _problems(database_url, {"gap": 1}) == []
    misfires = sorted(
        (run.scheduled_for, run.missed_ticks)
        for run in await runs_of(store, "gap")
        if run.skip_reason is SkipReason.MISFIRE
    )
    after = (cursor - skipped) // SECOND - 1
    assert misfires == [(skipped - SECOND, 10), (cursor - SECOND, after)]
    async with sessions.session(5) as session:
        [late] = await session.claim([_claim(job, skipped + timedelta(seconds=5))])
    assert (late.outcome, late.run) == (ClaimOutcome.ALREADY_RAN, None)
    # Run again, it records nothing it passed; on a slow machine, where more than a
    # second went by, the ticks that have since fallen out of reach are new misfires.
    again = await store.audit_cursors(100, "auditor", TAKEOVER)
    assert all(m.first >= cursor for a in again for m in a.missed)
    assert await _problems(database_url, {"gap": 1}) == []


async def test_the_audit_hands_over_the_ticks_an_owner_left_within_reach(
    store: Store, sessions: LockSessions, database_url: str
) -> None:
    """A 1 s job, grace 10 s, whose owner ran one tick 5 s ago and then nothing: the
    audit hands over each tick without a row that is within reach and due longer ago
    than the takeover time, none again until a later one falls owed, and leaves the
    cursor at the first of them until they are claimed; their claims move it on."""
    job = await _made(store, "left", timedelta(seconds=30), misfire_grace_seconds=10)
    now = _whole_second(_now())
    ran = now - 5 * SECOND
    async with sessions.session(5) as session:
        [claimed] = await session.claim([_claim(job, ran)])
        assert claimed.run is not None
        await session.finish(claimed.run.id, SUCCEEDED, job.lock_key)
    handed: list[datetime] = []

    def take_over(owner_left: Job, owed: OwedTick) -> None:
        assert owner_left.name == "left"
        assert owed.following == owed.tick + SECOND
        handed.append(owed.tick)

    await audit_cursors(store, TAKEOVER, "auditor", Metrics(), take_over)
    audit_time = _now()
    assert handed, "no tick was handed over"
    assert ran not in handed
    assert all(tick > now - 10 * SECOND and tick + SECOND <= audit_time for tick in handed)
    # The ticks between the grace and the audit, but the one that ran, every one of them.
    expected = [tick for tick in _seconds(handed[0], handed[-1]) if tick != ran]
    assert handed == expected
    assert await store.cursor("left") == handed[0]
    await audit_cursors(store, TAKEOVER, "auditor", Metrics(), take_over)
    # Nothing is handed over again until a later tick falls owed (a slow machine may
    # take that second); then the ticks still unclaimed and within reach go again
    # with it, in case their taker died.
    again = handed[len(expected) :]
    assert again == [] or (
        again[-1] > expected[-1]
        and [tick for tick in again if tick <= expected[-1]]
        == [tick for tick in expected if tick >= again[0]]
    ), "a tick was handed over twice with no new tick owed"
    del handed[len(expected) :]
    outcomes = []
    async with sessions.session(5) as session:
        for tick in expected:
            [claimed] = await session.claim([_claim(job, tick)])
            outcomes.append(claimed.outcome)
            if claimed.run is not None:
                await session.finish(claimed.run.id, SUCCEEDED, job.lock_key)
    # Each is claimed, unless it fell past reach meanwhile (a slow machine) and the
    # second round recorded it a misfire.
    assert outcomes[-1] is ClaimOutcome.CLAIMED
    assert set(outcomes) <= {ClaimOutcome.CLAIMED, ClaimOutcome.ALREADY_RAN}

    async def passed_them() -> bool:
        # Claims move the cursor tick by tick up to the tick A ran (its claim found the
        # cursor elsewhere); the audit walks past it once it lags again.
        await audit_cursors(store, TAKEOVER, "auditor", Metrics(), take_over)
        cursor = await store.cursor("left")
        return cursor is not None and cursor > expected[-1]

    await eventually_async(passed_them, 30, "the cursor to pass the ticks taken over")
    assert await _problems(database_url, {"left": 1}) == []


async def test_an_audit_behind_with_its_own_ticks_takes_over_none_and_still_accounts(
    store: Store, sessions: LockSessions, database_url: str
) -> None:
    """A replica whose own ticks wait past half a takeover period (`Runner.behind`)
    audits without taking: a tick still within reach is left to its owner, unlocked and
    untouched, while ticks past reach are recorded misfires as ever. A replica with
    time to spare then takes the owner's over."""
    late = await _made(store, "late", timedelta(seconds=8), misfire_grace_seconds=20)
    gone = await _made(store, "gone", timedelta(seconds=30), misfire_grace_seconds=2)
    ran = _whole_second(_now()) - 5 * SECOND
    async with sessions.session(5) as session:
        [claimed] = await session.claim([_claim(late, ran)])
        assert claimed.run is not None
        await session.finish(claimed.run.id, SUCCEEDED, late.lock_key)
    cursor = await store.cursor("late")
    handed: list[datetime] = []

    def take_over(job: Job, owed: OwedTick) -> None:
        handed.append(owed.tick)

    behind = replace(TAKEOVER, taking=False)
    await audit_cursors(store, behind, "busy", Metrics(), take_over)
    assert handed == []
    assert await store.cursor("late") == cursor
    gone_cursor = await store.cursor("gone")
    assert gone_cursor is not None
    assert gone_cursor > gone.fire_after + 20 * SECOND
    assert [run.skip_reason for run in await runs_of(store, "gone")] == [SkipReason.MISFIRE]
    await audit_cursors(store, TAKEOVER, "spare", Metrics(), take_over)
    assert handed[0] == cursor
    assert ran not in handed


def _seconds(first: datetime, last: datetime) -> list[datetime]:
    return [first + n * SECOND for n in range(int((last - first) / SECOND) + 1)]


async def test_a_resumed_job_s_cursor_starts_at_its_new_threshold(
    store: Store, database_url: str
) -> None:
    job = await _made(store, "paused", timedelta(seconds=30), misfire_grace_seconds=1)
    await store.mutate_job("paused", lambda current: current and pause_job(current, _now()))
    assert await store.audit_cursors(100, "auditor", TAKEOVER) == []  # paused: no ticks
    assert await store.cursor("paused") == job.first_tick
    change = await store.mutate_job(
        "paused", lambda current: current and resume_job(current, _now())
    )
    assert change.after is not None
    assert await store.cursor("paused") == change.after.first_tick
    assert await _problems(database_url, {"paused": 1}) == []


async def test_a_deleted_job_takes_its_cursor_with_it(store: Store, database_url: str) -> None:
    await _made(store, "gone", timedelta(seconds=30))
    await store.mutate_job("gone", lambda _: None)
    assert await store.cursor("gone") is None
    connection = await asyncpg.connect(database_url)
    try:
        assert await connection.fetchval("SELECT count(*) FROM tickgate_cursors") == 0
    finally:
        await connection.close()


@pytest.mark.parametrize("catchup", ["latest", "none"])
async def test_after_an_outage_past_the_grace_every_tick_has_its_outcome(
    settings: Settings, store: Store, database_url: str, catchup: str
) -> None:
    """Finding 1: a 1 s job, grace 3 s, whose last 30 s fell with no replica up. Before
    the cursor, the ticks within the grace at load (but the caught-up one) got no row;
    now every tick up to the cursor has one, or is counted in a misfire row."""
    await _made(store, "outage", timedelta(seconds=30), misfire_grace_seconds=3, catchup=catchup)
    started = _now()
    app = create_app(settings.model_copy(update={"scheduler": True, "takeover_seconds": 1}))
    async with app.router.lifespan_context(app):

        async def passed_the_start() -> bool:
            cursor = await store.cursor("outage")
            return cursor is not None and cursor > started + 2 * SECOND

        await eventually_async(passed_the_start, 60, "the cursor to pass the replica's start")
    assert await _problems(database_url, {"outage": 1}) == []
    rows = await runs_of(store, "outage")
    assert sum(run.missed_ticks or 0 for run in rows if run.skip_reason is SkipReason.MISFIRE) >= 25


async def _cursor_row(database_url: str, job: str) -> tuple[datetime, datetime]:
    connection = await asyncpg.connect(database_url)
    try:
        row = await connection.fetchrow(
            "SELECT tick, due_at FROM tickgate_cursors WHERE job = $1", job
        )
    finally:
        await connection.close()
    assert row is not None
    return row["tick"], row["due_at"]


async def _problems(database_url: str, periods: dict[str, int]) -> list[str]:
    connection = await asyncpg.connect(database_url)
    try:
        jobs = list(periods)
        cursors = await connection.fetch(CURSORS, jobs)
        return judge_cursors(cursors, await connection.fetch(OUTCOMES, jobs), periods)
    finally:
        await connection.close()


def _now() -> datetime:
    return datetime.now(UTC)


async def _made(store: Store, name: str, ago: timedelta, **spec: Any) -> Job:
    """A 1 s job made `ago`, with no replica up since."""
    fields: dict[str, Any] = {"schedule": EVERY_SECOND, "task": "log", "args": {}} | spec
    made = create_job(name, JobSpec(**fields), _now() - ago)
    change = await store.mutate_job(name, lambda _: made)
    assert change.after is not None
    return change.after


# A job as the previous release wrote it (no cursor).
# The job columns the previous release had: all of today's but those added since (last).
_NEWER_JOB_COLUMNS = ("capture", "hooks", "default_hooks")
_OLD_JOB_COLUMNS = JOB_COLUMNS.split(", ")[: -len(_NEWER_JOB_COLUMNS)]
_OLD_JOB = f"""INSERT INTO tickgate_jobs ({", ".join(_OLD_JOB_COLUMNS)})
    VALUES ({", ".join(f"${n}" for n in range(1, len(_OLD_JOB_COLUMNS) + 1))})"""
# The rows the previous release's claim and skip statements wrote (no cursor to move).
_OLD_ROW = """INSERT INTO tickgate_runs (id, job, scheduled_for, trigger, status, skip_reason,
        started_at, finished_at, duration_ms, attempts, runner, job_version, lock_key, locked,
        backend_pid)
    SELECT gen_random_uuid(), name, $2, $3, $4, $5, clock_timestamp(), clock_timestamp(), 0, 1,
        'old', version, lock_key, true, 0
    FROM tickgate_jobs WHERE name = $1"""


async def test_a_database_of_the_previous_release_keeps_its_jobs_runs_and_accounting(
    templates: TemplateDatabases,
) -> None:
    """A database as the release before the cursor left it (migrations up to 0013, rows
    as its statements wrote them) is brought forward: no job or run is lost, each job's
    cursor starts at its newest scheduled row (a manual run is none) or its threshold, and
    the audit then accounts for every tick after it."""
    name = f"tickgate_prev_{uuid4().hex[:12]}"
    await templates._admin(f'CREATE DATABASE "{name}"')
    url = with_database(templates.server_url, name)
    store = await Store.open(url, max_size=2)
    try:
        assert await store.migrate(through=13) == 13
        ran = create_job(
            "ran",
            JobSpec(schedule=EVERY_SECOND, task="log", args={}, misfire_grace_seconds=1),
            _now() - 20 * SECOND,
        )
        never = create_job("never", ran.spec(), _now() - 10 * SECOND)
        first = ran.first_tick
        assert first is not None
        connection = await asyncpg.connect(url)
        await init_connection(connection)
        try:
            for job in (ran, never):  # as the previous release wrote them
                await connection.execute(_OLD_JOB, *job_values(job)[: len(_OLD_JOB_COLUMNS)])
            await connection.execute(_OLD_ROW, "ran", first, "schedule", "succeeded", None)
            await connection.execute(
                _OLD_ROW, "ran", first + SECOND, "schedule", "skipped", "overlap"
            )
            # A manual run asked for on a tick's very second is still no tick's outcome.
            await connection.execute(
                _OLD_ROW, "ran", first + 9 * SECOND, "manual", "succeeded", None
            )
        finally:
            await connection.close()

        assert await store.migrate() == len([m for m in available_migrations() if m.version > 13])
        connection = await asyncpg.connect(url)
        try:
            buckets = dict(await connection.fetch("SELECT job, bucket FROM tickgate_cursors"))
        finally:
            await connection.close()
        assert buckets == {job.name: bucket_of(job.lock_key) for job in (ran, never)}
        assert {job.name for job in await store.get_jobs(["ran", "never"])} == {"ran", "never"}
        assert len(await runs_of(store, "ran")) == 3
        assert await store.cursor("ran") == first + SECOND
        assert await store.cursor("never") == never.fire_after
        await store.audit_cursors(100, "auditor", TAKEOVER)
        assert await _problems(url, {"ran": 1, "never": 1}) == []
        cursor = await store.cursor("ran")
        assert cursor is not None
        assert cursor > first + 10 * SECOND
    finally:
        await store.close()
        await templates.drop(name)
