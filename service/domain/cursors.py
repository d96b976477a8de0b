"""What the audit makes of a lagging tick cursor: pure schedule math, no I/O.

A job's cursor is the instant before which every nominal tick has its outcome (see
migration 0014). The audit reads a cursor once the tick it waits for is due longer
ago than the takeover time, and walks the job's ticks from it, tick by tick:
- a tick with a ledger row is decided, and passed over;
- a tick past the job's reach (misfire grace + jitter) can start nowhere any more;
- a tick that fell due before any live replica was up (`Takeover.since`: the whole
  cluster was down) is the job's catch-up policy's: `none` runs none of them, `latest`
  only the last, which the job's owner claims as it loads the job (the cursor waits at
  it, and the walk goes on past it); no other such tick will ever run;
- a tick within reach that fell due since then, longer ago than the takeover time, is
  owed: its owner left it (died, stalls, or never had the job), and the auditing
  replica claims it;
- the tick a queue_one job keeps waiting for its run in progress (`WaitingTick`) runs
  after that run, however long it takes: the walk stops there, recording nothing and
  handing nothing over; if its waiter is gone, the auditing replica waits in its place.
Each run of ticks without a row that will never run becomes one misfire row, at its
last tick, counting them all (`missed_ticks`). The cursor then stands at the first tick
not passed: the catch-up tick waited for, the first owed tick (their claims move it
on), or the first tick not due yet; the audit looks again (`due_at`) once the first tick
it did not take over is owed in its turn, or the catch-up tick is past its reach.
"""

