"""A backfill into a run of missed ticks: pure schedule math, no I/O.

A misfire row at the last tick of a run of ticks nobody started counts them all
(`missed_ticks`; see `cursors`): the ticks before it in the run have no row of their
own. A backfill gives some of those ticks a run. So that every tick keeps exactly one
outcome, the run is split first: each backfilled tick gets a misfire row of its own
(which the backfill's claim then turns into its run), each stretch of the run between
them one misfire row at its last tick counting it, and the row at the run's end counts
only the ticks after the last backfilled one. The work is bounded by the backfill's
ticks and the runs it touches (each counts at most the audit's walk), never by the
length of an outage.
"""

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from service.domain.jobs import Job

_INSTANT = timedelta(microseconds=1)


@dataclass(frozen=True)
class Outcome:
    """A tick's row in the ledger, as the split reads it: how many ticks it counts
    (`missed_ticks`; None: its own alone)."""

    tick: datetime
    missed_ticks: int | None = None

    @property
    def counts(self) -> int:
        return self.missed_ticks or 1


@dataclass(frozen=True)
class GapSplit:
    """One misfire row's run of missed ticks split: the row at `gap`, which counted
    `was` ticks, counts `keeps` now; each of `parts` (tick, count) is a misfire row of
    its own, at a tick that had none, counting the ticks of the run up to it."""

    gap: datetime
    was: int
    keeps: int
    parts: tuple[tuple[datetime, int], ...]


def split_gaps(job: Job, ticks: Collection[datetime], rows: Sequence[Outcome]) -> list[GapSplit]:
    """The splits a backfill of `ticks` needs, given the job's rows (not manual runs)
    from its first tick to the first row after its last. A run is split only if it is
    after the job's threshold (earlier ones belong to another schedule) and only for
    the ticks it counts."""
    splits, previous = [], None
    for row in sorted(rows, key=lambda row: row.tick):
        own = {t for t in ticks if (previous is None or t > previous) and t <= row.tick}
        if row.counts > 1 and row.tick > job.fire_after and own:
            split = _split(job, row, own)
            if split is not None:
                splits.append(split)
        previous = row.tick
    return splits


def _split(job: Job, gap: Outcome, own: set[datetime]) -> GapSplit | None:
    """Split the run `gap` ends around the ticks of `own` it counts; None if it counts
    none of them (or the schedule no longer places it: its rows are left as they are)."""
    walked = _walk(job, min(own), gap.tick, gap.counts)
    if walked is None:
        return None
    span = walked[-gap.counts :]
    if not own.intersection(span):
        return None
    parts: list[tuple[datetime, int]] = []
    # The run's ticks before the first one walked are not walked: only counted.
    pending, before = gap.counts - len(span), job.tick_at_or_before(span[0] - _INSTANT)
    for tick in span:
        if tick in own:
            if pending and before is None:
                return None
            if pending and before is not None:
                parts.append((before, pending))
            parts.append((tick, 1))
            pending = 0
        else:
            pending += 1
        before = tick
    keeps = parts.pop()[1] if parts[-1][0] == gap.tick else pending
    return GapSplit(gap.tick, gap.counts, keeps, tuple(parts))


def _walk(job: Job, start: datetime, end: datetime, most: int) -> list[datetime] | None:
    """The job's ticks from the first at or after `start` to `end`, if `end` is one
    of them and at most `most` lie between (a run counts no more ticks than that)."""
    walked: list[datetime] = []
    tick = job.tick_after(start - _INSTANT)
    while tick is not None and tick <= end and len(walked) < most:
        walked.append(tick)
        tick = job.tick_after(tick)
    return walked if walked and walked[-1] == end else None
