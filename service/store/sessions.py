"""The lock pool: pinned connections, and the statements run on them.

An advisory lock belongs to the session that took it, so the lock, the ledger claim,
the result and the unlock all go over the same connection, held for the whole run.
Ticks due at the same moment are claimed together in one statement and their runs
share that connection; their ends are recorded, and their locks released, in batches.
"""

import asyncio
import logging
from collections import Counter
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager, suppress
from dataclasses import dataclass
from typing import Any, Self
from uuid import UUID

import asyncpg

from service.domain.runs import Run
from service.store import fire_sql
from service.store.coalesce import Coalescer
from service.store.connection import Connection, Pool
from service.store.errors import is_unavailable
from service.store.fire_sql import RunEnd, TickClaim
from service.store.ports import Claim, ClaimOutcome, GateFacts
from service.store.rows import run_from_row
from service.store.store import create_pool, init_connection

__all__ = [
    "Claim",
    "ClaimOutcome",
    "RunEnd",
    "RunSession",
    "RunSessions",
    "TickClaim",
]


# Sessions that may hold advisory locks, by backend pid, and how many each holds.
LockCounts = Counter[int]

# How long the first end of several runs sharing a session waits for the others.
FINISH_LINGER_SECONDS = 0.005

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Ending:
    run_id: UUID
    end: RunEnd
    release_lock: int | None


class RunSession:
    """One pinned connection of the lock pool; the runs of one claim share it."""

    def __init__(self, connection: Connection, lock_counts: LockCounts) -> None:
        self._connection = connection
        self._lock_counts = lock_counts
        # Read while the connection is surely open: a connection the server closed is
        # detached from its pool proxy, which then answers nothing, not even its pid.
        self._pid: int = connection.get_server_pid()
        self._terminated = False
        # A connection runs one statement at a time; runs sharing it take turns, and
        # ends that queue up meanwhile are recorded together by whoever goes next.
        self._turn = asyncio.Lock()
        self._endings = Coalescer(self._record_endings, self._finish_linger)
        self._open_runs = 0  # claimed here and not yet recorded

    @property
    def closed(self) -> bool:
        """The session is gone: the server or the network closed it, or we did. An
        advisory lock it held is gone with it."""
        if self._terminated:
            return True
        try:
            return self._connection.is_closed()
        except asyncpg.InterfaceError:
            return True  # asyncpg detached the dead connection from its pool proxy

    @contextmanager
    def fenced(self, on_lost: Callable[[], None]) -> Iterator[None]:
        """Call `on_lost` if the connection closes while the block runs (a database
        restart, a cut link): the session died, and the job's lock with it, so another
        replica may now start the job's next tick.

        asyncpg calls termination listeners soon after it sees the connection close,
        idle or not; the pool then drops that connection and never hands it out again.
        """

        def lost(_connection: object) -> None:
            self._lock_counts.pop(self._pid, None)
            on_lost()

        if self.closed:
            lost(None)  # it died before the fence went up
        else:
            self._connection.add_termination_listener(lost)
        try:
            yield
        finally:
            if not self.closed:
                self._connection.remove_termination_listener(lost)

    async def claim(self, ticks: Sequence[TickClaim]) -> list[Claim]:
        """Pass ticks, each of a different job, through the gate in one statement (see
        `fire_sql.claim_statement`); one Claim per tick, in order. A claim that counts
        against `max_runs` goes alone.

        The lock is `pg_try_advisory_lock`, which never waits. Only claimed ticks leave
        their lock held. A session lock outlives a failed statement, so on any error a
        statement that may have taken locks closes the connection.
        """
        if len({tick.job.name for tick in ticks}) != len(ticks):
            raise ValueError("a claim takes at most one tick per job")
        counted = any(tick.counted for tick in ticks)
        if counted and len(ticks) > 1:
            raise ValueError("a claim that counts runs goes alone")
        statement = fire_sql.CLAIM_COUNTED if counted else fire_sql.CLAIM
        locking = any(tick.lock for tick in ticks)
        rows = await self._claiming(locking, statement, *fire_sql.claim_arguments(ticks))
        return [self._took(_claim_of(row, tick)) for row, tick in zip(rows, ticks, strict=True)]

    async def _claiming(self, locking: bool, statement: str, *arguments: object) -> list[Any]:
        try:
            async with self._turn:
                return list(await self._connection.fetch(statement, *arguments))
        except BaseException:
            if locking:
                self.terminate()
            raise

    def _took(self, claim: Claim) -> Claim:
        if claim.run is not None:
            self._open_runs += 1
        if claim.holds_lock:
            self._lock_counts[self._pid] += 1
        return claim

    def _released(self, count: int = 1) -> None:
        self._lock_counts[self._pid] -= count
        if self._lock_counts[self._pid] <= 0:
            del self._lock_counts[self._pid]

    async def finish(
        self, run_id: UUID, outcome: RunEnd, release_lock: int | None
    ) -> tuple[Run | None, bool]:
        """Record how the run ended and, in the same statement, release the job's lock
        if `release_lock` names it. Returns the run and whether the lock was released.
        Ends that runs sharing this session queue meanwhile go in the same statement."""
        return await self._endings.submit(_Ending(run_id, outcome, release_lock))

    def _finish_linger(self) -> float:
        """A lone run's end is written at once. Runs of one crowd, sharing the session,
        end within moments of each other: waiting FINISH_LINGER_SECONDS for them writes
        their ends in one statement (one commit for all), and keeps each lock no more
        than that past its run's end, far below a tick."""
        return FINISH_LINGER_SECONDS if self._open_runs > 1 else 0.0

    async def _record_endings(self, endings: Sequence[_Ending]) -> list[tuple[Run | None, bool]]:
        """Record the ends in one statement; per end, the run and whether its lock
        was released. If the database refuses the statement for what one end holds,
        each end is recorded alone, so no run is left `running` by another's bytes."""
        self._open_runs -= len(endings)
        try:
            rows = await self._finishing(endings)
        except (asyncpg.PostgresError, asyncpg.DataError) as error:
            if is_unavailable(error):
                raise
            log.warning(
                "%d run ends refused together (%r); recording each alone", len(endings), error
            )
            rows = [row for ending in endings for row in await self._finishing_alone(ending)]
        return self._finished(rows, endings)

    async def _finishing(self, endings: Sequence[_Ending]) -> list[Any]:
        # A refused statement ran nothing: no run was finished, no lock released.
        async with self._turn:
            return list(await self._connection.fetch(fire_sql.FINISH, *_finish_arguments(endings)))

    async def _finishing_alone(self, ending: _Ending) -> list[Any]:
        """One end; if the database refuses even that, the run is recorded with the
        refusal as its error and no result."""
        try:
            return await self._finishing([ending])
        except (asyncpg.PostgresError, asyncpg.DataError) as error:
            if is_unavailable(error):
                raise
            why = f"the run's result or error could not be stored: {type(error).__name__}"
            bare = RunEnd(ending.end.status, why, None, ending.end.attempts)
            return await self._finishing([_Ending(ending.run_id, bare, ending.release_lock)])

    def _finished(
        self, rows: Sequence[Any], endings: Sequence[_Ending]
    ) -> list[tuple[Run | None, bool]]:
        results = []
        for row, ending in zip(rows, endings, strict=True):
            released = bool(ending.release_lock is not None and row["released"])
            if released:
                self._released()
            results.append((run_from_row(row) if row["id"] is not None else None, released))
        return results

    async def unlock(self, key: int) -> bool:
        """True once this session no longer holds `key`; False if it never did."""
        async with self._turn:
            released = await self._connection.fetchval(fire_sql.UNLOCK, key)
        if released:
            self._released()
        return bool(released)

    def terminate(self) -> None:
        """Close the connection hard: its session, and any lock it holds, dies with it.
        Safe on a connection that is already gone."""
        self._lock_counts.pop(self._pid, None)
        self._terminated = True
        # Already closed and detached from its pool proxy: nothing is left to close.
        with suppress(asyncpg.InterfaceError):
            self._connection.terminate()


