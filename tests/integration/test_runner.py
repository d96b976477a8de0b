"""The fire path on real PostgreSQL: lock gate, ledger gate, run, record, unlock."""

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import uuid4

import asyncpg

from harness.receiver import receiving
from harness.waiting import eventually_async
from service.domain.jobs import Job, JobState, Overlap, replace_job
from service.domain.runs import RunStatus, RunTrigger, SkipReason
from service.domain.schedules import OnceSchedule
from service.metrics import Metrics
from service.scheduler import Runner
from service.scheduler.orphans import ORPHAN_GRACE_SECONDS, REJOIN_GRACE_SECONDS
from service.store import Store, members_sql
from service.store.ports import Orphan
from service.store.sessions import ClaimOutcome, LockSessions, RunEnd, TickClaim
from tests.support.db import advisory_locks_on
from tests.support.fire import (
    Gates,
    add_job,
    finished_runs,
    lock_pool,
    running,
    runs_of,
    skipped,
    tick_now,
)


async def test_ledger_claims_each_tick_once(store: Store, sessions: LockSessions) -> None:
    job = await add_job(store, "ledger")
    tick = tick_now()

    def claim_of(job: Job, **kwargs: Any) -> TickClaim:
        return TickClaim(job, tick, RunTrigger.SCHEDULE, "r", uuid4(), False, **kwargs)

    async with sessions.session(5) as first, sessions.session(5) as second:
        [won] = await first.claim([claim_of(job)])
        [lost] = await second.claim([claim_of(job)])
    assert won.outcome is ClaimOutcome.CLAIMED
    assert won.run is not None
    assert won.run.scheduled_for == tick
    assert won.run.status is RunStatus.RUNNING
    assert lost.outcome is ClaimOutcome.ALREADY_RAN
    assert [r.id for r in await runs_of(store, "ledger")] == [won.run.id]


async def test_ledger_refuses_a_changed_or_deleted_job(
    store: Store, sessions: LockSessions
) -> None:
    job = await add_job(store, "changing")
    spec = job.spec().model_copy(update={"description": "edited"})
    await store.mutate_job(
        "changing", lambda cur: replace_job(cur, spec, datetime.now(UTC)) if cur else None
    )
    async with sessions.session(5) as session:
        [stale] = await session.claim(
            [TickClaim(job, tick_now(), RunTrigger.SCHEDULE, "r", uuid4(), False)]
        )
        await store.mutate_job("changing", lambda _: None)
        [gone] = await session.claim(
            [TickClaim(job, tick_now(), RunTrigger.SCHEDULE, "r", uuid4(), False)]
        )
    assert stale.outcome is ClaimOutcome.STALE
    assert gone.outcome is ClaimOutcome.JOB_GONE


def scheduled(jobs: list[Job], tick: datetime) -> list[TickClaim]:
    return [TickClaim(job, tick, RunTrigger.SCHEDULE, "r", uuid4(), True) for job in jobs]


async def test_ticks_due_together_are_claimed_once_and_leave_no_stray_lock(
    store: Store, sessions: LockSessions, database_url: str
) -> None:
    jobs = [await add_job(store, f"together-{index}") for index in range(5)]
    tick = tick_now()
    succeeded = RunEnd(RunStatus.SUCCEEDED, None, {"ok": True}, 1)
    async with sessions.session(5) as first, sessions.session(5) as second:
        won = await first.claim(scheduled(jobs, tick))
        lost = await second.claim(scheduled(jobs, tick))
        assert [c.outcome for c in won] == [ClaimOutcome.CLAIMED] * 5
        assert all(c.holds_lock for c in won)
        # The lock is held, but the ledger already has the tick: it ran, or runs.
        assert [c.outcome for c in lost] == [ClaimOutcome.ALREADY_RAN] * 5
        # Runs sharing a connection end at once: their ends go in one statement.
        ended = await asyncio.gather(
            *(
                first.finish(c.run.id, succeeded, j.lock_key)
                for c, j in zip(won, jobs, strict=True)
                if c.run
            )
        )
        assert [(run.status if run else None, released) for run, released in ended] == [
            (RunStatus.SUCCEEDED, True)
        ] * 5
        late = await second.claim(scheduled(jobs, tick))
    assert [c.outcome for c in late] == [ClaimOutcome.ALREADY_RAN] * 5
    assert not any(c.holds_lock for c in late)
    for job in jobs:
        assert await advisory_locks_on(database_url, job.lock_key) == 0
        [run] = await runs_of(store, job.name)
        assert (run.status, run.result) == (RunStatus.SUCCEEDED, {"ok": True})


