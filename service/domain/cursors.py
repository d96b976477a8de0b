"""What the audit makes of a lagging tick cursor: pure schedule math, no I/O.

A job's cursor is the instant before which every nominal tick has its outcome (see
migration 0014). The audit reads a cursor once the tick it waits for is due longer
ago than the takeover time, and walks the job's ticks from it, tick by tick:
- a tick with a ledger row is decided, and passed over;
- a tick past the job's reach (misfire grace + jitter) can start nowhere any more: each
  run of such ticks without a row becomes one misfire row, at its last tick, counting
  them all (`missed_ticks`);
- a tick within reach, due longer ago than the takeover time, is owed: its owner left
  it (died, stalls, or never had the job), and the auditing replica claims it. Only if
  it fell due while the auditing replica was up (`Takeover.since`): one that fell due
  before, perhaps while the whole cluster was down, is left to the job's catch-up
  policy (applied when its owner loads it), and recorded a misfire once past reach.
The cursor then stands at the first tick not passed, and the audit looks again once the
first tick it did not hand over is owed in its turn (`due_at`).
"""

from collections.abc import Callable, Collection
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
class OwedTick:
    """A tick its owner left, to claim now; `following` is the job's next tick (None:
    none), where the claim moves the cursor."""

    tick: datetime
    following: datetime | None


@dataclass(frozen=True)
class Takeover:
    """Which ticks an auditing replica takes over: those due at least `after` ago (the
    takeover time) and at or after `since` (the database's clock when the replica came
    up). A tick that fell due earlier fell while this replica was down too: if every
    replica was, it is a catch-up matter (`catchup` runs the latest, or none), never a
    takeover, which would run every one of them."""

    after: timedelta
    since: datetime

    def owes(self, job: Job, tick: datetime, now: datetime) -> bool:
        due = job.due(tick)
        return self.since <= due and due + self.after <= now

    def look_again(self, job: Job, tick: datetime) -> datetime:
        """The cursor's `due_at` for a walk that stopped at `tick`: the audit reads it
        again `after` past this. A tick never owed here is looked at again once it is
        past its reach, to be recorded; any other once it is owed."""
        due = job.due(tick)
        return tick + job.reach - self.after if due < self.since else due


@dataclass(frozen=True)
class CursorAudit:
    """One cursor's audit: the runs of ticks to record as misfires, where the cursor
    goes (None: the job has no tick left), the ticks owed, and when to look again (a
    bound at or before the due time of the first tick not handed over; None: never)."""

    cursor: datetime | None
    missed: list[MissedTicks] = field(default_factory=list)
    owed: list[OwedTick] = field(default_factory=list)
    due_at: datetime | None = None


@dataclass
class _Walk:
    """The audit's walk over one job's ticks, at most `most` of them."""

    job: Job
    tick: datetime | None
    decided: Collection[datetime]
    most: int
    walked: int = 0

    def at(self, before: Callable[[datetime], bool]) -> bool:
        """Whether the walk goes on at a tick for which `before` holds."""
        return self.tick is not None and self.walked < self.most and before(self.tick)

    def step(self) -> datetime:
        tick = self.tick
        assert tick is not None
        self.tick, self.walked = self.job.tick_after(tick), self.walked + 1
        return tick


def audit_cursor(
    job: Job,
    cursor: datetime,
    *,
    now: datetime,
    takeover: Takeover,
    decided: Collection[datetime],
    most: int,
) -> CursorAudit:
    """Walk the job's ticks from `cursor` at `now` (the database's clock), at most
    `most` of them: every tick past the reach, then every tick decided or owed, so that
    the cursor ends at the first tick still open and the claims that follow meet it
    there. `decided`: the walked ticks that have a row."""
    walk = _Walk(job, job.tick_after(cursor - _INSTANT), decided, most)
    horizon = now - job.reach
    runs: list[list[datetime]] = [[]]  # the ticks past reach without a row, in runs
    while walk.at(lambda tick: tick < horizon):
        tick = walk.step()
        if tick in decided:
            runs.append([])
        else:
            runs[-1].append(tick)
    while walk.at(lambda tick: tick in decided):
        walk.step()
    at, owed = walk.tick, []
    while walk.at(lambda tick: tick in decided or takeover.owes(job, tick, now)):
        tick = walk.step()
        if tick not in decided:
            owed.append(OwedTick(tick, walk.tick))
    due_at = takeover.look_again(job, walk.tick) if walk.tick is not None else None
    missed = [MissedTicks(run[0], run[-1], len(run)) for run in runs if run]
    return CursorAudit(at, missed, owed, due_at)
