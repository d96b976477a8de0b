"""Every tick accounted for: each way the fire path used to lose, double or wrongly run
a tick, in process on real PostgreSQL (findings of the "every tick accounted for" issue,
by number)."""

import asyncio
from datetime import UTC, datetime, timedelta
from uuid import uuid4

import asyncpg
import pytest
from pydantic import JsonValue

from harness.waiting import eventually_async
from service.domain.jobs import Job, JobState, Overlap, complete_if_ended, replace_job
from service.domain.runs import RunStatus, RunTrigger, SkipReason
from service.domain.schedules import CronSchedule, IntervalSchedule, OnceSchedule
from service.metrics import Metrics
from service.scheduler import Runner, on_demand
from service.store import Store
from service.store.sessions import ClaimOutcome, LockSessions, TickClaim
from service.tasks import TaskContext, TaskDefinition
from tests.support.db import advisory_locks_on, blocks_someone, refusing_connections
from tests.support.fire import (
    GateArgs,
    Gates,
    add_job,
    finished_runs,
    lock_pool,
    running,
    runs_of,
    skipped,
    tick_now,
)


def scheduled(job: Job, tick: datetime) -> TickClaim:
    return TickClaim(job, tick, RunTrigger.SCHEDULE, "r", uuid4(), True)


async def replace_spec(store: Store, name: str, **changes: object) -> None:
    def change(current: Job | None) -> Job:
        assert current is not None
        spec = current.spec().model_copy(update=changes)
        return replace_job(current, spec, datetime.now(UTC))

    await store.mutate_job(name, change)


# 1. Delete and re-create reuses version 1: the old definition must never run.


async def test_a_tick_of_a_deleted_job_never_runs_as_its_recreated_namesake(
    runner: Runner, store: Store, gates: Gates
) -> None:
    old = await add_job(store, "reborn", args={"gate": "old"})
    await store.mutate_job("reborn", lambda _: None)
    new = await add_job(store, "reborn", args={"gate": "new"})
    assert (old.version, new.version) == (1, 1)
    gates["new"].set()
    runner.fire(old, tick_now(), RunTrigger.SCHEDULE)  # a mirror still holding the old one
    await finished_runs(store, "reborn", 1)
    assert gates.started == ["new"]


# 2. A delete at tick time: only the deleted job's tick is lost, never its batch.


async def test_a_delete_during_a_batched_claim_costs_only_its_own_tick(
    store: Store, sessions: LockSessions, database_url: str
) -> None:
    doomed, kept = await add_job(store, "doomed"), await add_job(store, "kept")
    tick = tick_now()
    deleter = await asyncpg.connect(database_url)
    try:
        transaction = deleter.transaction()
        await transaction.start()
        await deleter.execute("DELETE FROM tickgate_jobs WHERE name = 'doomed'")
        async with sessions.session(5) as session:
            claiming = asyncio.create_task(
                session.claim([scheduled(doomed, tick), scheduled(kept, tick)])
            )
            await eventually_async(
                lambda: blocks_someone(deleter), 30, "the claim to wait on the delete's row"
            )
            await transaction.commit()
            outcomes = [claim.outcome for claim in await claiming]
            # The statement saw the job before the delete committed: it may answer
            # CONTENDED (ask again) rather than JOB_GONE; asked again, it is gone.
            assert outcomes in (
                [ClaimOutcome.JOB_GONE, ClaimOutcome.CLAIMED],
                [ClaimOutcome.CONTENDED, ClaimOutcome.CLAIMED],
            )
            [again] = await session.claim([scheduled(doomed, tick)])
            assert again.outcome is ClaimOutcome.JOB_GONE
            assert await session.unlock(kept.lock_key)
    finally:
        await deleter.close()
    assert await advisory_locks_on(database_url, doomed.lock_key) == 0


