"""Schedule definitions and their tick arithmetic.

Everything here is pure: given a schedule, the job's zone and an instant, it
computes nominal fire times. All instants returned are aware and in UTC, and
every replica computes the same ticks from the same stored schedule, which is
why `resolve_schedule` pins defaults (anchors) before a schedule is stored.
"""

import re
from bisect import bisect_right
from dataclasses import dataclass
from datetime import UTC, date, datetime, time, timedelta
from functools import lru_cache, partial
from typing import Annotated, Final, Literal, assert_never
from zoneinfo import ZoneInfo

from cronsim import CronSim, CronSimError
from pydantic import (
    AfterValidator,
    AwareDatetime,
    BaseModel,
    ConfigDict,
    Field,
    ValidationInfo,
    field_validator,
)

MAX_INTERVAL_SECONDS: Final = 31_622_400  # 366 days
MAX_EVERY_DAYS: Final = 366
MAX_DAILY_TIMES: Final = 100

# Validation context key: the values were checked already (they come from our own
# database, or from a validated spec), so the checks of content are skipped.
CHECKED: Final = "checked"
# The instants a schedule may name and the API accepts. A datetime holds years 1 to 9999;
# a tick leaves room on either side for a zone's offset (under a day) and for what is
# added to it (grace, jitter and timeout: each at most a day), so no sum overflows.
FIRST_INSTANT: Final = datetime(1, 1, 8, tzinfo=UTC)
LAST_INSTANT: Final = datetime(9999, 12, 1, tzinfo=UTC)
_WALL_MARGIN: Final = timedelta(days=1)

_ONE_SECOND: Final = timedelta(seconds=1)
_ONE_MINUTE: Final = timedelta(minutes=1)
_ONE_DAY: Final = timedelta(days=1)
_CRON_CHECK_START: Final = datetime(2000, 1, 1, tzinfo=UTC)

# cronie's aliases; @reboot is deliberately absent because it has no clock time.
_CRON_ALIASES: Final = {
    "@yearly": "0 0 1 1 *",
    "@annually": "0 0 1 1 *",
    "@monthly": "0 0 1 * *",
    "@weekly": "0 0 * * 0",
    "@daily": "0 0 * * *",
    "@midnight": "0 0 * * *",
    "@hourly": "0 * * * *",
}
_CRON_FIELD_NAMES: Final = ("minute", "hour", "day-of-month", "month", "day-of-week")

# cronie's grammar, and cronsim's extensions where cronsim has them (#45): in the
# day of month, `L` (its last day) and `LW` (its last weekday); in the day of week, `5L`
# (the month's last Friday: a digit, as cronsim reads it) and `MON#2` or `1#2` (its
# second Monday, 1 to 5). Each field is checked with its own grammar, so an extension
# stays in the field it belongs to.
_CRON_VALUE: Final = r"(?:\d+|[A-Za-z]{3})"
_CRON_ITEM: Final = rf"(?:\*|{_CRON_VALUE}(?:-{_CRON_VALUE})?)(?:/\d+)?"
_DAY_OF_MONTH_ITEM: Final = rf"(?:{_CRON_ITEM}|LW|L)"
_DAY_OF_WEEK_ITEM: Final = rf"(?:{_CRON_ITEM}|[0-7]L|{_CRON_VALUE}#[1-5])"


def _field_syntax(item: str) -> re.Pattern[str]:
    return re.compile(rf"{item}(?:,{item})*")


_CRON_FIELD_SYNTAX: Final = (
    _field_syntax(_CRON_ITEM),  # minute
    _field_syntax(_CRON_ITEM),  # hour
    _field_syntax(_DAY_OF_MONTH_ITEM),
    _field_syntax(_CRON_ITEM),  # month
    _field_syntax(_DAY_OF_WEEK_ITEM),
)
_SECONDS_ITEM: Final = re.compile(
    r"(?:(?P<star>\*)|(?P<start>\d+)(?:-(?P<end>\d+))?)(?:/(?P<step>\d+))?"
)


