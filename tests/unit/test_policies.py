"""Pure policy math: retry backoff, the window, run caps, jitter, next runs."""

from collections.abc import Collection
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import ValidationError

from service.domain.cursors import (
    CursorAudit,
    Takeover,
    WaitingTick,
    audit_cursor,
    superseded_ticks,
)
from service.domain.jobs import (
    Job,
    JobSpec,
    JobState,
    complete_if_ended,
    create_job,
    finish_run,
    missed_tick,
    replace_job,
    ticks_between,
)
from service.domain.retry import RetryPolicy
from service.domain.runs import RunTrigger
from service.domain.schedules import CronSchedule, OnceSchedule
from service.domain.window import Filing, plan_ticks

T0 = datetime(2026, 12, 1, 10, 0, tzinfo=UTC)
EVERY_MINUTE = CronSchedule(kind="cron", expression="* * * * *")


def job(name: str = "j", **fields: Any) -> Job:
    spec = JobSpec(schedule=EVERY_MINUTE, task="log", args={}, **fields)
    return create_job(name, spec, T0 - timedelta(days=1))


def test_backoff_doubles_then_grows_linearly_then_caps() -> None:
    policy = RetryPolicy(
        max_attempts=9, min_backoff_seconds=10, max_backoff_seconds=300, max_doublings=3
    )
    assert [policy.backoff_seconds(r) for r in range(8)] == [10, 20, 40, 80, 160, 240, 300, 300]


def test_zero_doublings_is_linear() -> None:
    policy = RetryPolicy(min_backoff_seconds=1, max_backoff_seconds=100, max_doublings=0)
    assert [policy.backoff_seconds(r) for r in range(4)] == [1, 2, 3, 4]


def test_worst_case_respects_the_retry_budget() -> None:
    policy = RetryPolicy(max_attempts=3, min_backoff_seconds=1, max_doublings=1)
    assert policy.worst_case_seconds(10) == 10 * 3 + 1 + 2
    bounded = policy.model_copy(update={"max_retry_seconds": 5})
    assert bounded.worst_case_seconds(10) == 5


@pytest.mark.parametrize(
    "fields",
    [
        {"max_attempts": 0},
        {"max_attempts": 21},
        {"min_backoff_seconds": 0},
        {"min_backoff_seconds": 10, "max_backoff_seconds": 5},
        {"max_doublings": -1},
        {"max_retry_seconds": -1},
        {"surprise": 1},
    ],
)
def test_bad_retry_policies_are_rejected(fields: dict[str, Any]) -> None:
    with pytest.raises(ValidationError):
        RetryPolicy(**fields)


def test_window_bounds_ticks() -> None:
    windowed = job(start_at=T0, end_at=T0 + timedelta(minutes=3))
    assert windowed.upcoming(T0 - timedelta(hours=1), 10) == [
        T0,
        T0 + timedelta(minutes=1),
        T0 + timedelta(minutes=2),
        T0 + timedelta(minutes=3),
    ]
    assert windowed.tick_at_or_before(T0 - timedelta(seconds=1)) is None
    assert windowed.tick_at_or_before(T0 + timedelta(hours=1)) == T0 + timedelta(minutes=3)
    assert windowed.next_run_at(T0 + timedelta(minutes=5)) is None


def test_the_tick_in_grace_is_the_latest_within_the_misfire_grace() -> None:
    minutely = job(misfire_grace_seconds=90)
    assert minutely.tick_in_grace(T0 + timedelta(seconds=30)) == T0
    assert minutely.tick_in_grace(T0 + timedelta(seconds=90)) == T0 + timedelta(minutes=1)
    assert minutely.tick_in_grace(T0) == T0  # a tick exactly now is in grace
    yearly_spec = JobSpec(
        schedule=CronSchedule(kind="cron", expression="0 10 1 12 *"), task="log", args={}
    )
    yearly = create_job("y", yearly_spec, T0 - timedelta(days=1))
    assert yearly.tick_in_grace(T0 + timedelta(seconds=60)) == T0  # grace is inclusive
    assert yearly.tick_in_grace(T0 + timedelta(seconds=61)) is None
    windowed = job(end_at=T0 - timedelta(minutes=5))
    assert windowed.tick_in_grace(T0) is None  # the window closed before the grace


