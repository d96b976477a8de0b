"""The fire path's and the window's ports over two backends, for tests that must hold on both: real
PostgreSQL (LockSessions and Store on the test's database) and the in-memory fake
(harness/memory.py). Each backend also knows how to do, from the outside, what
the tests need: write jobs, hold a lock as a foreign session would, let time pass, and
hold a claim or a run's end mid-flight.

Holding mid-flight is the same on both. PostgreSQL: a transaction keeps the row the
call must lock (a claim locks its job's row after taking the advisory lock; an end
locks its run's row), and every call that reaches it waits there. The fake: a `Pause`
hook at the same two places.
"""

import abc
import asyncio
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import (
    AbstractAsyncContextManager,
    AbstractContextManager,
    AsyncExitStack,
    asynccontextmanager,
)
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import asyncpg

from harness.accounting import CURSORS, OUTCOMES
from harness.memory import (
    MemoryDatabase,
    MemoryLedger,
    MemoryLockPool,
    NoSuchJobError,
    Pause,
)
from harness.waiting import eventually_async
from service.domain.jobs import Job, JobSpec, create_job, replace_job
from service.domain.runs import AttemptTimes, CancelRequest, Run, RunTrigger
from service.metrics import Metrics
from service.scheduler import Runner
from service.store import Store
from service.store.listener import JobListener
from service.store.ports import (
    BackendId,
    Claim,
    ClaimOutcome,
    Ledger,
    Listener,
    LockPool,
    OpenListener,
    Orphan,
    PinnedSession,
    RunEnd,
    TickClaim,
    WindowReads,
)
from service.store.sessions import LockSessions
from tests.support.db import (
    advisory_lock_holders,
    advisory_locks_in,
    advisory_locks_on,
    refusing_connections,
)
from tests.support.fire import EVERY_SECOND, Gates, lock_pool, running


class Held(abc.ABC):
    """Calls held mid-flight until `resume`."""

    @abc.abstractmethod
    async def reached(self, calls: int = 1) -> None:
        """Wait until `calls` calls are held."""

    @abc.abstractmethod
    async def resume(self) -> None: ...


