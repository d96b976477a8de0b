"""Migrations an operator can trust, on real PostgreSQL: a database as an older release or
branch left it is brought forward with its jobs; an edited or unknown migration stops
startup with its name; a migration waiting for a lock lets the running replicas' claims
through."""

import asyncio
import logging
import os
import subprocess
import sys
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import replace
from datetime import timedelta
from uuid import uuid4

import asyncpg
import pytest

from harness.postgres import with_database
from harness.waiting import eventually_async
from service.config import ConfigurationError, Listen, Settings
from service.domain.jobs import JobSpec, create_job
from service.domain.runs import RunStatus, RunTrigger
from service.server import serve_app
from service.stopping import StopRequest
from service.store import Store
from service.store.base import init_connection
from service.store.link import Link
from service.store.migrate import (
    MIGRATION_LOCK_KEY,
    SHORT_LOCKS,
    Migration,
    MigrationError,
    ShortLocks,
    available_migrations,
    migrate,
)
from service.store.ports import ClaimOutcome, TickClaim
from service.store.rows import JOB_COLUMNS, job_values
from tests.support.db import TemplateDatabases, advisory_locks_on
from tests.support.fire import EVERY_SECOND, lock_pool, runs_of, tick_now

# 1fbbe32's record of migrations, and its migrate(): every pending file in one
# transaction, recorded by version and name alone.
_OLD_RECORD_TABLE = """CREATE TABLE IF NOT EXISTS tickgate_schema_migrations (
    version integer PRIMARY KEY,
    name text NOT NULL,
    applied_at timestamptz NOT NULL DEFAULT now())"""
_OLD_RECORD = "INSERT INTO tickgate_schema_migrations (version, name) VALUES ($1, $2)"
_OLD_LOCK = "SELECT pg_advisory_xact_lock($1)"

# The job columns 1fbbe32 wrote, and a run row as its claim statement wrote one.
_JOB_COLUMNS_OF_1FBBE32 = [
    "name",
    "lock_key",
    "description",
    "schedule",
    "timezone",
    "task",
    "args",
    "state",
    "overlap",
    "timeout_seconds",
    "misfire_grace_seconds",
    "created_at",
    "updated_at",
    "fire_after",
    "version",
    "retry",
    "start_at",
    "end_at",
    "max_runs",
    "jitter_seconds",
    "catchup",
    "pause_note",
    "runs_started",
    "incarnation",
    "managed_by",
    "labels",
    "capture",
    "hooks",
    "default_hooks",
]
_OLD_JOB = f"""INSERT INTO tickgate_jobs ({", ".join(_JOB_COLUMNS_OF_1FBBE32)})
    VALUES ({", ".join(f"${n}" for n in range(1, len(_JOB_COLUMNS_OF_1FBBE32) + 1))})"""
_OLD_RUN = """INSERT INTO tickgate_runs (id, job, scheduled_for, trigger, status, started_at,
        finished_at, duration_ms, attempts, runner, job_version, lock_key, locked, backend_pid)
    SELECT gen_random_uuid(), name, $2, 'schedule', 'succeeded', clock_timestamp(),
        clock_timestamp(), 0, 1, 'old', version, lock_key, false, 0
    FROM tickgate_jobs WHERE name = $1"""
_CURSOR = "SELECT tick FROM tickgate_cursors WHERE job = $1"
_RECORDED = "SELECT version, name, checksum FROM tickgate_schema_migrations ORDER BY version"

# The texts of 0004 and 0014 as first committed (b96b793, 186ac91): what the edits
# (bbc8359, 08239ce) added, taken out again.
_FIRST_TEXTS = {
    4: ("DROP INDEX tickgate_runs_running;\n", ""),
    14: (") WITH (fillfactor = 50);", ");"),
}
_INDEX_EXISTS = "SELECT to_regclass('tickgate_runs_running') IS NOT NULL"
_CURSORS_OPTIONS = "SELECT reloptions FROM pg_class WHERE relname = 'tickgate_cursors'"