def _claim_of(row: Mapping[str, Any], tick: TickClaim) -> Claim:
    facts = GateFacts(
        got=bool(row["got"]),
        job_exists=bool(row["job_exists"]),
        same_incarnation=bool(row["same_incarnation"]),
        same_revision=bool(row["same_revision"]),
        capped=bool(row["capped"]),
        ticked=bool(row["ticked"]),
        busy=bool(row["busy"]),
        released=bool(row["released"]),
        run=run_from_row(row) if row["id"] else None,
    )
    return facts.claim(tick)


def _finish_arguments(endings: Sequence[_Ending]) -> tuple[object, ...]:
    return fire_sql.finish_arguments([(e.run_id, e.end, e.release_lock) for e in endings])


class RunSessions:
    """The lock pool: one connection per claim in flight (a lone tick, or the ticks
    due together)."""

    def __init__(self, pool: Pool, lock_counts: LockCounts) -> None:
        self._pool = pool
        self._lock_counts = lock_counts

    @classmethod
    async def open(cls, dsn: str, size: int) -> Self:
        lock_counts: LockCounts = Counter()

        async def reset(connection: Connection) -> None:
            """asyncpg's safety net, paid only when needed: a session returned while
            it may still hold a lock (a bug: the runner always unlocks, or closes the
            session) drops every advisory lock it has."""
            pid = connection.get_server_pid()
            if lock_counts.pop(pid, 0) > 0:
                log.error("session %d went back to the pool holding a lock; releasing", pid)
                await connection.execute("SELECT pg_advisory_unlock_all()")

        pool = await create_pool(dsn, min_size=1, max_size=size, reset=reset, init=_warmed)
        return cls(pool, lock_counts)

    async def close(self) -> None:
        await self._pool.close()

    @asynccontextmanager
    async def session(self, wait_seconds: float) -> AsyncIterator[RunSession]:
        """A connection pinned for one claim and its runs: lock, claim, results and
        unlocks all use it. TimeoutError if none frees up within `wait_seconds`."""
        async with self._pool.acquire(timeout=wait_seconds) as connection:
            yield RunSession(connection, self._lock_counts)


async def _warmed(connection: Connection) -> None:
    """A new lock-pool connection runs every fire-path statement once (claiming and
    locking nothing) before it is handed out, so no run waits for a statement to be
    prepared or a type to be looked up."""
    await init_connection(connection)
    for statement, arguments in fire_sql.WARM_UP:
        await connection.fetch(statement, *arguments)