from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from service.domain.jobs import Catchup, Job

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
    none), where the claim moves the cursor. `waits_seconds`: the tick waits in its
    queue_one job's slot, whose waiter is gone: the taker waits for the run in progress
    in its place, this long at most (the slot's time left), however far past its
    grace (None: an ordinary tick, claimed within its grace)."""

    tick: datetime
    following: datetime | None
    waits_seconds: float | None = None


@dataclass(frozen=True)
class WaitingTick:
    """The tick a queue_one job keeps waiting for its run in progress: its slot
    (`tickgate_pending`) is unexpired and the tick has no row. Its waiter runs it once
    that run ends, so it is no misfire, nor a tick to take over. `adopted_seconds`: the
    waiter was gone and the auditing replica took the slot, for this long (its time
    left): the tick is taken over by it, to wait (None: a live waiter holds it)."""

    tick: datetime
    adopted_seconds: float | None = None


@dataclass(frozen=True)
class Takeover:
    """Which lagging ticks an auditing replica takes over: those due at least `after`
    ago (the takeover time), and at or after `since`, when the earliest live replica
    joined (the database's clock). A tick that fell due before then fell while every
    replica now live was down: a catch-up matter, never a takeover, which would run
    every one of them. A replica that is itself behind takes over nothing (`taking`
    false): its owner, only late like it, or a replica with time to spare claims the
    tick, or a later round records it missed; the audit then only accounts."""

    after: timedelta
    since: datetime
    taking: bool = True

    @classmethod
    def anytime(cls, after: timedelta) -> "Takeover":
        """No live member known: any tick may be taken over."""
        return cls(after, datetime.min.replace(tzinfo=UTC))

    def owes(self, job: Job, tick: datetime, now: datetime) -> bool:
        return self.taking and job.due(tick) + self.after <= now

    def missed_by_all(self, job: Job, tick: datetime) -> bool:
        return job.due(tick) < self.since


@dataclass(frozen=True)
class CursorAudit:
    """One cursor's audit: the runs of ticks to record as misfires, where the cursor
    goes (None: the job has no tick left), the ticks owed, and when to look again (a
    bound at or before the due time of the first tick not taken over; None: never)."""

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
    waiting: datetime | None = None  # a queue_one tick waiting: the walk stops there
    walked: int = 0

    def at(self, before: Callable[[datetime], bool]) -> bool:
        """Whether the walk goes on at a tick for which `before` holds."""
        if self.tick is None or self.walked >= self.most or self.tick == self.waiting:
            return False
        return before(self.tick)

    @property
    def stopped_at_waiting(self) -> bool:
        return self.tick is not None and self.tick == self.waiting

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
    waiting: WaitingTick | None = None,
) -> CursorAudit:
    """Walk the job's ticks from `cursor` at `now` (the database's clock), at most
    `most` of them: every tick nobody will start, then every tick decided or owed, so
    that the cursor ends at the first tick still open and the claims that follow meet
    it there. `decided`: the walked ticks that have a row; `waiting`: the tick its
    queue_one slot holds, where the walk stops (the ticks after it wait for it)."""
    first = job.tick_after(cursor - _INSTANT)
    walk = _Walk(job, first, decided, most, waiting.tick if waiting else None)
    horizon = now - job.reach
    runs: list[list[datetime]] = [[]]  # the ticks that will never run, in runs
    while walk.at(lambda tick: tick < horizon or takeover.missed_by_all(job, tick)):
        tick = walk.step()
        if tick in decided:
            runs.append([])
        else:
            runs[-1].append(tick)
    caught_up = _catch_up_tick(job, runs[-1], walk.tick, horizon, takeover)
    if caught_up is not None:
        runs[-1].pop()
    while caught_up is None and walk.at(lambda tick: tick in decided):
        walk.step()
    at, owed = caught_up or walk.tick, []
    while walk.at(lambda tick: tick in decided or takeover.owes(job, tick, now)):
        tick = walk.step()
        if tick not in decided:
            owed.append(OwedTick(tick, walk.tick))
    first_open, stopped = walk.tick, walk.stopped_at_waiting
    if stopped and waiting is not None:
        owed += _adopted(job, waiting)
        first_open = None  # looked at again a takeover period from now: its waiter may die
    missed = [MissedTicks(run[0], run[-1], len(run)) for run in runs if run]
    handed = now if owed or stopped else None
    return CursorAudit(at, missed, owed, _look_again(job, caught_up, first_open, handed, takeover))


def _adopted(job: Job, waiting: WaitingTick) -> list[OwedTick]:
    """The waiting tick, taken over to wait in its gone waiter's place, if adopted."""
    if waiting.adopted_seconds is None:
        return []
    return [OwedTick(waiting.tick, job.tick_after(waiting.tick), waiting.adopted_seconds)]


def _catch_up_tick(
    job: Job,
    missed: list[datetime],
    following: datetime | None,
    horizon: datetime,
    takeover: Takeover,
) -> datetime | None:
    """The tick of `missed` (the last run of rowless ticks the walk passed) that the
    job's catch-up policy runs: the last tick missed by every replica, if still in
    reach and the job catches up (`latest`)."""
    if job.catchup is not Catchup.LATEST or not missed or missed[-1] < horizon:
        return None
    if following is not None and takeover.missed_by_all(job, following):
        return None  # the walk stopped at its most: a later tick is the last one
    return missed[-1] if takeover.missed_by_all(job, missed[-1]) else None


def _look_again(
    job: Job,
    caught_up: datetime | None,
    first_open: datetime | None,
    handed: datetime | None,
    takeover: Takeover,
) -> datetime | None:
    """The cursor's `due_at`: the audit reads it again once `takeover.after` has passed
    this. The first tick not taken over is owed then; a catch-up tick still waited for
    is past its reach, to record; ticks taken over (`handed`: when) and still without
    a row then were let go (the taker was full, or died): they go again; and a queue_one
    tick still waiting then may have lost its waiter."""
    bounds = [job.due(first_open)] if first_open is not None else []
    if handed is not None:
        bounds.append(handed)
    if caught_up is not None:
        bounds.append(caught_up + job.reach - takeover.after)
    return min(bounds, default=None)


def superseded_ticks(
    old: Job,
    new: Job,
    cursor: datetime,
    *,
    until: datetime,
    decided: Collection[datetime],
    most: int,
) -> list[MissedTicks]:
    """The ticks of `old` that an edit to `new` leaves without an outcome: those from its
    `cursor` through `until` (the edit's moment) that have no row (`decided`: those that
    do) and are no tick of `new` either (those stay for its cursor), in runs of ticks in
    a row, each to be recorded as one `superseded` row at its last tick counting them.
    At most `most` ticks are walked: the audit keeps an active job's cursor within its
    reach, so only a cursor left behind by a whole-cluster outage has more."""
    runs: list[list[datetime]] = [[]]
    tick = old.tick_after(cursor - _INSTANT) if cursor <= until else None
    for _ in range(most):
        if tick is None or tick > until:
            break
        if tick in decided or new.is_tick(tick):
            runs.append([])
        else:
            runs[-1].append(tick)
        tick = old.tick_after(tick)
    return [MissedTicks(run[0], run[-1], len(run)) for run in runs if run]