def within_range(moment: datetime) -> datetime:
    """`moment` in UTC; ValueError if it lies outside FIRST_INSTANT..LAST_INSTANT."""
    if moment.utcoffset() is None:
        raise ValueError("needs a UTC offset")
    try:
        in_utc = moment.astimezone(UTC)
    except OverflowError:  # 9999-12-31T23:00-05:00 is past what a datetime holds
        in_utc = None
    if in_utc is None or not FIRST_INSTANT <= in_utc <= LAST_INSTANT:
        raise ValueError(f"must lie between {_SPAN} (UTC)")
    return in_utc


def _wall_within_range(wall: datetime) -> datetime:
    """A naive wall time, whatever its zone, must be an instant within range."""
    low = FIRST_INSTANT.replace(tzinfo=None) + _WALL_MARGIN
    high = LAST_INSTANT.replace(tzinfo=None) - _WALL_MARGIN
    if not low <= wall <= high:
        raise ValueError(f"must lie between {_SPAN} (UTC), a day inside them as a wall time")
    return wall


def _accepted(moment: datetime, info: ValidationInfo) -> datetime:
    """A new instant within range; one read back from the database as stored (a job
    written before the range was enforced can still be read, and has no tick past it)."""
    return moment if _checked(info) else within_range(moment)


def _checked(info: ValidationInfo) -> bool:
    return bool(info.context and info.context.get(CHECKED))


_SPAN: Final = f"{FIRST_INSTANT.date().isoformat()} and {LAST_INSTANT.date().isoformat()}"
# An instant the API accepts: aware, and within range (shown in UTC).
Instant = Annotated[AwareDatetime, AfterValidator(_accepted)]


class _ScheduleModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class CronSchedule(_ScheduleModel):
    """Classic 5-field cron, an @alias, or 6 fields with a leading seconds field."""

    kind: Literal["cron"]
    expression: str

    @field_validator("expression")
    @classmethod
    def _parse_eagerly(cls, value: str) -> str:
        normalised = " ".join(value.split())
        _parse_cron(normalised)
        return normalised


class IntervalSchedule(_ScheduleModel):
    """Ticks at anchor + k * every_seconds for every integer k."""

    kind: Literal["interval"]
    every_seconds: Annotated[int, Field(ge=1, le=MAX_INTERVAL_SECONDS)]
    anchor: datetime | None = None

    @field_validator("anchor")
    @classmethod
    def _normalise_anchor(cls, value: datetime | None, info: ValidationInfo) -> datetime | None:
        if value is None:
            return None
        if value.utcoffset() is None:
            raise ValueError("anchor must be timezone-aware")
        return _to_whole_seconds(value.astimezone(UTC) if _checked(info) else within_range(value))


class DailySchedule(_ScheduleModel):
    """Wall-clock times in the job's zone, every `every_days` days from anchor_date."""

    kind: Literal["daily"]
    every_days: Annotated[int, Field(ge=1, le=MAX_EVERY_DAYS)] = 1
    at: Annotated[list[time], Field(min_length=1, max_length=MAX_DAILY_TIMES)]
    anchor_date: date | None = None

    @field_validator("anchor_date")
    @classmethod
    def _anchor_within_range(cls, value: date | None, info: ValidationInfo) -> date | None:
        if value is not None and not _checked(info):
            _wall_within_range(datetime.combine(value, time()))
        return value

    @field_validator("at")
    @classmethod
    def _sorted_wall_times(cls, value: list[time]) -> list[time]:
        for wall in value:
            if wall.tzinfo is not None:
                raise ValueError(f"time {wall} must not carry a zone; the job's zone applies")
            if wall.microsecond:
                raise ValueError(f"time {wall} must be whole seconds")
        return sorted(set(value))


