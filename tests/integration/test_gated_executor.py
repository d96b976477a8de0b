"""`GatedExecutor` in one process on a real PostgreSQL, handed run times directly (as
APScheduler hands them): a misfire, an overlap across two schedulers (two processes, as
far as the lock and the ledger can tell), a failure, and what each leaves in the ledger
and tells APScheduler's listeners."""

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from uuid import uuid4

import asyncpg
import pytest
from apscheduler.events import (
    EVENT_JOB_ERROR,
    EVENT_JOB_EXECUTED,
    EVENT_JOB_MISSED,
    JobExecutionEvent,
)
from apscheduler.schedulers.asyncio import AsyncIOScheduler
from prometheus_client import CollectorRegistry

from harness.postgres import with_database
from harness.waiting import eventually_async
from service.domain.names import lock_key
from tests.support.db import TemplateDatabases, advisory_lock_holders
from tickgate.apscheduler import GatedExecutor, current_run

LEDGER = """SELECT extract(epoch FROM scheduled_for)::bigint AS tick, status, skip_reason,
    error, runner FROM tickgate_runs WHERE job = $1 ORDER BY scheduled_for"""


class App:
    """One scheduler with the gate, as one process of an app has it."""

    def __init__(self, database_url: str, runner: str, *, migrate: bool = False) -> None:
        self.registry = CollectorRegistry()
        executor = GatedExecutor(
            database_url, runner=runner, migrate=migrate, registry=self.registry
        )
        self.scheduler = AsyncIOScheduler(executors={"default": executor}, timezone="UTC")
        self.events: list[JobExecutionEvent] = []
        self.scheduler.add_listener(
            self.events.append, EVENT_JOB_MISSED | EVENT_JOB_EXECUTED | EVENT_JOB_ERROR
        )

    def submit(self, job_id: str, *run_times: datetime) -> None:
        """Hand the executor these run times of the job, as the scheduler's loop does."""
        job = self.scheduler.get_job(job_id)
        self.scheduler._lookup_executor("default").submit_job(job, list(run_times))

    def sample(self, name: str, **labels: str) -> float | None:
        return self.registry.get_sample_value(name, labels)


@pytest.fixture
async def apps(database_url: str) -> AsyncIterator[list[App]]:
    made = [App(database_url, f"app:test:{n}") for n in range(2)]
    try:
        yield made
    finally:
        for app in made:
            if app.scheduler.running:
                app.scheduler.shutdown(wait=False)
        await asyncio.sleep(0.1)  # the executors' pools close on the loop


async def ledger(database_url: str, job: str) -> list[tuple[object, ...]]:
    connection = await asyncpg.connect(database_url)
    try:
        return [tuple(row) for row in await connection.fetch(LEDGER, job)]
    finally:
        await connection.close()


def whole_second(seconds_ago: float) -> datetime:
    return (datetime.now(UTC) - timedelta(seconds=seconds_ago)).replace(microsecond=0)


async def test_a_run_time_past_its_grace_is_recorded_missed_and_not_run(
    apps: list[App], database_url: str
) -> None:
    ran: list[object] = []

    async def job() -> None:
        ran.append(current_run())

    app = apps[0]
    app.scheduler.add_job(job, "cron", second="*", id="late", misfire_grace_time=5)
    app.scheduler.start(paused=True)
    late, on_time = whole_second(30), whole_second(0)
    app.submit("late", late, on_time)
    await eventually_async(lambda: len(app.events) == 2, 30, "both run times to end")
    assert [e.code for e in app.events] == [EVENT_JOB_MISSED, EVENT_JOB_EXECUTED]
    assert await ledger(database_url, "late") == [
        (
            int(late.timestamp()),
            "skipped",
            "misfire",
            "no process started it within misfire_grace_time",
            "app:test:0",
        ),
        (int(on_time.timestamp()), "succeeded", None, None, "app:test:0"),
    ]
    [run] = ran
    assert run is not None
    assert (run.job, run.scheduled_for) == ("late", on_time)
    assert app.sample("tickgate_runs_total", job="late", status="succeeded") == 1.0


async def test_a_tick_behind_a_run_in_another_process_is_an_overlap(
    apps: list[App], database_url: str
) -> None:
    """max_instances=1 holds the job's lock for the run: the next tick, handed to another
    process while the first runs, is recorded `skipped` (`overlap`), and runs nowhere."""
    entered, leave = asyncio.Event(), asyncio.Event()
    calls = 0

    async def job() -> None:
        nonlocal calls
        calls += 1
        entered.set()
        await leave.wait()

    for app in apps:
        app.scheduler.add_job(job, "cron", second="*", id="long", misfire_grace_time=60)
        app.scheduler.start(paused=True)
    first, second = whole_second(2), whole_second(1)
    apps[0].submit("long", first)
    await entered.wait()
    apps[1].submit("long", second)
    await eventually_async(
        lambda: _has_overlap(database_url), 30, "the second tick's overlap to be recorded"
    )
    leave.set()
    await eventually_async(lambda: apps[0].events, 30, "the first run to end")
    assert calls == 1
    assert [row[:3] for row in await ledger(database_url, "long")] == [
        (int(first.timestamp()), "succeeded", None),
        (int(second.timestamp()), "skipped", "overlap"),
    ]
    assert apps[1].events == []  # nothing ran there: no event to tell of


