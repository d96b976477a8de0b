"""The fire path on real PostgreSQL: lock gate, ledger gate, run, record, unlock."""

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import uuid4

import asyncpg
import httpx
import pytest
from pydantic import BaseModel, JsonValue

from service.domain.jobs import Job, JobSpec, JobState, Overlap, create_job, replace_job
from service.domain.runs import Run, RunStatus, RunTrigger
from service.domain.schedules import CronSchedule, OnceSchedule
from service.metrics import Metrics
from service.scheduler import Runner
from service.store import Store
from service.store.sessions import ClaimOutcome, RunEnd, RunSessions, TickClaim
from service.store.targets import SqlTargetConnections
from service.tasks import TaskContext, TaskDefinition, builtin_registry
from tests.support.db import advisory_locks_on
from tests.support.receiver import receiving
from tests.support.waiting import eventually

EVERY_SECOND = CronSchedule(kind="cron", expression="* * * * * *")


class GateArgs(BaseModel):
    gate: str = "default"


@dataclass
class Gates:
    """Test tasks block on these until the test opens them."""

    events: dict[str, asyncio.Event] = field(default_factory=dict)
    started: list[str] = field(default_factory=list)

    def __getitem__(self, name: str) -> asyncio.Event:
        return self.events.setdefault(name, asyncio.Event())

    async def wait(self, args: GateArgs, context: TaskContext) -> JsonValue:
        self.started.append(args.gate)
        await self[args.gate].wait()
        return {"gate": args.gate}


async def explode(args: GateArgs, context: TaskContext) -> JsonValue:
    raise RuntimeError(f"boom at {args.gate}")


@pytest.fixture
async def sessions(database_url: str) -> AsyncIterator[RunSessions]:
    pool = await RunSessions.open(database_url, size=8)
    try:
        yield pool
    finally:
        await pool.close()


@pytest.fixture
def gates() -> Gates:
    return Gates()


@pytest.fixture
def metrics() -> Metrics:
    return Metrics()


def skipped(metrics: Metrics, reason: str) -> float:
    value = metrics.registry.get_sample_value("tickgate_ticks_skipped_total", {"reason": reason})
    return value or 0.0


@pytest.fixture
async def runner(
    store: Store, sessions: RunSessions, gates: Gates, metrics: Metrics
) -> AsyncIterator[Runner]:
    async with running(store, sessions, gates, metrics) as runner:
        yield runner


@asynccontextmanager
async def running(
    store: Store, sessions: RunSessions, gates: Gates, metrics: Metrics, max_in_flight: int = 32
) -> AsyncIterator[Runner]:
    registry = builtin_registry(http_allow="127.0.0.1")
    registry.register(TaskDefinition("wait", "blocks on a gate", GateArgs, gates.wait))
    registry.register(TaskDefinition("explode", "always fails", GateArgs, explode))
    async with httpx.AsyncClient() as http:
        runner = Runner(
            sessions=sessions,
            store=store,
            tasks=registry,
            http=http,
            runner_id="test-runner",
            metrics=metrics,
            sql=SqlTargetConnections({}),
            max_in_flight=max_in_flight,
        )
        yield runner
        await runner.shutdown(grace_seconds=0)
        await registry.aclose()


async def add_job(store: Store, name: str, **spec: Any) -> Job:
    fields: dict[str, Any] = {"schedule": EVERY_SECOND, "task": "wait", "args": {}} | spec
    now = datetime.now(UTC) - timedelta(hours=1)
    change = await store.mutate_job(name, lambda _: create_job(name, JobSpec(**fields), now))
    assert change.after is not None
    return change.after


async def runs_of(store: Store, job: str) -> list[Run]:
    return await store.list_runs(job, 100, None, None)


async def finished_runs(store: Store, job: str, count: int) -> list[Run]:
    async def done() -> bool:
        runs = await runs_of(store, job)
        return len(runs) >= count and all(r.status is not RunStatus.RUNNING for r in runs)

    await eventually(done, 30, f"{count} finished runs of {job}")
    return await runs_of(store, job)


def tick_now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)


