from datetime import UTC, date, datetime, time, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from pydantic import TypeAdapter, ValidationError

from service.domain.schedules import (
    CronSchedule,
    DailySchedule,
    IntervalSchedule,
    OnceSchedule,
    Schedule,
    fire_times,
    latest_fire_at_or_before,
    next_fire_after,
    resolve_schedule,
)

KYIV = ZoneInfo("Europe/Kyiv")
NEW_YORK = ZoneInfo("America/New_York")
UTC_ZONE = ZoneInfo("UTC")
SCHEDULE = TypeAdapter(Schedule)


def utc(
    year: int, month: int, day: int, hour: int = 0, minute: int = 0, second: int = 0
) -> datetime:
    return datetime(year, month, day, hour, minute, second, tzinfo=UTC)


def parse(data: dict[str, Any]) -> Schedule:
    return SCHEDULE.validate_python(data)


def cron(expression: str) -> Schedule:
    return parse({"kind": "cron", "expression": expression})


def daily(*at: str, every_days: int = 1, anchor_date: str = "2026-01-01") -> Schedule:
    return parse(
        {"kind": "daily", "at": list(at), "every_days": every_days, "anchor_date": anchor_date}
    )


def interval(every_seconds: int, anchor: datetime) -> Schedule:
    return parse({"kind": "interval", "every_seconds": every_seconds, "anchor": anchor})


# --- cron: syntax and day rules ------------------------------------------------------------


def test_cron_sunday_is_zero_seven_or_name() -> None:
    expected = [utc(2026, 1, 4, 12), utc(2026, 1, 11, 12), utc(2026, 1, 18, 12)]
    for expression in ("0 12 * * 0", "0 12 * * 7", "0 12 * * SUN", "0 12 * * sun"):
        assert fire_times(cron(expression), UTC_ZONE, utc(2026, 1, 1), 3) == expected


def test_cron_month_and_weekday_names() -> None:
    schedule = cron("0 9 * JAN MON-FRI")
    fires = fire_times(schedule, UTC_ZONE, utc(2026, 1, 29, 10), 3)
    # Fri 30 Jan, then nothing until Fri 1 Jan 2027 and Mon 4 Jan 2027.
    assert fires == [utc(2026, 1, 30, 9), utc(2027, 1, 1, 9), utc(2027, 1, 4, 9)]


def test_cron_ranges_steps_and_lists() -> None:
    assert fire_times(cron("0,30 8-10/2 * * *"), UTC_ZONE, utc(2026, 1, 1), 5) == [
        utc(2026, 1, 1, 8),
        utc(2026, 1, 1, 8, 30),
        utc(2026, 1, 1, 10),
        utc(2026, 1, 1, 10, 30),
        utc(2026, 1, 2, 8),
    ]
    assert fire_times(cron("*/20 * * * *"), UTC_ZONE, utc(2026, 1, 1), 3) == [
        utc(2026, 1, 1, 0, 20),
        utc(2026, 1, 1, 0, 40),
        utc(2026, 1, 1, 1, 0),
    ]
    assert fire_times(cron("5/20 * * * *"), UTC_ZONE, utc(2026, 1, 1), 4) == [
        utc(2026, 1, 1, 0, 5),
        utc(2026, 1, 1, 0, 25),
        utc(2026, 1, 1, 0, 45),
        utc(2026, 1, 1, 1, 5),
    ]


@pytest.mark.parametrize(
    ("alias", "expected"),
    [
        ("@hourly", [utc(2026, 1, 1, 1), utc(2026, 1, 1, 2)]),
        ("@daily", [utc(2026, 1, 2), utc(2026, 1, 3)]),
        ("@midnight", [utc(2026, 1, 2), utc(2026, 1, 3)]),
        ("@weekly", [utc(2026, 1, 4), utc(2026, 1, 11)]),
        ("@monthly", [utc(2026, 2, 1), utc(2026, 3, 1)]),
        ("@yearly", [utc(2027, 1, 1), utc(2028, 1, 1)]),
        ("@annually", [utc(2027, 1, 1), utc(2028, 1, 1)]),
    ],
)
def test_cron_aliases(alias: str, expected: list[datetime]) -> None:
    assert fire_times(cron(alias), UTC_ZONE, utc(2026, 1, 1, 0, 30), 2) == expected


