"""The timetable: a wake-up hands over exactly the ticks due by then, touching only the
jobs that fire."""

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

import service.scheduler.timetable as timetable_module
from service.domain.jobs import Job, JobSpec, create_job
from service.domain.schedules import CronSchedule, IntervalSchedule
from service.scheduler.timetable import Timetable
from service.scheduler.trigger import IDLE_WAKE, NextDue

T0 = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
EVERY_MINUTE = CronSchedule(kind="cron", expression="* * * * *")
HOURLY = CronSchedule(kind="cron", expression="0 * * * *")


def job(name: str, schedule: Any = EVERY_MINUTE, **fields: Any) -> Job:
    spec = JobSpec(schedule=schedule, task="log", args={}, **fields)
    return create_job(name, spec, T0 - timedelta(days=1))


def test_a_wake_up_hands_over_every_job_due_at_that_instant_and_no_other() -> None:
    timetable = Timetable()
    for index in range(300):
        timetable.put(job(f"minutely-{index}"), T0 + timedelta(seconds=1))
        timetable.put(job(f"hourly-{index}", HOURLY), T0 + timedelta(seconds=1))
    assert timetable.earliest == T0 + timedelta(minutes=1)
    due = timetable.due(T0 + timedelta(minutes=1))
    assert sorted(d.job.name for d in due) == sorted(f"minutely-{i}" for i in range(300))
    assert {d.tick for d in due} == {T0 + timedelta(minutes=1)}
    assert timetable.earliest == T0 + timedelta(minutes=2)


def test_a_wake_up_computes_next_ticks_only_for_the_jobs_that_fired(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    timetable = Timetable()
    timetable.put(job("minutely"), T0)
    for index in range(2000):
        timetable.put(job(f"hourly-{index}", HOURLY), T0 + timedelta(seconds=1))
    computed: list[str] = []
    original = timetable_module.next_tick

    def counting(job: Job, previous: datetime, now: datetime) -> datetime | None:
        computed.append(job.name)
        return original(job, previous, now)

    monkeypatch.setattr(timetable_module, "next_tick", counting)
    for minute in range(1, 6):
        assert [d.job.name for d in timetable.due(T0 + timedelta(minutes=minute))] == ["minutely"]
    assert computed == ["minutely"] * 5


def test_a_late_wake_up_hands_over_each_tick_still_in_grace_and_none_older() -> None:
    timetable = Timetable()
    every_second = IntervalSchedule(kind="interval", every_seconds=1, anchor=T0)
    timetable.put(job("fast", every_second, misfire_grace_seconds=3), T0)
    ticks = [d.tick for d in timetable.due(T0 + timedelta(seconds=10))]
    # 1 s was due first; of the rest only those within the 3 s grace of the wake-up.
    assert ticks == [T0 + timedelta(seconds=s) for s in (1, 7, 8, 9, 10)]


def test_a_replaced_job_fires_as_it_now_stands_and_a_dropped_one_not_at_all() -> None:
    timetable = Timetable()
    timetable.put(job("kept"), T0)
    timetable.put(job("dropped"), T0)
    replacement = job("kept", HOURLY)
    timetable.put(replacement, T0)
    timetable.drop("dropped")
    assert timetable.due(T0 + timedelta(minutes=59)) == []
    [due] = timetable.due(T0 + timedelta(hours=1))
    assert due.job is replacement
    assert len(timetable) == 1


def test_replacing_a_job_over_and_over_still_gives_one_tick_per_instant() -> None:
    timetable = Timetable()
    for version in range(1, 5001):
        timetable.put(job("edited").model_copy(update={"version": version}), T0)
    due = timetable.due(T0 + timedelta(minutes=1))
    assert [(d.job.version, d.tick) for d in due] == [(5000, T0 + timedelta(minutes=1))]


def test_the_wake_up_trigger_fires_at_the_earliest_tick_and_never_in_the_past() -> None:
    timetable = Timetable()
    trigger = NextDue(lambda: timetable.earliest)
    now = T0 + timedelta(seconds=1)
    assert trigger.get_next_fire_time(None, now) == now + IDLE_WAKE
    timetable.put(job("minutely"), now)
    assert trigger.get_next_fire_time(None, now) == T0 + timedelta(minutes=1)
    late = T0 + timedelta(minutes=5)
    # Asked again after a late wake-up, it answers a time ahead, never one it passed.
    assert trigger.get_next_fire_time(T0 + timedelta(minutes=1), late) > late
