"""The cluster-wide chores: taking a round, the overdue and next-tick books, retention
and the members' list (statements in `chores_sql` and `members_sql`)."""

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from service.domain.jobs import Job
from service.domain.ownership import Member
from service.store import chores_sql, members_sql
from service.store.base import StoreBase
from service.store.rows import (
    job_from_row,
    member_from_row,
)

# Jobs whose history one statement of a retention round prunes.
PRUNE_JOBS_PER_STATEMENT = 200


@dataclass(frozen=True)
class OverdueSummary:
    """What the overdue book holds: how many jobs, filed when (None: never yet)."""

    count: int
    checked_at: datetime | None


class ChoreStore(StoreBase):
    """The chores' statements."""

    async def take_chore(self, name: str, every_seconds: float) -> bool:
        """Take this round of a cluster-wide chore (`overdue`, `audit`), unless one
        began in the last `every_seconds` (on any replica)."""
        async with self._bounded() as connection:
            taken = await connection.fetchval(chores_sql.TAKE_CHORE, name, every_seconds)
        return bool(taken)

    async def active_jobs_page(self, after: str | None, limit: int) -> list[Job]:
        """Active jobs in name order, the first `limit` after the name `after`."""
        rows = await self._pool.fetch(chores_sql.ACTIVE_JOBS_PAGE, after, limit)
        return [job_from_row(row) for row in rows]

    async def file_next_ticks(self, ticks: Sequence[tuple[Job, datetime | None]]) -> None:
        """Book each job's next tick (None: it has none left), for the jobs still active at
        the revision given."""
        filing = chores_sql.FILE_NEXT_TICKS
        await self._pool.execute(filing.text, *filing.arguments(ticks=ticks))

    async def file_next_ticks_page(
        self, ticks: Sequence[tuple[Job, datetime | None]], after: str | None, through: str | None
    ) -> None:
        """The overdue check's page: book these active jobs' next ticks, and drop the rows
        of jobs named in (after, through] (None: open) that are no longer active."""
        filing = chores_sql.FILE_NEXT_TICKS_PAGE
        arguments = filing.arguments(ticks=ticks, after=after, through=through)
        await self._pool.execute(filing.text, *arguments)

    async def file_overdue(self, ticks: Sequence[tuple[str, datetime]]) -> None:
        """Replace the overdue book with these (job, missed tick) pairs."""
        async with self._pool.acquire() as connection, connection.transaction():
            await connection.execute(chores_sql.CLEAR_BOOK)
            await connection.execute(
                chores_sql.FILE_BOOK.text, *chores_sql.FILE_BOOK.arguments(ticks=ticks)
            )
            await connection.execute(chores_sql.FINISH_CHORE, "overdue")

    async def overdue_summary(self) -> OverdueSummary:
        async with self._bounded() as connection:
            row = await connection.fetchrow(chores_sql.SUMMARY)
        assert row is not None, "one row: a select of two subqueries"
        return OverdueSummary(row["overdue"], row["checked_at"])

    async def booked_overdue(self) -> list[tuple[Job, datetime]]:
        """The jobs in the overdue book, in name order, with the tick found missed."""
        rows = await self._pool.fetch(chores_sql.BOOKED_JOBS)
        return [(job_from_row(row), row["overdue_tick"]) for row in rows]

    async def prune_runs(
        self, keep: int, every_seconds: float = 0, output_bytes: int | None = None
    ) -> int:
        """Delete runs beyond the newest `keep` per job, sparing every run younger than
        its job's misfire grace plus 5 minutes (those rows still fence late replicas)
        and every run still `running` (its end is yet to be recorded on it); and the
        runs a delete left behind once they ended (chores_sql.PRUNE_DETACHED). Return
        how many were deleted: 0 if a replica began a round in the last `every_seconds`.

        One replica per round walks every job, PRUNE_JOBS_PER_STATEMENT at a time, each
        batch in a transaction of its own: a round deletes all that is due, however
        many rows that is, with no statement holding row locks for long. With
        `output_bytes`, each batch's jobs then keep that many bytes of outputs and logs
        at most, the newest (chores_sql.TRIM_OUTPUTS)."""
        if not await self._pool.fetchval(chores_sql.TAKE_CHORE, "retention", every_seconds):
            return 0
        detached = await self._pool.execute(
            chores_sql.PRUNE_DETACHED, chores_sql.DETACHED_KEPT_SECONDS
        )
        pruned, after = int(detached.split()[-1]), None
        while True:
            pruning = chores_sql.PRUNE_RUNS
            batch = pruning.arguments(keep=keep, after=after, jobs=PRUNE_JOBS_PER_STATEMENT)
            row = await self._pool.fetchrow(pruning.text, *batch)
            assert row is not None, "one row: a select of two subqueries"
            pruned += int(row["pruned"])
            if output_bytes is not None:
                trimming = chores_sql.TRIM_OUTPUTS
                trim = trimming.arguments(
                    bytes=output_bytes, after=after, jobs=PRUNE_JOBS_PER_STATEMENT
                )
                await self._pool.fetchval(trimming.text, *trim)
            if (after := row["last_job"]) is None:
                return pruned

    async def pruned_through(self, job: str) -> datetime | None:
        """The newest tick of `job` whose run retention deleted, if any did."""
        through: datetime | None = await self._pool.fetchval(chores_sql.PRUNED_THROUGH, job)
        return through

    async def live_members(self) -> list[Member]:
        """The cluster's live members in seed order, as their rows last reported them."""
        async with self._bounded() as connection:
            rows = await connection.fetch(members_sql.LIVE_MEMBERS)
        return [member_from_row(row) for row in rows]
