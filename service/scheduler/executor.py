"""Hands APScheduler's wake-ups to the mirror."""

from collections.abc import Callable
from datetime import datetime
from typing import Any

from apscheduler.executors.base import BaseExecutor


class WakeExecutor(BaseExecutor):  # type: ignore[misc]
    """Replaces APScheduler's run-the-callable executors: a wake-up calls `on_wake`
    at once, on the event loop, and the mirror takes every tick due from its timetable.
    No instance count or misfire check here: overlap is the advisory lock's business,
    cluster-wide, and a tick's grace is the runner's."""

    def __init__(self, on_wake: Callable[[], None]) -> None:
        super().__init__()
        self._on_wake = on_wake

    def submit_job(self, job: Any, run_times: list[datetime]) -> None:
        self._on_wake()

    def _do_submit_job(self, job: Any, run_times: list[datetime]) -> None:
        raise NotImplementedError("submit_job wakes the mirror directly")