def test_cron_restricted_day_fields_combine_with_or() -> None:
    fires = fire_times(cron("0 0 13 * 5"), UTC_ZONE, utc(2026, 1, 1), 8)
    # Every Friday plus Tuesday 13 Jan; Friday 13 Feb fires once.
    assert fires == [
        utc(2026, 1, 2),
        utc(2026, 1, 9),
        utc(2026, 1, 13),
        utc(2026, 1, 16),
        utc(2026, 1, 23),
        utc(2026, 1, 30),
        utc(2026, 2, 6),
        utc(2026, 2, 13),
    ]


def test_cron_star_step_day_of_month_switches_to_and() -> None:
    # As in cronie, "*/2" counts as unrestricted, so both fields must match:
    # only Fridays falling on odd days of the month.
    fires = fire_times(cron("0 0 */2 * 5"), UTC_ZONE, utc(2026, 1, 1), 6)
    assert fires == [
        utc(2026, 1, 9),
        utc(2026, 1, 23),
        utc(2026, 2, 13),
        utc(2026, 2, 27),
        utc(2026, 3, 13),
        utc(2026, 3, 27),
    ]


def test_cron_six_fields_every_fifteen_seconds() -> None:
    assert fire_times(cron("*/15 * * * * *"), UTC_ZONE, utc(2026, 1, 1), 5) == [
        utc(2026, 1, 1, 0, 0, 15),
        utc(2026, 1, 1, 0, 0, 30),
        utc(2026, 1, 1, 0, 0, 45),
        utc(2026, 1, 1, 0, 1, 0),
        utc(2026, 1, 1, 0, 1, 15),
    ]
    after = utc(2026, 1, 1, 0, 0, 14) + timedelta(microseconds=500_000)
    assert next_fire_after(cron("*/15 * * * * *"), UTC_ZONE, after) == utc(2026, 1, 1, 0, 0, 15)


def test_cron_six_fields_second_list_at_fixed_time() -> None:
    fires = fire_times(cron("5,10 0 12 * * *"), UTC_ZONE, utc(2026, 1, 1, 12, 0, 5), 3)
    assert fires == [
        utc(2026, 1, 1, 12, 0, 10),
        utc(2026, 1, 2, 12, 0, 5),
        utc(2026, 1, 2, 12, 0, 10),
    ]


def test_cron_six_fields_ranges_and_steps_in_seconds() -> None:
    fires = fire_times(cron("1-3,50/5 0 0 * * *"), UTC_ZONE, utc(2026, 1, 1), 6)
    assert [fire.second for fire in fires] == [1, 2, 3, 50, 55, 1]
    assert fires[-1] == utc(2026, 1, 2, 0, 0, 1)


def test_cron_six_fields_with_zero_seconds_match_five_fields_across_dst() -> None:
    after = utc(2026, 3, 6)
    assert fire_times(cron("0 30 2 * * *"), NEW_YORK, after, 4) == fire_times(
        cron("30 2 * * *"), NEW_YORK, after, 4
    )


def test_cron_expression_whitespace_is_normalised() -> None:
    schedule = cron("  0   9 *\t* mon-fri ")
    assert isinstance(schedule, CronSchedule)
    assert schedule.expression == "0 9 * * mon-fri"


