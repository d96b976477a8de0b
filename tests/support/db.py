"""Real PostgreSQL for tests: one server per session, a migrated template, a clone per test."""

import asyncio
import uuid
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from service.store import Store


def with_database(url: str, database: str) -> str:
    """`url` pointing at another database on the same server."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{database}"))


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

    async def _admin(self, statement: str) -> None:
        connection = await asyncpg.connect(self.server_url)
        try:
            await connection.execute(statement)
        finally:
            await connection.close()


async def advisory_locks_on(database_url: str, key: int) -> int:
    """Sessions holding the advisory lock on bigint `key` (classid = high 32 bits,
    objid = low 32 bits)."""
    connection = await asyncpg.connect(database_url)
    try:
        count: int = await connection.fetchval(
            """SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted
               AND classid = (($1::bigint >> 32) & 4294967295)::oid
               AND objid = ($1::bigint & 4294967295)::oid""",
            key,
        )
        return count
    finally:
        await connection.close()
