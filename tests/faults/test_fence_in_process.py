"""The lock-lost fence and the skewed clock, in process on real PostgreSQL.

A run's pinned session is killed from another session (`pg_terminate_backend`, what a
database restart or a cut link does to it): the run is cancelled at once and recorded
`cancelled` through the API pool, its lock is gone, and the pool never hands out the dead
connection again. If the database cannot take the record, the run is left to the orphan
sweep, which marks it `abandoned`.
"""

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from uuid import UUID

import asyncpg
import httpx
import pytest
from pydantic import BaseModel, JsonValue

from harness.waiting import eventually_async
from service.domain.jobs import Job, JobSpec, create_job
from service.domain.runs import Run, RunStatus
from service.domain.schedules import CronSchedule
from service.metrics import Metrics
from service.scheduler import Runner
from service.scheduler import running as running_module
from service.store import Store
from service.store.sessions import LockSessions, RunEnd
from service.store.targets import SqlTargetConnections
from service.tasks import TaskContext, TaskDefinition, builtin_registry
from tests.faults.figures import FaultFigures, record
from tests.support.db import advisory_locks_on

YEARLY = CronSchedule(kind="cron", expression="0 0 1 1 *")
EVERY_SECOND = CronSchedule(kind="cron", expression="* * * * * *")
LOCK_LOST = "lock lost: the connection holding the job's lock closed"


class NoArgs(BaseModel):
    pass


@dataclass
class Blocker:
    """A task that blocks until released, noting whether it was cancelled."""

    started: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)
    cancelled: int = 0

    async def run(self, args: NoArgs, context: TaskContext) -> JsonValue:
        self.started.set()
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled += 1
            raise
        return "done"


class UnreachableRecords(Store):
    """A store whose records of a run's end never reach the database."""

    async def finish_run(self, run_id: UUID, end: RunEnd, backend: int) -> Run | None:
        raise ConnectionRefusedError("the database is away")


@pytest.fixture
def blocker() -> Blocker:
    return Blocker()


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient() as client:
        yield client


@pytest.fixture
async def sessions(database_url: str) -> AsyncIterator[LockSessions]:
    pool = await LockSessions.open(database_url, size=2)
    try:
        yield pool
    finally:
        await pool.close()


def make_runner(
    store: Store, sessions: LockSessions, blocker: Blocker, http: httpx.AsyncClient
) -> Runner:
    registry = builtin_registry()
    registry.register(TaskDefinition("block", "blocks until released", NoArgs, blocker.run))
    return Runner(
        sessions=sessions,
        side_sessions=sessions,
        store=store,
        tasks=registry,
        http=http,
        runner_id="fenced-runner",
        metrics=Metrics(),
        sql=SqlTargetConnections({}),
    )


async def add_job(store: Store, name: str) -> Job:
    spec = JobSpec(schedule=YEARLY, task="block", args={})
    created = create_job(name, spec, datetime.now(UTC) - timedelta(hours=1))
    change = await store.mutate_job(name, lambda _: created)
    assert change.after is not None
    return change.after


async def kill_session_of(database_url: str, run_id: UUID) -> int:
    """Terminate the backend holding the run, as a restart or a cut link would."""
    admin = await asyncpg.connect(database_url)
    try:
        pid: int = await admin.fetchval(
            "SELECT backend_pid FROM tickgate_runs WHERE id = $1", run_id
        )
        assert await admin.fetchval("SELECT pg_terminate_backend($1)", pid)
        return pid
    finally:
        await admin.close()


async def status_of(store: Store, run_id: UUID) -> RunStatus | None:
    run = await store.get_run(run_id)
    return run.status if run else None


async def test_a_run_whose_session_dies_is_cancelled_and_recorded(
    store: Store,
    sessions: LockSessions,
    blocker: Blocker,
    http: httpx.AsyncClient,
    database_url: str,
) -> None:
    figures = FaultFigures(
        "fence_in_process",
        "Lock-lost fence (in process)",
        "pg_terminate_backend of a running run's pinned session",
        faults_injected=1,
    )
    runner = make_runner(store, sessions, blocker, http)
    job = await add_job(store, "fenced")
    run = await runner.on_demand.trigger_now(job)
    await asyncio.wait_for(blocker.started.wait(), 10)
    assert await advisory_locks_on(database_url, job.lock_key) == 1

    dead_pid = await kill_session_of(database_url, run.id)
    await eventually_async(_is(store, run.id, RunStatus.CANCELLED), 10, "the run to be cancelled")
    fenced = await store.get_run(run.id)
    assert fenced is not None
    assert (fenced.status, fenced.error) == (RunStatus.CANCELLED, LOCK_LOST)
    assert blocker.cancelled == 1, "the task went on after its lock was lost"
    assert runner.runs_in_flight == 0
    assert await advisory_locks_on(database_url, job.lock_key) == 0

    # The dead connection is never handed out again: the next runs get live sessions.
    blocker.release.set()
    for _ in range(3):
        again = await runner.on_demand.trigger_now(job)
        await eventually_async(_is(store, again.id, RunStatus.SUCCEEDED), 10, "next run")
        reran = await store.get_run(again.id)
        assert reran is not None
        assert reran.error is None
    pids = await _backend_pids(database_url, job.name)
    assert dead_pid not in pids[1:], pids
    await runner.shutdown(grace_seconds=0)
    figures.notes = {"fenced_run": fenced.status.value}
    record(figures)


async def test_a_fenced_run_the_database_cannot_record_is_left_to_the_orphan_sweep(
    store: Store,
    sessions: LockSessions,
    blocker: Blocker,
    http: httpx.AsyncClient,
    database_url: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(running_module, "RECORD_ELSEWHERE_SECONDS", 0.5)
    unreachable = await UnreachableRecords.open(database_url, max_size=2)
    runner = make_runner(unreachable, sessions, blocker, http)
    job = await add_job(store, "unrecorded")
    run = await runner.on_demand.trigger_now(job)
    await asyncio.wait_for(blocker.started.wait(), 10)
    await kill_session_of(database_url, run.id)
    await eventually_async(lambda: runner.runs_in_flight == 0, 10, "the run to stop")
    await asyncio.sleep(1.0)  # the bounded retry gives up
    assert await status_of(store, run.id) is RunStatus.RUNNING
    assert blocker.cancelled == 1

    async def swept() -> bool:
        return run.id in {orphan.id for orphan in await store.abandon(await store.orphans(100))}

    await eventually_async(swept, 10, "the orphan sweep to take the run")
    assert await status_of(store, run.id) is RunStatus.ABANDONED
    await runner.shutdown(grace_seconds=0)
    await unreachable.close()


def _is(store: Store, run_id: UUID, status: RunStatus) -> Callable[[], Awaitable[bool]]:
    """A condition: the run has `status`."""

    async def holds() -> bool:
        return await status_of(store, run_id) is status

    return holds


async def _backend_pids(database_url: str, job: str) -> list[int]:
    connection = await asyncpg.connect(database_url)
    try:
        rows = await connection.fetch(
            "SELECT backend_pid FROM tickgate_runs WHERE job = $1 ORDER BY started_at", job
        )
        return [row["backend_pid"] for row in rows]
    finally:
        await connection.close()
