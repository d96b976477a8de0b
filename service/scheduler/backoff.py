"""Pauses between retries of something that failed, doubling up to a cap."""

import asyncio


class Backoff:
    """Pauses that double from `min_seconds` to `max_seconds`; `reset` after a success."""

    def __init__(self, min_seconds: float = 0.5, max_seconds: float = 5.0) -> None:
        self._min_seconds = min_seconds
        self._max_seconds = max_seconds
        self._seconds = min_seconds

    def reset(self) -> None:
        self._seconds = self._min_seconds

    async def pause(self) -> None:
        await asyncio.sleep(self._seconds)
        self._seconds = min(self._seconds * 2, self._max_seconds)