def as_first_committed(migration: Migration) -> Migration:
    if migration.version not in _FIRST_TEXTS:
        return migration
    edited, first = _FIRST_TEXTS[migration.version]
    assert edited in migration.sql
    return Migration(migration.version, migration.name, migration.sql.replace(edited, first))


def files_through(version: int) -> list[Migration]:
    return [m for m in available_migrations() if m.version <= version]


async def migrate_as_1fbbe32(
    connection: asyncpg.Connection, migrations: Sequence[Migration]
) -> None:
    async with connection.transaction():
        await connection.execute(_OLD_LOCK, MIGRATION_LOCK_KEY)
        await connection.execute(_OLD_RECORD_TABLE)
        for migration in migrations:
            await connection.execute(migration.sql)
            await connection.execute(_OLD_RECORD, migration.version, migration.name)


@asynccontextmanager
async def empty_database(templates: TemplateDatabases) -> AsyncIterator[str]:
    name = f"tickgate_mig_{uuid4().hex[:12]}"
    await templates._admin(f'CREATE DATABASE "{name}"')
    try:
        yield with_database(templates.server_url, name)
    finally:
        await templates.drop(name)


@asynccontextmanager
async def connected(url: str) -> AsyncIterator[asyncpg.Connection]:
    connection = await asyncpg.connect(url)
    try:
        yield connection
    finally:
        await connection.close()


async def recorded(url: str) -> list[tuple[int, str, str | None]]:
    async with connected(url) as connection:
        return [tuple(row) for row in await connection.fetch(_RECORDED)]


def as_files_say() -> list[tuple[int, str, str | None]]:
    return [(m.version, m.name, m.checksum) for m in available_migrations()]


async def test_a_database_of_1fbbe32_is_brought_forward_and_its_job_fires(
    templates: TemplateDatabases,
) -> None:
    """Migrated by 1fbbe32 (0001..0025, recorded without checksums), holding a job with a
    run: the new migrator applies what is new, records every checksum, and the job
    reads, keeps its run and its cursor, and its next tick is claimed."""
    async with empty_database(templates) as url:
        made = create_job("old", JobSpec(schedule=EVERY_SECOND, task="log", args={}), tick_now())
        async with connected(url) as connection:
            await init_connection(connection)
            await migrate_as_1fbbe32(connection, files_through(25))
            values = dict(zip(JOB_COLUMNS.split(", "), job_values(made), strict=True))
            await connection.execute(_OLD_JOB, *(values[c] for c in _JOB_COLUMNS_OF_1FBBE32))
            assert made.first_tick is not None
            await connection.execute(_OLD_RUN, "old", made.first_tick - timedelta(seconds=5))
            cursor = await connection.fetchval(_CURSOR, "old")
            assert cursor is not None
        store = await Store.open(url, max_size=2)
        try:
            newer = [m for m in available_migrations() if m.version > 25]
            assert await store.migrate() == len(newer)
            assert await recorded(url) == as_files_say()
            [job] = await store.get_jobs(["old"])
            assert (job.name, job.version, job.incarnation) == ("old", 1, made.incarnation)
            assert await store.cursor("old") == cursor
            async with lock_pool(url, 1) as sessions, sessions.session(5) as session:
                [claimed] = await session.claim(
                    [TickClaim(job, made.first_tick, RunTrigger.SCHEDULE, "r", uuid4(), True)]
                )
            assert claimed.outcome is ClaimOutcome.CLAIMED
            runs = await runs_of(store, "old")
            assert sorted(r.status for r in runs) == [RunStatus.RUNNING, RunStatus.SUCCEEDED]
            assert await store.migrate() == 0
        finally:
            await store.close()