class OnceSchedule(_ScheduleModel):
    """A single fire; a naive `at` is a wall time in the job's zone until resolved."""

    kind: Literal["once"]
    at: datetime

    @field_validator("at")
    @classmethod
    def _at_within_range(cls, value: datetime, info: ValidationInfo) -> datetime:
        if _checked(info):
            return value
        return _wall_within_range(value) if value.utcoffset() is None else within_range(value)


class AppSchedule(_ScheduleModel):
    """Ticks an app's own scheduler decides (the APScheduler gate, `tickgate.apscheduler`):
    Tickgate computes none, so its replicas never fire the job; the gate records the run
    times the app hands it. `trigger` is the app's trigger as it describes itself. Only
    the gate writes this kind: a request that declares it is refused."""

    kind: Literal["app"]
    trigger: str = Field(max_length=1024)
    scheduler: str = Field("apscheduler", max_length=64)

    @field_validator("trigger")
    @classmethod
    def _written_by_the_gate(cls, value: str, info: ValidationInfo) -> str:
        if not _checked(info):
            raise ValueError(
                "kind 'app' is written by an app's gate (tickgate.apscheduler), "
                "not declared: use cron, interval, daily or once"
            )
        return value


# What a request may declare.
DeclaredSchedule = Annotated[
    CronSchedule | IntervalSchedule | DailySchedule | OnceSchedule,
    Field(discriminator="kind"),
]
# What a job may hold: the declared kinds, and the ticks of an app's scheduler.
Schedule = Annotated[
    CronSchedule | IntervalSchedule | DailySchedule | OnceSchedule | AppSchedule,
    Field(discriminator="kind"),
]


def resolve_schedule(
    schedule: Schedule, tz: ZoneInfo, now: datetime, previous: Schedule | None
) -> Schedule:
    """Pin every default that depends on time or zone, so all replicas agree on ticks."""
    now = _to_utc(now, "now")
    match schedule:
        case IntervalSchedule(anchor=None):
            return schedule.model_copy(update={"anchor": _interval_anchor(previous, now)})
        case DailySchedule(anchor_date=None):
            anchor_date = _daily_anchor_date(previous, tz, now)
            return schedule.model_copy(update={"anchor_date": anchor_date})
        case OnceSchedule():
            return schedule.model_copy(update={"at": _once_instant(schedule.at, tz)})
        case _:
            return schedule


def next_fire_after(schedule: Schedule, tz: ZoneInfo, after: datetime) -> datetime | None:
    """The first nominal tick strictly after `after`, or None if there is none (none is
    past LAST_INSTANT)."""
    try:
        tick = _next_fire_after(schedule, tz, _to_utc(after, "after"))
    except OverflowError:  # the search ran past what a datetime holds
        return None
    return tick if tick is not None and tick <= LAST_INSTANT else None


def _next_fire_after(schedule: Schedule, tz: ZoneInfo, after: datetime) -> datetime | None:
    match schedule:
        case CronSchedule():
            return _next_cron(_parse_cron(schedule.expression), tz, after)
        case IntervalSchedule():
            return _next_interval(_interval_anchor_of(schedule), schedule.every_seconds, after)
        case DailySchedule():
            return _next_daily(schedule, tz, after)
        case OnceSchedule():
            at = _resolved_once_at(schedule)
            return at if at > after else None
        case AppSchedule():
            return None
        case _:
            assert_never(schedule)


def latest_fire_at_or_before(schedule: Schedule, tz: ZoneInfo, at: datetime) -> datetime | None:
    """The latest nominal tick at or before `at`, or None if there is none (none is
    before FIRST_INSTANT)."""
    try:
        tick = _latest_fire_at_or_before(schedule, tz, _to_utc(at, "at"))
    except OverflowError:  # the search ran past what a datetime holds
        return None
    return tick if tick is not None and tick >= FIRST_INSTANT else None


