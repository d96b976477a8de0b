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
from datetime import datetime
from enum import Enum
from typing import Any, Self
from uuid import UUID

import asyncpg

from service.domain.jobs import Job
from service.domain.runs import Run, RunTrigger
from service.store.coalesce import Coalescer
from service.store.connection import Connection, Pool
from service.store.rows import RUN_COLUMNS, run_from_row
from service.store.store import FINISHED_RUNS, RunEnd, create_pool

__all__ = [
    "Claim",
    "ClaimOutcome",
    "RunEnd",
    "RunSession",
    "RunSessions",
    "TickClaim",
]

# How long the first of several runs sharing a session waits for others to end, so
# that their ends (and unlocks) go in one statement.
FINISH_LINGER_SECONDS = 0.01

# Sessions that may hold advisory locks, by backend pid, and how many each holds.
LockCounts = Counter[int]

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
        statement = _CLAIMS[(tick.lock, counted)]
        [row] = await self._claiming(tick.lock, statement, *_claim_arguments(tick))
        return self._took(_claim_of(row, tick))

    async def claim_together(self, ticks: Sequence[TickClaim]) -> list[Claim]:
        """Claim many scheduled ticks, each of a different job, in one statement.

        Per tick it does what `claim` does: `pg_try_advisory_lock` on the job's key
        (the loser, whose key another session holds, gets LOCKED), then the ledger row
        if the job is still active at the scheduled version and no row for the tick
        exists (the loser of that race gets ALREADY_RAN). A lock taken for a tick that
        was not claimed is released by the same statement, so only claimed ticks leave
        it held. Rows are inserted in (job, tick) order: two replicas inserting the
        same ticks of "allow" jobs (no lock) wait on each other in one order, never
        in a cycle. Jobs with `max_runs` must go through `claim`, which counts them.
        """
        if len({tick.job.name for tick in ticks}) != len(ticks):
            raise ValueError("claim_together takes at most one tick per job")
        locking = any(tick.lock for tick in ticks)
        rows = await self._claiming(locking, _CLAIM_TOGETHER, *_together_arguments(ticks))
        claims = []
        for row, tick in zip(rows, ticks, strict=True):
            claim = _claim_of(row, tick)
            if row["released"]:
                claim = Claim(claim.outcome, claim.run, holds_lock=False)
            claims.append(self._took(claim))
        return claims

    async def _claiming(self, locking: bool, statement: str, *arguments: object) -> list[Any]:
        """A session lock outlives a failed statement, so on any error a statement that
        may have taken locks closes the connection."""
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
        # Others sharing the session are likely to end within moments: one statement
        # for all of them costs the database and us far less.
        return FINISH_LINGER_SECONDS if self._open_runs > 1 else 0.0

    async def _record_endings(self, endings: Sequence[_Ending]) -> list[tuple[Run | None, bool]]:
        """Record the ends in one statement; per end, the run and whether its lock
        was released."""
        self._open_runs -= len(endings)
        async with self._turn:
            rows = await self._connection.fetch(_FINISH_TOGETHER, *_ending_arguments(endings))
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
            released = await self._connection.fetchval("SELECT pg_advisory_unlock($1)", key)
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


def _together_arguments(ticks: Sequence[TickClaim]) -> tuple[object, ...]:
    return (
        [tick.job.name for tick in ticks],
        [tick.run_id for tick in ticks],
        [tick.scheduled_for for tick in ticks],
        [tick.trigger.value for tick in ticks],
        [tick.job.lock_key for tick in ticks],
        [tick.lock for tick in ticks],
        [tick.job.version for tick in ticks],
        ticks[0].runner,
    )


_CLAIM_TOGETHER = f"""WITH ticks AS (
        SELECT * FROM unnest($1::text[], $2::uuid[], $3::timestamptz[], $4::text[],
                             $5::bigint[], $6::boolean[], $7::bigint[])
            WITH ORDINALITY AS t(job, id, scheduled_for, trigger, lock_key, locking,
                                 version, n)
    ), gated AS MATERIALIZED (
        SELECT ticks.*, (NOT locking OR pg_try_advisory_lock(lock_key)) AS got FROM ticks
    ), current AS (
        SELECT name, version, state FROM tickgate_jobs WHERE name = ANY($1::text[])
    ), claimed AS (
        INSERT INTO tickgate_runs (id, job, scheduled_for, trigger, status, started_at,
            runner, job_version, lock_key, locked, backend_pid)
        SELECT g.id, g.job, g.scheduled_for, g.trigger, 'running', clock_timestamp(), $8,
            c.version, g.lock_key, g.locking, pg_backend_pid()
        FROM gated g JOIN current c ON c.name = g.job
        WHERE g.got AND c.version = g.version AND c.state = 'active'
        ORDER BY g.job, g.scheduled_for
        ON CONFLICT (job, scheduled_for) DO NOTHING
        RETURNING {RUN_COLUMNS}
    )
    SELECT g.got AS got_lock, c.version AS current_version, false AS capped,
           CASE WHEN g.got AND g.locking AND claimed.id IS NULL
                THEN pg_advisory_unlock(g.lock_key) ELSE false END AS released,
           claimed.*
    FROM gated g LEFT JOIN current c ON c.name = g.job LEFT JOIN claimed ON claimed.id = g.id
    ORDER BY g.n"""


def _ending_arguments(endings: Sequence[_Ending]) -> tuple[object, ...]:
    return (
        [ending.run_id for ending in endings],
        [ending.end.status.value for ending in endings],
        [ending.end.error for ending in endings],
        [ending.end.result for ending in endings],
        [ending.end.attempts for ending in endings],
        [ending.release_lock for ending in endings],
    )


# The ledger rows were committed when the runs were claimed, so releasing a lock a
# moment before its run's end commits lets no one run the tick again.
_FINISH_TOGETHER = f"""{FINISHED_RUNS}
    SELECT e.n, CASE WHEN e.unlock_key IS NOT NULL
                     THEN pg_advisory_unlock(e.unlock_key) ELSE false END AS released,
           finished.*
    FROM ends e LEFT JOIN finished ON finished.id = e.run_id
    ORDER BY e.n"""


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

        pool = await create_pool(dsn, min_size=1, max_size=size, reset=reset)
        return cls(pool, lock_counts)

    async def close(self) -> None:
        await self._pool.close()

    @asynccontextmanager
    async def session(self) -> AsyncIterator[RunSession]:
        """A connection pinned for one run: lock, claim, result and unlock all use it."""
        async with self._pool.acquire() as connection:
            yield RunSession(connection, self._lock_counts)
