"""The APScheduler trigger that yields a job's nominal ticks, from the domain's math."""

from datetime import datetime, timedelta

from apscheduler.triggers.base import BaseTrigger

from service.domain.jobs import Job
from service.domain.schedules import next_fire_after


class NominalTicks(BaseTrigger):  # type: ignore[misc]
    """Every replica computes the same ticks: from the stored schedule and zone, never
    from when the process started. Ticks at or before the job's fence (`fire_after`)
    and ticks older than the misfire grace are never produced, so a long stall does
    not queue a backlog of runs that would only be dropped."""

    def __init__(self, job: Job) -> None:
        self._schedule = job.schedule
        self._zone = job.zone
        self._fence = job.fire_after
        self._grace = timedelta(seconds=job.misfire_grace_seconds)

    def get_next_fire_time(
        self, previous_fire_time: datetime | None, now: datetime
    ) -> datetime | None:
        after = max(previous_fire_time or now, now - self._grace, self._fence)
        return next_fire_after(self._schedule, self._zone, after)

    def __str__(self) -> str:
        return f"nominal ticks of {self._schedule!r}"