def _latest_fire_at_or_before(schedule: Schedule, tz: ZoneInfo, at: datetime) -> datetime | None:
    match schedule:
        case CronSchedule():
            return _latest_cron(_parse_cron(schedule.expression), tz, at)
        case IntervalSchedule():
            return _latest_interval(_interval_anchor_of(schedule), schedule.every_seconds, at)
        case DailySchedule():
            return _latest_daily(schedule, tz, at)
        case OnceSchedule():
            once = _resolved_once_at(schedule)
            return once if once <= at else None
        case AppSchedule():
            return None
        case _:
            assert_never(schedule)


def fire_times(schedule: Schedule, tz: ZoneInfo, after: datetime, count: int) -> list[datetime]:
    """The next `count` ticks strictly after `after` (fewer if the schedule runs out)."""
    if count < 0:
        raise ValueError("count must not be negative")
    fires: list[datetime] = []
    cursor = _to_utc(after, "after")
    while len(fires) < count and (fire := next_fire_after(schedule, tz, cursor)) is not None:
        fires.append(fire)
        cursor = fire
    return fires


# --- shared instant helpers -------------------------------------------------


def _to_utc(value: datetime, name: str) -> datetime:
    # Aware datetimes sharing a tzinfo compare by wall time, ignoring fold;
    # converting everything to UTC first keeps comparisons honest across DST.
    if value.utcoffset() is None:
        raise ValueError(f"{name} must be timezone-aware")
    return value.astimezone(UTC)


def _to_whole_seconds(value: datetime) -> datetime:
    return value.replace(microsecond=0)


def _local_to_utc(wall: datetime, tz: ZoneInfo) -> datetime:
    """Map a naive wall time to an instant the way cron does across DST changes."""
    # fold=0 picks the first pass through a repeated (fall back) wall time.
    instant = wall.replace(tzinfo=tz, fold=0).astimezone(UTC)
    if instant.astimezone(tz).replace(tzinfo=None) == wall:
        return instant
    return _gap_end(wall, tz)


def _gap_end(wall: datetime, tz: ZoneInfo) -> datetime:
    """The transition instant for a wall time skipped by a spring-forward jump."""
    # Inside a gap fold=1 applies the later offset, giving an instant before the
    # jump, and fold=0 the earlier offset, giving one after it.
    before = _to_whole_seconds(wall.replace(tzinfo=tz, fold=1).astimezone(UTC))
    after = wall.replace(tzinfo=tz, fold=0).astimezone(UTC)
    new_offset = after.astimezone(tz).utcoffset()
    low, high = 0, int((after - before).total_seconds())
    while high - low > 1:
        middle = (low + high) // 2
        if (before + timedelta(seconds=middle)).astimezone(tz).utcoffset() == new_offset:
            high = middle
        else:
            low = middle
    return before + timedelta(seconds=high)


# --- cron -------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _CronSpec:
    """A validated expression: 5 fields for cronsim, plus the seconds we add."""

    five_fields: str
    seconds: tuple[int, ...]


@lru_cache(maxsize=4096)
def _parse_cron(expression: str) -> _CronSpec:
    try:
        return _build_cron_spec(expression)
    except ValueError as error:
        raise ValueError(f"invalid cron expression {expression!r}: {error}") from None


def _build_cron_spec(expression: str) -> _CronSpec:
    if expression.startswith("@"):
        return _CronSpec(_cron_alias(expression), (0,))
    fields = expression.split()
    if len(fields) == 5:
        return _CronSpec(_checked_five_fields(fields), (0,))
    if len(fields) == 6:
        return _CronSpec(_checked_five_fields(fields[1:]), _parse_seconds(fields[0]))
    raise ValueError(f"expected 5 fields (or 6 with leading seconds), got {len(fields)}")


def cron_five_fields(expression: str) -> str:
    """An @alias as the 5-field expression it stands for; any other expression as it is."""
    return _cron_alias(expression) if expression.startswith("@") else expression


def _cron_alias(alias: str) -> str:
    five_fields = _CRON_ALIASES.get(alias.lower())
    if five_fields is None:
        raise ValueError(f"unsupported alias {alias!r}")
    return five_fields


