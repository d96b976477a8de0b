"""Where a decided tick moves its job's cursor: worked out from the job's schedule by
the adapter that writes the tick, and handed to its statement as values (a statement
module computes nothing)."""

from collections.abc import Sequence
from datetime import datetime
from uuid import UUID

from service.domain.hooks import HookPlan, events_of_skip
from service.domain.jobs import Job
from service.domain.runs import RunTrigger
from service.store.fire_sql import ClaimedTick, CursorMove, SkippedTick
from service.store.rows import encoded_calls
from service.store.values import Following, NextTick, Skip, TickClaim


def cursor_moves(
    job: Job, at: datetime, trigger: RunTrigger, following: NextTick = Following.UNKNOWN
) -> CursorMove:
    """Where the job's cursor goes once the tick `at` is decided (`following`, where
    known). Manual runs and backfills move no cursor."""
    if trigger in {RunTrigger.MANUAL, RunTrigger.CHAIN, RunTrigger.BACKFILL}:
        return CursorMove(None, False)
    if following is Following.UNKNOWN:
        following = job.tick_after(at)
    return CursorMove(following, job.first_tick == at)


def claimed_ticks(ticks: Sequence[TickClaim]) -> list[ClaimedTick]:
    return [
        ClaimedTick(t, cursor_moves(t.job, t.scheduled_for, t.trigger, t.following)) for t in ticks
    ]


def skipped_ticks(skips: Sequence[Skip], ids: Sequence[UUID], plan: HookPlan) -> list[SkippedTick]:
    return [
        SkippedTick(
            skip,
            run_id,
            cursor_moves(skip.job, skip.scheduled_for, skip.trigger, skip.following),
            encoded_calls(
                plan.calls(skip.job.hooks, skip.job.default_hooks, events_of_skip(skip.reason))
            ),
        )
        for skip, run_id in zip(skips, ids, strict=True)
    ]
