"""A silent link in process on real PostgreSQL (`service/store/link.py`): a TCP proxy
in front of the database stops forwarding without closing anything (`blackhole`).

The heartbeat of a quiet pinned session goes unanswered: the session is dropped, which
fences the runs bound to it, and PostgreSQL ends the quiet session (`idle_session_timeout`),
freeing its advisory locks, only after that. The listener hears of it the same way, and
the fire path's calls over the pool end at their deadline instead of waiting for good.
"""

import asyncio
import socket
import time
from uuid import uuid4

import asyncpg
import pytest

from harness.tcpproxy import proxying
from harness.waiting import eventually_async
from service.domain.jobs import Job
from service.domain.runs import RunTrigger
from service.store import Store
from service.store.link import Link
from service.store.listener import JobListener
from service.store.ports import ClaimOutcome, TickClaim
from tests.faults.figures import FaultFigures, record
from tests.support.db import advisory_lock_holders, advisory_locks_on
from tests.support.fire import add_job, lock_pool, tick_now

# The shortest link timeout there is: heartbeats every 1.7 s with a 1.7 s deadline
# (fence within 5 s), client deadlines 3.3 s, idle_session_timeout 6.7 s.
LINK = Link(10)
SLACK_SECONDS = 10.0  # a loaded 2-core box


def scheduled(job: Job) -> TickClaim:
    return TickClaim(job, tick_now(), RunTrigger.SCHEDULE, "r", uuid4(), True)


async def backend_alive(database_url: str, pid: int) -> bool:
    connection = await asyncpg.connect(database_url)
    try:
        return bool(
            await connection.fetchval("SELECT count(*) FROM pg_stat_activity WHERE pid = $1", pid)
        )
    finally:
        await connection.close()


async def test_lock_sessions_bound_a_silent_link_on_both_ends(
    database_url: str, store: Store
) -> None:
    figures = FaultFigures(
        "silent_link_in_process",
        "Silent link (in process)",
        "TCP proxy in front of a lock session holding a run's lock stops forwarding"
        f" without closing, link timeout {LINK.seconds:g} s",
        faults_injected=1,
    )
    job = await add_job(store, "silent")
    with proxying(database_url) as proxy:
        async with (
            lock_pool(proxy.dsn_for(database_url), 1, LINK) as sessions,
            sessions.session(5) as session,
        ):
            [claim] = await session.claim([scheduled(job)])
            assert claim.outcome is ClaimOutcome.CLAIMED
            assert await advisory_lock_holders(database_url, job.lock_key) == [session.pid]
            lost = asyncio.Event()
            with session.fenced(lost.set):
                silent_at = time.monotonic()
                await asyncio.to_thread(proxy.blackhole)
                # The replica's end: a quiet session's heartbeat goes unanswered, the
                # session is dropped, and the fence of every run on it trips.
                await asyncio.wait_for(lost.wait(), LINK.fence_seconds + SLACK_SECONDS)
                fenced_after = time.monotonic() - silent_at
                assert session.closed

                # The server's end: it ends the quiet session, and the lock is free.
                async def freed() -> bool:
                    return not await advisory_locks_on(database_url, job.lock_key)

                await eventually_async(
                    freed, LINK.free_seconds + SLACK_SECONDS, "the lock to be freed"
                )
                freed_after = time.monotonic() - silent_at

                async def ended() -> bool:
                    return not await backend_alive(database_url, session.pid)

                await eventually_async(ended, SLACK_SECONDS, "the session's backend to exit")
    figures.notes = {
        "fenced_after_s": round(fenced_after, 1),
        "fence_bound_s": LINK.fence_seconds,
        "lock_freed_after_s": round(freed_after, 1),
        "free_bound_s": round(LINK.free_seconds, 1),
    }
    record(figures)
    # The replica has stopped the run before another could take the job's lock.
    assert fenced_after < freed_after, (fenced_after, freed_after)


async def test_a_listener_whose_link_goes_silent_is_lost(database_url: str) -> None:
    lost = asyncio.Event()
    with proxying(database_url) as proxy:
        listener = await JobListener.open(
            proxy.dsn_for(database_url), lambda _name: None, lost.set, LINK
        )
        try:
            await asyncio.to_thread(proxy.blackhole)
            await asyncio.wait_for(lost.wait(), LINK.fence_seconds + SLACK_SECONDS)
            assert not listener.alive
        finally:
            await listener.close()


async def test_fire_path_calls_over_the_pool_end_within_their_deadline(database_url: str) -> None:
    with proxying(database_url) as proxy:
        store = await Store.open(proxy.dsn_for(database_url), max_size=2, link=LINK)
        try:
            assert await store.get_jobs(["none"]) == []
            await asyncio.to_thread(proxy.blackhole)
            started = time.monotonic()
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(
                    store.get_jobs(["none"]), LINK.statement_seconds + SLACK_SECONDS
                )
            assert time.monotonic() - started < LINK.statement_seconds + SLACK_SECONDS
            await asyncio.to_thread(proxy.restore)
            assert await store.get_jobs(["none"]) == []
        finally:
            await asyncio.wait_for(store.close(), 10)


async def test_a_tuned_connection_bounds_its_link_on_both_ends(database_url: str) -> None:
    with proxying(database_url) as proxy:
        connection = await asyncpg.connect(proxy.dsn_for(database_url))  # TCP to the proxy
        try:
            await LINK.tune(connection, quiet_ends=True, fire_path=True)
            shown = {
                name: await connection.fetchval(f"SHOW {name}")
                for name in ("idle_session_timeout", "statement_timeout", "lock_timeout")
            }
            assert shown == {
                "idle_session_timeout": "6667ms",
                "statement_timeout": "1667ms",
                "lock_timeout": "1s",
            }
            sock = getattr(connection, "_transport").get_extra_info("socket")  # noqa: B009
            options = {
                name: sock.getsockopt(level, getattr(socket, name))
                for level, name in (
                    (socket.SOL_SOCKET, "SO_KEEPALIVE"),
                    (socket.IPPROTO_TCP, "TCP_KEEPIDLE"),
                    (socket.IPPROTO_TCP, "TCP_KEEPINTVL"),
                    (socket.IPPROTO_TCP, "TCP_KEEPCNT"),
                    (socket.IPPROTO_TCP, "TCP_USER_TIMEOUT"),
                )
            }
            assert options == {
                "SO_KEEPALIVE": 1,
                "TCP_KEEPIDLE": 3,
                "TCP_KEEPINTVL": 2,
                "TCP_KEEPCNT": 3,
                "TCP_USER_TIMEOUT": 10_000,
            }
        finally:
            await connection.close()
