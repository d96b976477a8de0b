"""Turns on one connection: one statement at a time, and those that release locks first."""

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager


class Turns:
    """A lock whose waiters are served in arrival order, except that `urgent` ones go
    before every other waiter (never before the statement already running).

    A lock session runs claims and ends on one connection. An end releases a lock that
    another replica's next tick may be waiting for, and frees room here; a claim can
    wait one statement more. Ends are written in batches, so at most one waits at a
    time: claims are delayed by one statement at most, never starved.
    """

    def __init__(self) -> None:
        self._busy = False
        self._urgent: deque[asyncio.Future[None]] = deque()
        self._others: deque[asyncio.Future[None]] = deque()

    @property
    def busy(self) -> bool:
        """A statement holds the turn now."""
        return self._busy

    @asynccontextmanager
    async def turn(self, *, urgent: bool = False) -> AsyncIterator[None]:
        if self._busy:
            await self._wait(self._urgent if urgent else self._others)
        else:
            self._busy = True
        try:
            yield
        finally:
            self._pass_on()

    async def _wait(self, queue: deque[asyncio.Future[None]]) -> None:
        handed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        queue.append(handed)
        try:
            await handed
        except asyncio.CancelledError:
            # A cancelled wait stays queued, done: `_pass_on` skips it. One whose turn
            # came just as it was cancelled holds the turn, and passes it on.
            if not handed.cancelled():
                self._pass_on()
            raise

    def _pass_on(self) -> None:
        """Hand the turn to the next waiter (it stays busy meanwhile), or free it."""
        for queue in (self._urgent, self._others):
            while queue:
                waiter = queue.popleft()
                if not waiter.done():
                    waiter.set_result(None)
                    return
        self._busy = False
