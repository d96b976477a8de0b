"""Hands every due tick of APScheduler's to our fire path, one call per nominal tick."""

from collections.abc import Callable
from datetime import datetime
from typing import Any

from apscheduler.executors.base import BaseExecutor


class TickExecutor(BaseExecutor):  # type: ignore[misc]
    """Replaces APScheduler's run-the-callable executors.

    We need the nominal tick of each fire (APScheduler passes run times only to the
    executor), and we keep no per-job instance count here: overlap is the advisory
    lock's business, cluster-wide, not this process's.
    """

    def __init__(self, on_tick: Callable[[str, datetime], None]) -> None:
        super().__init__()
        self._on_tick = on_tick

    def submit_job(self, job: Any, run_times: list[datetime]) -> None:
        for run_time in run_times:
            self._on_tick(job.id, run_time)

    def _do_submit_job(self, job: Any, run_times: list[datetime]) -> None:
        raise NotImplementedError("submit_job hands ticks over directly")
