"""The oracle test of cron's extended tokens (#45): `L` and `LW` in the day of month, `nL`
and `#` in the day of week, mixed with the plain forms, in zones with daylight saving
time. Tickgate's answers (the next ticks, one search per tick from each tick, and the
latest tick at or before an instant, searched backwards) must be cronsim's own ticks,
iterated forwards once from well before, in UTC: the schedule math adds its seconds
field, its fall-back rule and its backward search on top of cronsim, and none of them may
move a tick of these forms."""

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from itertools import islice, takewhile
from zoneinfo import ZoneInfo

from cronsim import CronSim
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from service.domain.schedules import CronSchedule, fire_times, latest_fire_at_or_before

ZONES = ("UTC", "Europe/Kyiv", "America/New_York", "Australia/Lord_Howe", "America/Santiago")
# Around the year's transitions in those zones (each month of 2026 and 2027 starts one).
STARTS = st.datetimes(datetime(2026, 1, 1), datetime(2027, 12, 1)).map(
    lambda moment: moment.replace(second=0, microsecond=0, tzinfo=UTC)
)
MINUTES = st.sampled_from(("0", "30", "*/20", "15,45"))
HOURS = st.sampled_from(("0", "2", "3", "1-3", "*/6", "9,17", "*"))
DAYS_OF_MONTH = st.sampled_from(("*", "L", "LW", "L,15", "1,L", "1-7", "13"))
DAYS_OF_WEEK = st.sampled_from(
    ("*", "5L", "0L", "1#2", "MON#1", "FRI#5", "SUN#3", "5L,1#1", "1-5", "MON#2,5L")
)
MONTHS = st.sampled_from(("*", "*", "2", "3,10", "11-12"))
TICKS = 12


@st.composite
def expressions(draw: st.DrawFn) -> str:
    fields = [draw(MINUTES), draw(HOURS), draw(DAYS_OF_MONTH), draw(MONTHS), draw(DAYS_OF_WEEK)]
    if fields[2] == "*" and fields[4] == "*":
        fields[2] = "L"  # each expression names at least one extension
    return " ".join(fields)


def ticks(expression: str, zone: ZoneInfo, after: datetime) -> Iterator[datetime]:
    """cronsim's ticks strictly after `after`, iterated once, in UTC: a tick that does
    not move forward in real time (the second pass of a repeated hour) is not one."""
    last = after
    for tick in CronSim(expression, after.astimezone(zone)):
        instant = tick.astimezone(UTC)
        if instant > last:
            yield instant
            last = instant


def oracle(expression: str, zone: ZoneInfo, after: datetime, count: int) -> list[datetime]:
    return list(islice(ticks(expression, zone, after), count))


def latest_oracle(expression: str, zone: ZoneInfo, at: datetime) -> datetime | None:
    """The last of cronsim's forward ticks at or before `at`, looked for over ever longer
    spans before it (None: none in 800 days, which the test then does not judge)."""
    for days in (2, 40, 800):
        found = list(
            takewhile(lambda t: t <= at, ticks(expression, zone, at - timedelta(days=days)))
        )
        if found:
            return found[-1]
    return None


@settings(max_examples=150, deadline=None)
@given(expression=expressions(), zone=st.sampled_from(ZONES), start=STARTS)
def test_the_next_ticks_are_cronsims(expression: str, zone: str, start: datetime) -> None:
    schedule = CronSchedule(kind="cron", expression=expression)
    tz = ZoneInfo(zone)
    assert fire_times(schedule, tz, start, TICKS) == oracle(expression, tz, start, TICKS)


@settings(max_examples=150, deadline=None)
@given(
    expression=expressions(),
    zone=st.sampled_from(ZONES),
    start=STARTS,
    later=st.integers(0, 400 * 24 * 60),
)
def test_the_latest_tick_is_cronsims(
    expression: str, zone: str, start: datetime, later: int
) -> None:
    """Searched backwards from an instant up to 400 days after `start`: the last of
    cronsim's forward ticks at or before it."""
    schedule = CronSchedule(kind="cron", expression=expression)
    tz = ZoneInfo(zone)
    at = start + timedelta(minutes=later, seconds=later % 60)
    expected = latest_oracle(expression, tz, at)
    assume(expected is not None)
    assert latest_fire_at_or_before(schedule, tz, at) == expected


def test_the_extensions_as_a_scheduler_of_payroll_reads_them() -> None:
    """A few by hand, in Kyiv: the last day, the last weekday, the last Friday and the
    second Monday of January to April 2026."""
    kyiv = ZoneInfo("Europe/Kyiv")
    start = datetime(2026, 1, 1, tzinfo=UTC)

    def days(expression: str) -> list[str]:
        ticks = fire_times(CronSchedule(kind="cron", expression=expression), kyiv, start, 4)
        return [tick.astimezone(kyiv).strftime("%m-%d") for tick in ticks]

    assert days("0 9 L * *") == ["01-31", "02-28", "03-31", "04-30"]
    assert days("0 9 LW * *") == ["01-30", "02-27", "03-31", "04-30"]  # 31 Jan: a Saturday
    assert days("0 9 * * 5L") == ["01-30", "02-27", "03-27", "04-24"]
    assert days("0 9 * * MON#2") == ["01-12", "02-09", "03-09", "04-13"]
