"""A blocking asyncpg connection for sync tests that read the database as they go."""

import asyncio
from typing import Any

import asyncpg


class Sql:
    """A blocking asyncpg connection for sync tests: a private event loop run per call."""

    def __init__(self, dsn: str) -> None:
        self._loop = asyncio.new_event_loop()
        try:
            self._connection: asyncpg.Connection = self._loop.run_until_complete(
                asyncpg.connect(dsn)
            )
        except BaseException:
            self._loop.close()
            raise

    def fetch(self, query: str, *args: object) -> list[asyncpg.Record]:
        return self._loop.run_until_complete(self._connection.fetch(query, *args))

    def value(self, query: str, *args: object) -> Any:
        return self._loop.run_until_complete(self._connection.fetchval(query, *args))

    def close(self) -> None:
        try:
            self._loop.run_until_complete(self._connection.close())
        finally:
            self._loop.close()