async def test_a_database_migrated_between_the_edits_of_0004_and_0014_is_repaired(
    templates: TemplateDatabases,
) -> None:
    """0004 and 0014 were edited after their first commit; a database that applied the
    first texts kept the index of running rows by start (scanned on every claim) and a
    cursor table packed full. Their checksums were never recorded, so they cannot be told
    apart: migration 0032 repairs what the edits changed."""
    async with empty_database(templates) as url:
        first_texts = [as_first_committed(m) for m in files_through(25)]
        async with connected(url) as connection:
            await migrate_as_1fbbe32(connection, first_texts)
            assert await connection.fetchval(_INDEX_EXISTS)
            assert await connection.fetchval(_CURSORS_OPTIONS) is None
            await migrate(connection)
            assert not await connection.fetchval(_INDEX_EXISTS)
            assert await connection.fetchval(_CURSORS_OPTIONS) == ["fillfactor=50"]
        assert await recorded(url) == as_files_say()


async def test_a_database_of_the_renumbered_branch_is_brought_forward(
    templates: TemplateDatabases,
) -> None:
    """The dash branch recorded the next-tick book as 0011_next_ticks; the merge made it
    0012 and gave 0011 to labels. Recorded by version alone, such a database skipped
    0011_labels and failed on 0012's CREATE TABLE; now it is recorded again under 12 and
    gets the labels it skipped."""
    async with empty_database(templates) as url:
        [next_ticks] = [m for m in available_migrations() if m.name == "next_ticks"]
        branch = [*files_through(10), Migration(11, "next_ticks", next_ticks.sql)]
        async with connected(url) as connection:
            await migrate_as_1fbbe32(connection, branch)
            applied = await migrate(connection)
            assert [m.version for m in applied][:2] == [11, 13]
            labels = await connection.fetchval(
                """SELECT count(*) FROM information_schema.columns
                   WHERE table_name = 'tickgate_jobs' AND column_name = 'labels'"""
            )
            assert labels == 1
        assert await recorded(url) == as_files_say()


async def test_an_edited_migration_stops_startup_naming_it(store: Store, database_url: str) -> None:
    async with connected(database_url) as connection:
        await connection.execute(
            "UPDATE tickgate_schema_migrations SET checksum = repeat('0', 64) WHERE version = 4"
        )
    with pytest.raises(MigrationError, match="0004_tick_accounting was applied from a file"):
        await store.migrate()
    # The refusal holds no lock: the next start (here, once the record is right) goes on.
    assert await advisory_locks_on(database_url, MIGRATION_LOCK_KEY) == 0
    async with connected(database_url) as connection:
        [version_4] = [m for m in available_migrations() if m.version == 4]
        await connection.execute(
            "UPDATE tickgate_schema_migrations SET checksum = $1 WHERE version = 4",
            version_4.checksum,
        )
    assert await store.migrate() == 0


@pytest.mark.parametrize(
    ("change", "named"),
    [
        (
            "INSERT INTO tickgate_schema_migrations (version, name) VALUES (9999, 'future')",
            "9999_future is applied but unknown to this release, whose newest is",
        ),
        (
            "UPDATE tickgate_schema_migrations SET name = 'other_labels' WHERE version = 11",
            "0011_other_labels is applied but unknown to this release, which has 0011_labels",
        ),
    ],
)
async def test_an_unknown_migration_stops_startup_naming_it(
    store: Store, database_url: str, change: str, named: str
) -> None:
    async with connected(database_url) as connection:
        await connection.execute(change)
    with pytest.raises(MigrationError, match=named):
        await store.migrate()


