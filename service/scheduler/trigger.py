"""The APScheduler trigger that yields a job's nominal ticks, from the domain's math."""

from datetime import datetime, timedelta

from apscheduler.triggers.base import BaseTrigger

from service.domain.jobs import Job


class NominalTicks(BaseTrigger):  # type: ignore[misc]
    """Every replica computes the same ticks: from the stored schedule and zone, never
    from when the process started. Ticks at or before the job's fence (`fire_after`),
    outside its window, or older than the misfire grace are never produced, so a long
    stall does not queue a backlog of runs that would only be dropped."""

    def __init__(self, job: Job) -> None:
        self._job = job
        self._grace = timedelta(seconds=job.misfire_grace_seconds)

    def get_next_fire_time(
        self, previous_fire_time: datetime | None, now: datetime
    ) -> datetime | None:
        return self._job.tick_after(max(previous_fire_time or now, now - self._grace))

    def __str__(self) -> str:
        return f"nominal ticks of {self._job.schedule!r}"
