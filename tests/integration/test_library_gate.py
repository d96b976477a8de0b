"""`tickgate.gate.locked_run` and the app gate's claims (service/store/gate.py) on a real
PostgreSQL: what an app relies on when it runs jobs itself under Tickgate's promise."""

import asyncio

import asyncpg
import pytest

from harness.waiting import eventually_async
from service.domain.names import lock_key
from tests.support.db import advisory_lock_holders
from tickgate import locked_run


@pytest.fixture
async def pool(database_url: str) -> asyncpg.Pool:
    opened = await asyncpg.create_pool(database_url, min_size=0, max_size=8)
    try:
        yield opened
    finally:
        await opened.close()


async def test_five_racing_coroutines_one_runs_four_skip(pool: asyncpg.Pool) -> None:
    entered, leave = asyncio.Event(), asyncio.Event()
    ran = 0

    async def job() -> None:
        nonlocal ran
        ran += 1
        entered.set()
        await leave.wait()

    racers = [asyncio.create_task(locked_run(pool, "nightly-report", job)) for _ in range(5)]
    await entered.wait()
    # The four others answer at once, while the one that got the lock still runs.
    await eventually_async(lambda: sum(r.done() for r in racers) == 4, 30, "four to give up")
    early = [r.result() for r in racers if r.done()]
    leave.set()
    answers = await asyncio.gather(*racers)
    print(f"ran={answers.count(True)} skipped={answers.count(False)}")
    assert (answers.count(True), answers.count(False), ran) == (1, 4, 1)
    assert early == [False] * 4
    # The lock was released on its own connection: the next call runs.
    assert await locked_run(pool, "nightly-report", _nothing)


async def _nothing() -> None:
    return None


async def test_a_go_holder_of_the_key_keeps_it_from_running(
    pool: asyncpg.Pool, database_url: str
) -> None:
    go = await asyncpg.connect(database_url)
    try:
        # What a Go replica takes for the job "billing": int64(fnv.New64a().Sum64()).
        assert await go.fetchval("SELECT pg_try_advisory_lock($1)", lock_key("billing"))
        assert not await locked_run(pool, "billing", _nothing)
        await go.execute("SELECT pg_advisory_unlock($1)", lock_key("billing"))
        assert await locked_run(pool, "billing", _nothing)
    finally:
        await go.close()


async def test_a_failure_is_raised_after_the_unlock(pool: asyncpg.Pool) -> None:
    async def fails() -> None:
        raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        await locked_run(pool, "fails", fails)
    assert await locked_run(pool, "fails", _nothing)
    assert await _locks_held(pool) == 0


async def test_a_timeout_ends_the_run_and_frees_the_lock(pool: asyncpg.Pool) -> None:
    with pytest.raises(TimeoutError):
        await locked_run(pool, "slow", lambda: asyncio.sleep(30), timeout=0.2)
    assert await locked_run(pool, "slow", _nothing)


async def test_a_cancelled_caller_still_unlocks_on_the_same_connection(
    pool: asyncpg.Pool,
) -> None:
    entered = asyncio.Event()

    async def waits() -> None:
        entered.set()
        await asyncio.sleep(30)

    running = asyncio.create_task(locked_run(pool, "cancelled", waits))
    await entered.wait()
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    assert await _locks_held(pool) == 0
    assert await locked_run(pool, "cancelled", _nothing)


async def test_an_unconfirmed_unlock_closes_the_connection(
    pool: asyncpg.Pool, database_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An unlock that does not answer true (here: made to answer false) leaves the
    connection closed, not pooled: whatever it holds goes with its backend."""
    holders: list[int] = []

    async def note_holder() -> None:
        holders.extend(await advisory_lock_holders(database_url, lock_key("odd")))

    monkeypatch.setattr("tickgate.gate._UNLOCK", "SELECT false AND $1::bigint IS NULL")
    assert await locked_run(pool, "odd", note_holder)
    gone = "SELECT NOT EXISTS (SELECT FROM pg_stat_activity WHERE pid = $1)"
    await eventually_async(lambda: pool.fetchval(gone, holders[0]), 30, "the backend closed")
    assert await _locks_held(pool) == 0
    monkeypatch.undo()
    assert await locked_run(pool, "odd", _nothing)


async def _locks_held(pool: asyncpg.Pool) -> int:
    return int(await pool.fetchval("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory'"))
