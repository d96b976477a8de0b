"""The runs in flight on a replica: counted per job and in all, and a run's end costs the
same whatever the number of other jobs in flight (#22, finding 7: a Counter's `-=`
walked every job in flight on each end, quadratic over a crowd)."""

import sys
from collections.abc import Callable
from types import FrameType
from typing import Any

from service.scheduler.running import RunsInFlight


def test_runs_are_counted_per_job_and_in_all() -> None:
    runs = RunsInFlight()
    for job in ("a", "a", "b"):
        runs.started(job)
    assert (runs.total, runs.of("a"), runs.of("b"), runs.of("c"), len(runs)) == (3, 2, 1, 0, 2)
    runs.ended("a")
    runs.ended("b")
    assert (runs.total, runs.of("a"), runs.of("b"), len(runs)) == (1, 1, 0, 1)
    runs.ended("a")
    assert (runs.total, len(runs)) == (0, 0)  # no job is left behind with a count of 0


def lines_run(action: Callable[[], None]) -> int:
    """How many lines of Python `action` runs: a count of work, not of time."""
    count = 0

    def tracer(frame: FrameType, event: str, arg: Any) -> Any:
        nonlocal count
        count += event == "line"
        return tracer

    sys.settrace(tracer)
    try:
        action()
    finally:
        sys.settrace(None)
    return count


def test_a_run_s_end_costs_the_same_with_ten_or_ten_thousand_jobs_in_flight() -> None:
    def end_one_among(others: int) -> int:
        runs = RunsInFlight()
        for index in range(others):
            runs.started(f"other-{index}")
        runs.started("ending")
        return lines_run(lambda: runs.ended("ending"))

    assert end_one_among(10) == end_one_among(10_000) > 0
