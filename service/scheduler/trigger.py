"""The one APScheduler job of a replica: it wakes the mirror when the timetable's next
tick falls due."""

from collections.abc import Callable
from datetime import datetime, timedelta

from apscheduler.triggers.base import BaseTrigger

# With no tick filed, the wake-up job still needs a time; waking then finds nothing.
IDLE_WAKE = timedelta(hours=1)
# APScheduler asks its trigger again after each wake-up; the answer must lie ahead.
_AHEAD = timedelta(milliseconds=1)


class NextDue(BaseTrigger):  # type: ignore[misc]
    """Fires when the timetable's earliest tick is due (true time).

    APScheduler calls `get_next_fire_time(None, now)` when the job is filed, then, after
    each wake-up, with the wake-up's time. In between it may ask again to count missed
    wake-ups; answering "later than now" then stops it there: one wake-up takes every
    tick due by its time, however late it comes."""

    def __init__(self, earliest: Callable[[], datetime | None]) -> None:
        self._earliest = earliest

    def get_next_fire_time(
        self, previous_fire_time: datetime | None, now: datetime
    ) -> datetime | None:
        at = self._earliest() or now + IDLE_WAKE
        return at if previous_fire_time is None else max(at, now + _AHEAD)

    def __str__(self) -> str:
        return "next due tick of the timetable"
