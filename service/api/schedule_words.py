"""A schedule in words for people (the dashboard's jobs table): cron through
cron-descriptor, the other kinds in our own words."""

from datetime import time
from functools import lru_cache

from cron_descriptor import (
    FormatException,
    MissingFieldException,
    WrongArgumentException,
    get_description,
)

from service.domain.schedules import (
    AppSchedule,
    CronSchedule,
    DailySchedule,
    IntervalSchedule,
    OnceSchedule,
    cron_five_fields,
)

_UNITS = ((86400, "day"), (3600, "hour"), (60, "minute"), (1, "second"))


def schedule_text(
    schedule: CronSchedule | IntervalSchedule | DailySchedule | OnceSchedule | AppSchedule,
) -> str:
    if isinstance(schedule, AppSchedule):
        return f"Fired by an app ({schedule.scheduler}): {schedule.trigger}"
    if isinstance(schedule, CronSchedule):
        return cron_text(schedule.expression)
    if isinstance(schedule, IntervalSchedule):
        return f"Every {_duration(schedule.every_seconds)}"
    if isinstance(schedule, DailySchedule):
        days = "day" if schedule.every_days == 1 else f"{schedule.every_days} days"
        return f"Every {days} at {', '.join(_wall(at) for at in schedule.at)}"
    return f"Once, at {schedule.at.isoformat()}"


# A listing describes up to 1000 jobs a page, most sharing a few expressions.
@lru_cache(maxsize=4096)
def cron_text(expression: str) -> str:
    try:
        return str(get_description(cron_five_fields(expression)))
    except (FormatException, MissingFieldException, WrongArgumentException):
        # The domain accepts a few forms cron-descriptor does not know: say it as written.
        return f"Cron {expression}"


def _duration(seconds: int) -> str:
    """The largest unit that divides `seconds` exactly: 90 s is "90 seconds"."""
    for size, unit in _UNITS:
        if seconds % size == 0:
            count = seconds // size
            return unit if count == 1 else f"{count} {unit}s"
    raise AssertionError("every whole number of seconds is divisible by 1")


def _wall(at: time) -> str:
    return at.strftime("%H:%M:%S" if at.second else "%H:%M")
