"""The window on the in-memory fake of its ports (harness/memory.py): no PostgreSQL.

Two replicas, each a `Window` and a `Runner` over the same `MemoryDatabase` and owning
every job (no members known), hand over the same ticks of a one-second job: the gate
lets each tick through once, and the fake's ledger keeps one outcome per tick. Changes
reach a window through the fake's listener, not by a refill (the window here is read
again every half hour), and a change made while the listener was lost is read at its
reconnection.
"""

from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from datetime import UTC, datetime, timedelta

from harness.memory import MemoryDatabase, MemoryLedger, MemoryLockPool
from harness.waiting import eventually_async
from service.domain.jobs import Job, JobSpec, create_job, replace_job
from service.domain.runs import RunStatus
from service.domain.schedules import IntervalSchedule
from service.metrics import Metrics
from service.scheduler import Window
from service.store.ports import ClaimOutcome
from tests.support.backends import RecordingPool
from tests.support.fire import Gates, running

EVERY_SECOND = IntervalSchedule(kind="interval", every_seconds=1)
EVERY_MINUTE = IntervalSchedule(kind="interval", every_seconds=60)
PATIENCE_SECONDS = 20.0
AN_HOUR = 3600.0


def _now() -> datetime:
    return datetime.now(UTC)


def _job(name: str, schedule: IntervalSchedule, message: str = "v1") -> Job:
    spec = JobSpec(schedule=schedule, task="log", args={"message": message})
    return create_job(name, spec, _now())


@asynccontextmanager
async def windows(
    database: MemoryDatabase, names: str, window_seconds: float
) -> AsyncIterator[list[tuple[Window, RecordingPool]]]:
    """A started window per letter of `names`, each over a runner and a lock pool of
    its own, all over `database`."""
    async with AsyncExitStack() as stack:
        started = []
        for name in names:
            pool = RecordingPool(MemoryLockPool(database, size=2))
            runner = await stack.enter_async_context(
                running(MemoryLedger(database), pool, Gates(), Metrics(), runner_id=name)
            )
            window = Window(
                store=MemoryLedger(database),
                listen=database.listen,
                runner=runner,
                window_seconds=window_seconds,
            )
            stack.push_async_callback(window.stop)
            await window.start()
            started.append((window, pool))
        yield started


async def test_two_windows_on_the_fake_fire_each_tick_and_it_runs_once() -> None:
    database = MemoryDatabase(clock=_now)
    database.put_job(_job("often", EVERY_SECOND))
    async with windows(database, "ab", window_seconds=2.0) as replicas:

        def ran() -> list[datetime]:
            runs = database.runs("often")
            return [run.scheduled_for for run in runs if run.status is RunStatus.SUCCEEDED]

        await eventually_async(lambda: len(ran()) >= 4, PATIENCE_SECONDS, "four ticks run")
        for window, _ in replicas:
            window.pause()
    runs = sorted(database.runs("often"), key=lambda run: run.scheduled_for)
    ticks = [run.scheduled_for for run in runs]
    # Every tick from the first to the last has its one row: none missed, none twice.
    assert ticks == [ticks[0] + timedelta(seconds=i) for i in range(len(ticks))]
    for tick in ticks:
        outcomes = [outcome for _, pool in replicas for outcome in pool.outcomes("often", tick)]
        assert outcomes.count(ClaimOutcome.CLAIMED) == 1, (tick, outcomes)
    # The race was run: both replicas asked the gate for the same ticks.
    assert any(all(pool.outcomes("often", tick) for _, pool in replicas) for tick in ticks)


async def _holds(window: Window, expected: Callable[[], dict[str, object]], what: str) -> None:
    await eventually_async(lambda: window.filed() == expected(), PATIENCE_SECONDS, what)


async def test_an_edit_and_a_delete_reach_the_window_through_the_fake_listener() -> None:
    database = MemoryDatabase(clock=_now)
    first = _job("report", EVERY_MINUTE)
    database.put_job(first)
    async with windows(database, "a", window_seconds=AN_HOUR) as [(window, _)]:
        assert window.filed() == {"report": first.revision}
        assert window.healthy
        spec = first.spec().model_copy(update={"args": {"message": "v2"}})
        edited = replace_job(first, spec, _now())
        database.put_job(edited)
        await _holds(window, lambda: {"report": edited.revision}, "the edit")
        database.delete_job("report")
        await _holds(window, dict, "the delete")


async def test_a_change_made_while_the_listener_was_lost_is_read_when_it_reconnects() -> None:
    database = MemoryDatabase(clock=_now)
    first = _job("report", EVERY_MINUTE)
    database.put_job(first)
    async with windows(database, "a", window_seconds=AN_HOUR) as [(window, _)]:
        database.accepting.clear()  # no reconnection yet: the change is heard by nobody
        assert database.lose_listeners() == 1
        spec = first.spec().model_copy(update={"args": {"message": "v2"}})
        edited = replace_job(first, spec, _now())
        database.put_job(edited)
        await eventually_async(lambda: not window.healthy, PATIENCE_SECONDS, "the loss seen")
        assert window.filed() == {"report": first.revision}
        database.accepting.set()
        await _holds(window, lambda: {"report": edited.revision}, "the change read again")
        await eventually_async(lambda: window.healthy, PATIENCE_SECONDS, "a new listener")
