"""The app gate's adapter: an app's scheduler hands a run time to `tickgate.apscheduler`,
which claims the tick here through the job's advisory lock and the ledger, then records
the run's end, on one connection held for the whole run (a session lock belongs to its
connection). The statements are in `gate_sql`.

Each database call answers within the link's deadline, or the connection is dropped
(never handed back to the pool with a lock it may still hold)."""

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Self
from uuid import UUID, uuid4

from asyncpg import InterfaceError, Record

from service.domain.jobs import Job, JobSpec, JobState, app_job
from service.domain.runs import RunStatus, SkipReason
from service.shielding import run_to_completion
from service.store import gate_sql
from service.store.base import create_pool, init_connection
from service.store.connection import Connection, Pool
from service.store.jobs import JobStore
from service.store.link import Link, deadline


class Claim(StrEnum):
    """What a claim of one tick found.

    claimed: the ledger row is this process's, and the run is its to make; decided: the
    tick has its row already (another process ran it, or is running it); held: another
    holder has the job's lock (a run of it elsewhere, or a Go replica sharing the key);
    inactive: the job is paused or completed (from the API); unknown: no app job has the
    name (deleted from the API: registering it again brings it back)."""

    CLAIMED = "claimed"
    DECIDED = "decided"
    HELD = "held"
    INACTIVE = "inactive"
    UNKNOWN = "unknown"


@dataclass(frozen=True)
class GateRun:
    """A claimed tick: its ledger row's id, and whether its lock is held for the run."""

    id: UUID
    job: str
    tick: datetime
    lock_key: int | None


async def _no_reset(_connection: Connection) -> None:
    """Connections come back with no lock held (or are dropped) and no open transaction:
    there is nothing to reset."""


class AppGate:
    """The gate's pool (its own, sized for the runs the app makes at once) and its jobs."""

    def __init__(self, pool: Pool, runner: str, link: Link | None = None) -> None:
        self._pool = pool
        self._jobs = JobStore(pool, link)
        self._link = link or Link()
        self.runner = runner

    @classmethod
    async def open(cls, dsn: str, runner: str, *, max_size: int = 10, migrate: bool = True) -> Self:
        link = Link()

        async def init(connection: Connection) -> None:
            await init_connection(connection)
            await link.tune(connection)

        pool = await create_pool(dsn, 0, max_size, _no_reset, init)
        gate = cls(pool, runner, link)
        if migrate:
            await gate._jobs.migrate()
        return gate

    async def close(self) -> None:
        await self._pool.close()

    async def register(self, name: str, spec: JobSpec) -> Job:
        """Make or update the app's job `name` (see `app_job`)."""
        now = await self._jobs.clock()
        change = await self._jobs.mutate_job(
            name, lambda current: app_job(current, name, spec, now)
        )
        assert change.after is not None  # app_job never deletes
        return change.after

    async def state(self, name: str) -> JobState | None:
        job = await self._jobs.get_job(name)
        return job.state if job is not None else None

    @asynccontextmanager
    async def session(self) -> AsyncIterator["GateSession"]:
        """One connection for one run: claim, run, record and unlock all on it. One that
        may still hold a lock (an unlock not confirmed) is dropped, never pooled."""
        connection = await asyncio.wait_for(self._pool.acquire(), self._link.statement_seconds)
        session = GateSession(connection, self.runner, self._link)
        try:
            yield session
        finally:
            if session.holds_lock:
                drop(connection)
            await self._pool.release(connection)


class GateSession:
    def __init__(self, connection: Connection, runner: str, link: Link) -> None:
        self._connection = connection
        self._runner = runner
        self._link = link
        self._held: int | None = None
        self._lost = False  # a call past its deadline dropped the connection

    @property
    def holds_lock(self) -> bool:
        """Whether the connection may still hold a lock: one taken and not confirmed
        released, or a connection dropped mid-call."""
        return self._held is not None or self._lost

    async def claim(
        self, job: str, tick: datetime, *, lock_key: int | None
    ) -> tuple[Claim, GateRun | None]:
        """Claim `tick` of `job`: with `lock_key`, only while this session holds that
        lock, kept for the run (released by `unlock`); without, by the ledger alone."""
        if lock_key is not None and not await self._try_lock(lock_key):
            return Claim.HELD, None
        run = GateRun(uuid4(), job, tick, lock_key)
        arguments = gate_sql.CLAIM.arguments(
            job=job, id=run.id, tick=tick, runner=self._runner, locked=lock_key is not None
        )
        found = await self._answer(gate_sql.CLAIM.text, *arguments)
        if found["claimed"]:
            return Claim.CLAIMED, run
        await self.unlock()
        if found["state"] is None:
            return Claim.UNKNOWN, None
        return (Claim.INACTIVE if found["state"] != JobState.ACTIVE else Claim.DECIDED), None

    async def finish(self, run: GateRun, status: RunStatus, error: str | None) -> None:
        arguments = gate_sql.FINISH.arguments(id=run.id, status=status.value, error=error)
        await self._fetchrow(gate_sql.FINISH.text, *arguments)

    async def skip(self, job: str, tick: datetime, reason: SkipReason, note: str) -> bool:
        """Record `tick` skipped for `reason` unless it has its row; whether it was."""
        arguments = gate_sql.SKIP.arguments(
            id=uuid4(), job=job, tick=tick, reason=reason.value, note=note, runner=self._runner
        )
        return await self._fetchrow(gate_sql.SKIP.text, *arguments) is not None

    async def unlock(self) -> None:
        """Release the lock this session holds, if any. Cancellation waits for the answer
        (the unlock is shielded); a release not confirmed leaves the lock counted as
        held, so the connection is dropped rather than pooled."""
        if self._held is None:
            return
        await run_to_completion(self._release(self._held))

    async def _release(self, key: int) -> None:
        released = await self._answer(gate_sql.UNLOCK, key)
        if released[0]:
            self._held = None

    async def _try_lock(self, key: int) -> bool:
        got = await self._answer(gate_sql.TRY_LOCK, key)
        if got[0]:
            self._held = key
        return bool(got[0])

    async def _fetchrow(self, text: str, *arguments: object) -> Record | None:
        with deadline(self._link.statement_seconds, self._drop, "gate"):
            return await self._connection.fetchrow(text, *arguments)

    async def _answer(self, text: str, *arguments: object) -> Record:
        """The row of a statement that always answers one."""
        row = await self._fetchrow(text, *arguments)
        assert row is not None, "the statement answers one row"
        return row

    def _drop(self) -> None:
        self._lost = True
        drop(self._connection)


def drop(connection: Connection) -> None:
    """Close `connection` at once, unless it is gone already: a pool connection lost
    meanwhile was released by its pool, which detached it from the proxy in hand."""
    with contextlib.suppress(InterfaceError):
        connection.terminate()
