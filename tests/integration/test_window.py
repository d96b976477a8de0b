"""The replica's window of due ticks, on real PostgreSQL: what it holds, under races.

Every job definition comes from the database. A ScriptedStore is a real Store whose
window reads (a full `refill`, or the `load` of jobs a notification named) can be parked,
right before or right after they read, or can fail once as if the connection broke:
that is how each test puts a load and a refill, or a notification and a resync, in the
order that used to go wrong.
"""

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any, TypeVar

import asyncpg
import httpx
import pytest

from harness.waiting import eventually_async
from service.domain.cursors import OwedTick
from service.domain.hooks import HookPlan
from service.domain.jobs import Catchup, Job, JobSpec, create_job, replace_job
from service.domain.names import lock_key
from service.domain.ownership import BUCKETS, Members, bucket_of, owned_buckets
from service.domain.runs import RunStatus, RunTrigger
from service.domain.schedules import CronSchedule, IntervalSchedule, OnceSchedule
from service.metrics import Metrics
from service.scheduler import Runner, Window
from service.scheduler.chores import Chores
from service.store import Store
from service.store.connection import Pool
from service.store.link import Link
from service.store.listener import JobListener
from service.store.ports import Filed, Listener, OpenListener, WindowRead
from service.store.sessions import LockSessions
from service.store.targets import SqlTargetConnections
from service.tasks import builtin_registry

T = TypeVar("T")

# Jobs with a tick a minute: a window of an hour holds each, and no tick comes due
# during a test but those a test makes due.
EVERY_MINUTE = IntervalSchedule(kind="interval", every_seconds=60)
# Long enough that no periodic refill repairs the window behind a test's back.
AN_HOUR = 3600.0
# How long a fixed window needs at most to converge (its retry backoff is 0.5 s to 5 s).
CONVERGE_SECONDS = 8.0
# A second loader is given this long to run ahead of a parked one. With the loads
# serialised it cannot, and the test goes on when this runs out.
RUN_AHEAD_SECONDS = 0.5


@dataclass
class Hold:
    """Parks one read until the test releases it."""

    after_read: bool
    reached: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)

    async def park(self) -> None:
        self.reached.set()
        await self.release.wait()


class ScriptedStore(Store):
    """The real Store; `hold` parks its next read of a kind, `fail_once` breaks it."""

    def __init__(self, pool: Pool, link: Link | None = None, hooks: HookPlan | None = None) -> None:
        super().__init__(pool, link, hooks)
        self._holds: dict[str, Hold] = {}
        self._failures: dict[str, Exception] = {}
        self.reads: list[str] = []  # the window reads asked for, in order

    def hold(self, read: str, *, after_read: bool) -> Hold:
        self._holds[read] = Hold(after_read)
        return self._holds[read]

    def fail_once(self, read: str, error: Exception) -> None:
        self._failures[read] = error

    def tripped(self, read: str) -> bool:
        """Whether the failure scripted for `read` has happened."""
        return read not in self._failures

    async def read_window(
        self,
        buckets: frozenset[int] | None,
        seconds: float,
        names: Sequence[str] | None = None,
        filed: Filed = lambda _: None,
    ) -> WindowRead:
        self.reads.append("refill" if names is None else "load")
        call = partial(super().read_window, buckets, seconds, names, filed)
        return await self._scripted("refill" if names is None else "load", call)

    async def _scripted(self, read: str, call: Callable[[], Awaitable[T]]) -> T:
        if (error := self._failures.pop(read, None)) is not None:
            raise error
        hold = self._holds.pop(read, None)
        if hold is not None and not hold.after_read:
            await hold.park()
        result = await call()
        if hold is not None and hold.after_read:
            await hold.park()
        return result


@pytest.fixture
async def scripted(database_url: str) -> AsyncIterator[ScriptedStore]:
    opened = await ScriptedStore.open(database_url, max_size=4)
    try:
        yield opened
    finally:
        await opened.close()


