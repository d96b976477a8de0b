"""The test proxy forwards to PostgreSQL, cuts every connection on `sever`, turns new ones
away while severed, and lets them through again after `restore`."""

import asyncio

import asyncpg
import pytest

from harness.tcpproxy import Upstream, proxying
from harness.waiting import eventually_async


def test_the_upstream_comes_from_the_dsn() -> None:
    unix = Upstream.of_dsn("postgresql://postgres:@/db?host=/run/pg")
    assert unix.unix_path == "/run/pg/.s.PGSQL.5432"
    tcp = Upstream.of_dsn("postgresql://u:p@db.internal:6543/tickgate")
    assert (tcp.unix_path, tcp.host, tcp.port) == (None, "db.internal", 6543)


async def test_sever_cuts_connections_and_restore_lets_them_through(database_url: str) -> None:
    with proxying(database_url) as proxy:
        dsn = proxy.dsn_for(database_url)
        assert dsn.startswith(f"postgresql://postgres@127.0.0.1:{proxy.port}/")
        connection = await asyncpg.connect(dsn)
        closed = asyncio.Event()
        connection.add_termination_listener(lambda _: closed.set())
        assert await connection.fetchval("SELECT 1") == 1
        backend = connection.get_server_pid()

        await asyncio.to_thread(proxy.sever)
        await asyncio.wait_for(closed.wait(), 5)
        assert connection.is_closed()
        with pytest.raises((OSError, asyncpg.PostgresConnectionError)):
            await asyncpg.connect(dsn, timeout=5)

        # PostgreSQL saw the session end too: its backend (and any lock it held) is gone.
        direct = await asyncpg.connect(database_url)
        try:

            async def backend_gone() -> bool:
                return not await direct.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", backend
                )

            await eventually_async(backend_gone, 5, "the proxied backend to exit")
        finally:
            await direct.close()

        await asyncio.to_thread(proxy.restore)
        again = await asyncpg.connect(dsn)
        try:
            assert await again.fetchval("SELECT 2") == 2
        finally:
            await again.close()


async def test_blackhole_silences_connections_without_closing_them(database_url: str) -> None:
    with proxying(database_url) as proxy:
        dsn = proxy.dsn_for(database_url)
        connection = await asyncpg.connect(dsn)
        try:
            backend = connection.get_server_pid()
            await asyncio.to_thread(proxy.blackhole)
            # Nothing gets through either way, and nothing closes.
            query = asyncio.create_task(connection.fetchval("SELECT 42"))
            done, _ = await asyncio.wait({query}, timeout=2)
            assert not done
            assert not connection.is_closed()
            with pytest.raises(TimeoutError):
                await asyncpg.connect(dsn, timeout=2)  # accepted, never answered
            direct = await asyncpg.connect(database_url)
            try:
                alive = await direct.fetchval(
                    "SELECT count(*) FROM pg_stat_activity WHERE pid = $1", backend
                )
            finally:
                await direct.close()
            assert alive == 1, "PostgreSQL should not have heard of the silence"

            # Restored, the same connection carries on where it stopped.
            await asyncio.to_thread(proxy.restore)
            assert await asyncio.wait_for(query, 10) == 42
            again = await asyncpg.connect(dsn, timeout=10)
            await again.close()
        finally:
            await connection.close(timeout=5)