@pytest.mark.parametrize(
    ("expression", "message"),
    [
        ("61 * * * *", "bad minute field '61'"),
        ("* * *", "expected 5 fields (or 6 with leading seconds), got 3"),
        ("* * * * * * *", "got 7"),
        ("@reboot", "unsupported alias '@reboot'"),
        ("@daily 5", "unsupported alias"),
        ("70 * * * * *", "bad second field '70'"),
        ("5-1 * * * * *", "bad second field '5-1'"),
        ("*/0 * * * * *", "bad second field '*/0'"),
        ("", "got 0"),
        ("   ", "got 0"),
        ("0 24 * * *", "bad hour field '24'"),
        ("0 0 0 * *", "bad day-of-month field '0'"),
        ("0 0 * 13 *", "bad month field '13'"),
        ("0 0 * * 8", "bad day-of-week field '8'"),
        ("0 0 * * FRI-SUN", "bad day-of-week field 'FRI-SUN'"),
        ("*/0 * * * *", "bad minute field '*/0'"),
        ("0 0 30 2 *", "day-of-month never occurs in the selected months"),
        # cronsim's extensions in the field they belong to only, in cronsim's forms.
        ("0 L * * *", "bad hour field 'L'"),
        ("0 0 5L * *", "bad day-of-month field '5L'"),
        ("0 0 * * LW", "bad day-of-week field 'LW'"),
        ("0 0 * * MON#6", "bad day-of-week field 'MON#6'"),
        ("0 0 * * MON#0", "bad day-of-week field 'MON#0'"),
        ("0 0 * * FRIL", "bad day-of-week field 'FRIL'"),
        ("0 0 * * 8L", "bad day-of-week field '8L'"),
        ("0 0 L/2 * *", "bad day-of-month field 'L/2'"),
    ],
)
def test_cron_invalid_expressions_are_rejected(expression: str, message: str) -> None:
    with pytest.raises(ValidationError) as caught:
        cron(expression)
    (error,) = caught.value.errors()
    assert error["loc"] == ("cron", "expression")
    assert f"invalid cron expression {expression.strip()!r}" in error["msg"]
    assert message in error["msg"]


# --- cron: DST ---------------------------------------------------------------------------


def test_cron_kyiv_spring_forward_gap_fires_at_the_jump() -> None:
    fires = fire_times(cron("30 3 * * *"), KYIV, utc(2026, 3, 27, 12), 3)
    # 03:30 EET, then 03:30 does not exist on 29 Mar so it fires at 04:00 EEST.
    assert fires == [utc(2026, 3, 28, 1, 30), utc(2026, 3, 29, 1, 0), utc(2026, 3, 30, 0, 30)]
    assert fires[1].astimezone(KYIV).time() == time(4, 0)


def test_cron_kyiv_fall_back_fires_once_on_first_pass() -> None:
    fires = fire_times(cron("30 3 * * *"), KYIV, utc(2026, 10, 23, 12), 3)
    # 03:30 happens at 00:30Z (EEST) and again at 01:30Z (EET) on 25 Oct.
    assert fires == [utc(2026, 10, 24, 0, 30), utc(2026, 10, 25, 0, 30), utc(2026, 10, 26, 1, 30)]


def test_cron_new_york_spring_forward_gap_fires_at_the_jump() -> None:
    fires = fire_times(cron("30 2 * * *"), NEW_YORK, utc(2026, 3, 6, 12), 3)
    assert fires == [utc(2026, 3, 7, 7, 30), utc(2026, 3, 8, 7, 0), utc(2026, 3, 9, 6, 30)]
    assert fires[1].astimezone(NEW_YORK).time() == time(3, 0)


def test_cron_new_york_two_times_in_one_gap_collapse() -> None:
    fires = fire_times(cron("15,45 2 * * *"), NEW_YORK, utc(2026, 3, 7, 12), 3)
    assert fires == [utc(2026, 3, 8, 7, 0), utc(2026, 3, 9, 6, 15), utc(2026, 3, 9, 6, 45)]


def test_cron_new_york_repeated_hour_fires_once() -> None:
    fires = fire_times(cron("30 1 * * *"), NEW_YORK, utc(2026, 10, 31, 12), 2)
    # 01:30 EDT = 05:30Z; the EST repeat at 06:30Z is skipped.
    assert fires == [utc(2026, 11, 1, 5, 30), utc(2026, 11, 2, 6, 30)]
    assert next_fire_after(cron("30 2 * * *"), NEW_YORK, utc(2026, 10, 31, 12)) == utc(
        2026, 11, 1, 7, 30
    )