class Backend(abc.ABC):
    name: str
    sessions: LockPool
    ledger: Ledger
    window: WindowReads
    listen: OpenListener
    # What reserving a queue_one slot for a job that does not exist raises.
    missing_job: type[Exception]

    @abc.abstractmethod
    async def put(
        self, name: str, change: Callable[[Job | None, datetime], Job | None]
    ) -> Job | None:
        """Write a job as the API does: `change` gets the current job and the time."""

    async def add_job(self, name: str, **spec: Any) -> Job:
        fields: dict[str, Any] = {"schedule": EVERY_SECOND, "task": "wait", "args": {}} | spec
        created = await self.put(
            name, lambda _, now: create_job(name, JobSpec(**fields), now - timedelta(hours=1))
        )
        assert created is not None
        return created

    async def edit_job(self, name: str, **changes: Any) -> Job:
        def edit(current: Job | None, now: datetime) -> Job:
            assert current is not None
            return replace_job(current, current.spec().model_copy(update=changes), now)

        edited = await self.put(name, edit)
        assert edited is not None
        return edited

    async def delete_job(self, name: str) -> None:
        await self.put(name, lambda _, __: None)

    async def job(self, name: str) -> Job | None:
        jobs = await self.ledger.get_jobs([name])
        return jobs[0] if jobs else None

    @abc.abstractmethod
    async def runs_of(self, job: str) -> list[Run]: ...

    @abc.abstractmethod
    async def locks_on(self, key: int) -> int:
        """How many sessions hold advisory lock `key`."""

    @abc.abstractmethod
    async def lock_owner(self, key: int) -> int | None:
        """The session holding advisory lock `key` (a pid, an id), if one does."""

    @abc.abstractmethod
    async def advisory_locks(self) -> tuple[int, int]:
        """Advisory locks held in the database, and how many sessions hold them."""

    @abc.abstractmethod
    def refusing_connections(self) -> AbstractAsyncContextManager[None]:
        """The database refuses new sessions for the block; open ones stay open."""

    @abc.abstractmethod
    async def slot_of(self, job: str) -> datetime | None:
        """The tick holding the job's queue_one slot."""

    @abc.abstractmethod
    async def request_cancel(self, request: CancelRequest) -> bool:
        """Ask to cancel a run, as the API does; whether it was running."""

    @abc.abstractmethod
    def lock_pool(self, size: int = 8) -> AbstractAsyncContextManager[LockPool]:
        """Another replica's lock pool."""

    @abc.abstractmethod
    def foreign_lock(self, key: int) -> AbstractAsyncContextManager[None]:
        """Hold `key` from a session that writes no ledger row (a foreign holder)."""

    @abc.abstractmethod
    async def kill_lock_holder(self, key: int) -> None:
        """Close the session holding `key` from the outside (a restart, a cut link)."""

    @abc.abstractmethod
    async def pass_time(self, seconds: float) -> None: ...

    @abc.abstractmethod
    async def lose_listeners(self) -> int:
        """Cut every listener's connection from the outside; how many were cut."""

    @abc.abstractmethod
    async def accounted(self, jobs: Sequence[str]) -> tuple[list[Any], list[Any]]:
        """What tick accounting judges (`harness.accounting.judge_ticks`): each job's
        threshold and cursor (`CURSORS`), then its ticks' outcomes (`OUTCOMES`)."""

    @abc.abstractmethod
    def hold_claims(self, job: Job) -> AbstractAsyncContextManager[Held]:
        """Hold every claim of `job`'s ticks after it took (or failed to take) the lock."""

    @abc.abstractmethod
    def hold_finish(self, run_id: UUID) -> AbstractAsyncContextManager[Held]:
        """Hold the end of run `run_id` on its session before it is written."""