def test_window_must_be_ordered_and_aware() -> None:
    with pytest.raises(ValidationError, match="end_at must be after start_at"):
        job(start_at=T0, end_at=T0)
    with pytest.raises(ValidationError):
        JobSpec(schedule=EVERY_MINUTE, task="log", start_at="2026-12-01T10:00:00")


def test_closed_window_completes_the_job() -> None:
    windowed = job(end_at=T0)
    assert complete_if_ended(windowed, T0 - timedelta(minutes=1)).state is JobState.ACTIVE
    assert complete_if_ended(windowed, T0 + timedelta(seconds=1)).state is JobState.COMPLETED


def test_max_runs_completes_after_the_capped_run() -> None:
    capped = job(max_runs=2).model_copy(update={"runs_started": 1})
    assert finish_run(capped, T0, T0).state is JobState.ACTIVE
    reached = capped.model_copy(update={"runs_started": 2})
    done = finish_run(reached, T0, T0)
    assert done.state is JobState.COMPLETED
    assert done.version == reached.version + 1


def test_jitter_is_a_pure_function_of_job_and_tick() -> None:
    first, second = job("jittery", jitter_seconds=30), job("jittery", jitter_seconds=30)
    ticks = [T0 + timedelta(minutes=m) for m in range(50)]
    delays = [first.jitter_seconds_for(t) for t in ticks]
    assert delays == [second.jitter_seconds_for(t) for t in ticks]  # any replica agrees
    assert all(0 <= d < 30 for d in delays)
    assert len(set(delays)) > 40  # spread, not one constant
    assert job("other", jitter_seconds=30).jitter_seconds_for(T0) != delays[0]
    assert job("still").jitter_seconds_for(T0) == 0


def test_next_runs_and_backfill_ticks() -> None:
    plain = job()
    assert plain.upcoming(T0, 5) == [T0 + timedelta(minutes=m) for m in range(1, 6)]
    ticks = ticks_between(plain, T0, T0 + timedelta(minutes=2), 1000)
    assert ticks == [T0, T0 + timedelta(minutes=1), T0 + timedelta(minutes=2)]
    assert len(ticks_between(plain, T0, T0 + timedelta(days=1), 11)) == 11


def test_missed_tick_respects_grace() -> None:
    late = job(misfire_grace_seconds=30)
    assert missed_tick(late, T0 + timedelta(seconds=10)) is None
    assert missed_tick(late, T0 + timedelta(seconds=40)) == T0


# Jitter longer than the misfire grace (finding 8): the grace counts from when a tick is
# due (tick + jitter), everywhere a tick's lateness is judged.


def late_jittered_tick(jittered: Job) -> datetime:
    """A tick of `jittered` whose jitter is more than twice its grace."""
    tick = T0
    while jittered.jitter_seconds_for(tick) < 2 * jittered.misfire_grace_seconds:
        tick += timedelta(minutes=1)
    return tick


def test_a_jittered_tick_is_not_overdue_before_its_jitter_and_grace_pass() -> None:
    jittered = job(jitter_seconds=3000, misfire_grace_seconds=60)
    tick = late_jittered_tick(jittered)
    due = jittered.due(tick)
    just_after = tick + timedelta(seconds=61)
    assert just_after < due
    assert missed_tick(jittered.model_copy(update={"schedule": _once(tick)}), just_after) is None
    assert jittered.deadline(tick) == due + timedelta(seconds=60)


def test_a_restart_still_produces_a_jittered_tick_not_yet_due() -> None:
    jittered = job(jitter_seconds=3000, misfire_grace_seconds=60)
    tick = late_jittered_tick(jittered)
    now = tick + timedelta(seconds=120)  # past the grace from the tick, not from its due
    once = jittered.model_copy(update={"schedule": _once(tick)})
    plan = plan_ticks(
        once, once.fire_after, now=now, until=now + timedelta(hours=1), since=now, most=10
    )
    assert plan.filings == [Filing(tick, RunTrigger.SCHEDULE, None)]


def _once(at: datetime) -> OnceSchedule:
    return OnceSchedule(kind="once", at=at)


