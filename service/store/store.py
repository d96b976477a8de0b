"""The one class that issues SQL. Every method returns frozen domain objects."""

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Self

import asyncpg

from service.domain.errors import Conflict
from service.domain.jobs import Job, JobState
from service.store.connection import Connection, Pool
from service.store.migrate import applied_versions, migrate
from service.store.rows import job_from_row

JOBS_CHANNEL = "tickgate_jobs"
_JOB_COLUMNS = (
    "name, lock_key, description, schedule, timezone, task, args, state, overlap,"
    " timeout_seconds, misfire_grace_seconds, created_at, updated_at, fire_after, version"
)
_INSERT_ATTEMPTS = 3

JobChangeFn = Callable[[Job | None], Job | None]


@dataclass(frozen=True)
class JobChange:
    before: Job | None
    after: Job | None

    @property
    def created(self) -> bool:
        return self.before is None and self.after is not None


@dataclass(frozen=True)
class JobFilter:
    state: JobState | None = None
    task: str | None = None
    prefix: str | None = None


async def _init_connection(connection: Connection) -> None:
    for jsontype in ("json", "jsonb"):
        await connection.set_type_codec(
            jsontype, encoder=json.dumps, decoder=json.loads, schema="pg_catalog"
        )


async def create_pool(dsn: str, min_size: int, max_size: int) -> Pool:
    return await asyncpg.create_pool(
        dsn, min_size=min_size, max_size=max_size, init=_init_connection
    )


class Store:
    """Owns the API pool and every statement run on it."""

    def __init__(self, pool: Pool) -> None:
        self._pool = pool

    @classmethod
    async def open(cls, dsn: str, *, min_size: int = 1, max_size: int = 10) -> Self:
        return cls(await create_pool(dsn, min_size, max_size))

    async def close(self) -> None:
        await self._pool.close()

    async def migrate(self) -> int:
        """Apply pending migrations; return how many were applied."""
        async with self._pool.acquire() as connection:
            return len(await migrate(connection))

    async def schema_versions(self) -> set[int]:
        async with self._pool.acquire() as connection:
            return await applied_versions(connection)

    async def get_job(self, name: str) -> Job | None:
        row = await self._pool.fetchrow(
            f"SELECT {_JOB_COLUMNS} FROM tickgate_jobs WHERE name = $1", name
        )
        return job_from_row(row) if row else None

    async def list_jobs(self, limit: int, after: str | None, where: JobFilter) -> list[Job]:
        """Jobs in name order, strictly after `after`."""
        rows = await self._pool.fetch(
            f"""SELECT {_JOB_COLUMNS} FROM tickgate_jobs
                WHERE ($1::text IS NULL OR name > $1)
                  AND ($2::text IS NULL OR state = $2)
                  AND ($3::text IS NULL OR task = $3)
                  AND ($4::text IS NULL OR starts_with(name, $4))
                ORDER BY name LIMIT $5""",
            after,
            where.state,
            where.task,
            where.prefix,
            limit,
        )
        return [job_from_row(row) for row in rows]

    async def mutate_job(self, name: str, change: JobChangeFn) -> JobChange:
        """Run `change` on the row-locked current job and write what it returns.

        `change` gets None for a missing job and returns None to delete. It may raise
        to abort; nothing is written then. Every write notifies the schedulers.
        """
        for _ in range(_INSERT_ATTEMPTS):
            try:
                return await self._mutate_once(name, change)
            except asyncpg.UniqueViolationError as error:
                if error.constraint_name == "tickgate_jobs_lock_key_unique":
                    msg = f"job {name!r} has the lock_key of an existing job; choose another name"
                    raise Conflict(msg) from error
                # A concurrent create of the same name won; run again on its row.
        raise Conflict(f"job {name!r} is being changed concurrently; retry")

    async def _mutate_once(self, name: str, change: JobChangeFn) -> JobChange:
        async with self._pool.acquire() as connection, connection.transaction():
            row = await connection.fetchrow(
                f"SELECT {_JOB_COLUMNS} FROM tickgate_jobs WHERE name = $1 FOR UPDATE", name
            )
            before = job_from_row(row) if row else None
            after = change(before)
            if after != before:
                await _write_job(connection, name, after, exists=before is not None)
                await connection.execute("SELECT pg_notify($1, $2)", JOBS_CHANNEL, name)
            return JobChange(before, after)


async def _write_job(connection: Connection, name: str, job: Job | None, *, exists: bool) -> None:
    if job is None:
        await connection.execute("DELETE FROM tickgate_jobs WHERE name = $1", name)
    elif exists:
        await connection.execute(
            f"""UPDATE tickgate_jobs SET ({_JOB_COLUMNS}) =
                ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)
                WHERE name = $1""",
            *_job_values(job),
        )
    else:
        await connection.execute(
            f"""INSERT INTO tickgate_jobs ({_JOB_COLUMNS})
                VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15)""",
            *_job_values(job),
        )


def _job_values(job: Job) -> tuple[object, ...]:
    return (
        job.name,
        job.lock_key,
        job.description,
        job.schedule.model_dump(mode="json"),
        job.timezone,
        job.task,
        job.args,
        job.state.value,
        job.overlap.value,
        job.timeout_seconds,
        job.misfire_grace_seconds,
        job.created_at,
        job.updated_at,
        job.fire_after,
        job.version,
    )
