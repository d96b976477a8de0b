"""Shared fixtures: a real PostgreSQL (embedded unless TICKGATE_TEST_DATABASE_URL is set)."""

import asyncio
import os
import tempfile
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import asyncpg
import httpx
import pytest

from harness.postgres import EmbeddedServer, Sql, with_database
from harness.receiver import Receiver, receiving
from service.config import Settings
from service.store import Store
from tests.support.db import TemplateDatabases
from tests.support.inprocess import served

# The slow folders: whatever starts a real `tickgate serve`, a browser, PgBouncer, Helm,
# npm tools or a wheel build, and the injected faults. Marked here by folder (a folder
# and everything under it), so that a new test file there cannot join the fast loop
# (`make check`: `-m "not acceptance"`) by forgetting its mark; nothing else marks it.
SLOW_FOLDERS = ("acceptance", "faults", "fuzz", "deploy/slow")


def _is_slow(folder: tuple[str, ...]) -> bool:
    return any(folder[: len(slow.split("/"))] == tuple(slow.split("/")) for slow in SLOW_FOLDERS)


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    tests = Path(__file__).parent
    for item in items:
        if _is_slow(item.path.relative_to(tests).parent.parts):
            item.add_marker(pytest.mark.acceptance)


@pytest.fixture(scope="session")
def server_url() -> Iterator[str]:
    configured = os.environ.get("TICKGATE_TEST_DATABASE_URL")
    if configured:
        yield configured
        return
    # Not under pytest's numbered temp dirs: a concurrent pytest session prunes those.
    embedded = EmbeddedServer(Path(tempfile.mkdtemp(prefix="tickgate-pg-")))
    try:
        asyncio.run(_no_durability(embedded.url))
        yield embedded.url
    finally:
        embedded.close()


async def _no_durability(url: str) -> None:
    """A throwaway server need not survive a crash of the machine: no fsync, no waiting
    for the WAL to reach the disk at commit (what a commit makes visible is unchanged)."""
    connection = await asyncpg.connect(url)
    try:
        for setting in ("fsync", "synchronous_commit", "full_page_writes"):
            await connection.execute(f"ALTER SYSTEM SET {setting} = off")
        await connection.execute("SELECT pg_reload_conf()")
    finally:
        await connection.close()


@pytest.fixture(scope="session")
def templates(server_url: str) -> Iterator[TemplateDatabases]:
    databases = TemplateDatabases(server_url)
    databases.create_template()
    try:
        yield databases
    finally:
        databases.drop_template()


@pytest.fixture
async def database_url(templates: TemplateDatabases) -> AsyncIterator[str]:
    """A freshly migrated database of its own for each test."""
    name = await templates.clone()
    try:
        yield with_database(templates.server_url, name)
    finally:
        await templates.drop(name)


@pytest.fixture
def settings(database_url: str) -> Settings:
    # The http task reaches the loopback receiver (harness/receiver.py) only.
    return Settings(
        database_url=database_url,
        scheduler=False,
        runner_id="test-runner",
        http_allow="127.0.0.1",
    )


@pytest.fixture
async def store(database_url: str) -> AsyncIterator[Store]:
    opened = await Store.open(database_url, max_size=4)
    try:
        yield opened
    finally:
        await opened.close()


@pytest.fixture
async def client(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    """The app in-process, lifespan included, spoken to through httpx."""
    async with served(settings) as http:
        yield http


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    """A loopback HTTP receiver that records every request: jobs' deliveries are counted
    by it, independently of Tickgate's own ledger."""
    with receiving() as started:
        yield started


@pytest.fixture
def sql(database_url: str) -> Iterator[Sql]:
    """A blocking connection to the test's database, for checks from synchronous tests."""
    connection = Sql(database_url)
    try:
        yield connection
    finally:
        connection.close()
