"""Plug-in tasks that do not stop when told: the run is still recorded and its lock
released within a bound, and a task that does stop, slowly, is waited for."""

import asyncio
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import pytest
from pydantic import BaseModel, JsonValue

from service.domain.runs import RunStatus, RunTrigger
from service.metrics import Metrics
from service.scheduler import Runner
from service.scheduler.attempts import LEFT_RUNNING, STOP_GRACE_SECONDS
from service.store import Store
from service.store.sessions import LockSessions
from service.tasks import TaskDefinition
from tests.support.db import advisory_locks_on
from tests.support.fire import Gates, add_job, finished_runs, running, tick_now

# Everything below ends within the task's timeout plus STOP_GRACE_SECONDS; a loaded box
# gets this much more before a test calls it a hang.
SLACK_SECONDS = 30.0


class NoArgs(BaseModel):
    pass


@dataclass
class Stubborn:
    """Swallows every cancellation until the test lets it go."""

    released: asyncio.Event = field(default_factory=asyncio.Event)
    started: asyncio.Event = field(default_factory=asyncio.Event)
    ignored: int = 0

    async def run(self, args: NoArgs, context: object) -> JsonValue:
        self.started.set()
        while not self.released.is_set():
            try:
                await asyncio.sleep(0.05)
            except asyncio.CancelledError:
                self.ignored += 1
        return None


@dataclass
class SlowToStop:
    """Stops when cancelled, after a second of cleaning up."""

    started: asyncio.Event = field(default_factory=asyncio.Event)
    stopped_at: float | None = None

    async def run(self, args: NoArgs, context: object) -> JsonValue:
        self.started.set()
        try:
            await asyncio.sleep(3600)
        finally:
            await asyncio.sleep(1)
            self.stopped_at = time.time()
        return None


@pytest.fixture
async def stubborn() -> AsyncIterator[Stubborn]:
    task = Stubborn()
    yield task
    task.released.set()  # let it end before the test's event loop closes
    await asyncio.sleep(0.2)


@pytest.fixture
async def stubborn_runner(
    store: Store, sessions: LockSessions, gates: Gates, metrics: Metrics, stubborn: Stubborn
) -> AsyncIterator[Runner]:
    definition = TaskDefinition("stubborn", "ignores cancellation", NoArgs, stubborn.run)
    async with running(store, sessions, gates, metrics, tasks=[definition]) as runner:
        yield runner


async def test_a_timed_out_task_that_ignores_cancellation_does_not_pin_its_lock(
    stubborn_runner: Runner, stubborn: Stubborn, store: Store, database_url: str
) -> None:
    job = await add_job(store, "stubborn", task="stubborn", timeout_seconds=1)
    stubborn_runner.fire(job, tick_now(), RunTrigger.SCHEDULE)
    [run] = await finished_runs(store, "stubborn", 1)
    assert run.status is RunStatus.TIMED_OUT
    assert LEFT_RUNNING in (run.error or "")
    assert stubborn.ignored >= 1
    assert not stubborn.released.is_set(), "the task still runs, left behind"
    assert await advisory_locks_on(database_url, job.lock_key) == 0


async def test_shutdown_is_bounded_by_a_task_that_ignores_cancellation(
    stubborn_runner: Runner, stubborn: Stubborn, store: Store, database_url: str
) -> None:
    job = await add_job(store, "stubborn-at-shutdown", task="stubborn", timeout_seconds=3600)
    stubborn_runner.fire(job, tick_now(), RunTrigger.SCHEDULE)
    await asyncio.wait_for(stubborn.started.wait(), SLACK_SECONDS)
    async with asyncio.timeout(STOP_GRACE_SECONDS + SLACK_SECONDS):
        await stubborn_runner.shutdown(grace_seconds=0.2)
    [run] = await finished_runs(store, "stubborn-at-shutdown", 1)
    assert run.status is RunStatus.CANCELLED
    assert await advisory_locks_on(database_url, job.lock_key) == 0


async def test_shutdown_records_a_cancelled_run_once_its_task_has_stopped(
    store: Store, sessions: LockSessions, gates: Gates, metrics: Metrics
) -> None:
    slow = SlowToStop()
    definition = TaskDefinition("slow-to-stop", "cleans up for a second", NoArgs, slow.run)
    async with running(store, sessions, gates, metrics, tasks=[definition]) as runner:
        job = await add_job(store, "slow-to-stop", task="slow-to-stop", timeout_seconds=3600)
        runner.fire(job, tick_now(), RunTrigger.SCHEDULE)
        await asyncio.wait_for(slow.started.wait(), SLACK_SECONDS)
        await runner.shutdown(grace_seconds=0.2)
        [run] = await finished_runs(store, "slow-to-stop", 1)
    assert run.status is RunStatus.CANCELLED
    assert slow.stopped_at is not None, "shutdown returned before the task stopped"
    assert run.finished_at is not None
    assert run.finished_at.timestamp() >= slow.stopped_at - 0.05
