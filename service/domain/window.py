"""Which of a job's ticks a replica files in its window: pure schedule math, no I/O.

A replica holds only the ticks due in the next few seconds (its window), read from the
jobs' tick cursors (see `service/scheduler/window.py`). For each job it reads there, it
files the ticks from the cursor, or from past the last tick it filed already, up to the
window's end:
- a tick past its reach (misfire grace + jitter) is the audit's, never filed;
- a tick due by now that fell due before the earliest live replica was up (`since`,
  the audit's `Takeover.since`) was missed while every replica was down: the job's
  catch-up policy's (`latest`: the last of them runs, as a catch-up; `none`: none);
- any other is filed to run as scheduled, late if it is due already (a job created,
  or handed over, a moment before its tick).
"""

from dataclasses import dataclass, field
from datetime import datetime, timedelta

from service.domain.jobs import Catchup, Job
from service.domain.runs import RunTrigger

_INSTANT = timedelta(microseconds=1)


@dataclass(frozen=True)
class Filing:
    """One tick to fire when due, how it runs, and the job's tick after it (None:
    none left), where its claim moves the cursor."""

    tick: datetime
    trigger: RunTrigger
    following: datetime | None


@dataclass(frozen=True)
class Plan:
    """The ticks to file, and the last tick looked at (None: none): the next plan of
    the same job starts after it."""

    filings: list[Filing] = field(default_factory=list)
    through: datetime | None = None


def plan_ticks(
    job: Job, after: datetime, *, now: datetime, until: datetime, since: datetime, most: int
) -> Plan:
    """The ticks of `job` after `after` (exclusive) that fall due before `until`, at most
    `most`; `now` and `since` (when the earliest live replica came up) on the database's
    clock."""
    tick = job.tick_after(max(after, now - job.reach - _INSTANT))
    filings: list[Filing] = []
    missed: list[Filing] = []  # due by now, before this replica was up
    through = None
    while tick is not None and job.due(tick) < until and len(filings) + len(missed) < most:
        following = job.tick_after(tick)
        late = job.due(tick) <= now and job.due(tick) < since
        (missed if late else filings).append(Filing(tick, RunTrigger.SCHEDULE, following))
        through, tick = tick, following
    if missed and job.catchup is Catchup.LATEST:
        last = missed[-1]
        filings.insert(0, Filing(last.tick, RunTrigger.CATCHUP, last.following))
    return Plan(filings, through)