def _checked_five_fields(fields: list[str]) -> str:
    for index, (name, field) in enumerate(zip(_CRON_FIELD_NAMES, fields, strict=True)):
        if not _is_valid_cron_field(index, field):
            raise ValueError(f"bad {name} field {field!r}")
    five_fields = " ".join(fields)
    try:
        CronSim(five_fields, _CRON_CHECK_START)
    except CronSimError:
        # Each field is valid alone, so only cronsim's day-of-month check is left.
        raise ValueError("day-of-month never occurs in the selected months") from None
    return five_fields


def _is_valid_cron_field(index: int, field: str) -> bool:
    if _CRON_FIELD_SYNTAX[index].fullmatch(field) is None:
        return False
    # Probing one field at a time lets the error name the field at fault.
    probe = ["*"] * len(_CRON_FIELD_NAMES)
    probe[index] = field
    try:
        CronSim(" ".join(probe), _CRON_CHECK_START)
    except CronSimError:
        return False
    return True


def _parse_seconds(field: str) -> tuple[int, ...]:
    seconds: set[int] = set()
    for item in field.split(","):
        seconds.update(_seconds_item(item))
    return tuple(sorted(seconds))


def _seconds_item(item: str) -> range:
    match = _SECONDS_ITEM.fullmatch(item)
    if match is None:
        raise ValueError(f"bad second field {item!r}")
    start, end = _seconds_bounds(match)
    step = int(match["step"] or 1)
    if not 0 <= start <= end <= 59 or step == 0:
        raise ValueError(f"bad second field {item!r}")
    return range(start, end + 1, step)


def _seconds_bounds(match: re.Match[str]) -> tuple[int, int]:
    if match["star"]:
        return 0, 59
    start = int(match["start"])
    if match["end"] is not None:
        return start, int(match["end"])
    # Like cronie's "a/n": a bare start with a step runs to the end of the range.
    return (start, 59) if match["step"] else (start, start)


def _next_cron(spec: _CronSpec, tz: ZoneInfo, after: datetime) -> datetime | None:
    if spec.seconds == (0,):
        return _next_minute_tick(spec.five_fields, tz, after)
    # A minute tick up to 59 s before `after` may still have seconds to fire.
    tick = _next_minute_tick(spec.five_fields, tz, after - _ONE_MINUTE)
    while tick is not None:
        index = bisect_right(spec.seconds, (after - tick).total_seconds())
        if index < len(spec.seconds):
            return tick + timedelta(seconds=spec.seconds[index])
        tick = _next_minute_tick(spec.five_fields, tz, tick)
    return None


def _latest_cron(spec: _CronSpec, tz: ZoneInfo, at: datetime) -> datetime | None:
    tick = _latest_minute_tick(spec.five_fields, tz, at)
    if tick is None:
        return None
    index = bisect_right(spec.seconds, (at - tick).total_seconds())
    if index:
        return tick + timedelta(seconds=spec.seconds[index - 1])
    # Every second of this minute is still ahead; the previous minute's last one isn't.
    earlier = _latest_minute_tick(spec.five_fields, tz, tick - _ONE_SECOND)
    return None if earlier is None else earlier + timedelta(seconds=spec.seconds[-1])


# Jobs of one expression and zone tick at the same instants, so a window planning
# thousands of them asks this the same question thousands of times: the answer is a
# pure function of the arguments, and building a CronSim for it is the cost.
@lru_cache(maxsize=16384)
def _next_minute_tick(five_fields: str, tz: ZoneInfo, after: datetime) -> datetime | None:
    # For fixed-time jobs cronsim iterates naive wall time, so from inside the
    # second pass of a repeated hour it can yield a first-pass tick that
    # precedes `after`; those are skipped here.
    for tick in CronSim(five_fields, after.astimezone(tz)):
        fire = tick.astimezone(UTC)
        if fire > after:
            return fire
    return None


