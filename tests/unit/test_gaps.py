"""The split of a run of missed ticks a backfill reaches into (`service.domain.gaps`):
every tick of the run keeps exactly one count, whichever ticks are backfilled."""

from datetime import UTC, datetime, timedelta

import pytest

from service.domain.gaps import GapSplit, Outcome, split_gaps
from service.domain.jobs import Job, JobSpec, create_job
from service.domain.schedules import CronSchedule

MADE = datetime(2026, 1, 1, tzinfo=UTC)
T = [MADE + timedelta(minutes=n) for n in range(12)]  # T[1] is the job's first tick


def _job() -> Job:
    every_minute = CronSchedule(kind="cron", expression="* * * * *")
    return create_job("j", JobSpec(schedule=every_minute, task="log", args={}), MADE)


def _counts(split: GapSplit) -> dict[datetime, int]:
    return {**dict(split.parts), split.gap: split.keeps}


@pytest.mark.parametrize(
    ("backfilled", "counts"),
    [
        ([T[4], T[5]], {T[3]: 3, T[4]: 1, T[5]: 1}),
        ([T[2]], {T[1]: 1, T[2]: 1, T[5]: 3}),
        ([T[1]], {T[1]: 1, T[5]: 4}),
        ([T[5]], {T[4]: 4, T[5]: 1}),
        ([T[1], T[3], T[5]], {T[1]: 1, T[2]: 1, T[3]: 1, T[4]: 1, T[5]: 1}),
        ([T[3], T[4], T[5], T[6], T[7]], {T[2]: 2, T[3]: 1, T[4]: 1, T[5]: 1}),
    ],
)
def test_each_tick_of_the_run_is_counted_once(
    backfilled: list[datetime], counts: dict[datetime, int]
) -> None:
    [split] = split_gaps(_job(), backfilled, [Outcome(T[5], 5)])
    assert (split.gap, split.was) == (T[5], 5)
    assert _counts(split) == counts
    assert sum(counts.values()) == 5


def test_a_run_only_known_by_its_count_is_split_by_counting_back() -> None:
    """The run's ticks before the first backfilled one are not walked, only counted."""
    [split] = split_gaps(_job(), [T[9]], [Outcome(T[10], 10)])
    assert _counts(split) == {T[8]: 8, T[9]: 1, T[10]: 1}


def test_runs_the_backfill_does_not_reach_are_left_alone() -> None:
    job = _job()
    assert split_gaps(job, [T[6], T[7]], [Outcome(T[5], 5), Outcome(T[8], 1)]) == []
    assert split_gaps(job, [T[3]], [Outcome(T[5], 2)]) == []  # before the run: not its tick
    assert split_gaps(job, [T[3]], [Outcome(T[5])]) == []  # a tick's own row


def test_two_runs_in_one_backfill_are_split_each() -> None:
    rows = [Outcome(T[3], 3), Outcome(T[4]), Outcome(T[8], 4)]
    splits = split_gaps(_job(), [T[2], T[3], T[4], T[5], T[6]], rows)
    assert [_counts(split) for split in splits] == [
        {T[1]: 1, T[2]: 1, T[3]: 1},
        {T[5]: 1, T[6]: 1, T[8]: 2},
    ]


def test_a_run_before_the_threshold_belongs_to_another_schedule() -> None:
    job = _job().model_copy(update={"fire_after": T[6]})
    assert split_gaps(job, [T[4]], [Outcome(T[5], 5)]) == []
