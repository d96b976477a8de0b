"""The API pool and what every part of the store shares: bounded calls on it, the
database's clock and the migrations."""

import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Any, Self

import asyncpg

from service.domain.hooks import HookPlan
from service.store import migrate_sql, session_sql
from service.store.connection import Connection, Pool
from service.store.link import Link, deadline
from service.store.migrate import applied_versions, migrate
from service.store.rows import Encoded, SharedParts


async def init_connection(connection: Connection) -> None:
    # JIT compiling pays off for long analytic queries only; Tickgate's statements are
    # short, and under JIT asyncpg's type introspection of a new connection took about
    # a second wherever asyncpg's own guard does not reach. Set here rather than as a
    # startup parameter, which PgBouncer refuses; neither pool's reset undoes it.
    await connection.execute(session_sql.NO_JIT)
    for jsontype in ("json", "jsonb"):
        await connection.set_type_codec(
            jsontype, encoder=encode_json, decoder=json.loads, schema="pg_catalog"
        )


def encode_json(value: object) -> str:
    """A value as JSON text; `Encoded` is that already."""
    return value.text if isinstance(value, Encoded) else json.dumps(value)


ConnectionHook = Callable[[Connection], Awaitable[None]]
ConnectionInit = Callable[[Connection], Coroutine[Any, Any, None]]


async def create_pool(
    dsn: str,
    min_size: int,
    max_size: int,
    reset: ConnectionHook,
    init: ConnectionInit = init_connection,
) -> Pool:
    return await asyncpg.create_pool(
        dsn, min_size=min_size, max_size=max_size, init=init, reset=reset
    )


async def _stateless_reset(_connection: Connection) -> None:
    """The API pool keeps no session state (no SET, LISTEN or session lock; asyncpg
    rolls back any open transaction itself), so it skips asyncpg's reset query: one
    round trip fewer per request."""


class StoreBase:
    """Owns the API pool. Every call through `_bounded` answers within the link's
    `statement_seconds` (the wait for a connection included) or raises; past the deadline
    the connection is dropped, not returned to the pool, so a silent link never hangs it."""

    def __init__(self, pool: Pool, link: Link | None = None, hooks: HookPlan | None = None) -> None:
        self._pool = pool
        self._link = link or Link()
        self._shared = SharedParts()
        # The cluster's default hooks: the skips and abandoned runs written here get them.
        self._hooks = hooks or HookPlan()

    @classmethod
    async def open(
        cls,
        dsn: str,
        *,
        min_size: int = 1,
        max_size: int = 10,
        link: Link | None = None,
        hooks: HookPlan | None = None,
    ) -> Self:
        link = link or Link()

        async def init(connection: Connection) -> None:
            await init_connection(connection)
            await link.tune(connection)  # keepalives: pool connections never heartbeat

        return cls(await create_pool(dsn, min_size, max_size, _stateless_reset, init), link, hooks)

    @asynccontextmanager
    async def _bounded(self, seconds: float | None = None) -> AsyncIterator[Connection]:
        """A pool connection for one call that ends within `seconds` (by default the
        link's `statement_seconds`), the wait for the connection included."""
        seconds = seconds or self._link.statement_seconds
        ends_at = time.monotonic() + seconds
        async with self._pool.acquire(timeout=seconds) as connection:
            left = max(ends_at - time.monotonic(), 0.001)
            with deadline(left, connection.terminate, "statement"):
                yield connection

    async def close(self) -> None:
        await self._pool.close()

    async def migrate(self, through: int | None = None) -> int:
        """Apply pending migrations (up to version `through`: a database as an older
        release left it, for tests); return how many were applied."""
        async with self._pool.acquire() as connection:
            try:
                return len(await migrate(connection, through))
            except BaseException:
                # It may still hold the migrators' session lock (an unlock cut short):
                # dropped, never handed to the next borrower, which the pool does not reset.
                connection.terminate()
                raise

    async def schema_versions(self) -> set[int]:
        async with self._pool.acquire() as connection:
            return await applied_versions(connection)

    async def clock(self) -> datetime:
        """The database's clock: the one time every replica agrees on."""
        async with self._bounded() as connection:
            now: datetime = await connection.fetchval(session_sql.CLOCK)
        return now

    async def schema_version(self, within: float | None = None) -> int:
        """The newest migration applied; doubles as the readiness ping, answered
        `within` seconds."""
        async with self._bounded(within) as connection:
            version: int | None = await connection.fetchval(migrate_sql.NEWEST)
        return version or 0
