"""The soak's judge reads a gap row by its `missed_ticks`: the audit's misfire row at the
last tick of a run of ticks nobody could start accounts for all of them."""

from typing import Any, cast

from reliability.soak.plan import GRACE_SECONDS, Fleet, Stable
from reliability.soak.windows import Ledger, Window, _spans, judge_ledger

EVERY_SECOND = Stable("every-second", 1, "log")
EVERY_FIVE = Stable("every-five", 5, "http")
JOBS = {job.name: job for job in (EVERY_SECOND, EVERY_FIVE)}


def row(status: str, skip_reason: str | None = None) -> dict[str, Any]:
    return {"status": status, "skip_reason": skip_reason}


def test_a_gap_row_accounts_for_the_ticks_it_sums_up_and_no_other() -> None:
    # The database was down over 1078-1081: the audit wrote one misfire row at 1081
    # counting four ticks, and one at 1085 counting the five-second job's 1080 and 1085.
    gaps = [
        {"job": "every-second", "at": 1081.0, "missed_ticks": 4},
        {"job": "every-five", "at": 1085.0, "missed_ticks": 2},
    ]
    rows = {("every-second", float(t)): row("succeeded") for t in range(1070, 1078)}
    rows[("every-second", 1081.0)] = row("skipped", "misfire")
    rows |= {("every-second", float(t)): row("succeeded") for t in range(1083, 1090)}
    rows |= {("every-five", float(t)): row("succeeded") for t in (1070, 1075)}
    rows[("every-five", 1085.0)] = row("skipped", "misfire")
    window = Window(1070, 1090)
    # Plain dicts stand in for asyncpg's records: the judge only reads them by key.
    ledger = Ledger(cast(Any, rows), _spans(cast(Any, gaps), JOBS), 0)
    judge_ledger(window, JOBS, ledger)
    assert window.expected == 20 + 4
    assert (window.gap_covered, window.unaccounted) == (3 + 1, 1)
    assert window.examples["unaccounted"] == ["every-second @ 1082.0 (period 1)"]
    assert window.skip_reasons == {"misfire": 2}


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
