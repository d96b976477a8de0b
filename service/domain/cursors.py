"""What the audit makes of a lagging tick cursor: pure schedule math, no I/O.

A job's cursor is the instant before which every nominal tick has its outcome (see
migration 0014). When it lags past the job's reach, no replica may start the ticks it
waits for any more; the audit walks them, tick by tick: a tick with a ledger row is
decided, and each run of ticks without one becomes one misfire row, at its last tick,
counting them all (`missed_ticks`). The cursor then moves to the first tick it did not
walk.
"""

from collections.abc import Collection
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from service.domain.jobs import Job

_INSTANT = timedelta(microseconds=1)


@dataclass(frozen=True)
class MissedTicks:
    """A run of consecutive ticks that have no ledger row: one misfire row counts them."""

    first: datetime
    last: datetime
    count: int


@dataclass(frozen=True)
class CursorAudit:
    """One cursor's audit: the runs of ticks to record as misfires, and where the
    cursor goes (None: the job has no tick left)."""

    cursor: datetime | None
    missed: list[MissedTicks] = field(default_factory=list)


def audit_cursor(
    job: Job, cursor: datetime, horizon: datetime, decided: Collection[datetime], most: int
) -> CursorAudit:
    """Walk the job's ticks from `cursor`, at most `most` of them: every tick before
    `horizon` (the database's clock less the job's reach), and after it every tick that
    is decided already, so that the cursor ends at the first tick still open and the
    claims that follow meet it there. `decided`: the walked ticks that have a row."""
    runs: list[list[datetime]] = [[]]  # the ticks without a row, in runs
    walked, tick = 0, job.tick_after(cursor - _INSTANT)
    while tick is not None and (tick < horizon or tick in decided) and walked < most:
        if tick in decided:
            runs.append([])
        else:
            runs[-1].append(tick)
        tick, walked = job.tick_after(tick), walked + 1
    return CursorAudit(tick, [MissedTicks(run[0], run[-1], len(run)) for run in runs if run])
