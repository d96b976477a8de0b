"""Versioned migrations: `NNNN_name.sql` files applied in order, each recorded in a table
by version, name and checksum.

Startup refuses a database whose record disagrees with this release's files: a migration
applied whose file has changed since (its checksum differs), or one this release does
not know (a newer release's, another branch's). A migration renumbered on a merge is
recognised by its name (RENUMBERED) and recorded again under its new number, so the one
it skipped runs.

Each pending migration runs in a transaction of its own, waiting at most `lock_timeout`
for each table lock, and is tried again after a pause if a wait ran out: while it waits
for an exclusive lock every other session's lock on that table queues behind it, and
during a rolling upgrade those are the old replicas' claims.
"""

import asyncio
import hashlib
import logging
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from importlib import resources

import asyncpg

from service.config import ConfigurationError
from service.domain.names import lock_key
from service.store import migrate_sql
from service.store.connection import Connection

log = logging.getLogger(__name__)

Step = Callable[[Connection], Awaitable[None]]

MIGRATION_LOCK_KEY = lock_key("tickgate:migrations")
_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")

# Migrations renumbered after databases had applied them: (old version, name) -> new
# version. 0011_next_ticks became 0012 when the labels branch, which took 0011, was
# merged (1c1d25e); a database of the branch before the merge recorded it as 11.
RENUMBERED: dict[tuple[int, str], int] = {(11, "next_ticks"): 12}


class MigrationError(ConfigurationError):
    """The database's migrations disagree with this release, or one could not take its
    locks: startup stops with this one line, naming the migration."""


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def label(self) -> str:
        return f"{self.version:04d}_{self.name}"

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


@dataclass(frozen=True)
class ShortLocks:
    """How a migration waits for its locks: at most `timeout_seconds` per lock, then it
    rolls back and is tried again after a pause (doubling from `pause_seconds` up to
    `max_pause_seconds`), at most `tries` times in all."""

    # Below the fire path's own lock_timeout (a tenth of the 30 s link: 3 s, see
    # service/store/link.py), so an old replica's claim queued behind a waiting
    # migration is let through before its own wait runs out.
    timeout_seconds: float = 1.0
    tries: int = 30
    pause_seconds: float = 0.2
    max_pause_seconds: float = 2.0

    def pause(self, attempt: int) -> float:
        return float(min(self.pause_seconds * 2**attempt, self.max_pause_seconds))


SHORT_LOCKS = ShortLocks()


@dataclass(frozen=True)
class Applied:
    """A row of tickgate_schema_migrations."""

    version: int
    name: str
    checksum: str | None

    @property
    def label(self) -> str:
        return f"{self.version:04d}_{self.name}"


def available_migrations() -> list[Migration]:
    folder = resources.files("service.store") / "migrations"
    found = []
    for entry in folder.iterdir():
        match = _FILE.match(entry.name)
        if match:
            found.append(Migration(int(match[1]), match[2], entry.read_text()))
    return sorted(found, key=lambda m: m.version)


def head_version() -> int:
    return available_migrations()[-1].version


async def migrate(
    connection: Connection,
    through: int | None = None,
    *,
    migrations: Sequence[Migration] | None = None,
    locks: ShortLocks = SHORT_LOCKS,
) -> list[Migration]:
    """Check the migrations applied against `migrations` (this release's files by
    default), then apply each pending one (up to version `through`, if given) in a
    transaction of its own; return those applied. Raises MigrationError on a record
    that disagrees with the files, or a migration that could not take its locks.

    Replicas that start together all call this: the session advisory lock makes the
    losers wait, and they find nothing pending. The lock is released before returning,
    whatever happens; a caller whose connection may have broken must not give it back
    to a pool (see StoreBase.migrate)."""
    known = list(available_migrations() if migrations is None else migrations)
    await connection.execute(migrate_sql.LOCK, MIGRATION_LOCK_KEY)
    try:
        await _in_short_locks(connection, locks, "the record of migrations", _bootstrap)
        applied = await _checked_record(connection, known)
        pending = [m for m in known if m.version not in applied and _within(m, through)]
        for migration in pending:
            await _apply(connection, migration, locks)
        return pending
    finally:
        if not connection.is_closed():  # a broken link's error is the one to raise
            await connection.execute(migrate_sql.UNLOCK, MIGRATION_LOCK_KEY)


def _within(migration: Migration, through: int | None) -> bool:
    return through is None or migration.version <= through


async def _bootstrap(connection: Connection) -> None:
    await connection.execute(migrate_sql.BOOTSTRAP)


