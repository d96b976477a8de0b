"""The tick cursors' audit over one connection (statements in `cursor_sql`)."""

import asyncio
from collections import defaultdict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from uuid import uuid4

from service.domain.cursors import (
    CursorAudit,
    MissedTicks,
    Takeover,
    WaitingTick,
    audit_cursor,
    superseded_ticks,
)
from service.domain.hooks import HookPlan, events_of_skip
from service.domain.jobs import Job, JobState, Overlap
from service.domain.runs import SkipReason
from service.store import cursor_sql, session_sql
from service.store.base import StoreBase
from service.store.connection import Connection, Pool
from service.store.cursor_sql import CursorPlace, FirstTick, MissedRun
from service.store.rows import encoded_calls, job_from_row
from service.store.values import Audited, Filed, WindowRead, waits_for_a_tick

# Ticks one audit walks per cursor: a long outage of a frequent job is worked off over
# several batches, each a short transaction (its cursors' claims wait for it) of at most
# AUDIT_BATCH x TICKS_PER_CURSOR schedule steps, with the event loop free between them.
TICKS_PER_CURSOR = 100
# Window rows made into jobs between two turns of the event loop.
ROWS_PER_SLICE = 1000
# Cursors whose due_at one statement sets again from their tick, at most.
REFRESH_BATCH = 10_000
# Ticks of an old definition an edit walks per job, at most (`superseded_ticks`).
SUPERSEDED_MOST = 10_000
# Who the `superseded` rows say recorded them: an edit, on whichever process answered it.
SUPERSEDING_RUNNER = "edit"


@dataclass(frozen=True)
class WindowRows:
    """A window read as the database answered it, before its rows become jobs."""

    now: datetime
    until: datetime
    rows: list[Mapping[str, Any]]
    kept: list[tuple[Job, datetime]] = field(default_factory=list)  # filed, reused

    async def read(self, job_of: Callable[[Mapping[str, Any]], Job]) -> WindowRead:
        """The jobs, made a slice at a time: a crowd's window is tens of thousands of
        rows, and the ticks due meanwhile still go out between slices."""
        jobs = list(self.kept)
        for start in range(0, len(self.rows), ROWS_PER_SLICE):
            jobs += [(job_of(r), r["cursor"]) for r in self.rows[start : start + ROWS_PER_SLICE]]
            await asyncio.sleep(0)
        return WindowRead(self.now, self.until, jobs)


async def fetch_window(
    connection: Connection,
    buckets: frozenset[int] | None,
    seconds: float,
    names: Sequence[str] | None = None,
    filed: Filed = lambda _: None,
) -> WindowRows:
    """The active jobs of `buckets` (None: all) with a cursor that may fall due in the
    next `seconds`, by the database's clock, the `filed` ones (at the revision read)
    reused; or, given `names`, the jobs of those names that exist, in any state (and
    cursors past the last tick: `waits_for_a_tick`)."""
    now: datetime = await connection.fetchval(session_sql.CLOCK)
    until = now + timedelta(seconds=seconds)
    if names is not None:
        rows = await connection.fetch(cursor_sql.CURSORED_JOBS, list(names))
        return WindowRows(now, until, rows)
    if buckets is None:
        due = await connection.fetch(cursor_sql.WINDOW_ALL, until)
    else:
        due = await connection.fetch(cursor_sql.WINDOW, sorted(buckets), until)
    kept, unfiled = _filed_at_revision(due, filed)
    rows = await connection.fetch(cursor_sql.WINDOW_JOBS, unfiled) if unfiled else []
    return WindowRows(now, until, rows, kept)


def _filed_at_revision(
    due: Sequence[Mapping[str, Any]], filed: Filed
) -> tuple[list[tuple[Job, datetime]], list[str]]:
    """The jobs read that are filed at the revision read, with their cursors, and the
    names of the others, whose definitions are to read."""
    kept, unfiled = [], []
    for row in due:
        job = filed(row["name"])
        if job is not None and job.revision == (row["incarnation"], row["version"]):
            kept.append((job, row["cursor"]))
        else:
            unfiled.append(row["name"])
    return kept, unfiled


async def refresh(connection: Connection, takeover: timedelta) -> int:
    """Set `due_at` again from the tick, for cursors that only look as if they lag
    (claims moved them on); how many."""
    status = await connection.execute(cursor_sql.REFRESH, REFRESH_BATCH, takeover.total_seconds())
    return int(status.split()[-1])