@asynccontextmanager
async def opened_window(
    database_url: str,
    store: Store,
    members: Callable[[], Members] = Members.unknown,
    runner_kw: dict[str, Any] | None = None,
    metrics: Metrics | None = None,
    **kw: Any,
) -> AsyncIterator[Window]:
    """A window reading through `store`, not started: a test starts it (listener and
    loops) or drives refills itself, as a replica whose listener is down does. Its
    runner is built with `runner_kw` on top of the defaults."""
    sessions = LockSessions(database_url, size=2)  # opened when first needed
    tasks = builtin_registry()
    async with httpx.AsyncClient() as http:
        runner = Runner(
            sessions=sessions,
            side_sessions=sessions,
            store=store,
            tasks=tasks,
            http=http,
            sql=SqlTargetConnections({}),
            runner_id="test-window",
            metrics=metrics or Metrics(),
            **(runner_kw or {}),
        )
        built = Window(
            store=store,
            listen=listening(database_url),
            runner=runner,
            members=members,
            **({"window_seconds": AN_HOUR} | kw),
        )
        try:
            yield built
        finally:
            await built.stop()
            await runner.shutdown(grace_seconds=0)
            await tasks.aclose()
            await sessions.close()


def listening(database_url: str) -> OpenListener:
    """The window's listener over PostgreSQL, as a replica opens it (service/app.py)."""

    async def listen(
        on_change: Callable[[str], None], on_lost: Callable[[], None], on_cancel: Callable[[], None]
    ) -> Listener:
        return await JobListener.open(database_url, on_change, on_lost, None, on_cancel)

    return listen


@asynccontextmanager
async def chores_beside(store: Store, window: Window, **kw: Any) -> AsyncIterator[Chores]:
    """The window's chores (the audit among them), not started: a test starts them
    after the window, as a replica does."""
    chores = Chores(
        store=store,
        runner=window.runner,
        run_history=100,
        buckets_read=window.buckets_read,
        **({"reconcile_seconds": AN_HOUR} | kw),
    )
    try:
        yield chores
    finally:
        await chores.stop()


@pytest.fixture
async def window(database_url: str, scripted: ScriptedStore) -> AsyncIterator[Window]:
    async with opened_window(database_url, scripted) as built:
        yield built


def spec(message: str) -> JobSpec:
    return JobSpec(
        schedule=EVERY_MINUTE, task="log", args={"message": message}, catchup=Catchup.NONE
    )


async def create(store: Store, name: str, message: str) -> Job:
    now = datetime.now(UTC)
    change = await store.mutate_job(name, lambda _: create_job(name, spec(message), now))
    assert change.created
    assert change.after is not None
    return change.after


async def update(store: Store, name: str, message: str) -> Job:
    now = datetime.now(UTC)

    def change(current: Job | None) -> Job | None:
        assert current is not None
        return replace_job(current, spec(message), now)

    after = (await store.mutate_job(name, change)).after
    assert after is not None
    return after


async def delete(store: Store, name: str) -> None:
    await store.mutate_job(name, lambda _: None)


async def holds(window: Window, *jobs: Job) -> None:
    """The window comes to hold exactly these definitions."""
    expected = {job.name: job.revision for job in jobs}
    await eventually_async(lambda: window.filed() == expected, CONVERGE_SECONDS, f"{expected}")


async def run_ahead(until: Callable[[], bool]) -> None:
    """Give a second loader the chance to get ahead of a parked one: wait until
    `until()` holds, or RUN_AHEAD_SECONDS if the window makes the loader wait."""
    with contextlib.suppress(AssertionError):
        await eventually_async(until, RUN_AHEAD_SECONDS, "a second loader to run ahead")


async def test_a_job_deleted_and_created_again_is_held_as_the_new_job(
    store: Store, window: Window
) -> None:
    """Refill: the new job restarts at version 1, like the old one; only the
    incarnation tells them apart."""
    await create(store, "report", "old definition")
    await window.refill()
    await delete(store, "report")
    new = await create(store, "report", "new definition")
    await window.refill()
    assert window.filed() == {"report": new.revision}


async def test_a_notified_delete_and_create_leave_the_new_job_held(
    store: Store, scripted: ScriptedStore, window: Window
) -> None:
    """Notifications: both writes are committed by the time the window reads the row."""
    old = await create(store, "report", "old definition")
    await window.start()
    await holds(window, old)
    load = scripted.hold("load", after_read=False)
    await delete(store, "report")
    await load.reached.wait()
    new = await create(store, "report", "new definition")
    load.release.set()
    await holds(window, new)