async def test_ticks_due_together_refuse_changed_and_deleted_jobs(
    store: Store, sessions: LockSessions, database_url: str
) -> None:
    changed, gone, kept = [await add_job(store, name) for name in ("chg", "gone", "kept")]
    spec = changed.spec().model_copy(update={"description": "edited"})
    await store.mutate_job(
        "chg", lambda cur: replace_job(cur, spec, datetime.now(UTC)) if cur else None
    )
    await store.mutate_job("gone", lambda _: None)
    async with sessions.session(5) as session:
        claims = await session.claim(scheduled([changed, gone, kept], tick_now()))
        outcomes = [(c.outcome, c.holds_lock) for c in claims]
        assert outcomes == [
            (ClaimOutcome.STALE, False),
            (ClaimOutcome.JOB_GONE, False),
            (ClaimOutcome.CLAIMED, True),
        ]
        assert await advisory_locks_on(database_url, changed.lock_key) == 0
        assert await session.unlock(kept.lock_key)


async def test_a_crowd_of_due_ticks_shares_one_connection(
    runner: Runner, store: Store, gates: Gates, database_url: str
) -> None:
    jobs = [await add_job(store, f"crowd-{index:02d}") for index in range(20)]
    gates["default"].set()
    tick = tick_now()
    for job in jobs:
        runner.fire(job, tick, RunTrigger.SCHEDULE)
    for job in jobs:
        assert len(await finished_runs(store, job.name, 1)) == 1
    connection = await asyncpg.connect(database_url)
    try:
        sessions_used = await connection.fetchval(
            "SELECT count(DISTINCT backend_pid) FROM tickgate_runs WHERE job LIKE 'crowd-%'"
        )
    finally:
        await connection.close()
    assert sessions_used == 1


async def test_due_ticks_wait_for_room_under_the_in_flight_cap(
    store: Store, sessions: LockSessions, gates: Gates, metrics: Metrics
) -> None:
    jobs = [await add_job(store, f"capped-{index}") for index in range(5)]
    async with running(store, sessions, gates, metrics, room=2) as runner:
        tick = tick_now()
        for job in jobs:
            runner.fire(job, tick, RunTrigger.SCHEDULE)
        await eventually_async(lambda: len(gates.started) == 2, 30, "two runs to start")
        claimed = [run for job in jobs for run in await runs_of(store, job.name)]
        assert len(claimed) == 2  # the other three wait unclaimed, free for other replicas
        gates["default"].set()
        for job in jobs:
            assert len(await finished_runs(store, job.name, 1)) == 1


async def test_a_replica_whose_ticks_wait_past_half_a_takeover_is_behind(
    store: Store, sessions: LockSessions, gates: Gates, metrics: Metrics
) -> None:
    """`behind` (its audit then takes over no other replica's ticks) holds while a tick
    due more than half a takeover period ago still waits for room here, and no longer."""
    jobs = [await add_job(store, f"behind-{index}", misfire_grace_seconds=60) for index in range(2)]
    async with running(store, sessions, gates, metrics, room=1, takeover_seconds=2) as runner:
        assert not runner.behind
        tick = tick_now() - timedelta(seconds=5)
        for job in jobs:
            runner.fire(job, tick, RunTrigger.SCHEDULE)
        await eventually_async(lambda: len(gates.started) == 1, 30, "one run to start")
        assert runner.behind  # the other tick, due 5 s ago, waits for the room
        gates["default"].set()
        await eventually_async(lambda: not runner.behind, 30, "the waiting tick to start")
        for job in jobs:
            assert len(await finished_runs(store, job.name, 1)) == 1


async def test_a_run_holds_the_lock_until_it_ends(
    runner: Runner, store: Store, gates: Gates, database_url: str
) -> None:
    job = await add_job(store, "held")
    runner.fire(job, tick_now(), RunTrigger.SCHEDULE)
    await eventually_async(lambda: bool(gates.started), 30, "the task to start")
    assert await advisory_locks_on(database_url, job.lock_key) == 1
    assert [r.status for r in await runs_of(store, "held")] == [RunStatus.RUNNING]
    gates["default"].set()
    [run] = await finished_runs(store, "held", 1)
    assert run.status is RunStatus.SUCCEEDED
    assert run.result == {"gate": "default"}
    assert run.runner == "test-runner"
    assert run.finished_at is not None
    assert run.duration_ms is not None
    assert await advisory_locks_on(database_url, job.lock_key) == 0


