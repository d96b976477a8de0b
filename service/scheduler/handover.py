"""Handovers that leave no gap: a job this replica stops owning is dropped from its
mirror only after HANDOVER_SECONDS.

When the members change, every replica sees it within about a second of the others, and
loads what it now owns only after that. So a job newly owned here is fired at once, and
one owned elsewhere now is fired here as before until its handover ends, while its new
owner loads it. For a moment both may claim the same ticks; the gate lets one through.
"""

import asyncio
from collections.abc import Callable

# Longer than every member takes to see a change of members and load what it now owns.
HANDOVER_SECONDS = 10.0


class Handover:
    """The mirrored jobs this replica no longer owns, each until its handover ends,
    when `on_dropped` drops it from the mirror."""

    def __init__(
        self, on_dropped: Callable[[str], object], handover_seconds: float = HANDOVER_SECONDS
    ) -> None:
        self._on_dropped = on_dropped
        self._handover_seconds = handover_seconds
        self._leaving: set[str] = set()
        self._left_now: list[str] = []

    def __contains__(self, name: str) -> bool:
        return name in self._leaving

    def assign(self, name: str, owned: bool) -> None:
        """Whether this replica owns the mirrored job `name` now."""
        if owned:
            self._leaving.discard(name)
        elif name not in self._leaving:
            self._leave(name)

    def forget(self, name: str) -> None:
        """The job is gone from the mirror (deleted, paused, ended)."""
        self._leaving.discard(name)

    def _leave(self, name: str) -> None:
        # The jobs one reconcile hands over end their handover together, on one timer.
        if not self._left_now:
            asyncio.get_running_loop().call_soon(self._start_handover)
        self._leaving.add(name)
        self._left_now.append(name)

    def _start_handover(self) -> None:
        names, self._left_now = self._left_now, []
        asyncio.get_running_loop().call_later(self._handover_seconds, self._end_handover, names)

    def _end_handover(self, names: list[str]) -> None:
        for name in names:
            if name in self._leaving:  # not owned again, nor gone, meanwhile
                self._leaving.discard(name)
                self._on_dropped(name)
