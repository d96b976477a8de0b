"""The timetable: every mirrored job and its next due tick, in a heap.

A wake-up hands over every tick due by then in O(due · log N), whatever the number of
jobs N: the heap is ordered by when each job's next tick falls due here, and only the
jobs that fire are touched. A job that is replaced or dropped leaves its old entry in
the heap; the entry is discarded when it comes up (it no longer matches the job
mirrored under that name), and the heap is rebuilt when such dead entries outnumber
the live ones.

Ticks are computed the same way on every replica: from the stored schedule, zone and
fence, never from when the process started. Ticks no longer due (past the jitter and
the misfire grace) are never produced, so a long stall does not queue a backlog of
runs that would only be dropped. A tick is due when this replica's clock reads it;
the heap is keyed by true time (`ReplicaClock.true`), which is what the timer reads.
"""

import heapq
import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from uuid import UUID

from service.domain.jobs import Job
from service.scheduler.clock import ReplicaClock


@dataclass(frozen=True, order=True)
class _Entry:
    at: datetime  # true time at which the tick is due here
    order: int  # ties at one instant go in the order the jobs were filed
    tick: datetime = field(compare=False)
    job: Job = field(compare=False)


@dataclass(frozen=True)
class ScheduledTick:
    """A due tick, and the job's tick after it (None: none left), worked out once here
    for the timetable and the tick's cursor both."""

    job: Job
    tick: datetime
    following: datetime | None


class Timetable:
    def __init__(self, clock: ReplicaClock | None = None) -> None:
        self._clock = clock or ReplicaClock()
        self._jobs: dict[str, Job] = {}
        self._heap: list[_Entry] = []
        self._order = itertools.count()

    def __len__(self) -> int:
        return len(self._jobs)

    def __iter__(self) -> Iterator[Job]:
        return iter(self._jobs.values())

    def get(self, name: str) -> Job | None:
        return self._jobs.get(name)

    def revisions(self) -> dict[str, tuple[UUID, int]]:
        return {name: job.revision for name, job in self._jobs.items()}

    @property
    def earliest(self) -> datetime | None:
        """When (true time) the next tick is due, or None if no job has one. It may be
        a dead entry's: a wake-up then finds nothing due, which is harmless."""
        return self._heap[0].at if self._heap else None

    def put(self, job: Job, now: datetime) -> datetime | None:
        """File `job` (replacing any job of its name) with its first tick after `now`
        (true time); returns when that tick is due, or None if it has none."""
        self._jobs[job.name] = job
        self._compact()
        return self._file(job, first_tick(job, self._clock.local(now)))

    def drop(self, name: str) -> Job | None:
        return self._jobs.pop(name, None)

    def due(self, now: datetime) -> list[ScheduledTick]:
        """Take every tick due at or before `now` (true time), and file each job's
        next one. A job late by several ticks hands over each that is still due."""
        taken = []
        while self._heap and self._heap[0].at <= now:
            entry = heapq.heappop(self._heap)
            if self._jobs.get(entry.job.name) is entry.job:
                following = entry.job.tick_after(entry.tick)
                taken.append(ScheduledTick(entry.job, entry.tick, following))
                local_now = self._clock.local(now)
                self._file(entry.job, next_tick(entry.job, following, local_now))
        return taken

    def _file(self, job: Job, tick: datetime | None) -> datetime | None:
        if tick is None:
            return None
        at = self._clock.true(tick)
        heapq.heappush(self._heap, _Entry(at, next(self._order), tick, job))
        return at

    def _compact(self) -> None:
        """Drop dead entries once they are most of the heap: replacing jobs many times
        over (an edit storm) must not grow it without bound."""
        if len(self._heap) > 2 * len(self._jobs) + 1024:
            self._heap = [e for e in self._heap if self._jobs.get(e.job.name) is e.job]
            heapq.heapify(self._heap)


def first_tick(job: Job, now: datetime) -> datetime | None:
    """The first tick of a newly filed job, with `now` on this replica's clock. A
    jittered tick whose time has passed may not be due yet: it is still produced (and
    fires at its due time), so a restart does not lose it."""
    return job.tick_after(now - timedelta(seconds=job.jitter_seconds))


def next_tick(job: Job, following: datetime | None, now: datetime) -> datetime | None:
    """The first tick from `following` (the one after the tick just due) that is still
    due at `now` (this replica's clock): after a stall, ticks already past their reach
    are never produced."""
    stale = now - job.reach - _INSTANT
    if following is None or following > stale:
        return following
    return job.tick_after(stale)


# tick_after is strict: a tick exactly at the grace's edge is still due.
_INSTANT = timedelta(microseconds=1)