async def test_a_foreign_lock_holder_costs_the_tick_as_a_recorded_misfire(
    runner: Runner, store: Store, gates: Gates, database_url: str, metrics: Metrics
) -> None:
    """A Go replica running the seed's LockedRun holds the same key and writes no ledger
    row: the tick is retried within its grace, then recorded as a misfire."""
    job = await add_job(store, "foreign", misfire_grace_seconds=1)
    go_replica = await asyncpg.connect(database_url)
    try:
        await go_replica.execute("SELECT pg_advisory_lock($1)", job.lock_key)
        tick = tick_now()
        runner.fire(job, tick, RunTrigger.SCHEDULE)
        await eventually_async(lambda: skipped(metrics, "misfire") == 1, 30, "a misfire")
        [skip] = await runs_of(store, "foreign")
        assert (skip.scheduled_for, skip.status, skip.skip_reason) == (
            tick,
            RunStatus.SKIPPED,
            SkipReason.MISFIRE,
        )
    finally:
        await go_replica.close()
    gates["default"].set()
    runner.fire(job, tick_now() + timedelta(seconds=1), RunTrigger.SCHEDULE)
    runs = await finished_runs(store, "foreign", 2)
    assert sorted(r.status for r in runs) == [RunStatus.SKIPPED, RunStatus.SUCCEEDED]


async def test_an_end_the_database_refuses_keeps_its_lock_and_fences_no_other_run(
    store: Store, gates: Gates, metrics: Metrics, database_url: str
) -> None:
    """#41: an end whose recording fails (here its hook delivery breaks a constraint)
    is recorded again, alone and then bare, while its job's lock stays held: the lock
    goes only once an end is recorded. Before, FINISH released it before writing the
    deliveries; the retry found it gone, and the whole session was dropped, fencing
    every other run on it (`cancelled: lock lost`)."""
    hook = {"on": ["success"], "action": {"kind": "http", "args": {"url": "http://127.0.0.1:9"}}}
    bystander = await add_job(store, "bystander", args={"gate": "long"})
    poisoned = await add_job(store, "poisoned", hooks=[hook])
    connection = await asyncpg.connect(database_url)
    try:
        await connection.execute(
            """ALTER TABLE tickgate_hook_deliveries
               ADD CONSTRAINT refused_here CHECK (job <> 'poisoned')"""
        )
    finally:
        await connection.close()
    gates["default"].set()
    async with lock_pool(database_url, 1) as one, running(store, one, gates, metrics) as runner:
        tick = tick_now()
        runner.fire(bystander, tick, RunTrigger.SCHEDULE)
        await eventually_async(lambda: gates.started == ["long"], 30, "the bystander to run")
        runner.fire(poisoned, tick, RunTrigger.SCHEDULE)
        [ended] = await finished_runs(store, "poisoned", 1)
        assert ended.status is RunStatus.SUCCEEDED
        assert "could not be stored" in (ended.error or "")

        async def released() -> bool:
            return await advisory_locks_on(database_url, poisoned.lock_key) == 0

        await eventually_async(released, 30, "the poisoned run's lock to go")
        assert await advisory_locks_on(database_url, bystander.lock_key) == 1
        gates["long"].set()
        [other] = await finished_runs(store, "bystander", 1)
    assert (other.status, other.error) == (RunStatus.SUCCEEDED, None)


async def test_skip_overlap_records_ticks_that_come_while_running(
    runner: Runner, store: Store, gates: Gates, metrics: Metrics
) -> None:
    job = await add_job(store, "skipper")
    first = tick_now()
    runner.fire(job, first, RunTrigger.SCHEDULE)
    await eventually_async(lambda: len(gates.started) == 1, 30, "the first run")
    runner.fire(job, first + timedelta(seconds=1), RunTrigger.SCHEDULE)
    await eventually_async(lambda: skipped(metrics, "overlap") == 1, 30, "an overlap skip")
    gates["default"].set()
    runs = {run.scheduled_for: run for run in await finished_runs(store, "skipper", 2)}
    assert runs[first].status is RunStatus.SUCCEEDED
    overlapped = runs[first + timedelta(seconds=1)]
    assert (overlapped.status, overlapped.skip_reason) == (RunStatus.SKIPPED, SkipReason.OVERLAP)
    assert len(gates.started) == 1


