"""Many callers, one statement: items submitted close together are written as one batch."""

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

T = TypeVar("T")
R = TypeVar("R")


class Coalescer(Generic[T, R]):
    """`submit` queues an item and returns its own result once `flush` has written it.

    The first item of a batch waits `linger()` seconds for company, then flushes every
    item queued by then. One batch is written at a time: items arriving meanwhile
    queue up and go together in the next one. `flush` gets the items in order and
    returns one result per item; if it raises an Exception, every item of the batch
    gets that error. Callers that must not lose
    their write should shield `submit` (a cancelled first caller still flushes).
    """

    def __init__(
        self,
        flush: Callable[[Sequence[T]], Awaitable[Sequence[R]]],
        linger: Callable[[], float],
    ) -> None:
        self._flush = flush
        self._linger = linger
        self._queued: list[tuple[T, asyncio.Future[R]]] = []
        self._writing = asyncio.Lock()  # one batch at a time; the next one queues up

    async def submit(self, item: T) -> R:
        done: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        first = not self._queued
        self._queued.append((item, done))
        if not first:
            return await done  # the batch's first item flushes this one with it
        try:
            wait = self._linger()
            if wait > 0:
                await asyncio.sleep(wait)
        finally:
            async with self._writing:
                await self._flush_queued()
        return done.result()

    async def _flush_queued(self) -> None:
        batch, self._queued = self._queued, []
        try:
            results = await self._flush([item for item, _ in batch])
        except Exception as error:  # noqa: BLE001 - every caller of the batch gets it
            for _, done in batch:
                done.set_exception(error)
            return
        except BaseException:
            for _, done in batch:
                done.cancel()
            raise
        for (_, done), result in zip(batch, results, strict=True):
            done.set_result(result)