async def test_a_failure_is_recorded_and_told_to_the_listeners(
    apps: list[App], database_url: str
) -> None:
    async def job() -> None:
        raise ValueError("no such report")

    app = apps[0]
    app.scheduler.add_job(job, "cron", second="*", id="broken", misfire_grace_time=60)
    app.scheduler.start(paused=True)
    tick = whole_second(0)
    app.submit("broken", tick)
    await eventually_async(lambda: app.events, 30, "the run to end")
    [event] = app.events
    assert event.code == EVENT_JOB_ERROR
    assert isinstance(event.exception, ValueError)
    assert await ledger(database_url, "broken") == [
        (int(tick.timestamp()), "failed", None, "ValueError: no such report", "app:test:0")
    ]
    assert app.sample("tickgate_runs_total", job="broken", status="failed") == 1.0
    assert app.sample("tickgate_job_last_success_timestamp_seconds", job="broken") is None


async def _has_overlap(database_url: str) -> bool:
    return any(row[2] == "overlap" for row in await ledger(database_url, "long"))


async def test_the_gate_makes_tickgates_tables_in_an_empty_database(
    templates: TemplateDatabases,
) -> None:
    """No Tickgate server needed: the first run migrates a database of the app's own."""
    name = f"tickgate_empty_{uuid4().hex[:12]}"
    connection = await asyncpg.connect(templates.server_url)
    try:
        await connection.execute(f'CREATE DATABASE "{name}"')
    finally:
        await connection.close()
    url = with_database(templates.server_url, name)
    app = App(url, "app:fresh", migrate=True)
    try:

        async def job() -> None:
            return None

        app.scheduler.add_job(job, "cron", second="*", id="fresh", misfire_grace_time=60)
        app.scheduler.start(paused=True)
        tick = whole_second(0)
        app.submit("fresh", tick)
        await eventually_async(lambda: app.events, 60, "the first run to end")
        assert [row[:2] for row in await ledger(url, "fresh")] == [
            (int(tick.timestamp()), "succeeded")
        ]
    finally:
        app.scheduler.shutdown(wait=False)
        await asyncio.sleep(0.1)
        await templates.drop(name)


async def test_a_shutdown_mid_run_records_it_cancelled_and_frees_its_lock(
    apps: list[App], database_url: str
) -> None:
    """AsyncIOScheduler shuts down on its own loop: the executor cancels the run there
    (waiting would block the loop the run needs); the run still records its end and
    releases the job's lock, so another process may run the job's next tick."""
    entered = asyncio.Event()

    async def job() -> None:
        entered.set()
        await asyncio.sleep(60)

    app = apps[0]
    app.scheduler.add_job(job, "cron", second="*", id="cut", misfire_grace_time=60)
    app.scheduler.start(paused=True)
    tick = whole_second(0)
    app.submit("cut", tick)
    await entered.wait()
    app.scheduler.shutdown()  # wait=True, APScheduler's default

    async def ended() -> bool:
        rows = await ledger(database_url, "cut")
        holders = await advisory_lock_holders(database_url, lock_key("cut"))
        return rows[0][1] == "cancelled" and not holders

    await eventually_async(ended, 30, "the run to end cancelled, its lock freed")


async def test_max_instances_above_one_lets_runs_of_two_ticks_overlap(
    apps: list[App], database_url: str
) -> None:
    """The lock is then not held over the run: another process runs the next tick while
    the first still runs; each tick still runs once (the ledger decides)."""
    entered, leave = asyncio.Semaphore(0), asyncio.Event()
    calls = 0

    async def job() -> None:
        nonlocal calls
        calls += 1
        entered.release()
        await leave.wait()

    for app in apps:
        app.scheduler.add_job(
            job, "cron", second="*", id="wide", misfire_grace_time=60, max_instances=3
        )
        app.scheduler.start(paused=True)
    first, second = whole_second(2), whole_second(1)
    apps[0].submit("wide", first)
    apps[1].submit("wide", second)
    apps[1].submit("wide", first)  # late: the row is there, it does not run again
    for _ in range(2):
        await entered.acquire()  # both runs in progress at once
    leave.set()
    await eventually_async(lambda: len(apps[0].events) + len(apps[1].events) == 2, 30, "both")
    assert calls == 2
    assert [row[:2] for row in await ledger(database_url, "wide")] == [
        (int(first.timestamp()), "succeeded"),
        (int(second.timestamp()), "succeeded"),
    ]