class PostgresBackend(Backend):
    name = "postgres"
    missing_job = asyncpg.ForeignKeyViolationError

    def __init__(self, database_url: str, store: Store, sessions: LockSessions) -> None:
        self._url = database_url
        self._store = store
        self.ledger = store
        self.window = store
        self.sessions = sessions
        self.listen = self._listen

    async def _listen(
        self,
        on_change: Callable[[str], None],
        on_lost: Callable[[], None],
        on_cancel: Callable[[], None],
    ) -> Listener:
        return await JobListener.open(self._url, on_change, on_lost, None, on_cancel)

    async def lose_listeners(self) -> int:
        connection = await asyncpg.connect(self._url)
        try:
            cut: int = await connection.fetchval(
                """SELECT count(*) FILTER (WHERE pg_terminate_backend(pid, 5000))
                   FROM pg_stat_activity
                   WHERE datname = current_database() AND query LIKE 'LISTEN %'"""
            )
        finally:
            await connection.close()
        return cut

    async def accounted(self, jobs: Sequence[str]) -> tuple[list[Any], list[Any]]:
        connection = await asyncpg.connect(self._url)
        try:
            # The cursors first: rows written meanwhile only add outcomes.
            cursors = await connection.fetch(CURSORS, list(jobs))
            return cursors, await connection.fetch(OUTCOMES, list(jobs))
        finally:
            await connection.close()

    async def put(
        self, name: str, change: Callable[[Job | None, datetime], Job | None]
    ) -> Job | None:
        written = await self._store.mutate_job(
            name, lambda current: change(current, datetime.now(UTC))
        )
        return written.after

    async def runs_of(self, job: str) -> list[Run]:
        return await self._store.list_runs(job, 100, None, None)

    async def attempts_of(self, run_id: UUID) -> list[AttemptTimes]:
        kept = await self._store.get_run_kept(run_id)
        assert kept is not None
        return kept.attempts()

    async def request_cancel(self, request: CancelRequest) -> bool:
        answer = await self._store.request_cancel(request)
        return answer is not None and answer.asked

    async def locks_on(self, key: int) -> int:
        return await advisory_locks_on(self._url, key)

    async def lock_owner(self, key: int) -> int | None:
        return next(iter(await advisory_lock_holders(self._url, key)), None)

    async def advisory_locks(self) -> tuple[int, int]:
        return await advisory_locks_in(self._url)

    def refusing_connections(self) -> AbstractAsyncContextManager[None]:
        return refusing_connections(self._url)

    async def slot_of(self, job: str) -> datetime | None:
        connection = await asyncpg.connect(self._url)
        try:
            held: datetime | None = await connection.fetchval(
                "SELECT scheduled_for FROM tickgate_pending WHERE job = $1", job
            )
            return held
        finally:
            await connection.close()

    def lock_pool(self, size: int = 8) -> AbstractAsyncContextManager[LockPool]:
        return lock_pool(self._url, size)

    @asynccontextmanager
    async def foreign_lock(self, key: int) -> AsyncIterator[None]:
        connection = await asyncpg.connect(self._url)
        try:
            await connection.execute("SELECT pg_advisory_lock($1)", key)
            yield
        finally:
            await connection.close()

    async def kill_lock_holder(self, key: int) -> None:
        connection = await asyncpg.connect(self._url)
        try:
            killed = await connection.fetchval(
                """SELECT count(pg_terminate_backend(pid)) FROM pg_locks
                   WHERE locktype = 'advisory' AND granted
                     AND classid = (($1::bigint >> 32) & 4294967295)::oid
                     AND objid = ($1::bigint & 4294967295)::oid""",
                key,
            )
        finally:
            await connection.close()
        assert killed == 1

    async def pass_time(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def hold_claims(self, job: Job) -> AbstractAsyncContextManager[Held]:
        return self._holding_row("SELECT 1 FROM tickgate_jobs WHERE name = $1 FOR UPDATE", job.name)

    def hold_finish(self, run_id: UUID) -> AbstractAsyncContextManager[Held]:
        return self._holding_row("SELECT 1 FROM tickgate_runs WHERE id = $1 FOR UPDATE", run_id)

    @asynccontextmanager
    async def _holding_row(self, lock_row: str, key: object) -> AsyncIterator[Held]:
        connection = await asyncpg.connect(self._url)
        try:
            transaction = connection.transaction()
            await transaction.start()
            assert await connection.fetchval(lock_row, key) == 1
            held = RowHeld(self._url, transaction)
            try:
                yield held
            finally:
                await held.resume()
        finally:
            await connection.close()


@dataclass
class RowHeld(Held):
    """Statements waiting for a row lock this transaction holds."""

    url: str
    transaction: Any
    done: bool = False

    async def reached(self, calls: int = 1) -> None:
        # Another connection: pg_stat_activity is a snapshot per transaction.
        async def waiting() -> bool:
            connection = await asyncpg.connect(self.url)
            try:
                count: int = await connection.fetchval(
                    """SELECT count(*) FROM pg_stat_activity
                       WHERE datname = current_database() AND wait_event_type = 'Lock'"""
                )
            finally:
                await connection.close()
            return count >= calls

        await eventually_async(waiting, 30, f"{calls} statements waiting for the held row")

    async def resume(self) -> None:
        if not self.done:
            self.done = True
            await self.transaction.commit()


class SteppingClock:
    """A clock that moves on by `step` at every reading: every event gets its own
    time, in order, and a test moves it further with `advance`."""

    def __init__(self, start: datetime, step: timedelta = timedelta(microseconds=1)) -> None:
        self._now = start
        self._step = step

    def __call__(self) -> datetime:
        self._now += self._step
        return self._now

    def advance(self, seconds: float) -> None:
        self._now += timedelta(seconds=seconds)


class MemoryBackend(Backend):
    name = "memory"
    missing_job = NoSuchJobError

    def __init__(self, *, wall_clock: bool = False) -> None:
        """`wall_clock`: the database reads the time, for a window to fire by; else a
        `SteppingClock` that `pass_time` moves."""
        self.clock = SteppingClock(datetime.now(UTC))
        self._wall_clock = wall_clock
        self.database = MemoryDatabase(clock=_now if wall_clock else self.clock)
        self.ledger = self.window = MemoryLedger(self.database)
        self.sessions = MemoryLockPool(self.database)
        self.listen = self.database.listen

    async def lose_listeners(self) -> int:
        return self.database.lose_listeners()

    async def put(
        self, name: str, change: Callable[[Job | None, datetime], Job | None]
    ) -> Job | None:
        # A copy, as PostgreSQL reads one: the fake's stored job may carry what the fire
        # path cached on it (`Job.first_tick`), which a new version must not inherit.
        current = self.database.job(name)
        after = change(current and current.model_copy(), self.database.clock())
        if after is None:
            self.database.delete_job(name)
        else:
            self.database.put_job(after)
        return after

    async def runs_of(self, job: str) -> list[Run]:
        return self.database.runs(job)

    async def request_cancel(self, request: CancelRequest) -> bool:
        return self.database.request_cancel(request)

    async def locks_on(self, key: int) -> int:
        return self.database.lock_holders(key)

    async def lock_owner(self, key: int) -> int | None:
        return self.database.lock_owner(key)

    async def advisory_locks(self) -> tuple[int, int]:
        return self.database.advisory_locks()

    @asynccontextmanager
    async def refusing_connections(self) -> AsyncIterator[None]:
        self.database.accepting.clear()
        try:
            yield
        finally:
            self.database.accepting.set()

    async def slot_of(self, job: str) -> datetime | None:
        return self.database.slot(job)

    @asynccontextmanager
    async def lock_pool(self, size: int = 8) -> AsyncIterator[LockPool]:
        yield MemoryLockPool(self.database, size)

    @asynccontextmanager
    async def foreign_lock(self, key: int) -> AsyncIterator[None]:
        session = self.database.connect()
        assert session.try_lock(key)
        try:
            yield
        finally:
            session.terminate()

    async def kill_lock_holder(self, key: int) -> None:
        owner = self.database.lock_owner(key)
        assert owner is not None
        assert self.database.terminate_backend(owner)

    async def pass_time(self, seconds: float) -> None:
        if self._wall_clock:
            await asyncio.sleep(seconds)
        else:
            self.clock.advance(seconds)

    async def accounted(self, jobs: Sequence[str]) -> tuple[list[Any], list[Any]]:
        cursors, outcomes = [], []
        for name in jobs:
            job, cursor = self.database.job(name), self.database.cursor(name)
            if job is None or cursor is None:
                continue
            at = cursor.timestamp() if cursor.year < datetime.max.year else float("inf")
            cursors.append({"job": name, "threshold": job.fire_after.timestamp(), "cursor": at})
            outcomes += [
                {"job": name, "at": run.scheduled_for.timestamp(), "missed_ticks": run.missed_ticks}
                | {"trigger": run.trigger.value}
                for run in self.database.runs(name)
                if not run.trigger.on_demand
            ]
            if (waiting := self.database.slot(name)) is not None:
                outcomes.append(
                    {"job": name, "at": waiting.timestamp(), "missed_ticks": None}
                    | {"trigger": "waiting"}
                )
        return cursors, outcomes

    @asynccontextmanager
    async def hold_claims(self, job: Job) -> AsyncIterator[Held]:
        pause: Pause[TickClaim] = Pause(lambda tick: tick.job.name == job.name)
        self.database.hooks.before_deciding = pause
        try:
            yield Paused(pause)
        finally:
            pause.resume()
            self.database.hooks.before_deciding = None

    @asynccontextmanager
    async def hold_finish(self, run_id: UUID) -> AsyncIterator[Held]:
        pause: Pause[UUID] = Pause(lambda ended: ended == run_id)
        self.database.hooks.before_finishing = pause
        try:
            yield Paused(pause)
        finally:
            pause.resume()
            self.database.hooks.before_finishing = None


def _now() -> datetime:
    return datetime.now(UTC)


@dataclass
class Paused(Held):
    pause: Pause[Any]

    async def reached(self, calls: int = 1) -> None:
        await asyncio.wait_for(self.pause.reached(calls), 30)

    async def resume(self) -> None:
        self.pause.resume()


# --- replicas ---------------------------------------------------------------------


@dataclass(frozen=True)
class Replica:
    """One replica's fire path over a backend, and what its gate said."""

    runner: Runner
    claims: "RecordingPool"
    metrics: Metrics

    def fire(self, job: Job, tick: datetime) -> None:
        self.runner.fire(job, tick, RunTrigger.SCHEDULE)

    def outcomes(self, job: str, tick: datetime) -> list[ClaimOutcome]:
        return self.claims.outcomes(job, tick)


@asynccontextmanager
async def replicas(
    backend: Backend, gates: Gates, names: str = "ab", takeover_seconds: float = 3.0
) -> AsyncIterator[list[Replica]]:
    """A replica per letter of `names` (its runner id), each with its own lock pool
    over `backend`, all with the same gate tasks."""
    async with AsyncExitStack() as stack:
        started = []
        for name in names:
            claims = RecordingPool(await stack.enter_async_context(backend.lock_pool()))
            metrics = Metrics()
            runner = await stack.enter_async_context(
                running(
                    backend.ledger,
                    claims,
                    gates,
                    metrics,
                    runner_id=name,
                    takeover_seconds=takeover_seconds,
                )
            )
            started.append(Replica(runner, claims, metrics))
        yield started


# --- a lock pool that notes what the gate said ------------------------------------


@dataclass
class RecordingPool:
    """A replica's lock pool that notes every claim's outcome, per (job, tick)."""

    inner: LockPool
    claims: list[tuple[str, datetime, ClaimOutcome]] = field(default_factory=list)

    @property
    def size(self) -> int:
        return self.inner.size

    async def fill(self) -> None:
        await self.inner.fill()

    @asynccontextmanager
    async def session(self, wait_seconds: float) -> AsyncIterator[PinnedSession]:
        async with self.inner.session(wait_seconds) as session:
            yield RecordingSession(session, self.claims)

    def outcomes(self, job: str, tick: datetime) -> list[ClaimOutcome]:
        return [outcome for name, at, outcome in self.claims if (name, at) == (job, tick)]


@dataclass
class RecordingSession:
    inner: PinnedSession
    claims: list[tuple[str, datetime, ClaimOutcome]]

    @property
    def pid(self) -> int:
        return self.inner.pid

    @property
    def backend(self) -> BackendId:
        return self.inner.backend

    @property
    def closed(self) -> bool:
        return self.inner.closed

    def fenced(self, on_lost: Callable[[], None]) -> AbstractContextManager[None]:
        return self.inner.fenced(on_lost)

    async def claim(self, ticks: Sequence[TickClaim]) -> list[Claim]:
        claims = await self.inner.claim(ticks)
        for tick, claim in zip(ticks, claims, strict=True):
            self.claims.append((tick.job.name, tick.scheduled_for, claim.outcome))
        return claims

    async def finish(
        self, run_id: UUID, outcome: RunEnd, release_lock: int | None
    ) -> tuple[Run | None, bool]:
        return await self.inner.finish(run_id, outcome, release_lock)

    async def resume(self, orphans: Sequence[Orphan], runner: str) -> list[Claim]:
        return await self.inner.resume(orphans, runner)

    async def unlock(self, key: int) -> bool:
        return await self.inner.unlock(key)

    def terminate(self) -> None:
        self.inner.terminate()