async def test_an_older_read_never_replaces_a_newer_one(
    store: Store, scripted: ScriptedStore, window: Window
) -> None:
    """Two refills overlap (the periodic one and a resync, say): the first read v2
    and is slow to apply it; meanwhile v3 is written and the second reads it."""
    await create(store, "report", "v1")
    await window.refill()
    await update(store, "report", "v2")
    slow_read = scripted.hold("refill", after_read=True)
    first = asyncio.create_task(window.refill())
    await slow_read.reached.wait()
    v3 = await update(store, "report", "v3")
    second = asyncio.create_task(window.refill())
    await run_ahead(second.done)
    slow_read.release.set()
    await asyncio.gather(first, second)
    assert window.filed() == {"report": v3.revision}


async def test_a_job_created_during_a_refill_is_not_dropped_by_it(
    store: Store, scripted: ScriptedStore, window: Window
) -> None:
    """The refill read the window before the create; the create's notification is
    applied before that refill finishes."""
    await window.start()
    listing = scripted.hold("refill", after_read=True)
    refill = asyncio.create_task(window.refill())
    await listing.reached.wait()
    created = await create(store, "report", "created meanwhile")
    await run_ahead(lambda: "report" in window.filed())
    listing.release.set()
    await refill
    await holds(window, created)


async def test_a_change_whose_load_failed_is_loaded_on_retry(
    store: Store, scripted: ScriptedStore, window: Window
) -> None:
    """The load a notification asked for fails: no second notification will come."""
    await create(store, "report", "v1")
    await window.start()
    scripted.fail_once("load", asyncpg.exceptions.ConnectionDoesNotExistError("closed"))
    v2 = await update(store, "report", "v2")
    await holds(window, v2)
    assert scripted.tripped("load")


async def cursor_gone(store: Store, name: str) -> bool:
    """Whether the job's cursor is past its last tick ('infinity', a naive datetime.max)."""
    cursor = await store.cursor(name)
    return cursor is not None and cursor.tzinfo is None


async def test_a_change_to_a_job_past_its_last_tick_holds_up_no_other_change(
    store: Store, window: Window, caplog: pytest.LogCaptureFixture
) -> None:
    """A one-time job whose tick is gone is still `active` until the completion chore completes it,
    its cursor at 'infinity' (which asyncpg reads as a naive datetime.max). A change to
    it used to fail the load of its whole batch with a TypeError, retried (and logged)
    for ever: no other change reached the window but by a refill, until the completion chore."""
    await create(store, "report", "v1")
    await window.start()
    at = datetime.now(UTC) + timedelta(seconds=1)
    gone = spec("gone").model_copy(update={"schedule": OnceSchedule(kind="once", at=at)})
    await store.mutate_job("gone", lambda _: create_job("gone", gone, datetime.now(UTC)))
    await eventually_async(
        lambda: cursor_gone(store, "gone"), CONVERGE_SECONDS, "the one tick to be claimed"
    )
    changed = gone.model_copy(update={"args": {"message": "changed after its tick"}})
    await store.mutate_job("gone", lambda job: replace_job(job, changed, datetime.now(UTC)))
    v2 = await update(store, "report", "v2")
    await holds(window, v2)
    failed = [r.getMessage() for r in caplog.records if r.name == "service.scheduler.window"]
    assert not [message for message in failed if message.startswith("failed")], failed


async def test_a_failed_resync_after_a_reconnect_is_retried(
    store: Store, scripted: ScriptedStore, window: Window, database_url: str
) -> None:
    """The listener's connection is cut; a change made before it reconnects is never
    notified, and the resync that should find it fails once."""
    await create(store, "report", "v1")
    await window.start()
    scripted.fail_once("refill", OSError("connection reset"))
    await cut_listener(database_url)
    v2 = await update(store, "report", "v2")
    await holds(window, v2)
    assert scripted.tripped("refill")


async def test_a_listener_lost_without_its_callback_is_noticed_and_replaced(
    store: Store, window: Window, database_url: str
) -> None:
    """asyncpg calls no termination callback for a connection lost while it was already
    closing. A listener gone that way still leaves the window unhealthy for a moment
    only: the closed connection is found and replaced, and changes are heard again."""
    await create(store, "report", "v1")
    await window.start()
    assert window.healthy
    listener = window._listener
    assert listener is not None
    listener._connection._termination_listeners.clear()  # the callback that never comes
    await cut_listener(database_url)
    await eventually_async(
        lambda: window.healthy and window._listener is not listener, 30, "a new listener"
    )
    v2 = await update(store, "report", "v2")
    await holds(window, v2)