async def test_allow_overlap_runs_ticks_side_by_side(
    runner: Runner, store: Store, gates: Gates, database_url: str
) -> None:
    job = await add_job(store, "allower", overlap=Overlap.ALLOW)
    runner.fire(job, tick_now(), RunTrigger.SCHEDULE)
    runner.fire(job, tick_now() + timedelta(seconds=1), RunTrigger.SCHEDULE)
    await eventually_async(lambda: len(gates.started) == 2, 30, "two concurrent runs")
    assert await advisory_locks_on(database_url, job.lock_key) == 0
    gates["default"].set()
    assert len(await finished_runs(store, "allower", 2)) == 2


async def test_failures_and_timeouts_are_recorded(runner: Runner, store: Store) -> None:
    failing = await add_job(store, "failing", task="explode", args={"gate": "g1"})
    slow = await add_job(store, "slow", timeout_seconds=1)
    runner.fire(failing, tick_now(), RunTrigger.SCHEDULE)
    runner.fire(slow, tick_now(), RunTrigger.SCHEDULE)
    [failed] = await finished_runs(store, "failing", 1)
    assert failed.status is RunStatus.FAILED
    assert failed.error == "RuntimeError: boom at g1"
    [timed_out] = await finished_runs(store, "slow", 1)
    assert timed_out.status is RunStatus.TIMED_OUT
    assert "1s" in (timed_out.error or "")


async def test_late_tick_beyond_grace_is_recorded_as_a_misfire(
    runner: Runner, store: Store, metrics: Metrics
) -> None:
    job = await add_job(store, "late", misfire_grace_seconds=5)
    tick = tick_now() - timedelta(seconds=30)
    runner.fire(job, tick, RunTrigger.SCHEDULE)
    await eventually_async(lambda: skipped(metrics, "misfire") == 1, 30, "a misfire skip")
    [skip] = await runs_of(store, "late")
    assert (skip.scheduled_for, skip.skip_reason, skip.attempts) == (tick, SkipReason.MISFIRE, 0)


async def test_shutdown_cancels_after_grace_records_and_unlocks(
    runner: Runner, store: Store, gates: Gates, database_url: str
) -> None:
    job = await add_job(store, "stuck")
    runner.fire(job, tick_now(), RunTrigger.SCHEDULE)
    await eventually_async(lambda: bool(gates.started), 30, "the task to start")
    await runner.shutdown(grace_seconds=0.2)
    [run] = await runs_of(store, "stuck")
    assert run.status is RunStatus.CANCELLED
    assert await advisory_locks_on(database_url, job.lock_key) == 0
    runner.fire(job, tick_now() + timedelta(seconds=1), RunTrigger.SCHEDULE)
    await asyncio.sleep(0)  # nothing new may start once shutdown began
    assert len(await runs_of(store, "stuck")) == 1


async def test_shutdown_lets_runs_finish_within_grace(
    runner: Runner, store: Store, gates: Gates
) -> None:
    job = await add_job(store, "finisher")
    runner.fire(job, tick_now(), RunTrigger.SCHEDULE)
    await eventually_async(lambda: bool(gates.started), 30, "the task to start")
    asyncio.get_running_loop().call_later(0.2, gates["default"].set)
    await runner.shutdown(grace_seconds=30)
    [run] = await runs_of(store, "finisher")
    assert run.status is RunStatus.SUCCEEDED


async def test_one_time_job_completes_after_its_run(
    runner: Runner, store: Store, gates: Gates
) -> None:
    at = tick_now() + timedelta(seconds=1)
    job = await add_job(store, "once", schedule=OnceSchedule(kind="once", at=at))
    gates["default"].set()
    runner.fire(job, at, RunTrigger.SCHEDULE)
    await finished_runs(store, "once", 1)

    async def completed() -> bool:
        current = await store.get_job("once")
        return current is not None and current.state is JobState.COMPLETED

    await eventually_async(completed, 30, "the one-time job to complete")


async def test_http_task_sends_dedupe_headers_and_fails_on_bad_status(
    runner: Runner, store: Store
) -> None:
    with receiving() as receiver:
        receiver.respond("/broken", status=503)
        ok = await add_job(store, "hook", task="http", args={"url": f"{receiver.url}/ok"})
        bad = await add_job(store, "broken", task="http", args={"url": f"{receiver.url}/broken"})
        tick = tick_now()
        runner.fire(ok, tick, RunTrigger.SCHEDULE)
        runner.fire(bad, tick, RunTrigger.SCHEDULE)
        [good_run] = await finished_runs(store, "hook", 1)
        [bad_run] = await finished_runs(store, "broken", 1)
    [receipt] = receiver.receipts("hook")
    assert good_run.status is RunStatus.SUCCEEDED
    assert receipt.idempotency_key == receipt.run_id == str(good_run.id)
    assert receipt.scheduled_for == tick.strftime("%Y-%m-%dT%H:%M:%SZ")
    assert receipt.user_agent is not None
    assert receipt.user_agent.startswith("tickgate/")
    assert b'"run_id"' in receipt.body
    assert bad_run.status is RunStatus.FAILED
    assert "503" in (bad_run.error or "")


