"""The lock pool: one pinned connection per run in flight, and the statements run on it.

An advisory lock belongs to the session that took it, so the lock, the ledger claim,
the result and the unlock all go over the same connection, held for the whole run.
"""

import logging
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from contextlib import asynccontextmanager, contextmanager, suppress
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from typing import Any, Self
from uuid import UUID

import asyncpg

from service.domain.jobs import Job
from service.domain.runs import Run, RunTrigger
from service.store.connection import Connection, Pool
from service.store.rows import RUN_COLUMNS, run_from_row
from service.store.store import FINISH_RUN, FINISHED_RUN, RunEnd, create_pool

__all__ = [
    "Claim",
    "ClaimOutcome",
    "RunEnd",
    "RunSession",
    "RunSessions",
    "TickClaim",
]

log = logging.getLogger(__name__)


class ClaimOutcome(Enum):
    LOCKED = "locked"
    CLAIMED = "claimed"
    ALREADY_RAN = "already_ran"
    JOB_CHANGED = "job_changed"
    JOB_GONE = "job_gone"
    CAPPED = "capped"


@dataclass(frozen=True)
class Claim:
    outcome: ClaimOutcome
    run: Run | None = None
    holds_lock: bool = False


@dataclass(frozen=True)
class TickClaim:
    """What a replica asks for: this job, at this version, for this tick; `lock` takes
    the job's advisory lock first (every overlap mode but "allow")."""

    job: Job
    scheduled_for: datetime
    trigger: RunTrigger
    runner: str
    run_id: UUID
    lock: bool
    any_version: bool = False


class RunSession:
    """One pinned connection of the lock pool."""

    def __init__(self, connection: Connection, locked_pids: set[int]) -> None:
        self._connection = connection
        self._locked_pids = locked_pids
        # Read while the connection is surely open: a connection the server closed is
        # detached from its pool proxy, which then answers nothing, not even its pid.
        self._pid: int = connection.get_server_pid()
        self._terminated = False

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
            self._locked_pids.discard(self._pid)
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

    async def claim(self, tick: TickClaim) -> Claim:
        """Take the job's lock, then insert the ledger row, in one statement (one round
        trip) that also re-reads the job.

        The lock is `pg_try_advisory_lock`, which never waits: if another session holds
        the job (another replica running it, or a Go replica using the same name), the
        loser gets LOCKED and skips the tick. The row is written only if the job still
        exists at the version the replica scheduled from (and is active, for scheduled
        ticks), no row for the same (job, scheduled_for) exists, and a `max_runs` cap
        leaves room; the loser of the race for a tick gets ALREADY_RAN. A session lock
        outlives a failed statement, so on any error the connection is closed.
        """
        counted = tick.job.max_runs is not None and tick.trigger is not RunTrigger.MANUAL
        try:
            row = await self._connection.fetchrow(
                _CLAIMS[(tick.lock, counted)], *_claim_arguments(tick)
            )
        except BaseException:
            if tick.lock:
                self.terminate()
            raise
        assert row is not None
        claim = _claim_of(row, tick)
        if claim.holds_lock:
            self._locked_pids.add(self._pid)
        return claim

    async def finish(
        self, run_id: UUID, outcome: RunEnd, release_lock: int | None
    ) -> tuple[Run | None, bool]:
        """Record how the run ended and, in the same statement, release the job's lock
        if `release_lock` names it. Returns the run and whether the lock was released.
        The ledger row was committed when the run was claimed, so releasing the lock a
        moment before this row commits lets no one run the tick again."""
        releasing = release_lock is not None
        row = await self._connection.fetchrow(
            _FINISH_AND_UNLOCK if releasing else _FINISH,
            run_id,
            outcome.status.value,
            outcome.error,
            outcome.result,
            outcome.attempts,
            *((release_lock,) if releasing else ()),
        )
        assert row is not None
        released = bool(releasing and row["released"])
        if released:
            self._locked_pids.discard(self._pid)
        return (run_from_row(row) if row["id"] is not None else None), released

    async def unlock(self, key: int) -> bool:
        """True once this session no longer holds `key`; False if it never did."""
        released = bool(await self._connection.fetchval("SELECT pg_advisory_unlock($1)", key))
        if released:
            self._locked_pids.discard(self._pid)
        return released

    def terminate(self) -> None:
        """Close the connection hard: its session, and any lock it holds, dies with it.
        Safe on a connection that is already gone."""
        self._locked_pids.discard(self._pid)
        self._terminated = True
        # Already closed and detached from its pool proxy: nothing is left to close.
        with suppress(asyncpg.InterfaceError):
            self._connection.terminate()