def test_cron_from_inside_the_repeated_hour_stays_in_order() -> None:
    # 06:15Z is 01:15 EST, after the 05:30Z fire; cronsim alone would say 05:30Z.
    schedule = cron("30 1 * * *")
    assert next_fire_after(schedule, NEW_YORK, utc(2026, 11, 1, 6, 15)) == utc(2026, 11, 2, 6, 30)
    assert latest_fire_at_or_before(schedule, NEW_YORK, utc(2026, 11, 1, 6, 10)) == utc(
        2026, 11, 1, 5, 30
    )


def test_cron_wildcard_hour_follows_real_time_across_fall_back() -> None:
    fires = fire_times(cron("0 * * * *"), NEW_YORK, utc(2026, 11, 1, 4, 30), 3)
    # 01:00 EDT, 01:00 EST, 02:00 EST: every real hour fires.
    assert fires == [utc(2026, 11, 1, 5), utc(2026, 11, 1, 6), utc(2026, 11, 1, 7)]


# --- cron: latest ------------------------------------------------------------------------


def test_cron_latest_includes_the_instant_itself() -> None:
    schedule = cron("0 12 * * 0")
    assert latest_fire_at_or_before(schedule, UTC_ZONE, utc(2026, 1, 11, 12)) == utc(
        2026, 1, 11, 12
    )
    assert latest_fire_at_or_before(schedule, UTC_ZONE, utc(2026, 1, 11, 11, 59, 59)) == utc(
        2026, 1, 4, 12
    )
    assert latest_fire_at_or_before(cron("@yearly"), UTC_ZONE, utc(2026, 6, 1)) == utc(2026, 1, 1)


def test_cron_latest_six_fields() -> None:
    schedule = cron("5,10 0 12 * * *")
    assert latest_fire_at_or_before(schedule, UTC_ZONE, utc(2026, 1, 2, 12, 0, 7)) == utc(
        2026, 1, 2, 12, 0, 5
    )
    assert latest_fire_at_or_before(schedule, UTC_ZONE, utc(2026, 1, 2, 12, 0, 4)) == utc(
        2026, 1, 1, 12, 0, 10
    )
    late = utc(2026, 1, 2, 12, 0, 10) + timedelta(microseconds=500_000)
    assert latest_fire_at_or_before(schedule, UTC_ZONE, late) == utc(2026, 1, 2, 12, 0, 10)
    every_15 = cron("*/15 * * * * *")
    assert latest_fire_at_or_before(every_15, UTC_ZONE, utc(2026, 1, 1, 12, 0, 14)) == utc(
        2026, 1, 1, 12
    )
    assert latest_fire_at_or_before(every_15, UTC_ZONE, utc(2026, 1, 1, 12)) == utc(2026, 1, 1, 12)


def test_cron_latest_around_the_kyiv_gap() -> None:
    schedule = cron("30 3 * * *")
    assert latest_fire_at_or_before(schedule, KYIV, utc(2026, 3, 29, 1)) == utc(2026, 3, 29, 1)
    assert latest_fire_at_or_before(schedule, KYIV, utc(2026, 3, 29, 0, 59, 59)) == utc(
        2026, 3, 28, 1, 30
    )


def test_cron_latest_is_fast_for_rare_schedules() -> None:
    # Found by reverse iteration rather than by scanning forward from the past.
    schedule = cron("0 0 29 2 *")
    assert latest_fire_at_or_before(schedule, UTC_ZONE, utc(2031, 1, 1)) == utc(2028, 2, 29)


# --- interval ----------------------------------------------------------------------------


