"""The soak's judge counts its windows by `harness.accounting`'s per-tick rule: a tick
lost or doubled is reported, and the audit's gap row (a misfire row at the last tick of a
run of ticks nobody could start) accounts for those ticks and no other."""

from typing import Any, cast

from harness.accounting import judge_span
from reliability.soak.plan import GRACE_SECONDS, Fleet, Stable
from reliability.soak.windows import Ledger, Window, by_job, judge_ledger, reaches

EVERY_SECOND = Stable("every-second", 1, "log")
EVERY_FIVE = Stable("every-five", 5, "http")
JOBS = {job.name: job for job in (EVERY_SECOND, EVERY_FIVE)}


def row(job: str, at: float, status: str = "succeeded", **more: Any) -> dict[str, Any]:
    """A ledger row as `harness.accounting.LEDGER_ROWS` reads it (plain dicts stand in for
    asyncpg's records: the judge only reads them by key)."""
    fields = {"skip_reason": None, "missed_ticks": None, "trigger": "schedule"} | more
    return {"job": job, "at": at, "status": status} | fields


def judged(rows: list[dict[str, Any]], gaps: list[dict[str, Any]], end: int = 1090) -> Window:
    window = Window(1070, end)
    ledger = Ledger(by_job(cast(Any, rows)), reaches(cast(Any, gaps), JOBS, end), 0)
    judge_ledger(window, JOBS, ledger)
    return window


def test_a_lost_tick_and_a_doubled_one_are_both_reported() -> None:
    rows = [row("every-second", float(t)) for t in range(1070, 1090) if t != 1075]
    # 1080 has its run, and the gap row at 1081 sums it up again with itself.
    rows[10] = row("every-second", 1081.0, "skipped", skip_reason="misfire", missed_ticks=2)
    rows += [row("every-five", float(t)) for t in range(1070, 1090, 5)]
    window = judged(rows, [])
    assert (window.expected, window.unaccounted, window.double_counted) == (24, 1, 1)
    assert window.examples["unaccounted"] == ["every-second @ 1075.0 (period 1)"]
    assert window.examples["double_counted"] == ["every-second @ 1081 counts 2, not 1"]
    # The same rule the stateful test judges by, on the same rows.
    outcomes = {r["at"]: r for r in rows if r["job"] == "every-second"}
    rule = judge_span([float(t) for t in range(1070, 1090)], outcomes)
    assert rule.uncounted == [1075.0]
    assert rule.miscounts == [(1076.0, 1, 2), (1081.0, 2, 1)]


def test_a_gap_row_accounts_for_the_ticks_it_sums_up_and_no_other() -> None:
    # The database was down over 1078-1081: the audit wrote one misfire row at 1081
    # counting four ticks, and one at 1085 counting the five-second job's 1080 and 1085.
    misfire = {"skip_reason": "misfire"}
    rows = [row("every-second", float(t)) for t in range(1070, 1078)]
    rows.append(row("every-second", 1081.0, "skipped", missed_ticks=4, **misfire))
    rows += [row("every-second", float(t)) for t in range(1083, 1090)]
    rows += [row("every-five", float(t)) for t in (1070, 1075)]
    rows.append(row("every-five", 1085.0, "skipped", missed_ticks=2, **misfire))
    window = judged(rows, [r for r in rows if r["missed_ticks"]])
    assert window.expected == 20 + 4
    assert (window.gap_covered, window.unaccounted, window.double_counted) == (3 + 1, 1, 0)
    assert window.examples["unaccounted"] == ["every-second @ 1082.0 (period 1)"]
    assert window.skip_reasons == {"misfire": 2}


def test_a_gap_row_after_the_window_accounts_for_its_last_ticks() -> None:
    # The window ends at 1080; the gap row at 1081 sums up 1078-1081, read past the end.
    misfire = {"skip_reason": "misfire", "missed_ticks": 4}
    rows = [row("every-second", float(t)) for t in range(1070, 1078)]
    rows.append(row("every-second", 1081.0, "skipped", **misfire))
    rows += [row("every-five", 1070.0), row("every-five", 1075.0)]
    window = judged(rows, [r for r in rows if r["missed_ticks"]], end=1080)
    assert (window.expected, window.gap_covered, window.unaccounted) == (10 + 2, 2, 0)
    assert window.statuses == {"succeeded": 10}
    without_it = judged(rows[:8] + rows[9:], [], end=1080)
    assert (without_it.gap_covered, without_it.unaccounted) == (0, 2)


def test_a_job_rescheduled_within_a_misfire_grace_after_the_window_is_not_judged() -> None:
    # A changed schedule starts the cursor again at a new fence: a tick of the window its
    # owner had not decided yet (a saturated box) gets no row, by design.
    fleet = Fleet()
    every = {"kind": "interval", "every_seconds": 1}
    for name in ("changed-later", "changed-much-later"):
        fleet.created({"name": name, "task": "log", "schedule": every}, 900.0, 901.0)
    for name, at in (("changed-later", 1060.0 + GRACE_SECONDS - 5), ("changed-much-later", 1130.0)):
        fleet.begin_change(name, at)
        fleet.end_change(name, at + 1, exists=True, period=5)
    judged = fleet.stable(1000, 1060, 5.0, 1200.0, reach=GRACE_SECONDS)
    assert [job.name for job in judged] == ["changed-much-later"]
    assert [job.name for job in fleet.stable(1000, 1060, 5.0, 1200.0)] == [
        "changed-later",
        "changed-much-later",
    ]
