"""Wait for a condition with a deadline, inside the event loop."""

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable


async def eventually(
    condition: Callable[[], bool | Awaitable[bool]], deadline_seconds: float, what: str
) -> None:
    """Poll `condition` (sync or async) until it holds; fail naming `what` at the deadline."""
    deadline = time.monotonic() + deadline_seconds
    while True:
        outcome = condition()
        if inspect.isawaitable(outcome):
            outcome = await outcome
        if outcome:
            return
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {deadline_seconds}s waiting for {what}")
        await asyncio.sleep(0.02)