def _latest_minute_tick(five_fields: str, tz: ZoneInfo, at: datetime) -> datetime | None:
    # Reverse iteration never yields its (whole-second) start, so start a second later.
    start = _to_whole_seconds(at) + _ONE_SECOND
    tick = next(CronSim(five_fields, start.astimezone(tz), reverse=True), None)
    if tick is None:
        return None
    return _roll_forward(five_fields, tz, tick.astimezone(UTC), at)


def _roll_forward(five_fields: str, tz: ZoneInfo, fire: datetime, limit: datetime) -> datetime:
    # Reverse iteration is fold-blind too: from the second pass of a repeated
    # hour it jumps over first-pass ticks, which the forward search recovers.
    while (following := _next_minute_tick(five_fields, tz, fire)) is not None:
        if following > limit:
            break
        fire = following
    return fire


# --- interval ---------------------------------------------------------------


def _interval_anchor(previous: Schedule | None, now: datetime) -> datetime:
    # Keeping the old phase means editing a job does not shift its grid.
    if isinstance(previous, IntervalSchedule) and previous.anchor is not None:
        return previous.anchor
    return _to_whole_seconds(now)


def _interval_anchor_of(schedule: IntervalSchedule) -> datetime:
    if schedule.anchor is None:
        raise ValueError("interval schedule has no anchor; resolve it first")
    return schedule.anchor


def _next_interval(anchor: datetime, every_seconds: int, after: datetime) -> datetime:
    step = timedelta(seconds=every_seconds)
    return anchor + ((after - anchor) // step + 1) * step


def _latest_interval(anchor: datetime, every_seconds: int, at: datetime) -> datetime:
    step = timedelta(seconds=every_seconds)
    return anchor + ((at - anchor) // step) * step


# --- daily ------------------------------------------------------------------


def _daily_anchor_date(previous: Schedule | None, tz: ZoneInfo, now: datetime) -> date:
    if isinstance(previous, DailySchedule) and previous.anchor_date is not None:
        return previous.anchor_date
    return now.astimezone(tz).date()


def _daily_anchor_of(schedule: DailySchedule) -> date:
    if schedule.anchor_date is None:
        raise ValueError("daily schedule has no anchor_date; resolve it first")
    return schedule.anchor_date


def _daily_fire(day: date, wall: time, tz: ZoneInfo) -> datetime:
    return _local_to_utc(datetime.combine(day, wall), tz)


def _next_daily(schedule: DailySchedule, tz: ZoneInfo, after: datetime) -> datetime:
    step = timedelta(days=schedule.every_days)
    # Start a day early: a fire pushed past midnight by a gap belongs to the day before.
    start = after.astimezone(tz).date() - _ONE_DAY
    day = start + timedelta(days=(_daily_anchor_of(schedule) - start).days % step.days)
    while True:
        # Fires within a day never decrease as wall times increase, so bisect works.
        fire_on_day = partial(_daily_fire, day, tz=tz)
        index = bisect_right(schedule.at, after, key=fire_on_day)
        if index < len(schedule.at):
            return fire_on_day(schedule.at[index])
        day += step


def _latest_daily(schedule: DailySchedule, tz: ZoneInfo, at: datetime) -> datetime:
    step = timedelta(days=schedule.every_days)
    end = at.astimezone(tz).date()
    day = end - timedelta(days=(end - _daily_anchor_of(schedule)).days % step.days)
    while True:
        fire_on_day = partial(_daily_fire, day, tz=tz)
        index = bisect_right(schedule.at, at, key=fire_on_day)
        if index:
            return fire_on_day(schedule.at[index - 1])
        day -= step


# --- once -------------------------------------------------------------------


def _once_instant(at: datetime, tz: ZoneInfo) -> datetime:
    if at.utcoffset() is None:
        return _local_to_utc(at, tz)
    return at.astimezone(UTC)


def _resolved_once_at(schedule: OnceSchedule) -> datetime:
    if schedule.at.utcoffset() is None:
        raise ValueError("once schedule has a naive 'at'; resolve it first")
    return schedule.at.astimezone(UTC)
