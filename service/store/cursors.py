"""The tick cursors' audit over one connection (statements in `cursor_sql`)."""

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime
from uuid import uuid4

from service.domain.cursors import CursorAudit, MissedTicks, audit_cursor
from service.domain.jobs import Job
from service.store import cursor_sql
from service.store.connection import Connection
from service.store.rows import job_from_row

# Ticks one audit walks per cursor: a long outage of a frequent job is worked off over
# several batches, each a short transaction (its cursors' claims wait for it) of at most
# AUDIT_BATCH x TICKS_PER_CURSOR schedule steps, with the event loop free between them.
TICKS_PER_CURSOR = 100


@dataclass(frozen=True)
class Audited:
    """One cursor the audit moved: its job, and the runs of ticks it recorded missed."""

    job: str
    missed: list[MissedTicks]


async def audit(connection: Connection, most: int, runner: str) -> list[Audited]:
    """Audit up to `most` lagging cursors, in the caller's transaction."""
    rows = await connection.fetch(cursor_sql.LAGGING, most)
    if not rows:
        return []
    now: datetime = rows[0]["now"]
    lagging = [(job_from_row(row), row["cursor"]) for row in rows]
    decided = await _decided(connection, lagging)
    audits = [
        (job, audit_cursor(job, cursor, now - job.reach, decided[job.name], TICKS_PER_CURSOR))
        for job, cursor in lagging
    ]
    await connection.execute(cursor_sql.MOVE_CURSORS, *_pass_arguments(audits, runner))
    return [Audited(job.name, done.missed) for job, done in audits]


async def _decided(
    connection: Connection, lagging: list[tuple[Job, datetime]]
) -> dict[str, set[datetime]]:
    rows = await connection.fetch(
        cursor_sql.DECIDED,
        [job.name for job, _ in lagging],
        [cursor for _, cursor in lagging],
        TICKS_PER_CURSOR,
    )
    decided: dict[str, set[datetime]] = defaultdict(set)
    for row in rows:
        decided[row["job"]].add(row["scheduled_for"])
    return decided


def _pass_arguments(audits: list[tuple[Job, CursorAudit]], runner: str) -> tuple[object, ...]:
    missed = [(job.name, run) for job, done in audits for run in done.missed]
    return (
        [name for name, _ in missed],
        [uuid4() for _ in missed],
        [run.last for _, run in missed],
        [run.count for _, run in missed],
        [misfire_note(run) for _, run in missed],
        runner,
        [job.name for job, _ in audits],
        [done.cursor for _, done in audits],
        [job.reach.total_seconds() for job, _ in audits],
    )


def misfire_note(run: MissedTicks) -> str:
    """What a misfire row the audit wrote says of the ticks it counts."""
    if run.count == 1:
        ticks = f"the tick {run.first.isoformat()}"
    else:
        ticks = f"{run.count} ticks from {run.first.isoformat()} to {run.last.isoformat()}"
    return f"not started within its misfire grace: {ticks}, with no replica starting it"