def test_tickgate_migrate_reports_a_refused_migration_in_one_line(
    templates: TemplateDatabases,
) -> None:
    """What the operator sees: `tickgate migrate` exits 2 with one line naming the
    migration, no traceback."""
    with templates.cloned_url() as url:
        asyncio.run(_set_checksum(url, 14, "f" * 64))
        environment = os.environ | {"DATABASE_URL": url, "TICKGATE_LOG_FORMAT": "text"}
        done = subprocess.run(
            [sys.executable, "-m", "service", "migrate"],
            check=False,
            env=environment,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 2, done.stderr
        assert "0014_cursors was applied from a file that differs" in done.stderr
        assert "Traceback" not in done.stderr


def test_serve_refuses_before_serving(templates: TemplateDatabases) -> None:
    """`tickgate serve` checks the migrations before uvicorn starts: the refusal is a
    ConfigurationError, which the command line reports in one line (exit 2), not a
    lifespan traceback."""
    with templates.cloned_url() as url:
        asyncio.run(_set_checksum(url, 14, "f" * 64))
        settings = Settings(database_url=url, scheduler=False, runner_id="refused")
        with pytest.raises(ConfigurationError, match="0014_cursors was applied from a file"):
            serve_app(settings, Listen("127.0.0.1", 0), StopRequest())


async def _set_checksum(url: str, version: int, checksum: str) -> None:
    async with connected(url) as connection:
        await connection.execute(
            "UPDATE tickgate_schema_migrations SET checksum = $2 WHERE version = $1",
            version,
            checksum,
        )


# A migration that needs tickgate_jobs' exclusive lock, after this release's files.
_PROBE = Migration(9001, "lock_probe", "ALTER TABLE tickgate_jobs ADD COLUMN lock_probe integer")
_WAITING_FOR_JOBS = """SELECT EXISTS (SELECT 1 FROM pg_locks
    WHERE pid = $1 AND NOT granted AND relation = 'tickgate_jobs'::regclass)"""


async def test_a_migration_waiting_for_a_lock_lets_claims_through_then_applies(
    database_url: str, caplog: pytest.LogCaptureFixture
) -> None:
    """While a long transaction holds tickgate_jobs, the migration that must alter it
    waits at most its lock_timeout at a time: a claim queued behind it, which waits no
    longer than the fire path's own lock_timeout, gets through. Once the transaction ends,
    the migration is applied and recorded."""
    locks = replace(SHORT_LOCKS, tries=1000, pause_seconds=0.05, max_pause_seconds=0.1)
    fire_path = Link().server_settings(quiet_ends=False, fire_path=True)
    async with (
        connected(database_url) as holder,
        connected(database_url) as migrator,
        connected(database_url) as claimant,
    ):
        reading = holder.transaction()
        await reading.start()
        await holder.execute("LOCK TABLE tickgate_jobs IN ACCESS SHARE MODE")
        applying = asyncio.create_task(
            migrate(migrator, migrations=[*available_migrations(), _PROBE], locks=locks)
        )
        pid = migrator.get_server_pid()

        async def waiting() -> bool:
            return bool(await claimant.fetchval(_WAITING_FOR_JOBS, pid))

        await eventually_async(waiting, 10, "the migration waiting for tickgate_jobs")
        await claimant.execute(f"SET lock_timeout = {fire_path['lock_timeout']}")
        with caplog.at_level(logging.WARNING, logger="service.store.migrate"):
            # Takes a lock the migration's queued request conflicts with, as a claim does.
            await claimant.execute("UPDATE tickgate_jobs SET description = description")
            assert not applying.done()
            await reading.commit()
            assert await asyncio.wait_for(applying, 30) == [_PROBE]
        assert "migration 9001_lock_probe waited 1.0 s" in caplog.text
        assert await claimant.fetchval("SELECT count(lock_probe) FROM tickgate_jobs") == 0
        assert (9001, "lock_probe", _PROBE.checksum) in await recorded(database_url)


async def test_a_migration_that_never_gets_its_locks_stops_startup_naming_it(
    database_url: str,
) -> None:
    locks = ShortLocks(timeout_seconds=0.1, tries=2, pause_seconds=0.05)
    async with connected(database_url) as holder, connected(database_url) as migrator:
        async with holder.transaction():
            await holder.execute("LOCK TABLE tickgate_jobs IN ACCESS SHARE MODE")
            with pytest.raises(MigrationError, match="migration 9001_lock_probe could not take"):
                await migrate(migrator, migrations=[*available_migrations(), _PROBE], locks=locks)
        assert await advisory_locks_on(database_url, MIGRATION_LOCK_KEY) == 0
        assert 9001 not in [version for version, _, _ in await recorded(database_url)]
