"""The APScheduler trigger that yields a job's nominal ticks, from the domain's math."""

from datetime import datetime, timedelta

from apscheduler.triggers.base import BaseTrigger

from service.domain.jobs import Job
from service.scheduler.clock import ReplicaClock


class NominalTicks(BaseTrigger):  # type: ignore[misc]
    """Every replica computes the same ticks: from the stored schedule and zone, never
    from when the process started. Ticks at or before the job's fence (`fire_after`),
    outside its window, or no longer due (past the jitter and the misfire grace) are
    never produced, so a long stall does not queue a backlog of runs that would only be
    dropped.

    APScheduler works in true time; a tick is due when this replica's clock reads it,
    so the fire times given to APScheduler are the ticks moved by the clock's offset
    (none in production). `ReplicaClock.local(fire_time)` gives the tick back."""

    def __init__(self, job: Job, clock: ReplicaClock | None = None) -> None:
        self._job = job
        self._reach = job.reach
        self._jitter = timedelta(seconds=job.jitter_seconds)
        self._clock = clock or ReplicaClock()

    def get_next_fire_time(
        self, previous_fire_time: datetime | None, now: datetime
    ) -> datetime | None:
        local_now = self._clock.local(now)
        # At the start, a jittered tick whose time has passed may not be due yet: it
        # fires at its due time, so a restart does not lose it.
        start = local_now - self._jitter
        if previous_fire_time:
            start = self._clock.local(previous_fire_time)
        tick = self._job.tick_after(max(start, local_now - self._reach))
        return None if tick is None else self._clock.true(tick)

    def __str__(self) -> str:
        return f"nominal ticks of {self._job.schedule!r}"