def test_interval_ticks_sit_on_the_anchor_grid() -> None:
    schedule = interval(60, utc(2026, 1, 1, 0, 0, 10))
    assert next_fire_after(schedule, UTC_ZONE, utc(2026, 1, 1, 5)) == utc(2026, 1, 1, 5, 0, 10)
    assert next_fire_after(schedule, UTC_ZONE, utc(2026, 1, 1, 5, 0, 10)) == utc(
        2026, 1, 1, 5, 1, 10
    )
    just_before = utc(2026, 1, 1, 5, 0, 10) - timedelta(microseconds=1)
    assert latest_fire_at_or_before(schedule, UTC_ZONE, just_before) == utc(2026, 1, 1, 4, 59, 10)


def test_interval_ticks_do_not_depend_on_where_you_start() -> None:
    schedule = interval(7, utc(2026, 1, 1, 0, 0, 3))
    # 12:00:00 is 43197 s = 6171 * 7 s after the anchor, so it is a tick.
    assert latest_fire_at_or_before(schedule, UTC_ZONE, utc(2026, 1, 1, 12)) == utc(2026, 1, 1, 12)
    expected = [utc(2026, 1, 1, 12, 0, 7), utc(2026, 1, 1, 12, 0, 14), utc(2026, 1, 1, 12, 0, 21)]
    for start in (utc(2026, 1, 1, 12), utc(2026, 1, 1, 12, 0, 3), utc(2026, 1, 1, 12, 0, 6)):
        assert fire_times(schedule, KYIV, start, 3) == expected


def test_interval_grid_extends_before_the_anchor() -> None:
    schedule = interval(60, utc(2026, 1, 1, 0, 0, 10))
    assert fire_times(schedule, UTC_ZONE, utc(2025, 12, 31, 23, 58, 50), 3) == [
        utc(2025, 12, 31, 23, 59, 10),
        utc(2026, 1, 1, 0, 0, 10),
        utc(2026, 1, 1, 0, 1, 10),
    ]
    assert latest_fire_at_or_before(schedule, UTC_ZONE, utc(2025, 12, 31, 23, 59, 9)) == utc(
        2025, 12, 31, 23, 58, 10
    )


def test_interval_anchor_is_normalised_to_whole_utc_seconds() -> None:
    schedule = parse(
        {"kind": "interval", "every_seconds": 5, "anchor": "2026-01-01T03:00:00.7+03:00"}
    )
    assert isinstance(schedule, IntervalSchedule)
    assert schedule.anchor == utc(2026, 1, 1)
    assert schedule.anchor is not None
    assert schedule.anchor.tzinfo is UTC