def _claim_arguments(tick: TickClaim) -> tuple[object, ...]:
    return (
        tick.job.name,
        tick.run_id,
        tick.scheduled_for,
        tick.trigger.value,
        tick.runner,
        tick.job.lock_key,
        tick.lock,
        tick.any_version,
        tick.job.version,
    )


def _claim_of(row: Mapping[str, Any], tick: TickClaim) -> Claim:
    holds = bool(tick.lock and row["got_lock"])
    if not row["got_lock"]:
        return Claim(ClaimOutcome.LOCKED)
    if row["current_version"] is None:
        return Claim(ClaimOutcome.JOB_GONE, holds_lock=holds)
    if row["id"] is not None:
        return Claim(ClaimOutcome.CLAIMED, run_from_row(row), holds_lock=holds)
    if not tick.any_version and row["current_version"] != tick.job.version:
        return Claim(ClaimOutcome.JOB_CHANGED, holds_lock=holds)
    if row["capped"]:
        return Claim(ClaimOutcome.CAPPED, holds_lock=holds)
    return Claim(ClaimOutcome.ALREADY_RAN, holds_lock=holds)


def _claim_statement(*, locking: bool, counted: bool) -> str:
    lock = "SELECT pg_try_advisory_lock($6) AS got" if locking else "SELECT true AS got"
    row_lock = "FOR UPDATE" if counted else ""
    count = (
        """, counted AS (
            UPDATE tickgate_jobs SET runs_started = runs_started + 1
            WHERE name = $1 AND EXISTS (SELECT 1 FROM claimed) RETURNING runs_started)"""
        if counted
        else ""
    )
    cap = "AND (current.max_runs IS NULL OR current.runs_started < current.max_runs)"
    return f"""WITH lock AS ({lock}),
        current AS (
            SELECT version, state, max_runs, runs_started FROM tickgate_jobs
            WHERE name = $1 {row_lock}
        ), claimed AS (
            INSERT INTO tickgate_runs (id, job, scheduled_for, trigger, status,
                started_at, runner, job_version, lock_key, locked, backend_pid)
            SELECT $2, $1, $3, $4, 'running', clock_timestamp(), $5, current.version,
                $6, $7, pg_backend_pid()
            FROM current, lock
            WHERE lock.got AND ($8 OR (current.version = $9 AND current.state = 'active'))
              {cap if counted else ""}
            ON CONFLICT (job, scheduled_for) DO NOTHING
            RETURNING {RUN_COLUMNS}
        ){count}
        SELECT (SELECT got FROM lock) AS got_lock,
               (SELECT version FROM current) AS current_version,
               COALESCE((SELECT runs_started >= max_runs FROM current), false) AS capped,
               claimed.*
        FROM (SELECT 1) AS one LEFT JOIN claimed ON true"""


_CLAIMS = {
    (locking, counted): _claim_statement(locking=locking, counted=counted)
    for locking in (True, False)
    for counted in (True, False)
}

_FINISH = FINISH_RUN
_FINISH_AND_UNLOCK = f"""{FINISHED_RUN}
    SELECT finished.*, pg_advisory_unlock($6) AS released
    FROM (SELECT 1) AS one LEFT JOIN finished ON true"""


class RunSessions:
    """The lock pool, sized to the runs a replica may have in flight."""

    def __init__(self, pool: Pool, locked_pids: set[int]) -> None:
        self._pool = pool
        self._locked_pids = locked_pids

    @classmethod
    async def open(cls, dsn: str, size: int) -> Self:
        locked_pids: set[int] = set()

        async def reset(connection: Connection) -> None:
            """asyncpg's safety net, paid only when needed: a session returned while
            it may still hold a lock (a bug: the runner always unlocks, or closes the
            session) drops every advisory lock it has."""
            pid = connection.get_server_pid()
            if pid in locked_pids:
                locked_pids.discard(pid)
                log.error("session %d went back to the pool holding a lock; releasing", pid)
                await connection.execute("SELECT pg_advisory_unlock_all()")

        pool = await create_pool(dsn, min_size=1, max_size=size, reset=reset)
        return cls(pool, locked_pids)

    async def close(self) -> None:
        await self._pool.close()

    @asynccontextmanager
    async def session(self) -> AsyncIterator[RunSession]:
        """A connection pinned for one run: lock, claim, result and unlock all use it."""
        async with self._pool.acquire() as connection:
            yield RunSession(connection, self._locked_pids)