async def test_a_tick_and_a_manual_run_whose_cursor_is_held_run_once_it_is_free(
    runner: Runner, store: Store, gates: Gates, database_url: str
) -> None:
    """A claim never waits for a held cursor (an audit, a skip, an edit): it asks
    again. A scheduled tick of one such job and a manual run of another both run once
    their cursors are free, neither skipped nor refused."""
    ticked = await add_job(store, "ticked", args={"gate": "held"})
    manual = await add_job(store, "manual", args={"gate": "held"})
    gates["held"].set()
    tick = tick_now()
    holder = await asyncpg.connect(database_url)
    try:
        async with holder.transaction():
            await holder.execute(
                "SELECT 1 FROM tickgate_cursors WHERE job = ANY($1) FOR NO KEY UPDATE",
                ["ticked", "manual"],
            )
            runner.fire(ticked, tick, RunTrigger.SCHEDULE)
            triggered = asyncio.create_task(runner.on_demand.trigger_now(manual))
            await asyncio.sleep(1)  # both asked, and asked again, meanwhile
            assert not triggered.done()
            assert await runs_of(store, "ticked") == []
        assert (await triggered).trigger is RunTrigger.MANUAL
    finally:
        await holder.close()
    [run] = await finished_runs(store, "ticked", 1)
    assert (run.scheduled_for, run.status) == (tick, RunStatus.SUCCEEDED)
    [run] = await finished_runs(store, "manual", 1)
    assert run.status is RunStatus.SUCCEEDED


# 3. queue_one with more than one replica.


async def test_queue_one_across_two_replicas_runs_each_tick_in_order(
    store: Store, gates: Gates, metrics: Metrics, database_url: str
) -> None:
    job = await add_job(store, "queued", overlap=Overlap.QUEUE_ONE)
    first = tick_now()
    second = first + timedelta(seconds=1)
    async with (
        lock_pool(database_url, 4) as one_pool,
        lock_pool(database_url, 4) as two_pool,
        running(store, one_pool, gates, metrics) as one,
        running(store, two_pool, gates, Metrics()) as two,
    ):
        for replica in (one, two):  # both replicas fire the first tick...
            replica.fire(job, first, RunTrigger.SCHEDULE)
        await eventually_async(lambda: len(gates.started) == 1, 30, "the first run")
        await asyncio.sleep(0.5)  # ...and the loser sees it running, holding the lock
        for replica in (one, two):
            replica.fire(job, second, RunTrigger.SCHEDULE)
        await asyncio.sleep(1)
        assert len(gates.started) == 1, "the second tick must wait, not overlap"
        gates["default"].set()
        runs = sorted(await finished_runs(store, "queued", 2), key=lambda r: r.scheduled_for)
    assert [(r.scheduled_for, r.status) for r in runs] == [
        (first, RunStatus.SUCCEEDED),
        (second, RunStatus.SUCCEEDED),
    ]
    assert runs[0].finished_at is not None
    assert runs[0].finished_at <= runs[1].started_at


# 4. No lock session to be had (the database refuses new connections and the open
#    session died): every wait for a session has a deadline, and a tick that waited is
#    judged against its grace again.


async def test_a_manual_trigger_with_no_session_to_be_had_fails_in_time(
    store: Store, gates: Gates, metrics: Metrics, database_url: str
) -> None:
    job = await add_job(store, "starved")
    async with (
        lock_pool(database_url, 1) as sessions,
        lock_pool(database_url, 1) as side,
        running(store, sessions, gates, metrics, side_sessions=side) as runner,
    ):
        async with side.session(5) as session:
            session.terminate()
        async with refusing_connections(database_url), asyncio.timeout(60) as patience:
            with pytest.raises(TimeoutError):
                await runner.on_demand.trigger_now(job)
        assert not patience.expired(), "the trigger waited for a session without end"


async def test_a_tick_that_waited_past_its_grace_for_a_session_is_a_misfire(
    store: Store, gates: Gates, metrics: Metrics, database_url: str
) -> None:
    job = await add_job(store, "waited", misfire_grace_seconds=1)
    gates["default"].set()
    async with (
        lock_pool(database_url, 1) as sessions,
        running(store, sessions, gates, metrics) as runner,
    ):
        async with sessions.session(5) as session:
            session.terminate()
        async with refusing_connections(database_url):
            runner.fire(job, tick_now(), RunTrigger.SCHEDULE)
            await asyncio.sleep(2.5)
        await eventually_async(lambda: skipped(metrics, "misfire") == 1, 30, "a misfire")
    [skip] = await runs_of(store, "waited")
    assert (skip.status, skip.skip_reason) == (RunStatus.SKIPPED, SkipReason.MISFIRE)
    assert gates.started == []


