"""Which ticks a window files for a job (`plan_ticks`): pure schedule math."""

from datetime import UTC, datetime, timedelta

from service.domain.jobs import Job, JobSpec, create_job
from service.domain.runs import RunTrigger
from service.domain.schedules import IntervalSchedule
from service.domain.window import Filing, plan_ticks

T0 = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
SECOND = timedelta(seconds=1)


def every_second(**fields: object) -> Job:
    spec = JobSpec(
        schedule=IntervalSchedule(kind="interval", every_seconds=1, anchor=T0),
        task="log",
        args={},
        **fields,  # type: ignore[arg-type]
    )
    return create_job("j", spec, T0 - timedelta(hours=1))


def ticks(filings: list[Filing]) -> list[tuple[datetime, RunTrigger]]:
    return [(filing.tick, filing.trigger) for filing in filings]


def test_it_files_the_ticks_after_the_cursor_that_fall_due_in_the_window() -> None:
    job = every_second()
    plan = plan_ticks(job, T0, now=T0, until=T0 + 3.5 * SECOND, since=T0 - SECOND, most=100)
    assert ticks(plan.filings) == [(T0 + n * SECOND, RunTrigger.SCHEDULE) for n in (1, 2, 3)]
    assert [filing.following for filing in plan.filings] == [T0 + n * SECOND for n in (2, 3, 4)]
    assert plan.through == T0 + 3 * SECOND  # the next plan starts after it
    capped = plan_ticks(job, T0, now=T0, until=T0 + 60 * SECOND, since=T0, most=2)
    assert (len(capped.filings), capped.through) == (2, T0 + 2 * SECOND)


def test_a_tick_past_its_reach_is_the_audit_s_and_a_late_one_since_up_runs_late() -> None:
    """A replica up since T0: the cursor lags 100 s (the owner died, say); the grace is
    5 s. Ticks past it are left to the audit; those within it run, late, as scheduled."""
    job = every_second(misfire_grace_seconds=5)
    now = T0 + 100 * SECOND
    plan = plan_ticks(job, T0, now=now, until=now + 2 * SECOND, since=T0, most=100)
    assert plan.filings[0].tick == now - 5 * SECOND
    assert {filing.trigger for filing in plan.filings} == {RunTrigger.SCHEDULE}
    assert plan.filings[-1].tick == now + SECOND


def test_ticks_missed_before_the_replica_was_up_follow_the_catch_up_policy() -> None:
    now = T0 + 10 * SECOND
    scheduled = [(now, RunTrigger.SCHEDULE), (now + SECOND, RunTrigger.SCHEDULE)]
    for catchup, expected in (
        ("latest", [(now - SECOND, RunTrigger.CATCHUP)]),  # the last one missed
        ("none", []),
    ):
        job = every_second(misfire_grace_seconds=30, catchup=catchup)
        plan = plan_ticks(job, T0, now=now, until=now + 1.5 * SECOND, since=now, most=100)
        assert ticks(plan.filings) == [*expected, *scheduled]
        assert plan.through == now + SECOND  # the missed ones are never looked at again