def _audit(
    cursor: datetime, now: datetime, decided: Collection[datetime], most: int = 100
) -> CursorAudit:
    """The audit of an every-minute job with no grace, and a takeover time of 10 s."""
    return audit_cursor(
        job(misfire_grace_seconds=1),
        cursor,
        now=now,
        takeover=Takeover(timedelta(seconds=10), T0 - timedelta(days=1)),
        decided=decided,
        most=most,
    )


def test_the_audit_counts_each_run_of_ticks_without_a_row_and_stops_at_most() -> None:
    minute, reach = timedelta(minutes=1), timedelta(seconds=1)
    decided = {T0 + 4 * minute}
    # A cursor between ticks (a threshold, say) waits for the next.
    done = _audit(T0 + minute / 2, T0 + 10 * minute + reach, decided)
    assert done.cursor == T0 + 10 * minute  # the first tick within reach
    assert [(m.first, m.last, m.count) for m in done.missed] == [
        (T0 + minute, T0 + 3 * minute, 3),
        (T0 + 5 * minute, T0 + 9 * minute, 5),
    ]
    assert done.owed == []  # 1 s after it was due: not yet the takeover time
    assert done.due_at == T0 + 10 * minute
    capped = _audit(T0 + 5 * minute, T0 + 10 * minute + reach, decided, most=2)
    assert capped.cursor == T0 + 7 * minute  # the rest is the next round's
    assert [(m.first, m.count) for m in capped.missed] == [(T0 + 5 * minute, 2)]
    # Past the reach it walks on over ticks decided already, to the first still open:
    # the claims that follow meet the cursor there.
    ahead = _audit(T0 + minute / 2, T0 + 2 * minute + reach, {T0 + 2 * minute})
    assert ahead.cursor == T0 + 3 * minute
    assert [(m.first, m.count) for m in ahead.missed] == [(T0 + minute, 1)]
    # A cursor standing at a tick counts it; one within reach moves nowhere.
    assert _audit(T0 + 9 * minute, T0 + 9 * minute, ()).missed == []


def test_the_audit_hands_over_the_ticks_within_reach_due_longer_ago_than_the_takeover() -> None:
    minute = timedelta(minutes=1)
    late = audit_cursor(
        job(misfire_grace_seconds=300),
        T0,
        now=T0 + 3 * minute + timedelta(seconds=30),
        takeover=Takeover(timedelta(seconds=10), T0 - minute),
        decided={T0 + minute},
        most=100,
    )
    assert late.missed == []
    # T0 + minute ran: the others owed, each with the tick after it.
    assert [(o.tick, o.following) for o in late.owed] == [
        (T0, T0 + minute),
        (T0 + 2 * minute, T0 + 3 * minute),
        (T0 + 3 * minute, T0 + 4 * minute),
    ]
    assert late.cursor == T0  # it moves as they are claimed
    # Looked at again a takeover period after this hand-over (before the first tick not
    # handed over, T0 + 4 min): any still without a row then was let go, or its taker
    # died, and goes again.
    assert late.due_at == T0 + 3 * minute + timedelta(seconds=30)


@pytest.mark.parametrize("adopted", [None, 420.0])
def test_the_audit_stops_at_a_queue_one_tick_waiting_however_late(adopted: float | None) -> None:
    """T0 + 2 min waits in its queue_one slot for the run of T0 + 1 min, 5 minutes past
    its 1 s grace. The ticks before it are walked as ever (T0 missed); it is no misfire
    and, while its waiter lives, no tick to hand over; nor is any tick after it. If the
    auditor took the slot of a waiter gone, the tick is handed to it to wait, for the
    slot's time left. Either way the audit looks again a takeover period later."""
    minute = timedelta(minutes=1)
    now = T0 + 7 * minute
    done = audit_cursor(
        job(misfire_grace_seconds=1),
        T0,
        now=now,
        takeover=Takeover(timedelta(seconds=10), T0 - timedelta(days=1)),
        decided={T0 + minute},
        most=100,
        waiting=WaitingTick(T0 + 2 * minute, adopted),
    )
    assert [(m.first, m.count) for m in done.missed] == [(T0, 1)]
    assert done.cursor == T0 + 2 * minute
    handed = [(o.tick, o.following, o.waits_seconds) for o in done.owed]
    assert handed == ([] if adopted is None else [(T0 + 2 * minute, T0 + 3 * minute, adopted)])
    assert done.due_at == now


