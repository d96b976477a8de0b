"""Real PostgreSQL for tests: one server per session, a migrated template, a clone per test."""

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from urllib.parse import urlsplit

import asyncpg

from harness.postgres import with_database
from service.store import Store


class TemplateDatabases:
    """Clones of one migrated template: CREATE DATABASE ... TEMPLATE is ~10 ms."""

    def __init__(self, server_url: str) -> None:
        self.server_url = server_url
        self.template = f"tickgate_tpl_{uuid.uuid4().hex[:12]}"

    def create_template(self) -> None:
        asyncio.run(self._create_template())

    async def _create_template(self) -> None:
        await self._admin(f'CREATE DATABASE "{self.template}"')
        store = await Store.open(with_database(self.server_url, self.template), max_size=1)
        try:
            await store.migrate()
        finally:
            await store.close()

    def drop_template(self) -> None:
        asyncio.run(self._admin(f'DROP DATABASE IF EXISTS "{self.template}" WITH (FORCE)'))

    async def clone(self) -> str:
        name = f"tickgate_test_{uuid.uuid4().hex[:12]}"
        await self._admin(f'CREATE DATABASE "{name}" TEMPLATE "{self.template}"')
        return name

    async def drop(self, name: str) -> None:
        await self._admin(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')

    @contextmanager
    def cloned_url(self) -> Iterator[str]:
        """The URL of a fresh clone, dropped afterwards: a database of its own for the
        real `tickgate serve` processes of a module (which are not in the test's loop)."""
        name = asyncio.run(self.clone())
        try:
            yield with_database(self.server_url, name)
        finally:
            asyncio.run(self.drop(name))

    async def _admin(self, statement: str) -> None:
        connection = await asyncpg.connect(self.server_url)
        try:
            await connection.execute(statement)
        finally:
            await connection.close()


async def advisory_lock_holders(database_url: str, key: int) -> list[int]:
    """Backend pids of the sessions holding the advisory lock on bigint `key` (classid =
    high 32 bits, objid = low 32 bits)."""
    connection = await asyncpg.connect(database_url)
    try:
        rows = await connection.fetch(
            """SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted
               AND classid = (($1::bigint >> 32) & 4294967295)::oid
               AND objid = ($1::bigint & 4294967295)::oid""",
            key,
        )
        return [row["pid"] for row in rows]
    finally:
        await connection.close()


async def blocks_someone(connection: asyncpg.Connection) -> bool:
    """Whether another backend waits on a lock this connection's transaction holds: the
    interleaving a race test drives has then been reached, not hoped for."""
    waiting = await connection.fetchval(
        "SELECT count(*) FROM pg_stat_activity WHERE pg_backend_pid() = ANY(pg_blocking_pids(pid))"
    )
    return bool(waiting)


async def advisory_locks_on(database_url: str, key: int) -> int:
    """How many sessions hold the advisory lock on bigint `key`."""
    return len(await advisory_lock_holders(database_url, key))


async def advisory_locks_in(database_url: str) -> tuple[int, int]:
    """Advisory locks held in the database, and how many sessions hold them."""
    connection = await asyncpg.connect(database_url)
    try:
        row = await connection.fetchrow(
            """SELECT count(*) AS locks, count(DISTINCT pid) AS sessions FROM pg_locks
               WHERE locktype = 'advisory' AND granted
                 AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"""
        )
        assert row is not None
        return row["locks"], row["sessions"]
    finally:
        await connection.close()


@asynccontextmanager
async def refusing_connections(database_url: str) -> AsyncIterator[None]:
    """The database refuses new connections (superusers too) for the block; those open
    stay open."""
    database = urlsplit(database_url).path.lstrip("/")
    # From another database: PostgreSQL refuses this for the one a session is on.
    connection = await asyncpg.connect(with_database(database_url, "postgres"))
    try:
        await connection.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS false')
        try:
            yield
        finally:
            await connection.execute(f'ALTER DATABASE "{database}" ALLOW_CONNECTIONS true')
    finally:
        await connection.close()


async def role_url(url: str, role: str) -> str:
    """`url` as `role`: a login role (made if missing, by the server's superuser) that is
    not a superuser and has no right on anything it does not own, as an operator gives
    the sql task (#42). Its password is its name."""
    connection = await asyncpg.connect(url)
    try:
        await connection.execute(
            f"""DO $$ BEGIN CREATE ROLE "{role}" LOGIN NOSUPERUSER PASSWORD '{role}';
            EXCEPTION WHEN duplicate_object THEN NULL; END $$"""
        )
    finally:
        await connection.close()
    parts = urlsplit(url)
    return parts._replace(netloc=f"{role}:{role}@{parts.netloc.rsplit('@', 1)[-1]}").geturl()