async def test_orphaned_runs_become_abandoned(store: Store, database_url: str) -> None:
    job = await add_job(store, "orphan")
    alive = await add_job(store, "alive")
    dead_runner = await asyncpg.connect(database_url)
    live_runner = await asyncpg.connect(database_url)
    insert = """INSERT INTO tickgate_runs (id, job, scheduled_for, trigger, status, started_at,
                runner, job_version, lock_key, locked, backend_pid)
                VALUES ($1, $2, now() - interval '1 minute', 'schedule', 'running',
                        now() - interval '1 minute', 'x', 1, $3, true, pg_backend_pid())"""
    try:
        await dead_runner.execute("SELECT pg_advisory_lock($1)", job.lock_key)
        await dead_runner.execute(insert, uuid4(), "orphan", job.lock_key)
        await live_runner.execute("SELECT pg_advisory_lock($1)", alive.lock_key)
        await live_runner.execute(insert, uuid4(), "alive", alive.lock_key)
    finally:
        await dead_runner.close()  # the replica dies: its session and lock go with it
    try:

        async def abandoned() -> bool:
            return [r.job for r in await store.abandon(await store.orphans(100))] == ["orphan"]

        await eventually_async(abandoned, 30, "the orphan to be abandoned")
        assert (await runs_of(store, "orphan"))[0].status is RunStatus.ABANDONED
        assert (await runs_of(store, "alive"))[0].status is RunStatus.RUNNING
    finally:
        await live_runner.close()


ZERO = timedelta(0)
# A `running` row of the job $1, as a replica long gone left it (found orphaned a minute
# ago), naming this connection's backend by its PID and a start $2 before its own (NULL:
# none, as rows written before migration 0026).
_REUSED_PID_ROW = """INSERT INTO tickgate_runs (id, job, scheduled_for, trigger, status,
        started_at, runner, job_version, lock_key, locked, backend_pid, backend_start,
        orphaned_at)
    SELECT gen_random_uuid(), j.name, now() - interval '1 minute', 'schedule', 'running',
        now() - interval '1 minute', 'gone', j.version, j.lock_key, true, a.pid,
        a.backend_start - $2::interval, now() - interval '1 minute'
    FROM tickgate_jobs j, pg_stat_activity a WHERE j.name = $1 AND a.pid = pg_backend_pid()"""


async def test_a_run_whose_backend_s_pid_went_to_a_new_backend_is_an_orphan(
    runner: Runner, store: Store, gates: Gates, database_url: str
) -> None:
    """#41, finding 6: a backend is its PID and its start. After a PostgreSQL restart in
    a new PID namespace, a new backend (here the test's connection) may get the PID of
    the one that held a run, its lock long gone. That run is an orphan all the same: it
    is resumed where its retry policy allows another attempt, and abandoned where not.
    A row that names the live backend by both, or by its PID alone (written before
    migration 0026), is that backend's: not an orphan."""
    await add_job(store, "retried", retry={"max_attempts": 3, "min_backoff_seconds": 1})
    await add_job(store, "single")
    await add_job(store, "alive")
    await add_job(store, "legacy")
    gates["default"].set()
    new_backend = await asyncpg.connect(database_url)
    try:
        earlier = {"retried": timedelta(hours=1), "single": timedelta(seconds=1), "alive": ZERO}
        for job, before in earlier.items():
            await new_backend.execute(_REUSED_PID_ROW, job, before)
        await new_backend.execute(_REUSED_PID_ROW, "legacy", None)
        await runner.orphans.sweep()
        [resumed] = await finished_runs(store, "retried", 1)
        assert (resumed.status, resumed.attempts, resumed.runner) == (
            RunStatus.SUCCEEDED,
            2,
            "test-runner",
        )
        [abandoned] = await finished_runs(store, "single", 1)
        assert abandoned.status is RunStatus.ABANDONED
        for job in ("alive", "legacy"):
            assert [run.status for run in await runs_of(store, job)] == [RunStatus.RUNNING]
        assert [o.run.job for o in await store.orphans(10)] == []
    finally:
        await new_backend.close()


