"""Finish what must finish, even when the task doing it is being cancelled: the fire
path's record of a run's end and its unlock, and the library face's (tickgate) alike.
Plain asyncio, so any layer may use it."""

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

T = TypeVar("T")


async def run_to_completion(work: Coroutine[Any, Any, T]) -> T:
    """Await `work` to its end; if the caller is cancelled meanwhile, still wait for
    `work` (it is shielded) and only then let the cancellation through.

    This is what Go's context.WithoutCancel gives the seed's unlock: a cancelled run
    must still record its end and release its lock on its own connection, before the
    connection goes back to the pool.
    """
    task = asyncio.ensure_future(work)
    try:
        return await asyncio.shield(task)
    except asyncio.CancelledError:
        await asyncio.wait({task})
        if not task.cancelled():
            task.exception()  # seen here: what failed is the caller's to find, not the loop's
        raise
