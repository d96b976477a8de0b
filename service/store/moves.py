"""Where a decided tick moves its job's cursor: worked out from the job's schedule by
the adapter that writes the tick, and handed to its statement as values (a statement
module computes nothing)."""

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple
from uuid import UUID

from service.domain.hooks import HookPlan, events_of_skip
from service.domain.jobs import Job
from service.domain.runs import RunTrigger
from service.store.rows import Encoded, encoded_calls
from service.store.values import Following, NextTick, Skip, TickClaim


class CursorMove(NamedTuple):
    """Where the cursor goes once a tick is decided (`following`; None: it stays, or
    the job has no tick after), and whether the tick is the job's first (`opens`: a
    cursor still at the threshold waits for it)."""

    following: datetime | None
    opens: bool


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


@dataclass(frozen=True)
class ClaimedTick:
    """A tick to claim, with the move of its cursor (`fire_sql.CLAIM`'s row)."""

    tick: TickClaim
    move: CursorMove


def claimed_ticks(ticks: Sequence[TickClaim]) -> list[ClaimedTick]:
    return [
        ClaimedTick(t, cursor_moves(t.job, t.scheduled_for, t.trigger, t.following)) for t in ticks
    ]


@dataclass(frozen=True)
class SkippedTick:
    """A skip to record, with its row's id, the move of its cursor and its hooks' calls
    (`fire_sql.RECORD_SKIPS`'s row)."""

    skip: Skip
    id: UUID
    move: CursorMove
    calls: Encoded | None


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