@pytest.mark.parametrize("catchup", ["none", "latest"])
def test_ticks_missed_by_every_live_replica_are_the_catch_up_policy_s(catchup: str) -> None:
    """The earliest live replica joined at T0 + 2 min: the ticks within reach before
    then fell while every replica now live was down. None of them is taken over: under
    `none` they misfire now, under `latest` the last waits for its owner's catch-up
    (the cursor holds there, the walk goes on past it). Those due since are owed."""
    minute = timedelta(minutes=1)
    every_minute = job(misfire_grace_seconds=300, catchup=catchup)
    done = audit_cursor(
        every_minute,
        T0,
        now=T0 + 3 * minute + timedelta(seconds=30),
        takeover=Takeover(timedelta(seconds=10), T0 + 2 * minute),
        decided=set(),
        most=100,
    )
    assert [o.tick for o in done.owed] == [T0 + 2 * minute, T0 + 3 * minute]
    if catchup == "none":
        assert [(m.first, m.count) for m in done.missed] == [(T0, 2)]
        assert done.cursor == T0 + 2 * minute
    else:
        assert [(m.first, m.count) for m in done.missed] == [(T0, 1)]
        assert done.cursor == T0 + minute  # the catch-up tick, waited for
    assert done.due_at == T0 + 3 * minute + timedelta(seconds=30)  # the hand-over


def test_a_catch_up_tick_nobody_claims_misfires_once_past_its_reach() -> None:
    minute = timedelta(minutes=1)
    every_minute = job(misfire_grace_seconds=120)
    takeover = Takeover(timedelta(seconds=10), T0 + 2 * minute)
    later = audit_cursor(
        every_minute,
        T0 + minute,
        now=T0 + minute + timedelta(seconds=121),
        takeover=takeover,
        decided={T0 + 2 * minute, T0 + 3 * minute},
        most=100,
    )
    assert [(m.first, m.count) for m in later.missed] == [(T0 + minute, 1)]
    assert later.owed == []
    assert later.cursor == T0 + 4 * minute  # past the ticks the owner ran


def test_an_edit_supersedes_each_run_of_old_ticks_without_a_row_but_the_new_ticks() -> None:
    """The old definition's ticks from the cursor up to the edit, with no row, in runs
    broken by ticks that have one and by ticks the new definition has too (one after its
    threshold, due before the edit wrote it)."""
    minute = timedelta(minutes=1)
    old = job()
    fence = T0 + 4 * minute + minute / 2
    new = replace_job(old, old.spec().model_copy(update={"end_at": T0 + 7 * minute}), fence)
    assert new.fire_after == fence  # a window edit is a new threshold
    edited = T0 + 5 * minute + minute / 2

    def runs(cursor: datetime, most: int = 100) -> list[tuple[datetime, datetime, int]]:
        found = superseded_ticks(
            old, new, cursor, until=edited, decided={T0 + 3 * minute}, most=most
        )
        return [(r.first, r.last, r.count) for r in found]

    assert runs(T0 + minute) == [
        (T0 + minute, T0 + 2 * minute, 2),
        (T0 + 4 * minute, T0 + 4 * minute, 1),  # T0 + 5 min is the new definition's
    ]
    assert runs(T0 + minute, most=1) == [(T0 + minute, T0 + minute, 1)]
    assert runs(T0 + 9 * minute) == []  # a cursor after the edit: nothing undecided


def test_a_window_edit_reopens_a_completed_job_only_with_a_tick_left() -> None:
    ended = complete_if_ended(job(end_at=T0), T0 + timedelta(hours=1))
    assert ended.state is JobState.COMPLETED
    later = T0 + timedelta(days=1)
    extended = replace_job(ended, ended.spec().model_copy(update={"end_at": later}), T0)
    assert (extended.state, extended.fire_after) == (JobState.ACTIVE, T0)
    moved = replace_job(
        ended, ended.spec().model_copy(update={"end_at": T0 - timedelta(minutes=1)}), T0
    )
    assert moved.state is JobState.COMPLETED
