"""The replica's work in flight: every task the fire path, manual runs, backfills, skip
records and orphan resumes start, so that a shutdown starts no more and gives what runs
its grace. One per Runner, shared by its parts."""

import asyncio
import logging
from collections.abc import Awaitable, Coroutine
from typing import Any

from service.store.errors import is_unavailable

log = logging.getLogger(__name__)


class Background:
    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[None]] = set()
        # False once a shutdown began: nothing new is claimed or started.
        self.accepting = True

    def spawn(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def land(self, grace_seconds: float) -> None:
        """Start nothing new; give the tasks in flight `grace_seconds`, then cancel them.
        A cancelled run still records `cancelled` and unlocks before its task ends."""
        self.accepting = False
        unfinished = set(self._tasks)
        if unfinished:
            log.info("waiting up to %ss for %d runs in flight", grace_seconds, len(unfinished))
            _, unfinished = await asyncio.wait(unfinished, timeout=grace_seconds)
        for task in unfinished:
            task.cancel()
        if unfinished:
            await asyncio.wait(unfinished)


def log_failure(what: str, error: Exception) -> None:
    """A failure the caller recovers from (a retry, the next round): a warning while the
    database is away, else the error with its traceback."""
    if is_unavailable(error):
        log.warning("%s failed: database unavailable (%r)", what, error)
    else:
        log.exception("%s failed", what, exc_info=error)


async def guarded(work: Awaitable[None], what: str, logger: logging.Logger) -> bool:
    """Run a loop's round of `work`; False if it failed, which `logger` logs: whatever
    went wrong, the loops must live on, and the next round tries again."""
    try:
        await work
    except Exception as error:
        if is_unavailable(error):
            logger.warning("failed %s, database unavailable (%r); will retry", what, error)
        else:
            logger.exception("failed %s; will retry", what)
        return False
    return True
