"""The ledger's invariant as the stateful test and the soak judge it
(`harness.accounting.judge_ticks`), on rows written by hand."""

import math
from collections.abc import Iterator
from typing import Any

from harness.accounting import Ticks, every, judge_ticks


def _cursor(job: str, threshold: float, cursor: float) -> dict[str, Any]:
    return {"job": job, "threshold": threshold, "cursor": cursor}


def _row(job: str, at: float, trigger: str = "schedule", missed: int | None = None) -> Any:
    return {"job": job, "at": at, "missed_ticks": missed, "trigger": trigger}


def until(last: float) -> Ticks:
    """Every 10 s up to `last` (a job with an end): none after it."""

    def ticks(after: float, before: float) -> Iterator[float]:
        at = (math.floor(after / 10) + 1) * 10
        while at < before and at <= last:
            yield float(at)
            at += 10

    return ticks


def test_a_cursor_parked_past_the_last_tick_while_ticks_remain_is_a_problem() -> None:
    """An end moved later after the last tick (finding 1 of #41): the cursor says every
    tick is decided, yet ticks remain that have no row."""
    rows = [_row("j", 10.0), _row("j", 20.0)]
    assert judge_ticks([_cursor("j", 0, math.inf)], rows, {"j": until(20)}) == []
    [problem] = judge_ticks([_cursor("j", 0, math.inf)], rows, {"j": until(50)})
    assert "3 ticks before its cursor past its last tick have no outcome" in problem


def test_a_misfire_row_counts_the_rowless_ticks_before_it_and_no_more() -> None:
    ticks = {"j": every(10)}
    gap = [_row("j", 30.0, missed=3)]
    assert judge_ticks([_cursor("j", 0, 40)], gap, ticks) == []
    split = [_row("j", 20.0, trigger="backfill"), _row("j", 30.0, missed=3)]
    first, second = judge_ticks([_cursor("j", 0, 40)], split, ticks)
    assert "counts 1 ticks, not 2" in first  # tick 10 left behind with no outcome
    assert "counts 3 ticks, not 1" in second  # tick 20 counted twice


def test_a_waiting_tick_is_an_outcome_and_a_backfill_off_the_schedule_no_stray() -> None:
    ticks = {"j": every(10)}
    rows = [_row("j", 10.0), _row("j", 20.0, trigger="waiting"), _row("j", 15.0, "backfill")]
    assert judge_ticks([_cursor("j", 0, 30)], rows, ticks) == []
    [problem] = judge_ticks([_cursor("j", 0, 30)], [*rows, _row("j", 25.0)], ticks)
    assert "has a row at" in problem