async def test_ledger_claims_each_tick_once(store: Store, sessions: RunSessions) -> None:
    job = await add_job(store, "ledger")
    tick = tick_now()

    def claim_of(job: Job, **kwargs: Any) -> TickClaim:
        return TickClaim(job, tick, RunTrigger.SCHEDULE, "r", uuid4(), False, **kwargs)

    async with sessions.session() as first, sessions.session() as second:
        won = await first.claim(claim_of(job))
        lost = await second.claim(claim_of(job))
    assert won.outcome is ClaimOutcome.CLAIMED
    assert won.run is not None
    assert won.run.scheduled_for == tick
    assert won.run.status is RunStatus.RUNNING
    assert lost.outcome is ClaimOutcome.ALREADY_RAN
    assert [r.id for r in await runs_of(store, "ledger")] == [won.run.id]


async def test_ledger_refuses_a_changed_or_deleted_job(store: Store, sessions: RunSessions) -> None:
    job = await add_job(store, "changing")
    spec = job.spec().model_copy(update={"description": "edited"})
    await store.mutate_job(
        "changing", lambda cur: replace_job(cur, spec, datetime.now(UTC)) if cur else None
    )
    async with sessions.session() as session:
        stale = await session.claim(
            TickClaim(job, tick_now(), RunTrigger.SCHEDULE, "r", uuid4(), False)
        )
        await store.mutate_job("changing", lambda _: None)
        gone = await session.claim(
            TickClaim(job, tick_now(), RunTrigger.SCHEDULE, "r", uuid4(), False)
        )
    assert stale.outcome is ClaimOutcome.JOB_CHANGED
    assert gone.outcome is ClaimOutcome.JOB_GONE


def scheduled(jobs: list[Job], tick: datetime) -> list[TickClaim]:
    return [TickClaim(job, tick, RunTrigger.SCHEDULE, "r", uuid4(), True) for job in jobs]


async def test_ticks_due_together_are_claimed_once_and_leave_no_stray_lock(
    store: Store, sessions: RunSessions, database_url: str
) -> None:
    jobs = [await add_job(store, f"together-{index}") for index in range(5)]
    tick = tick_now()
    succeeded = RunEnd(RunStatus.SUCCEEDED, None, {"ok": True}, 1)
    async with sessions.session() as first, sessions.session() as second:
        won = await first.claim_together(scheduled(jobs, tick))
        lost = await second.claim_together(scheduled(jobs, tick))
        assert [c.outcome for c in won] == [ClaimOutcome.CLAIMED] * 5
        assert all(c.holds_lock for c in won)
        assert [c.outcome for c in lost] == [ClaimOutcome.LOCKED] * 5
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
        late = await second.claim_together(scheduled(jobs, tick))
    assert [c.outcome for c in late] == [ClaimOutcome.ALREADY_RAN] * 5
    assert not any(c.holds_lock for c in late)
    for job in jobs:
        assert await advisory_locks_on(database_url, job.lock_key) == 0
        [run] = await runs_of(store, job.name)
        assert (run.status, run.result) == (RunStatus.SUCCEEDED, {"ok": True})


async def test_ticks_due_together_refuse_changed_and_deleted_jobs(
    store: Store, sessions: RunSessions, database_url: str
) -> None:
    changed, gone, kept = [await add_job(store, name) for name in ("chg", "gone", "kept")]
    spec = changed.spec().model_copy(update={"description": "edited"})
    await store.mutate_job(
        "chg", lambda cur: replace_job(cur, spec, datetime.now(UTC)) if cur else None
    )
    await store.mutate_job("gone", lambda _: None)
    async with sessions.session() as session:
        claims = await session.claim_together(scheduled([changed, gone, kept], tick_now()))
        outcomes = [(c.outcome, c.holds_lock) for c in claims]
        assert outcomes == [
            (ClaimOutcome.JOB_CHANGED, False),
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
    store: Store, sessions: RunSessions, gates: Gates, metrics: Metrics
) -> None:
    jobs = [await add_job(store, f"capped-{index}") for index in range(5)]
    async with running(store, sessions, gates, metrics, max_in_flight=2) as runner:
        tick = tick_now()
        for job in jobs:
            runner.fire(job, tick, RunTrigger.SCHEDULE)
        await eventually(lambda: len(gates.started) == 2, 30, "two runs to start")
        claimed = [run for job in jobs for run in await runs_of(store, job.name)]
        assert len(claimed) == 2  # the other three wait unclaimed, free for other replicas
        gates["default"].set()
        for job in jobs:
            assert len(await finished_runs(store, job.name, 1)) == 1