async def audit(
    connection: Connection, most: int, runner: str, takeover: Takeover, hooks: HookPlan
) -> list[Audited]:
    """Audit up to `most` cursors lagging more than the takeover time, in the caller's
    transaction."""
    lagging_rows = cursor_sql.LAGGING.arguments(
        most=most, takeover_seconds=takeover.after.total_seconds(), taking=takeover.taking
    )
    rows = await connection.fetch(cursor_sql.LAGGING.text, *lagging_rows)
    if not rows:
        return []
    now: datetime = rows[0]["now"]
    lagging = [(job_from_row(row), row["cursor"]) for row in rows]
    decided = await _decided(connection, lagging)
    waiting = await _waiting(connection, [job for job, _ in lagging], runner, takeover.taking)
    audits = [
        (
            job,
            audit_cursor(
                job,
                cursor,
                now=now,
                takeover=takeover,
                decided=decided[job.name],
                most=TICKS_PER_CURSOR,
                waiting=waiting.get(job.name),
            ),
        )
        for job, cursor in lagging
    ]
    moving = cursor_sql.MOVE_CURSORS
    await connection.execute(moving.text, *_pass_arguments(audits, runner, hooks))
    return [Audited(job, done.missed, done.owed) for job, done in audits]


async def _waiting(
    connection: Connection, jobs: list[Job], runner: str, taking: bool
) -> dict[str, WaitingTick]:
    """The tick each queue_one job of `jobs` keeps waiting for its run in progress, if
    any; the slots of waiters gone are this `runner`'s now, if `taking` (`WAITING`)."""
    queued = [job.name for job in jobs if job.overlap is Overlap.QUEUE_ONE]
    if not queued:
        return {}
    waiting = cursor_sql.WAITING
    rows = await connection.fetch(
        waiting.text, *waiting.arguments(jobs=queued, runner=runner, taking=taking)
    )
    return {
        row["job"]: WaitingTick(
            row["scheduled_for"], max(row["seconds_left"], 0.0) if row["adopted"] else None
        )
        for row in rows
    }


async def _decided(
    connection: Connection, lagging: list[tuple[Job, datetime]]
) -> dict[str, set[datetime]]:
    cursors = [(job.name, cursor) for job, cursor in lagging]
    arguments = cursor_sql.DECIDED.arguments(cursors=cursors, most=TICKS_PER_CURSOR)
    rows = await connection.fetch(cursor_sql.DECIDED.text, *arguments)
    decided: dict[str, set[datetime]] = defaultdict(set)
    for row in rows:
        decided[row["job"]].add(row["scheduled_for"])
    return decided


def _pass_arguments(
    audits: list[tuple[Job, CursorAudit]], runner: str, hooks: HookPlan
) -> tuple[object, ...]:
    misfired = events_of_skip(SkipReason.MISFIRE)
    misfires = [
        MissedRun(
            job.name,
            uuid4(),
            run.last,
            run.count,
            misfire_note(run),
            encoded_calls(hooks.calls(job.hooks, job.default_hooks, misfired)),
        )
        for job, done in audits
        for run in done.missed
    ]
    places = [CursorPlace(job.name, done.cursor, done.due_at) for job, done in audits]
    return cursor_sql.MOVE_CURSORS.arguments(misfires=misfires, places=places, runner=runner)


def misfire_note(run: MissedTicks) -> str:
    """What a misfire row the audit wrote says of the ticks it counts."""
    if run.count == 1:
        ticks = f"the tick {run.first.isoformat()}"
    else:
        ticks = f"{run.count} ticks from {run.first.isoformat()} to {run.last.isoformat()}"
    return f"not started within its misfire grace: {ticks}, with no replica starting it"