async def _checked_record(connection: Connection, known: list[Migration]) -> set[int]:
    """The versions applied, once renumbered migrations are recorded under their new
    numbers, every applied one is known and unchanged, and checksums missing are filled."""
    await _renumber(connection, known)
    applied = [Applied(**row) for row in await connection.fetch(migrate_sql.APPLIED)]
    problems = [problem for a in applied if (problem := _disagreement(a, known))]
    if problems:
        raise MigrationError(
            "refusing to start: the database's migrations disagree with this release's: "
            + "; ".join(problems)
        )
    await _trust_on_first_use(connection, applied, known)
    return {a.version for a in applied}


async def _renumber(connection: Connection, known: list[Migration]) -> None:
    by_version = {m.version: m for m in known}
    for (old, name), new in RENUMBERED.items():
        target = by_version.get(new)
        if target is None or target.name != name:
            continue
        renumbering = migrate_sql.RENUMBER
        arguments = renumbering.arguments(old=old, name=name, new=new)
        status = await connection.execute(renumbering.text, *arguments)
        if status == "UPDATE 1":
            log.warning(
                "migration %04d_%s was renumbered %s on a merge: recorded again under %d, "
                "and the migration now numbered %d is applied if it is not yet",
                old,
                name,
                target.label,
                new,
                old,
            )


def _disagreement(applied: Applied, known: list[Migration]) -> str | None:
    """Why an applied migration disagrees with this release's files, if it does."""
    match = next((m for m in known if m.version == applied.version), None)
    newest = known[-1] if known else None
    if match is None and newest is not None and applied.version > newest.version:
        return (
            f"migration {applied.label} is applied but unknown to this release, whose "
            f"newest is {newest.label}: a newer release migrated this database"
        )
    if match is None or match.name != applied.name:
        here = f"has {match.label}" if match else "has no migration"
        return (
            f"migration {applied.label} is applied but unknown to this release, which "
            f"{here} at version {applied.version}: another branch migrated this database"
        )
    if applied.checksum is not None and applied.checksum != match.checksum:
        return (
            f"migration {applied.label} was applied from a file that differs from this "
            f"release's (checksum {applied.checksum[:12]} recorded, {match.checksum[:12]} "
            "now): a migration must never be edited once applied"
        )
    return None


async def _trust_on_first_use(
    connection: Connection, applied: list[Applied], known: list[Migration]
) -> None:
    unchecked = {a.version for a in applied if a.checksum is None}
    if not unchecked:
        return
    files = [m for m in known if m.version in unchecked]
    trusting = migrate_sql.TRUST_ON_FIRST_USE
    checksums = [(m.version, m.checksum) for m in files]
    await connection.execute(trusting.text, *trusting.arguments(files=checksums))
    log.info("recorded the checksums of %d migrations applied before they were kept", len(files))


async def _apply(connection: Connection, migration: Migration, locks: ShortLocks) -> None:
    async def apply(connection: Connection) -> None:
        await connection.execute(migration.sql)
        await connection.execute(
            migrate_sql.RECORD, migration.version, migration.name, migration.checksum
        )

    log.info("applying migration %s", migration.label)
    await _in_short_locks(connection, locks, f"migration {migration.label}", apply)


async def _in_short_locks(connection: Connection, locks: ShortLocks, what: str, step: Step) -> None:
    """`step` in a transaction of its own whose lock waits are short, tried again after
    a pause while a wait runs out, at most `locks.tries` times."""
    for attempt in range(1, locks.tries + 1):
        try:
            return await _in_one_transaction(connection, locks, step)
        except asyncpg.LockNotAvailableError:
            if attempt == locks.tries:
                break
            pause = locks.pause(attempt - 1)
            log.warning(
                "%s waited %.1f s for a lock others hold: let them through, again in %.1f s",
                *(what, locks.timeout_seconds, pause),
            )
            await asyncio.sleep(pause)
    raise MigrationError(
        f"{what} could not take its locks in {locks.tries} tries of {locks.timeout_seconds} s: "
        "a long transaction holds a lock on its tables (see pg_locks and pg_stat_activity); "
        "startup stops, and the next start tries again"
    )


async def _in_one_transaction(connection: Connection, locks: ShortLocks, step: Step) -> None:
    async with connection.transaction():
        wait = f"{round(locks.timeout_seconds * 1000)}ms"
        await connection.execute(migrate_sql.SHORT_LOCK_WAIT, wait)
        await step(connection)


async def migrate_database(dsn: str) -> list[Migration]:
    """`migrate` on a connection of its own, closed afterwards (the migrators' session
    lock with it, whatever happened)."""
    connection = await asyncpg.connect(dsn)
    try:
        return await migrate(connection)
    finally:
        await connection.close()


async def applied_versions(connection: Connection) -> set[int]:
    rows = await connection.fetch(migrate_sql.VERSIONS)
    return {row["version"] for row in rows}
