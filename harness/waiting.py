"""Waiting for a condition with a deadline: one contract, a sync and an async form.

`eventually(condition, seconds, what)` polls `condition` until it returns a truthy
value, and returns that value. A condition may also raise AssertionError to say why it
does not hold yet. At the deadline `eventually` raises AssertionError naming `what` and
what the condition last said (its last value, or its last assertion's message), so a
failure shows the state it gave up on, not only that it timed out.
"""

import asyncio
import inspect
import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

T = TypeVar("T")
POLL_SECONDS = 0.05


class _Attempts:
    """The deadline and what the condition last said: `with attempts: return
    _truthy(condition())` returns the value, or notes why not and checks the deadline."""

    def __init__(self, deadline_seconds: float, what: str) -> None:
        self.deadline_seconds = deadline_seconds
        self.what = what
        self.last = "nothing yet"
        self._ends = time.monotonic() + deadline_seconds

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: object, error: BaseException | None, trace: object) -> bool:
        if not isinstance(error, AssertionError):
            return False  # returned a value, or failed in earnest
        self.last = str(error)
        if time.monotonic() > self._ends:
            raise AssertionError(
                f"timed out after {self.deadline_seconds}s waiting for {self.what};"
                f" last seen: {self.last}"
            )
        return True


def _truthy(value: T) -> T:
    if not value:
        raise AssertionError(repr(value))
    return value


def eventually(
    condition: Callable[[], T], deadline_seconds: float, what: str, poll: float = POLL_SECONDS
) -> T:
    """Poll `condition` until it is truthy and return its value; fail at the deadline."""
    attempts = _Attempts(deadline_seconds, what)
    while True:
        with attempts:
            return _truthy(condition())
        time.sleep(poll)


async def eventually_async(
    condition: Callable[[], T | Awaitable[T]],
    deadline_seconds: float,
    what: str,
    poll: float = 0.02,
) -> T:
    """`eventually` inside an event loop: `condition` may be sync or async."""
    attempts = _Attempts(deadline_seconds, what)
    while True:
        with attempts:
            outcome = condition()
            value: T = await outcome if inspect.isawaitable(outcome) else outcome
            return _truthy(value)
        await asyncio.sleep(poll)


def until_quiet(
    count: Callable[[], int], expected: int, *, quiet_seconds: float, deadline: float
) -> int:
    """The count once it reached `expected`, or stopped growing for `quiet_seconds`
    after its first step, or at `deadline` (time.time()): never fails, for figures that
    report what is missing rather than assert it. Before anything counted only the
    deadline ends the wait: a big burst can take a while to deliver anything."""
    last, since = count(), time.monotonic()
    while last < expected and time.time() < deadline:
        time.sleep(0.2)
        now = count()
        if now != last:
            last, since = now, time.monotonic()
        elif last and time.monotonic() - since >= quiet_seconds:
            break
    return last