class CursorStore(StoreBase):
    """The tick cursors' statements on the API pool: the audit, the window and a look."""

    async def refresh_cursors(self, takeover: timedelta) -> int:
        """Set `due_at` again where claims moved cursors on (`cursors.refresh`)."""
        async with self._bounded() as connection:
            return await refresh(connection, takeover)

    async def audit_cursors(self, most: int, runner: str, takeover: Takeover) -> list[Audited]:
        """Audit up to `most` cursors lagging past the takeover time: the ticks they pass
        past reach without a row recorded as misfires, the owed ones returned to claim
        (`cursors.audit`), in one transaction."""
        async with self._bounded() as connection, connection.transaction():
            return await audit(connection, most, runner, takeover, self._hooks)

    async def read_window(
        self,
        buckets: frozenset[int] | None,
        seconds: float,
        names: Sequence[str] | None = None,
        filed: Filed = lambda _: None,
    ) -> WindowRead:
        """The active jobs of `buckets` (None: all) whose cursor may fall due in the
        next `seconds` (those `filed` at their revision reused), or the jobs of `names` in
        any state (`cursors.fetch_window`), each with its cursor; shared parts held
        once, as by `get_jobs`."""
        async with self._bounded() as connection:
            rows = await fetch_window(connection, buckets, seconds, names, filed)
        return await rows.read(self._shared.job_from_row)

    async def cursor(self, job: str) -> datetime | None:
        """The job's tick cursor: every scheduled tick before it has its outcome."""
        async with self._bounded() as connection:
            tick: datetime | None = await connection.fetchval(cursor_sql.CURSOR, job)
        return tick


async def open_cursors(connection: Connection | Pool, jobs: Sequence[Job]) -> None:
    """Move the cursors of these jobs, just written, from their threshold to their first
    tick (`cursor_sql.OPEN_CURSORS`)."""
    if jobs:
        opened = [FirstTick(job.name, job.incarnation, job.version, job.first_tick) for job in jobs]
        arguments = cursor_sql.OPEN_CURSORS.arguments(jobs=opened)
        await connection.execute(cursor_sql.OPEN_CURSORS.text, *arguments)


async def supersede(connection: Connection, changes: Sequence[tuple[Job, Job]]) -> None:
    """Before these (before, after) writes of jobs go in, in the writer's transaction:
    where an active job gets a new threshold (other ticks: schedule, zone, window) or is
    paused, record the ticks of its old definition still undecided, up to now, as
    `superseded` skips (`superseded_ticks`), under its cursor's lock, so that every tick
    it had ends with one outcome. The lock is taken for every such job, rows or not: no
    claim of an old tick gets in between."""
    moved = sorted(
        ((before, after) for before, after in changes if _supersedes(before, after)),
        key=lambda change: change[0].name,
    )
    if not moved:
        return
    rows = await connection.fetch(cursor_sql.LOCK_CURSORS, [before.name for before, _ in moved])
    if not rows:
        return
    now: datetime = rows[0]["now"]
    cursors = {row["job"]: row["tick"] for row in rows if waits_for_a_tick(row["tick"])}
    decided = await _decided_through(connection, cursors, now)
    runs = [
        (before.name, run)
        for before, after in moved
        if (cursor := cursors.get(before.name)) is not None
        for run in superseded_ticks(
            before, after, cursor, until=now, decided=decided[before.name], most=SUPERSEDED_MOST
        )
    ]
    if runs:
        recording = cursor_sql.RECORD_SUPERSEDED
        await connection.execute(recording.text, *_superseded_arguments(runs))


def _supersedes(before: Job, after: Job | None) -> bool:
    """Whether writing `after` over the active `before` ends the ticks it had: a new
    threshold (other ticks), or a pause (no ticks until it resumes, from then on)."""
    if after is None or before.state is not JobState.ACTIVE:
        return False
    return after.fire_after != before.fire_after or after.state is JobState.PAUSED


async def _decided_through(
    connection: Connection, cursors: Mapping[str, datetime], now: datetime
) -> dict[str, set[datetime]]:
    deciding = cursor_sql.DECIDED_THROUGH
    arguments = deciding.arguments(cursors=list(cursors.items()), now=now, most=SUPERSEDED_MOST)
    rows = await connection.fetch(deciding.text, *arguments)
    decided: dict[str, set[datetime]] = defaultdict(set)
    for row in rows:
        decided[row["job"]].add(row["scheduled_for"])
    return decided


def _superseded_arguments(runs: Sequence[tuple[str, MissedTicks]]) -> tuple[object, ...]:
    superseded = [
        MissedRun(job, uuid4(), run.last, run.count, superseded_note(run)) for job, run in runs
    ]
    return cursor_sql.RECORD_SUPERSEDED.arguments(runs=superseded, runner=SUPERSEDING_RUNNER)


def superseded_note(run: MissedTicks) -> str:
    """What a `superseded` row says of the ticks it counts."""
    if run.count == 1:
        ticks = f"the tick {run.first.isoformat()}"
    else:
        ticks = f"{run.count} ticks from {run.first.isoformat()} to {run.last.isoformat()}"
    return f"undecided when an edit changed the job's ticks or paused it: {ticks}"