# 5. Backfill waits a bounded time for the job's lock.


async def test_a_backfill_gives_up_on_a_lock_held_elsewhere(
    runner: Runner, store: Store, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(on_demand, "BACKFILL_WAIT_SECONDS", 1.0)
    job = await add_job(store, "blocked")
    holder = await asyncpg.connect(database_url)
    try:
        await holder.execute("SELECT pg_advisory_lock($1)", job.lock_key)
        with pytest.raises(Exception, match="stopped at"):
            await asyncio.wait_for(runner.on_demand.backfill(job, [tick_now()]), timeout=30)
    finally:
        await holder.close()


# 7. An edit near a tick: a tick the job still has runs, with the new definition.


async def test_an_edit_between_schedule_and_claim_loses_no_tick(
    runner: Runner, store: Store, gates: Gates
) -> None:
    job = await add_job(store, "edited", args={"gate": "before"})
    await replace_spec(store, "edited", description="edited", args={"gate": "after"})
    gates["after"].set()
    runner.fire(job, tick_now(), RunTrigger.SCHEDULE)  # scheduled from version 1
    [run] = await finished_runs(store, "edited", 1)
    assert run.status is RunStatus.SUCCEEDED
    assert gates.started == ["after"]


async def test_a_tick_the_rescheduled_job_no_longer_has_does_not_run(
    runner: Runner, store: Store, gates: Gates
) -> None:
    job = await add_job(store, "moved")
    anchor = datetime(2026, 1, 1, tzinfo=UTC)
    await replace_spec(
        store,
        "moved",
        schedule=IntervalSchedule(kind="interval", every_seconds=3600, anchor=anchor),
    )
    tick = tick_now()
    runner.fire(job, tick, RunTrigger.SCHEDULE)
    await asyncio.sleep(1)
    # The old ticks nobody decided before the edit (an hour's) have their `superseded`
    # row; none ran.
    runs = await runs_of(store, "moved")
    assert {run.skip_reason for run in runs} <= {SkipReason.SUPERSEDED}
    assert gates.started == []


# 9. A result or error holding bytes PostgreSQL refuses is stored safely, and never
#    costs the other runs of its batch their record.


async def test_nul_in_a_result_or_error_is_stored_and_spares_the_batch(
    store: Store, sessions: LockSessions, gates: Gates, metrics: Metrics
) -> None:
    async def nul_result(args: GateArgs, context: TaskContext) -> JsonValue:
        return {"text\x00key": ["a\x00b", "\udc80"]}

    async def nul_error(args: GateArgs, context: TaskContext) -> JsonValue:
        raise RuntimeError("bad\x00byte \udc80")

    tasks = [
        TaskDefinition("nul_result", "NUL result", GateArgs, nul_result),
        TaskDefinition("nul_error", "NUL error", GateArgs, nul_error),
    ]
    async with running(store, sessions, gates, metrics, tasks=tasks) as runner:
        jobs = [
            await add_job(store, "nul-result", task="nul_result"),
            await add_job(store, "nul-error", task="nul_error"),
            await add_job(store, "plain"),
        ]
        gates["default"].set()
        tick = tick_now()
        for job in jobs:
            runner.fire(job, tick, RunTrigger.SCHEDULE)
        [result] = await finished_runs(store, "nul-result", 1)
        [error] = await finished_runs(store, "nul-error", 1)
        [plain] = await finished_runs(store, "plain", 1)
    assert result.status is RunStatus.SUCCEEDED
    assert result.result == {"text\ufffdkey": ["a\ufffdb", "?"]}
    assert (error.status, error.error) == (RunStatus.FAILED, "RuntimeError: bad\ufffdbyte ?")
    assert plain.status is RunStatus.SUCCEEDED


# 10. While hung runs hold all the room, waiting ticks do not pile up without end:
#     past their grace they are recorded misfires.


async def test_ticks_waiting_for_room_past_their_grace_are_recorded_misfires(
    store: Store, sessions: LockSessions, gates: Gates, metrics: Metrics
) -> None:
    hung = await add_job(store, "hung", args={"gate": "never"})
    waiting = await add_job(store, "waiting", misfire_grace_seconds=1)
    async with running(store, sessions, gates, metrics, room=1) as runner:
        runner.fire(hung, tick_now(), RunTrigger.SCHEDULE)
        await eventually_async(lambda: gates.started == ["never"], 30, "the hung run")
        runner.fire(waiting, tick_now(), RunTrigger.SCHEDULE)
        await asyncio.sleep(1.5)
        runner.fire(hung, tick_now() + timedelta(seconds=1), RunTrigger.SCHEDULE)
        await eventually_async(lambda: skipped(metrics, "misfire") >= 1, 30, "a misfire")
        [skip] = await runs_of(store, "waiting")
        assert skip.skip_reason is SkipReason.MISFIRE


# 12. Jobs that would stay active forever.


async def test_a_one_time_job_whose_tick_misfired_completes(
    runner: Runner, store: Store, metrics: Metrics
) -> None:
    at = tick_now() - timedelta(seconds=30)
    job = await add_job(
        store, "missed-once", schedule=OnceSchedule(kind="once", at=at), misfire_grace_seconds=5
    )
    runner.fire(job, at, RunTrigger.SCHEDULE)

    async def completed() -> bool:
        current = await store.get_job("missed-once")
        return current is not None and current.state is JobState.COMPLETED

    await eventually_async(completed, 30, "the one-time job to complete")
    [skip] = await runs_of(store, "missed-once")
    assert skip.skip_reason is SkipReason.MISFIRE


async def test_the_completion_chore_completes_jobs_with_nothing_left_to_fire(store: Store) -> None:
    past = tick_now() - timedelta(minutes=10)
    await add_job(
        store, "stale-once", schedule=OnceSchedule(kind="once", at=past), misfire_grace_seconds=5
    )
    capped = await add_job(store, "used-up", max_runs=2)
    await store.update_jobs({"used-up": lambda job, _: job.model_copy(update={"runs_started": 2})})
    await add_job(store, "busy")  # an ordinary job stays active
    ended = {job.name: job for job in await store.ended_jobs()}
    assert set(ended) == {"stale-once", "used-up"}
    now = await store.clock()
    assert {complete_if_ended(job, now).state for job in ended.values()} == {JobState.COMPLETED}
    assert capped.state is JobState.ACTIVE


async def test_scheduled_ticks_go_ahead_of_remaining_backfill_ticks(
    store: Store, sessions: LockSessions, gates: Gates, metrics: Metrics
) -> None:
    """A scheduled tick falls due while a backfill run holds the job's lock: it runs
    next, before the backfill's remaining ticks (the backfill sees it due and without a
    ledger row, and waits for it)."""

    async def nap(args: GateArgs, context: TaskContext) -> JsonValue:
        await asyncio.sleep(2.5)  # longer than the tick's lead: it falls due mid-run
        return None

    tasks = [TaskDefinition("nap", "sleeps a little", GateArgs, nap)]
    async with running(store, sessions, gates, metrics, tasks=tasks) as runner:
        due = tick_now() + timedelta(seconds=2)  # 1 to 2 s ahead: in the first backfill run
        hourly = IntervalSchedule(kind="interval", every_seconds=3600, anchor=due)
        job = await add_job(store, "busy-history", task="nap", schedule=hourly)
        past = [due - timedelta(hours=n) for n in range(3, 0, -1)]
        # Handed over first, as the scheduler does: it arrives when due, whenever that is.
        runner.fire(job, due, RunTrigger.SCHEDULE)
        backfilling = asyncio.create_task(runner.on_demand.backfill(job, past))
        await eventually_async(lambda: _started(store, "busy-history", 1), 30, "the first backfill")
        made = await asyncio.wait_for(backfilling, timeout=60)
        runs = sorted(await finished_runs(store, "busy-history", 4), key=lambda r: r.started_at)
    assert len(made) == 3
    order = [run.trigger for run in runs]
    assert order == [RunTrigger.BACKFILL, RunTrigger.SCHEDULE, *[RunTrigger.BACKFILL] * 2], order
    assert all(run.status is RunStatus.SUCCEEDED for run in runs)


async def _started(store: Store, job: str, count: int) -> bool:
    return len(await runs_of(store, job)) >= count


async def test_an_end_the_database_refuses_is_recorded_alone_and_spares_the_batch(
    store: Store, sessions: LockSessions, gates: Gates, metrics: Metrics, database_url: str
) -> None:
    """Whatever the database refuses in one run's end (here a constraint the test adds),
    the other runs of its batch are recorded, and so is that run, without the bytes."""

    async def poisoned(args: GateArgs, context: TaskContext) -> JsonValue:
        raise RuntimeError("poison")

    async def nested(args: GateArgs, context: TaskContext) -> JsonValue:
        deep: JsonValue = []
        for _ in range(5000):
            deep = [deep]
        return deep

    connection = await asyncpg.connect(database_url)
    try:
        await connection.execute(
            "ALTER TABLE tickgate_runs ADD CONSTRAINT refuse_poison"
            " CHECK (error IS NULL OR error NOT LIKE '%poison%')"
        )
    finally:
        await connection.close()
    tasks = [
        TaskDefinition("poisoned", "fails with an error the database refuses", GateArgs, poisoned),
        TaskDefinition("nested", "returns JSON too deep to write", GateArgs, nested),
    ]
    async with running(store, sessions, gates, metrics, tasks=tasks) as runner:
        jobs = [
            await add_job(store, "poisoned", task="poisoned"),
            await add_job(store, "nested", task="nested"),
            await add_job(store, "healthy"),
        ]
        gates["default"].set()
        tick = tick_now()
        for job in jobs:
            runner.fire(job, tick, RunTrigger.SCHEDULE)
        [bad] = await finished_runs(store, "poisoned", 1)
        [deep] = await finished_runs(store, "nested", 1)
        [good] = await finished_runs(store, "healthy", 1)
    assert (bad.status, bad.result) == (RunStatus.FAILED, None)
    assert bad.error == "the run's result or error could not be stored: CheckViolationError"
    assert deep.status is RunStatus.FAILED
    assert "not JSON" in (deep.error or "")
    assert good.status is RunStatus.SUCCEEDED


async def test_a_counted_backfill_tick_that_waited_on_an_edit_runs_the_edited_job(
    runner: Runner, store: Store, gates: Gates, database_url: str
) -> None:
    """#41: a backfill tick of a `max_runs` job locks the job's row to count its run, so
    it waits for an edit holding that row; once the edit commits, the run is of the
    edited version and runs the edited definition, never the one read before."""
    yearly = CronSchedule(kind="cron", expression="0 0 1 1 *")  # no scheduled tick to give way to
    job = await add_job(store, "capped-edit", schedule=yearly, max_runs=5, args={"gate": "old"})
    new_year = datetime(datetime.now(UTC).year, 1, 1, tzinfo=UTC)
    gates["old"].set()
    gates["new"].set()
    editor = await asyncpg.connect(database_url)
    try:
        edit = editor.transaction()
        await edit.start()
        await editor.execute(
            "UPDATE tickgate_jobs SET args = $2, version = version + 1 WHERE name = $1",
            job.name,
            '{"gate": "new"}',
        )
        backfilling = asyncio.create_task(runner.on_demand.backfill(job, [new_year]))
        await eventually_async(
            lambda: blocks_someone(editor), 30, "the counted claim to wait on the edit"
        )
        await edit.commit()
        [run] = await asyncio.wait_for(backfilling, timeout=30)
    finally:
        await editor.close()
    [ended] = await finished_runs(store, "capped-edit", 1)
    assert gates.started == ["new"]
    assert (run.id, ended.status) == (ended.id, RunStatus.SUCCEEDED)