async def cut_listener(database_url: str) -> None:
    """Terminate the window's LISTEN session and wait until it is gone, as a database
    failover or a proxy dropping the connection would."""
    connection = await asyncpg.connect(database_url)
    try:
        cut = await connection.fetchval(
            """SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 5000))
               FROM pg_stat_activity
               WHERE datname = current_database() AND query LIKE 'LISTEN %'"""
        )
    finally:
        await connection.close()
    assert cut == 1


async def test_a_tick_due_between_a_job_s_creation_and_its_load_runs_as_scheduled(
    store: Store, scripted: ScriptedStore, window: Window
) -> None:
    """The load of a new one-second job is slow: a tick falls due after the job was
    made and before the window files it. It is one of the job's scheduled ticks, late,
    not a tick missed while no replica was up: it runs as scheduled, whatever the job's
    catch-up policy (before, it ran as a catch-up, and only under `latest`)."""
    await window.start()
    load = scripted.hold("load", after_read=True)
    every_second = spec("late").model_copy(
        update={
            "schedule": IntervalSchedule(kind="interval", every_seconds=1),
            "catchup": Catchup.LATEST,
        }
    )
    # Made early in a second, so that the tick found late at the load is the first.
    await asyncio.sleep(1.02 - datetime.now(UTC).microsecond / 1e6)
    made = datetime.now(UTC)
    change = await store.mutate_job("late", lambda _: create_job("late", every_second, made))
    assert change.after is not None
    await load.reached.wait()
    await asyncio.sleep(1.2)  # a tick boundary passes while the load is parked
    load.release.set()
    first = change.after.first_tick
    assert first is not None

    async def first_ran() -> bool:
        runs = await store.list_runs("late", 100, None, None)
        return any(run.scheduled_for == first for run in runs)

    await eventually_async(first_ran, CONVERGE_SECONDS, "the first tick's run")
    [run] = [r for r in await store.list_runs("late", 100, None, None) if r.scheduled_for == first]
    assert (run.trigger, run.status is not RunStatus.SKIPPED) == (RunTrigger.SCHEDULE, True)


async def test_the_window_and_the_audit_agree_on_the_catch_up_tick(
    database_url: str, store: Store
) -> None:
    """Replicas start one after another: the earliest joined 4 s before this one reads
    its window. A one-second job made before any of them has ticks missed by all (before
    the earliest joined) and ticks due since. The audit waits for the last tick missed
    by all to run as the catch-up, so the window must make that same tick the catch-up
    (it used its own start, caught up a later tick, and the cursor waited at a tick
    nobody would run until its reach: a minute of audits, then a misfire)."""
    every_second = spec("catch-up").model_copy(
        update={
            "schedule": IntervalSchedule(kind="interval", every_seconds=1),
            "catchup": Catchup.LATEST,
        }
    )
    made = datetime.now(UTC) - timedelta(seconds=8)
    change = await store.mutate_job("caught", lambda _: create_job("caught", every_second, made))
    assert change.after is not None
    since = _whole_second(datetime.now(UTC)) - timedelta(seconds=3, microseconds=500_000)
    async with (
        opened_window(database_url, store, cluster_since=lambda: since) as window,
        chores_beside(store, window, cluster_since=lambda: since) as chores,
    ):
        await window.start()
        chores.start()

        async def passed_since() -> bool:
            cursor = await store.cursor("caught")
            return cursor is not None and cursor > since

        await eventually_async(passed_since, 30, "the cursor to pass the catch-up")
    runs = {r.scheduled_for: r for r in await store.list_runs("caught", 100, None, None)}
    caught_up = _whole_second(since)
    assert runs[caught_up].trigger is RunTrigger.CATCHUP
    assert runs[caught_up + timedelta(seconds=1)].trigger is RunTrigger.SCHEDULE


def _whole_second(moment: datetime) -> datetime:
    return moment.replace(microsecond=0)


