"""Versioned migrations: `NNNN_name.sql` files applied in order, recorded in a table."""

import logging
import re
from dataclasses import dataclass
from importlib import resources

from service.domain.names import lock_key
from service.store.connection import Connection

log = logging.getLogger(__name__)

MIGRATION_LOCK_KEY = lock_key("tickgate:migrations")
_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str


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


async def migrate(connection: Connection, through: int | None = None) -> list[Migration]:
    """Apply every pending migration (up to version `through`, if given) in one
    transaction; return those applied.

    Replicas that start together all call this. The transaction-scoped advisory lock
    makes the losers wait (blocking is right here, unlike on the fire path); when the
    winner commits, they find nothing pending and return an empty list.
    """
    async with connection.transaction():
        await connection.execute("SELECT pg_advisory_xact_lock($1)", MIGRATION_LOCK_KEY)
        await connection.execute(
            """CREATE TABLE IF NOT EXISTS tickgate_schema_migrations (
                   version integer PRIMARY KEY,
                   name text NOT NULL,
                   applied_at timestamptz NOT NULL DEFAULT now())"""
        )
        applied = await applied_versions(connection)
        pending = [
            m
            for m in available_migrations()
            if m.version not in applied and (through is None or m.version <= through)
        ]
        for migration in pending:
            log.info("applying migration %04d_%s", migration.version, migration.name)
            await connection.execute(migration.sql)
            await connection.execute(
                "INSERT INTO tickgate_schema_migrations (version, name) VALUES ($1, $2)",
                migration.version,
                migration.name,
            )
    return pending


async def applied_versions(connection: Connection) -> set[int]:
    rows = await connection.fetch("SELECT version FROM tickgate_schema_migrations")
    return {row["version"] for row in rows}
