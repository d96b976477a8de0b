"""The run ledger: the API's reads of runs, and the fire path's writes that go over the
API pool (skips, the queue_one slot, orphans, an end recorded elsewhere). Statements in
`runs_sql` and `fire_sql`."""

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any
from uuid import UUID, uuid4

from service.domain.gaps import Outcome, split_gaps
from service.domain.hooks import events_of_end
from service.domain.jobs import Job
from service.domain.runs import (
    EARLIER_ATTEMPTS,
    JOB_DELETED,
    AttemptEnd,
    CancelRequest,
    Run,
    RunStatus,
    SkipReason,
)
from service.store import backfill_sql, fire_sql, runs_sql
from service.store.base import StoreBase
from service.store.fire_sql import ABANDONED_ERROR
from service.store.moves import skipped_ticks
from service.store.ports import BackendId, NextAttempt, Orphan, RunEnd, Skip
from service.store.rows import (
    encoded_calls,
    job_from_row,
    last_run_from_row,
    run_from_row,
)
from service.store.runs_sql import RunFilter, RunPosition
from service.store.values import CancelAnswer, KeptRun


class LedgerStore(StoreBase):
    """The ledger's statements on the API pool."""

    async def get_run(self, run_id: UUID) -> Run | None:
        row = await self._pool.fetchrow(runs_sql.GET_RUN, run_id)
        return run_from_row(row) if row else None

    async def get_run_kept(self, run_id: UUID) -> KeptRun | None:
        """The run, with what its last attempt answered (None: its task kept nothing)
        and what it logged (`{"lines": [...], "dropped": n}`, or None), in one read."""
        row = await self._pool.fetchrow(runs_sql.GET_RUN_KEPT, run_id)
        if row is None:
            return None
        earlier = EARLIER_ATTEMPTS.validate_python(row["kept_attempts"] or [])
        return KeptRun(run_from_row(row), row["kept_output"], row["kept_log"], earlier)

    async def list_runs(
        self, job: str | None, limit: int, before: RunPosition | None, where: RunFilter | None
    ) -> list[Run]:
        """Runs of `job` (of every job when None), newest first, strictly older than
        `before`. Only the conditions in use reach the statement: a prepared plan stays
        on the index that serves them (per job, or across jobs)."""
        statement, args = runs_sql.runs_statement(job, before, where or RunFilter(), limit)
        rows = await self._pool.fetch(statement, *args)
        return [run_from_row(row) for row in rows]

    async def last_runs(self, names: Sequence[str]) -> dict[str, Run]:
        rows = await self._pool.fetch(
            runs_sql.LAST_RUNS.text, *runs_sql.LAST_RUNS.arguments(names=names)
        )
        return {run.job: run for run in map(last_run_from_row, rows) if run is not None}

    async def ticks_without_runs(
        self, ticks: Sequence[tuple[str, datetime]], *, unrun: Sequence[SkipReason] = ()
    ) -> set[tuple[str, datetime]]:
        """Which of these (job, tick) pairs have no ledger row yet; a tick skipped for
        one of the `unrun` reasons counts as having none either (it never ran)."""
        async with self._bounded() as connection:
            asking = runs_sql.TICKS_WITHOUT_RUNS
            arguments = asking.arguments(ticks=ticks, unrun=[reason.value for reason in unrun])
            rows = await connection.fetch(asking.text, *arguments)
        return {(row["job"], row["tick"]) for row in rows}

    async def split_missed(self, job: Job, ticks: Sequence[datetime]) -> bool:
        """Give the ticks of a backfill that runs of missed ticks count rows of their
        own (see `ports.Ledger.split_missed`)."""
        if not ticks:
            return True
        async with self._bounded() as connection:
            rows = await connection.fetch(backfill_sql.GAP_ROWS, job.name, min(ticks), max(ticks))
            outcomes = [Outcome(row["scheduled_for"], row["missed_ticks"]) for row in rows]
            splits = split_gaps(job, ticks, outcomes)
            if not splits:
                return True
            arguments = backfill_sql.split_arguments(job.name, splits)
            split: int = await connection.fetchval(backfill_sql.SPLIT_GAPS.text, *arguments)
        return split == len(splits)

    async def finish_run(self, run_id: UUID, end: RunEnd, backend: BackendId) -> Run | None:
        """Record a run's end through the API pool, for a run whose own connection (the
        backend `backend`) is gone, and with it the job's lock. None if the run is no
        longer `running` there: it was recorded already, or the orphan sweep marked it
        `abandoned` or another replica took it over meanwhile."""
        async with self._bounded() as connection:
            [row] = await connection.fetch(
                fire_sql.FINISH.text, *fire_sql.finish_arguments([(run_id, end)], backend)
            )
        return run_from_row(row) if row["id"] is not None else None

    async def record_skips(self, skips: Sequence[Skip], runner: str) -> list[Run]:
        """Record ticks that will not run as `skipped` rows; the skips recorded now (a
        tick that has a row already, or whose job is gone, records nothing)."""
        if not skips:
            return []
        skipped = skipped_ticks(skips, [uuid4() for _ in skips], self._hooks)
        recording = fire_sql.RECORD_SKIPS
        arguments = recording.arguments(skips=skipped, runner=runner)
        async with self._bounded() as connection:
            rows = await connection.fetch(recording.text, *arguments)
        return [run_from_row(row) for row in rows]

    async def orphans(self, most: int) -> list[Orphan]:
        """Runs whose replica is gone (see `ports.Ledger.orphans`)."""
        async with self._bounded() as connection:
            rows = await connection.fetch(fire_sql.ORPHANS, most)
        return [
            Orphan(
                run_from_row(row),
                job_from_row({"job": row["stored_job"]}),
                BackendId(row["backend_pid"], row["backend_start"]),
                row["locked"],
                row["lock_key"],
                row["orphaned_seconds"],
                row["runner_live"],
                row["cancel_requested"],
            )
            for row in rows
        ]

    async def abandon(self, orphans: Sequence[Orphan]) -> list[Run]:
        """End as `abandoned` those of `orphans` still orphaned; those ended."""
        if not orphans:
            return []
        # The abandoned runs' `failure` hooks go with them (by their jobs as stored).
        failed = events_of_end(RunStatus.ABANDONED)
        abandoned = [
            (o.run.id, encoded_calls(self._hooks.calls(o.job.hooks, o.job.default_hooks, failed)))
            for o in orphans
        ]
        arguments = fire_sql.ABANDON.arguments(orphans=abandoned, error=ABANDONED_ERROR)
        async with self._bounded() as connection:
            rows = await connection.fetch(fire_sql.ABANDON.text, *arguments)
        return [run_from_row(row) for row in rows]

    async def note_attempt(self, run: Run, job: Job, ended: AttemptEnd) -> NextAttempt:
        """A retry of a `running` run is to start: its row counts it and keeps `ended`,
        and the job as stored says what it runs (see `ports.Ledger.note_attempt`)."""
        async with self._bounded() as connection:
            row = await connection.fetchrow(
                fire_sql.NOTE_ATTEMPT.text, *fire_sql.note_attempt_arguments(run, job, ended)
            )
        assert row is not None, "one row: a select from one row"
        if row["counted"]:
            return NextAttempt(job_from_row(row))
        return NextAttempt(None, _why_not(row, run, ended.attempt + 1))

    async def reserve_slot(
        self, job: str, tick: datetime, runner: str, expires_in_seconds: float
    ) -> datetime | None:
        """Try to become the one tick of a queue_one job that waits for the run in
        progress; return the tick that holds the slot now (this one if reserved).

        A waiter that died leaves a row that simply expires.
        """
        reserving = fire_sql.RESERVE_SLOT
        arguments = reserving.arguments(
            job=job, tick=tick, runner=runner, expires_in_seconds=expires_in_seconds
        )
        async with self._bounded() as connection:
            held: datetime | None = await connection.fetchval(reserving.text, *arguments)
        return held

    async def release_slot(self, job: str, tick: datetime) -> None:
        async with self._bounded() as connection:
            await connection.execute(fire_sql.RELEASE_SLOT, job, tick)

    async def slot_tick(self, job: str) -> datetime | None:
        async with self._bounded() as connection:
            tick: datetime | None = await connection.fetchval(fire_sql.SLOT_TICK, job)
        return tick

    async def request_cancel(self, request: CancelRequest) -> CancelAnswer | None:
        """Ask the replica running the run to cancel it (see `fire_sql.REQUEST_CANCEL`);
        None if there is no such run."""
        asking = fire_sql.REQUEST_CANCEL
        arguments = asking.arguments(run_id=request.run_id, by=request.by, reason=request.reason)
        async with self._bounded() as connection:
            row = await connection.fetchrow(asking.text, *arguments)
        if row is None:
            return None
        return CancelAnswer(run_from_row(row), row["asked"], row["gone"])

    async def cancels_asked(self, runner: str) -> list[CancelRequest]:
        async with self._bounded() as connection:
            rows = await connection.fetch(fire_sql.CANCELS_ASKED, runner)
        return [CancelRequest(row["id"], row["cancelled_by"], row["cancel_reason"]) for row in rows]


def _why_not(row: Mapping[str, Any], run: Run, attempt: int) -> str:
    """Why NOTE_ATTEMPT did not count the attempt: what the run records as it ends."""
    if row["cancel_asked"]:
        return CancelRequest(run.id, row["cancelled_by"], row["cancel_reason"]).error()
    if not row["same_job"]:
        return f"cancelled: {JOB_DELETED} before attempt {attempt}"
    if row["paused"]:
        return f"cancelled: the job was paused before attempt {attempt}"
    return f"cancelled: the run was ended elsewhere before attempt {attempt}"