async def test_a_job_with_no_tick_in_the_window_is_not_held(
    database_url: str, store: Store
) -> None:
    """Memory follows the window, not the jobs: of a job due every second and one due
    once a year, a 10 s window holds the first alone, and no tick of the second."""
    yearly = spec("yearly").model_copy(
        update={"schedule": CronSchedule(kind="cron", expression="0 0 1 1 *")}
    )
    now = datetime.now(UTC)
    await store.mutate_job("yearly", lambda _: create_job("yearly", yearly, now))
    often = spec("often").model_copy(
        update={"schedule": IntervalSchedule(kind="interval", every_seconds=1)}
    )
    made = (await store.mutate_job("often", lambda _: create_job("often", often, now))).after
    assert made is not None
    async with opened_window(database_url, store, window_seconds=10) as window:
        await window.refill()
        assert window.filed() == {"often": made.revision}


async def test_a_crowd_beyond_the_runner_s_waiting_limit_all_runs(
    database_url: str, store: Store
) -> None:
    """A crowd bigger than the room and the runner's waiting limit together: the ticks
    the runner cannot take yet stay filed in the window and go as room frees. Before,
    every tick past the limit was recorded at once as a misfire ("too many ticks waited
    for room here"): a 100,000-job crowd over 3 replicas lost 40,000 ticks that way."""
    crowd, room, limit = 60, 2, 10
    at = datetime.fromtimestamp(int(datetime.now(UTC).timestamp()) + 3, UTC)
    once = spec("crowd").model_copy(update={"schedule": OnceSchedule(kind="once", at=at)})
    now = datetime.now(UTC)
    names = [f"crowd-{index:02d}" for index in range(crowd)]
    for name in names:
        await store.mutate_job(name, lambda _, name=name: create_job(name, once, now))
    runner_kw = {"room": room, "waiting_limit": limit}
    async with opened_window(database_url, store, runner_kw=runner_kw, window_seconds=10) as window:
        await window.start()

        async def outcomes() -> list[Any]:
            return [r for n in names for r in await store.list_runs(n, 10, None, None)]

        async def all_ended() -> bool:
            ended = [r for r in await outcomes() if r.status is not RunStatus.RUNNING]
            return len(ended) == crowd

        await eventually_async(all_ended, 30.0, f"{crowd} outcomes")
    statuses = {(run.job, run.status) for run in await outcomes()}
    assert statuses == {(name, RunStatus.SUCCEEDED) for name in names}


async def test_takeovers_past_the_waiting_limit_are_left_to_the_audit_not_misfired(
    database_url: str, store: Store
) -> None:
    """Retries and takeovers reach a full runner anyway (the window holds back, they
    do not). Those past the waiting limit are left undecided, not recorded as misfires
    (a replica merely full never decides a tick): the audit hands them over again, and
    every one runs. Before, each was recorded at once: a 100,000-job crowd over 3
    replicas lost 2,521 ticks that way."""
    made = datetime.now(UTC) - timedelta(seconds=30)
    at = datetime.fromtimestamp(int(datetime.now(UTC).timestamp()) - 5, UTC)  # owed now
    once = spec("owed").model_copy(update={"schedule": OnceSchedule(kind="once", at=at)})
    names = [f"owed-{index}" for index in range(6)]
    jobs = []
    for name in names:
        change = await store.mutate_job(name, lambda _, name=name: create_job(name, once, made))
        assert change.after is not None
        jobs.append(change.after)
    runner_kw = {"room": 1, "waiting_limit": 2, "takeover_seconds": 1.0}
    async with (
        opened_window(database_url, store, runner_kw=runner_kw) as window,
        chores_beside(store, window) as chores,
    ):
        for job in jobs:  # one audit's hand-over, in one turn of the loop: 4 past the limit
            window.runner.take_over(job, OwedTick(at, None))

        async def outcomes() -> list[Any]:
            return [r for n in names for r in await store.list_runs(n, 10, None, None)]

        await eventually_async(
            lambda: _count(outcomes, RunStatus.SUCCEEDED, 2), 30.0, "the two admitted"
        )
        assert [r for r in await outcomes() if r.status is RunStatus.SKIPPED] == []
        await window.start()
        chores.start()  # and its audit
        await eventually_async(
            lambda: _count(outcomes, RunStatus.SUCCEEDED, len(names)), 30.0, "every tick"
        )
    assert sorted((run.job, run.status) for run in await outcomes()) == [
        (name, RunStatus.SUCCEEDED) for name in names
    ]