@pytest.mark.parametrize(
    "data",
    [
        {"kind": "interval", "every_seconds": 0},
        {"kind": "interval", "every_seconds": 31_622_401},
        {"kind": "interval", "every_seconds": 5, "anchor": "2026-01-01T00:00:00"},
        {"kind": "interval", "every_seconds": 5, "phase": 3},
    ],
)
def test_interval_invalid_input_is_rejected(data: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        parse(data)


def test_interval_upper_bound_is_accepted() -> None:
    assert isinstance(parse({"kind": "interval", "every_seconds": 31_622_400}), IntervalSchedule)


def test_resolve_interval_anchors_at_now_truncated() -> None:
    now = datetime(2026, 5, 5, 10, 20, 30, 987_654, tzinfo=KYIV)
    resolved = resolve_schedule(parse({"kind": "interval", "every_seconds": 60}), KYIV, now, None)
    assert isinstance(resolved, IntervalSchedule)
    assert resolved.anchor == utc(2026, 5, 5, 7, 20, 30)
    assert fire_times(resolved, KYIV, utc(2026, 5, 5, 8), 2) == [
        utc(2026, 5, 5, 8, 0, 30),
        utc(2026, 5, 5, 8, 1, 30),
    ]


def test_resolve_interval_inherits_previous_anchor() -> None:
    previous = interval(60, utc(2026, 1, 1, 0, 0, 10))
    edited = parse({"kind": "interval", "every_seconds": 30})
    resolved = resolve_schedule(edited, UTC_ZONE, utc(2026, 5, 5, 12, 0, 44), previous)
    assert isinstance(resolved, IntervalSchedule)
    assert resolved.anchor == utc(2026, 1, 1, 0, 0, 10)
    assert resolved.every_seconds == 30
    assert resolved is not edited


def test_resolve_interval_ignores_other_kinds_and_keeps_explicit_anchor() -> None:
    now = utc(2026, 5, 5, 12, 0, 44)
    unanchored = parse({"kind": "interval", "every_seconds": 30})
    from_daily = resolve_schedule(unanchored, UTC_ZONE, now, daily("09:00"))
    assert isinstance(from_daily, IntervalSchedule)
    assert from_daily.anchor == now
    explicit = interval(30, utc(2026, 1, 1))
    kept = resolve_schedule(explicit, UTC_ZONE, now, interval(30, utc(2025, 1, 1, 0, 0, 1)))
    assert isinstance(kept, IntervalSchedule)
    assert kept.anchor == utc(2026, 1, 1)


def test_unresolved_interval_cannot_be_evaluated() -> None:
    schedule = parse({"kind": "interval", "every_seconds": 30})
    with pytest.raises(ValueError, match="anchor"):
        next_fire_after(schedule, UTC_ZONE, utc(2026, 1, 1))


# --- daily -------------------------------------------------------------------------------


def test_daily_times_are_sorted_and_deduplicated() -> None:
    schedule = daily("18:00", "09:00:30", "09:00:30", "07:15")
    assert isinstance(schedule, DailySchedule)
    assert schedule.at == [time(7, 15), time(9, 0, 30), time(18, 0)]
    assert fire_times(schedule, UTC_ZONE, utc(2026, 1, 1, 8), 4) == [
        utc(2026, 1, 1, 9, 0, 30),
        utc(2026, 1, 1, 18),
        utc(2026, 1, 2, 7, 15),
        utc(2026, 1, 2, 9, 0, 30),
    ]


def test_daily_every_other_day_counts_from_anchor_date() -> None:
    schedule = daily("09:00", every_days=2, anchor_date="2026-03-01")
    assert fire_times(schedule, UTC_ZONE, utc(2026, 3, 1, 10), 2) == [
        utc(2026, 3, 3, 9),
        utc(2026, 3, 5, 9),
    ]
    # Before the anchor the same grid applies: 25 and 27 Feb, then 1 Mar.
    assert fire_times(schedule, UTC_ZONE, utc(2026, 2, 24), 3) == [
        utc(2026, 2, 25, 9),
        utc(2026, 2, 27, 9),
        utc(2026, 3, 1, 9),
    ]


def test_daily_uses_the_job_zone() -> None:
    schedule = daily("09:00", anchor_date="2026-06-01")
    assert next_fire_after(schedule, KYIV, utc(2026, 6, 1)) == utc(2026, 6, 1, 6)


def test_daily_latest() -> None:
    schedule = daily("09:00", every_days=2, anchor_date="2026-03-01")
    assert latest_fire_at_or_before(schedule, UTC_ZONE, utc(2026, 3, 3, 8, 59, 59)) == utc(
        2026, 3, 1, 9
    )
    assert latest_fire_at_or_before(schedule, UTC_ZONE, utc(2026, 3, 3, 9)) == utc(2026, 3, 3, 9)
    assert latest_fire_at_or_before(schedule, UTC_ZONE, utc(2026, 2, 28)) == utc(2026, 2, 27, 9)


def test_daily_keeps_local_time_across_dst() -> None:
    spring = fire_times(daily("03:00"), NEW_YORK, utc(2026, 3, 6, 12), 3)
    assert spring == [utc(2026, 3, 7, 8), utc(2026, 3, 8, 7), utc(2026, 3, 9, 7)]
    autumn = fire_times(daily("03:00"), KYIV, utc(2026, 10, 23, 12), 3)
    # 03:00 repeats in Kyiv on 25 Oct; the first pass (EEST) is used.
    assert autumn == [utc(2026, 10, 24, 0), utc(2026, 10, 25, 0), utc(2026, 10, 26, 1)]
    for fires, zone in ((spring, NEW_YORK), (autumn, KYIV)):
        local = [fire.astimezone(zone) for fire in fires]
        assert {moment.time() for moment in local} == {time(3, 0)}
        assert local[0].utcoffset() != local[2].utcoffset()


def test_daily_gap_fires_at_the_jump() -> None:
    kyiv = fire_times(daily("03:30"), KYIV, utc(2026, 3, 27, 12), 3)
    assert kyiv == [utc(2026, 3, 28, 1, 30), utc(2026, 3, 29, 1, 0), utc(2026, 3, 30, 0, 30)]
    new_york = fire_times(daily("02:30"), NEW_YORK, utc(2026, 3, 6, 12), 3)
    assert new_york == [utc(2026, 3, 7, 7, 30), utc(2026, 3, 8, 7, 0), utc(2026, 3, 9, 6, 30)]


def test_daily_times_in_one_gap_collapse() -> None:
    fires = fire_times(daily("02:15", "02:45"), NEW_YORK, utc(2026, 3, 7, 12), 3)
    assert fires == [utc(2026, 3, 8, 7, 0), utc(2026, 3, 9, 6, 15), utc(2026, 3, 9, 6, 45)]


def test_daily_repeated_hour_fires_once() -> None:
    kyiv = fire_times(daily("03:30"), KYIV, utc(2026, 10, 23, 12), 3)
    assert kyiv == [utc(2026, 10, 24, 0, 30), utc(2026, 10, 25, 0, 30), utc(2026, 10, 26, 1, 30)]
    new_york = fire_times(daily("01:30"), NEW_YORK, utc(2026, 10, 31, 12), 2)
    assert new_york == [utc(2026, 11, 1, 5, 30), utc(2026, 11, 2, 6, 30)]
    inside_repeat = utc(2026, 11, 1, 6, 10)
    assert latest_fire_at_or_before(daily("01:30"), NEW_YORK, inside_repeat) == utc(
        2026, 11, 1, 5, 30
    )


def test_daily_matches_cron_around_dst() -> None:
    for zone, wall, start in (
        (KYIV, "03:30", utc(2026, 3, 20)),
        (NEW_YORK, "02:30", utc(2026, 3, 1)),
    ):
        hour, minute = wall.split(":")
        expression = f"{int(minute)} {int(hour)} * * *"
        assert fire_times(daily(wall), zone, start, 20) == fire_times(
            cron(expression), zone, start, 20
        )


@pytest.mark.parametrize(
    "data",
    [
        {"kind": "daily", "at": []},
        {"kind": "daily", "at": ["03:30Z"]},
        {"kind": "daily", "at": ["03:30+02:00"]},
        {"kind": "daily", "at": ["03:30:00.5"]},
        {"kind": "daily", "at": ["25:00"]},
        {"kind": "daily", "at": ["09:00"] * 101},
        {"kind": "daily", "at": ["09:00"], "every_days": 0},
        {"kind": "daily", "at": ["09:00"], "every_days": 367},
    ],
)
def test_daily_invalid_input_is_rejected(data: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        parse(data)


def test_resolve_daily_anchor_date() -> None:
    # 22:30Z on 5 May is already 6 May in Kyiv.
    now = utc(2026, 5, 5, 22, 30)
    resolved = resolve_schedule(parse({"kind": "daily", "at": ["09:00"]}), KYIV, now, None)
    assert isinstance(resolved, DailySchedule)
    assert resolved.anchor_date == date(2026, 5, 6)
    previous = daily("10:00", anchor_date="2026-01-07")
    edited = parse({"kind": "daily", "at": ["09:00"], "every_days": 3})
    inherited = resolve_schedule(edited, KYIV, now, previous)
    assert isinstance(inherited, DailySchedule)
    assert inherited.anchor_date == date(2026, 1, 7)


def test_unresolved_daily_cannot_be_evaluated() -> None:
    with pytest.raises(ValueError, match="anchor_date"):
        next_fire_after(parse({"kind": "daily", "at": ["09:00"]}), KYIV, utc(2026, 1, 1))


# --- once --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("at", "zone", "expected"),
    [
        ("2026-06-01T09:00:00", KYIV, utc(2026, 6, 1, 6)),
        ("2026-06-01T09:00:00+05:00", KYIV, utc(2026, 6, 1, 4)),
        # Repeated wall time: the first pass (EDT).
        ("2026-11-01T01:30:00", NEW_YORK, utc(2026, 11, 1, 5, 30)),
        # Skipped wall time: the jump itself, as for daily and cron.
        ("2026-03-08T02:30:00", NEW_YORK, utc(2026, 3, 8, 7)),
    ],
)
def test_resolve_once(at: str, zone: ZoneInfo, expected: datetime) -> None:
    resolved = resolve_schedule(parse({"kind": "once", "at": at}), zone, utc(2026, 1, 1), None)
    assert isinstance(resolved, OnceSchedule)
    assert resolved.at == expected
    assert resolved.at.tzinfo is UTC


def test_once_next_and_latest() -> None:
    schedule = resolve_schedule(
        parse({"kind": "once", "at": "2026-06-01T09:00:00"}), KYIV, utc(2026, 1, 1), None
    )
    fire = utc(2026, 6, 1, 6)
    assert next_fire_after(schedule, KYIV, utc(2026, 6, 1, 5, 59, 59)) == fire
    assert next_fire_after(schedule, KYIV, fire) is None
    assert latest_fire_at_or_before(schedule, KYIV, fire) == fire
    assert latest_fire_at_or_before(schedule, KYIV, fire - timedelta(seconds=1)) is None
    assert fire_times(schedule, KYIV, utc(2026, 1, 1), 5) == [fire]


def test_unresolved_once_cannot_be_evaluated() -> None:
    schedule = parse({"kind": "once", "at": "2026-06-01T09:00:00"})
    with pytest.raises(ValueError, match="naive"):
        next_fire_after(schedule, KYIV, utc(2026, 1, 1))


# --- common ------------------------------------------------------------------------------


def test_resolve_leaves_cron_unchanged() -> None:
    schedule = cron("@daily")
    assert resolve_schedule(schedule, KYIV, utc(2026, 1, 1), None) == schedule


def test_fire_times_count() -> None:
    schedule = cron("@hourly")
    assert fire_times(schedule, UTC_ZONE, utc(2026, 1, 1), 0) == []
    assert len(fire_times(schedule, UTC_ZONE, utc(2026, 1, 1), 25)) == 25
    with pytest.raises(ValueError, match="count"):
        fire_times(schedule, UTC_ZONE, utc(2026, 1, 1), -1)


def test_results_are_utc_for_any_aware_input() -> None:
    after = datetime(2026, 1, 1, 2, 0, tzinfo=KYIV)
    fire = next_fire_after(cron("@hourly"), KYIV, after)
    assert fire == utc(2026, 1, 1, 1)
    assert fire is not None
    assert fire.tzinfo is UTC


def test_naive_instants_are_rejected() -> None:
    naive = datetime(2026, 1, 1)
    with pytest.raises(ValueError, match="after"):
        next_fire_after(cron("@hourly"), UTC_ZONE, naive)
    with pytest.raises(ValueError, match="at"):
        latest_fire_at_or_before(cron("@hourly"), UTC_ZONE, naive)
    with pytest.raises(ValueError, match="now"):
        resolve_schedule(cron("@hourly"), UTC_ZONE, naive, None)


def test_models_are_frozen_strict_and_discriminated() -> None:
    schedule = CronSchedule(kind="cron", expression="@hourly")
    with pytest.raises(ValidationError):
        schedule.expression = "@daily"  # type: ignore[misc]
    with pytest.raises(ValidationError):
        parse({"kind": "cron", "expression": "@hourly", "tz": "UTC"})
    with pytest.raises(ValidationError):
        parse({"kind": "weekly", "expression": "@hourly"})
