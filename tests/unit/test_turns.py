"""Turns: one at a time, in arrival order, urgent waiters first; a cancelled wait
never keeps or loses the turn."""

import asyncio

from service.store.turns import Turns


async def test_one_at_a_time_and_urgent_waiters_go_first() -> None:
    turns = Turns()
    order: list[str] = []
    release = asyncio.Event()

    async def take(name: str, *, urgent: bool = False) -> None:
        async with turns.turn(urgent=urgent):
            order.append(name)
            if name == "running":
                await release.wait()

    running = asyncio.create_task(take("running"))
    await asyncio.sleep(0)
    waiters = [
        asyncio.create_task(take("claim-1")),
        asyncio.create_task(take("end-1", urgent=True)),
        asyncio.create_task(take("claim-2")),
        asyncio.create_task(take("end-2", urgent=True)),
    ]
    await asyncio.sleep(0)
    assert order == ["running"]  # never before the statement already running
    release.set()
    await asyncio.gather(running, *waiters)
    assert order == ["running", "end-1", "end-2", "claim-1", "claim-2"]


async def test_a_cancelled_wait_neither_keeps_nor_loses_the_turn() -> None:
    turns = Turns()
    entered: list[str] = []
    hold = asyncio.Event()

    async def take(name: str) -> None:
        async with turns.turn():
            entered.append(name)
            await hold.wait()

    first = asyncio.create_task(take("first"))
    await asyncio.sleep(0)
    cancelled = asyncio.create_task(take("cancelled"))
    last = asyncio.create_task(take("last"))
    await asyncio.sleep(0)
    cancelled.cancel()
    hold.set()
    await asyncio.gather(first, last)
    assert cancelled.cancelled()
    assert entered == ["first", "last"]
    # Handed the turn in the same moment it is cancelled: it passes the turn on.
    hold.set()
    mine = turns.turn()
    await mine.__aenter__()
    unlucky = asyncio.create_task(take("unlucky"))
    after = asyncio.create_task(take("after"))
    await asyncio.sleep(0)
    await mine.__aexit__(None, None, None)  # hands the turn to "unlucky"...
    unlucky.cancel()  # ...which is cancelled before it resumes
    async with asyncio.timeout(5):
        await after
    assert unlucky.cancelled()
    assert entered == ["first", "last", "after"]
    async with asyncio.timeout(5), turns.turn():
        pass  # the turn is free again