async def _count(
    outcomes: Callable[[], Awaitable[list[Any]]], status: RunStatus, count: int
) -> bool:
    return sum(run.status is status for run in await outcomes()) == count


async def test_a_window_reads_and_hears_only_the_buckets_it_owns(
    database_url: str, scripted: ScriptedStore
) -> None:
    """Three members: this replica holds only the jobs of its own buckets, and a change
    to a job of another's bucket costs it no read at all."""
    members = Members.seen(2, [1, 2, 3])
    mine = owned_buckets(members)
    assert mine is not None
    assert BUCKETS / 5 < len(mine) < BUCKETS / 2
    names = [f"job-{index}" for index in range(60)]
    jobs = [await create(scripted, name, "v1") for name in names]
    async with opened_window(database_url, scripted, members=lambda: members) as window:
        await window.start()
        expected = {job.name: job.revision for job in jobs if bucket_of(job.lock_key) in mine}
        assert 0 < len(expected) < len(names)
        assert window.filed() == expected
        foreign = next(name for name in names if bucket_of(lock_key(name)) not in mine)
        reads = len(scripted.reads)
        await update(scripted, foreign, "v2")
        own = next(iter(expected))
        changed = await update(scripted, own, "v2")
        await eventually_async(
            lambda: window.filed().get(own) == changed.revision, CONVERGE_SECONDS, "own change"
        )
        assert scripted.reads[reads:] == ["load"]  # the own job's change, read once


async def test_a_deleted_job_run_here_by_takeover_loses_its_series_here(
    database_url: str, scripted: ScriptedStore
) -> None:
    """A replica that ran a tick of a job it does not own (a takeover) keeps the job's
    run series; when the job is deleted they go, or every job ever taken over would
    stay in its scrape. The job is read to learn that, never held."""
    members = Members.seen(2, [1, 2, 3])
    mine = owned_buckets(members)
    assert mine is not None
    names = [f"job-{index}" for index in range(30)]
    foreign = next(name for name in names if bucket_of(lock_key(name)) not in mine)
    await create(scripted, foreign, "v1")
    metrics = Metrics()
    async with opened_window(
        database_url, scripted, members=lambda: members, metrics=metrics
    ) as window:
        await window.start()
        metrics.count_run(foreign, lock_key(foreign), RunStatus.SUCCEEDED, datetime.now(UTC))
        assert f'job="{foreign}"' in metrics.exposition().decode()
        reads = len(scripted.reads)
        await update(scripted, foreign, "v2")
        await eventually_async(lambda: len(scripted.reads) > reads, CONVERGE_SECONDS, "a load")
        assert foreign not in window.filed()
        await delete(scripted, foreign)
        await eventually_async(
            lambda: f'job="{foreign}"' not in metrics.exposition().decode(),
            CONVERGE_SECONDS,
            "the deleted job's series gone",
        )
        assert foreign not in window.filed()


async def test_a_replica_drops_the_series_of_jobs_it_no_longer_owns(
    database_url: str, scripted: ScriptedStore
) -> None:
    """Each handover gives a replica the moved jobs for a moment: their run series go
    again once the job is owned elsewhere and has not run here for the linger (0 here),
    or every replica would end up exporting every job (the soak of 2026-12-07)."""
    members = Members.seen(2, [1, 2, 3])
    mine = owned_buckets(members)
    assert mine is not None
    names = [f"job-{index}" for index in range(30)]
    foreign = next(name for name in names if bucket_of(lock_key(name)) not in mine)
    own = next(name for name in names if bucket_of(lock_key(name)) in mine)
    metrics = Metrics(series_linger_seconds=0)
    for name in (foreign, own):
        metrics.count_run(name, lock_key(name), RunStatus.SUCCEEDED, datetime.now(UTC))
    async with (
        opened_window(database_url, scripted, members=lambda: members, metrics=metrics) as window,
        chores_beside(scripted, window, members=lambda: members, reconcile_seconds=0.1) as chores,
    ):
        await window.start()
        chores.start()
        await eventually_async(
            lambda: f'job="{foreign}"' not in metrics.exposition().decode(),
            CONVERGE_SECONDS,
            "the series of the job owned elsewhere gone",
        )
        assert f'job="{own}"' in metrics.exposition().decode()
