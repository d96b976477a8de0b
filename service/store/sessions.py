"""The lock pool: one pinned connection per run in flight, and the statements run on it.

An advisory lock belongs to the session that took it, so the lock, the ledger claim,
the result and the unlock all go over the same connection, held for the whole run.
"""

from collections.abc import AsyncIterator, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from typing import Any, Self
from uuid import UUID

from pydantic import JsonValue

from service.domain.jobs import Job
from service.domain.runs import Run, RunStatus, RunTrigger
from service.store.connection import Connection, Pool
from service.store.rows import RUN_COLUMNS, run_from_row
from service.store.store import create_pool


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


@dataclass(frozen=True)
class TickClaim:
    """What a replica asks the ledger for: this job, at this version, for this tick."""

    job: Job
    scheduled_for: datetime
    trigger: RunTrigger
    runner: str
    run_id: UUID
    locked: bool
    any_version: bool = False


class RunSession:
    """One pinned connection of the lock pool."""

    def __init__(self, connection: Connection) -> None:
        self._connection = connection

    async def try_lock(self, key: int) -> bool:
        """`pg_try_advisory_lock`, which never waits.

        False means another session holds the job: another replica running it now, or
        a Go replica using the same job name. The loser skips the tick; it never queues.
        """
        return bool(await self._connection.fetchval("SELECT pg_try_advisory_lock($1)", key))

    async def unlock(self, key: int) -> bool:
        """True once this session no longer holds `key`; False if it never did."""
        return bool(await self._connection.fetchval("SELECT pg_advisory_unlock($1)", key))

    def terminate(self) -> None:
        """Close the connection hard: its session, and any lock it holds, dies with it."""
        self._connection.terminate()

    async def claim(self, tick: TickClaim) -> Claim:
        """Insert the ledger row for a tick, in one statement that re-reads the job.

        The row is written only if the job still exists at the version the replica
        scheduled from (and is active, for scheduled ticks), no row for the same
        (job, scheduled_for) exists, and a `max_runs` cap leaves room. The loser of the
        race for a tick gets ALREADY_RAN. Jobs with a cap lock their row for the claim,
        so concurrent claims count one at a time.
        """
        counted = tick.job.max_runs is not None and tick.trigger is not RunTrigger.MANUAL
        row = await self._connection.fetchrow(
            _CLAIM_COUNTED if counted else _CLAIM,
            tick.job.name,
            tick.run_id,
            tick.scheduled_for,
            tick.trigger.value,
            tick.runner,
            tick.job.lock_key,
            tick.locked,
            tick.any_version,
            tick.job.version,
        )
        assert row is not None
        return _claim_of(row, tick)

    async def finish(
        self, run_id: UUID, status: RunStatus, error: str | None, result: JsonValue, attempts: int
    ) -> Run | None:
        row = await self._connection.fetchrow(
            f"""UPDATE tickgate_runs SET status = $2, error = $3, result = $4, attempts = $5,
                    finished_at = clock_timestamp(),
                    duration_ms = round(extract(epoch FROM clock_timestamp() - started_at) * 1000)
                WHERE id = $1 AND status = 'running'
                RETURNING {RUN_COLUMNS}""",
            run_id,
            status.value,
            error,
            result,
            attempts,
        )
        return run_from_row(row) if row else None


def _claim_of(row: Mapping[str, Any], tick: TickClaim) -> Claim:
    if row["current_version"] is None:
        return Claim(ClaimOutcome.JOB_GONE)
    if row["id"] is not None:
        return Claim(ClaimOutcome.CLAIMED, run_from_row(row))
    if not tick.any_version and row["current_version"] != tick.job.version:
        return Claim(ClaimOutcome.JOB_CHANGED)
    if row["capped"]:
        return Claim(ClaimOutcome.CAPPED)
    return Claim(ClaimOutcome.ALREADY_RAN)


def _claim_statement(*, counted: bool) -> str:
    lock = "FOR UPDATE" if counted else ""
    count = (
        """, counted AS (
            UPDATE tickgate_jobs SET runs_started = runs_started + 1
            WHERE name = $1 AND EXISTS (SELECT 1 FROM claimed) RETURNING runs_started)"""
        if counted
        else ""
    )
    cap = "AND (current.max_runs IS NULL OR current.runs_started < current.max_runs)"
    return f"""WITH current AS (
            SELECT version, state, max_runs, runs_started FROM tickgate_jobs
            WHERE name = $1 {lock}
        ), claimed AS (
            INSERT INTO tickgate_runs (id, job, scheduled_for, trigger, status,
                started_at, runner, job_version, lock_key, locked, backend_pid)
            SELECT $2, $1, $3, $4, 'running', clock_timestamp(), $5, current.version,
                $6, $7, pg_backend_pid()
            FROM current
            WHERE ($8 OR (current.version = $9 AND current.state = 'active'))
              {cap if counted else ""}
            ON CONFLICT (job, scheduled_for) DO NOTHING
            RETURNING {RUN_COLUMNS}
        ){count}
        SELECT (SELECT version FROM current) AS current_version,
               COALESCE((SELECT runs_started >= max_runs FROM current), false) AS capped,
               claimed.*
        FROM (SELECT 1) AS one LEFT JOIN claimed ON true"""


_CLAIM = _claim_statement(counted=False)
_CLAIM_COUNTED = _claim_statement(counted=True)


class RunSessions:
    """The lock pool, sized to the runs a replica may have in flight."""

    def __init__(self, pool: Pool) -> None:
        self._pool = pool

    @classmethod
    async def open(cls, dsn: str, size: int) -> Self:
        return cls(await create_pool(dsn, min_size=1, max_size=size))

    async def close(self) -> None:
        await self._pool.close()

    @asynccontextmanager
    async def session(self) -> AsyncIterator[RunSession]:
        """A connection pinned for one run. asyncpg's reset on release also runs
        pg_advisory_unlock_all(): a safety net only, the runner unlocks explicitly."""
        async with self._pool.acquire() as connection:
            yield RunSession(connection)