async def test_a_row_moved_by_its_pid_alone_forgets_its_backend_s_start(
    store: Store, database_url: str
) -> None:
    """A replica of the release before 0026 (a rolling upgrade) resumes an orphan or
    backfills a skip by moving its row's PID alone: the row then names no start, and
    its backend is judged by the PID, never by a start that was another backend's."""
    await add_job(store, "moved")
    connection = await asyncpg.connect(database_url)
    try:
        await connection.execute(_REUSED_PID_ROW, "moved", ZERO)
        moved = """UPDATE tickgate_runs SET backend_pid = backend_pid + 1 WHERE job = 'moved'
            RETURNING backend_start"""
        assert await connection.fetchval(moved) is None
    finally:
        await connection.close()


async def test_a_live_replica_s_orphan_is_left_to_it_for_the_grace(
    store: Store, database_url: str
) -> None:
    """A run whose session died while its replica lives on (a restart, a cut link) is
    fenced there, and that replica records its end: the sweep finds the orphan, stamps
    when it first did, and leaves it alone until the grace has passed. A replica that
    is no member now gets a shorter grace to come back (a restart ends members'
    sessions too); then its orphan is due."""
    await add_job(store, "fenced-here")
    await add_job(store, "died-there")
    member = await asyncpg.connect(database_url)
    lost = await asyncpg.connect(database_url)
    insert = """INSERT INTO tickgate_runs (id, job, scheduled_for, trigger, status, started_at,
                runner, job_version, lock_key, locked, backend_pid)
                VALUES ($1, $2, now() - interval '1 minute', 'schedule', 'running',
                        now() - interval '1 minute', $3, 1, 0, false, pg_backend_pid())"""
    try:
        assert await member.fetchval(members_sql.JOIN, "alive", "test", "2025a", None) is not None
        await lost.execute(insert, uuid4(), "fenced-here", "alive")
        await lost.execute(insert, uuid4(), "died-there", "gone")
        await lost.close()  # the runs' session dies; runner "alive" lives on

        async def both() -> list[Orphan] | None:
            ours = {"fenced-here", "died-there"}  # the database may hold others' too
            found = [o for o in await store.orphans(10) if o.run.job in ours]
            return found if len(found) == 2 else None

        first = {o.run.job: o for o in await eventually_async(both, 30, "the two orphans")}
        assert (first["fenced-here"].runner_live, first["died-there"].runner_live) == (True, False)
        # Just found: each is left to its replica, live or maybe coming back.
        graces = (REJOIN_GRACE_SECONDS, ORPHAN_GRACE_SECONDS)
        assert first["fenced-here"].awaits_its_replica(*graces)
        assert first["died-there"].awaits_its_replica(*graces)
        await asyncio.sleep(1.1)
        later = {o.run.job: o for o in await store.orphans(10)}
        # One stamp, the first: the time since then grows.
        assert later["fenced-here"].orphaned_seconds >= first["fenced-here"].orphaned_seconds + 1
        # Past the rejoin grace only the dead replica's orphan is due.
        assert not later["died-there"].awaits_its_replica(1.0, ORPHAN_GRACE_SECONDS)
        assert later["fenced-here"].awaits_its_replica(1.0, ORPHAN_GRACE_SECONDS)
        assert not later["fenced-here"].awaits_its_replica(1.0, 1.0)
    finally:
        await member.close()


async def test_retention_keeps_newest_and_the_fence(store: Store, database_url: str) -> None:
    job = await add_job(store, "history", misfire_grace_seconds=60)
    connection = await asyncpg.connect(database_url)
    try:
        await connection.execute(
            """INSERT INTO tickgate_runs (id, job, scheduled_for, trigger, status, started_at,
                   runner, job_version, lock_key, locked, backend_pid)
               SELECT gen_random_uuid(), 'history', now() - make_interval(mins => n, secs => 30),
                   'schedule', 'succeeded', now(), 'x', 1, $1, true, 0
               FROM generate_series(1, 12) AS n""",
            job.lock_key,
        )
    finally:
        await connection.close()
    # Keep 3; but the runs 1.5..5.5 minutes old are younger than grace + 5 minutes:
    # they still fence late replicas and stay. The 7 from 6.5 minutes on go.
    assert await store.prune_runs(keep=3) == 7
    remaining = sorted(r.scheduled_for for r in await runs_of(store, "history"))
    assert len(remaining) == 5
    assert datetime.now(UTC) - remaining[0] < timedelta(minutes=7)