async def test_a_run_holds_the_lock_until_it_ends(
    runner: Runner, store: Store, gates: Gates, database_url: str
) -> None:
    job = await add_job(store, "held")
    runner.fire(job, tick_now(), RunTrigger.SCHEDULE)
    await eventually(lambda: bool(gates.started), 30, "the task to start")
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


async def test_foreign_lock_holder_stops_the_job(
    runner: Runner, store: Store, gates: Gates, database_url: str, metrics: Metrics
) -> None:
    """A Go replica running the seed's LockedRun holds the same key: we skip."""
    job = await add_job(store, "foreign")
    go_replica = await asyncpg.connect(database_url)
    try:
        await go_replica.execute("SELECT pg_advisory_lock($1)", job.lock_key)
        runner.fire(job, tick_now(), RunTrigger.SCHEDULE)
        await eventually(lambda: skipped(metrics, "locked") == 1, 30, "a locked skip")
        assert await runs_of(store, "foreign") == []
    finally:
        await go_replica.close()
    gates["default"].set()
    runner.fire(job, tick_now() + timedelta(seconds=1), RunTrigger.SCHEDULE)
    assert len(await finished_runs(store, "foreign", 1)) == 1


async def test_skip_overlap_drops_ticks_while_running(
    runner: Runner, store: Store, gates: Gates, metrics: Metrics
) -> None:
    job = await add_job(store, "skipper")
    runner.fire(job, tick_now(), RunTrigger.SCHEDULE)
    await eventually(lambda: len(gates.started) == 1, 30, "the first run")
    runner.fire(job, tick_now() + timedelta(seconds=1), RunTrigger.SCHEDULE)
    await eventually(lambda: skipped(metrics, "overlap") == 1, 30, "an overlap skip")
    gates["default"].set()
    assert len(await finished_runs(store, "skipper", 1)) == 1


async def test_allow_overlap_runs_ticks_side_by_side(
    runner: Runner, store: Store, gates: Gates, database_url: str
) -> None:
    job = await add_job(store, "allower", overlap=Overlap.ALLOW)
    runner.fire(job, tick_now(), RunTrigger.SCHEDULE)
    runner.fire(job, tick_now() + timedelta(seconds=1), RunTrigger.SCHEDULE)
    await eventually(lambda: len(gates.started) == 2, 30, "two concurrent runs")
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


async def test_late_tick_beyond_grace_is_dropped(
    runner: Runner, store: Store, metrics: Metrics
) -> None:
    job = await add_job(store, "late", misfire_grace_seconds=5)
    runner.fire(job, tick_now() - timedelta(seconds=30), RunTrigger.SCHEDULE)
    await eventually(lambda: skipped(metrics, "misfire") == 1, 30, "a misfire skip")
    assert await runs_of(store, "late") == []


async def test_shutdown_cancels_after_grace_records_and_unlocks(
    runner: Runner, store: Store, gates: Gates, database_url: str
) -> None:
    job = await add_job(store, "stuck")
    runner.fire(job, tick_now(), RunTrigger.SCHEDULE)
    await eventually(lambda: bool(gates.started), 30, "the task to start")
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
    await eventually(lambda: bool(gates.started), 30, "the task to start")
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

    await eventually(completed, 30, "the one-time job to complete")


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
            return [r.job for r in await store.abandon_orphans()] == ["orphan"]

        await eventually(abandoned, 30, "the orphan to be abandoned")
        assert (await runs_of(store, "orphan"))[0].status is RunStatus.ABANDONED
        assert (await runs_of(store, "alive"))[0].status is RunStatus.RUNNING
    finally:
        await live_runner.close()


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
