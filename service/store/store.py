"""The one class that issues SQL. Every method returns frozen domain objects."""

import json
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Mapping, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Self
from uuid import UUID, uuid4

import asyncpg

from service.domain.cursors import Takeover
from service.domain.errors import Conflict
from service.domain.jobs import Job, JobState
from service.domain.ownership import Member
from service.domain.runs import Run, RunStatus, SkipReason
from service.store import chores_sql, cursor_sql, cursors, fire_sql, members_sql
from service.store.connection import Connection, Pool
from service.store.cursors import Audited, WindowRead
from service.store.link import Link, deadline
from service.store.migrate import applied_versions, migrate
from service.store.ports import JobUpdateFn, Orphan, RunEnd, Skip
from service.store.rows import (
    JOB_COLUMN_TYPES,
    JOB_COLUMNS,
    RUN_COLUMNS,
    SharedParts,
    job_columns,
    job_document,
    job_from_row,
    job_values,
    last_run_columns,
    last_run_from_row,
    member_from_row,
    run_from_row,
)

JOBS_CHANNEL = "tickgate_jobs"
_JOB_PLACEHOLDERS = ", ".join(f"${n}" for n in range(1, JOB_COLUMNS.count(",") + 2))
_INSERT_ATTEMPTS = 3
# Jobs whose history one statement of a retention round prunes.
PRUNE_JOBS_PER_STATEMENT = 200

JobChangeFn = Callable[[Job | None], Job | None]
# Given the stored jobs of a bulk apply's names (those that exist), the jobs as they
# should stand, one per name, in the request's order. It may raise to abort.
JobsPlan = Callable[[Mapping[str, Job]], Sequence[Job]]


@dataclass(frozen=True)
class JobChange:
    before: Job | None
    after: Job | None

    @property
    def created(self) -> bool:
        return self.before is None and self.after is not None


# Selected labels: (key, value) pairs, all of which a job carries.
Labels = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class JobsApplied:
    """What a bulk apply did, by job name."""

    created: tuple[str, ...]
    updated: tuple[str, ...]
    unchanged: tuple[str, ...]
    deleted: tuple[str, ...]


@dataclass(frozen=True)
class Prune:
    """Delete the active and paused jobs in scope that a bulk apply does not name: those
    of `managed_by` (any manager when None) that carry every one of `labels`. At least
    one of the two is given: an empty scope would hold every job."""

    managed_by: str | None
    labels: Labels = ()

    def __post_init__(self) -> None:
        if self.managed_by is None and not self.labels:
            raise ValueError("a prune needs a manager or labels to scope it")


@dataclass(frozen=True)
class OverdueSummary:
    """What the overdue book holds: how many jobs, filed when (None: never yet)."""

    count: int
    checked_at: datetime | None


@dataclass(frozen=True)
class ShownJob:
    """A job with its latest run, as the API shows it."""

    job: Job
    last_run: Run | None

    @classmethod
    def of(cls, row: Mapping[str, Any]) -> Self:
        return cls(job_from_row(row), last_run_from_row(row))


@dataclass(frozen=True)
class TickPosition:
    """Where a page of jobs in next-tick order stopped: the last job's booked tick (None:
    it sorts after every tick, among the jobs ordered by name) and its name."""

    tick: datetime | None
    name: str


@dataclass(frozen=True)
class RunPosition:
    """Where a newest-first page of runs stopped."""

    started_at: datetime
    run_id: UUID


@dataclass(frozen=True)
class RunFilter:
    """Which runs a listing shows: any of `statuses` (all when empty), started in
    [since, until)."""

    statuses: frozenset[RunStatus] = frozenset()
    since: datetime | None = None
    until: datetime | None = None


def _runs_statement(
    job: str | None, before: RunPosition | None, where: RunFilter
) -> tuple[str, list[object]]:
    conditions: list[str] = []
    args: list[object] = []

    def arg(value: object) -> str:
        args.append(value)
        return f"${len(args)}"

    if job is not None:
        conditions.append(f"job = {arg(job)}")
    if before is not None:
        position = f"({arg(before.started_at)}, {arg(before.run_id)}::uuid)"
        conditions.append(f"(started_at, id) < {position}")
    if where.statuses:
        statuses = sorted(status.value for status in where.statuses)
        conditions.append(f"status = ANY({arg(statuses)}::text[])")
    if where.since is not None:
        conditions.append(f"started_at >= {arg(where.since)}")
    if where.until is not None:
        conditions.append(f"started_at < {arg(where.until)}")
    predicate = " AND ".join(conditions) or "TRUE"
    statement = f"""SELECT {RUN_COLUMNS} FROM tickgate_runs WHERE {predicate}
                    ORDER BY started_at DESC, id DESC"""
    return statement, args


@dataclass(frozen=True)
class JobFilter:
    state: JobState | None = None
    task: str | None = None
    prefix: str | None = None
    labels: Labels = ()  # every one of these (key, value) pairs

    def admits(self, job: Job) -> bool:
        """The same test as list_jobs' WHERE clause, for jobs already in hand."""
        return (
            (self.state is None or job.state is self.state)
            and (self.task is None or job.task == self.task)
            and (self.prefix is None or job.name.startswith(self.prefix))
            and all(job.labels.get(key) == value for key, value in self.labels)
        )


async def init_connection(connection: Connection) -> None:
    # JIT compiling pays off for long analytic queries only; Tickgate's statements are
    # short, and under JIT asyncpg's type introspection of a new connection took about
    # a second wherever asyncpg's own guard does not reach. Set here rather than as a
    # startup parameter, which PgBouncer refuses; neither pool's reset undoes it.
    await connection.execute("SET jit = off")
    for jsontype in ("json", "jsonb"):
        await connection.set_type_codec(
            jsontype, encoder=json.dumps, decoder=json.loads, schema="pg_catalog"
        )


ConnectionHook = Callable[[Connection], Awaitable[None]]
ConnectionInit = Callable[[Connection], Coroutine[Any, Any, None]]


async def create_pool(
    dsn: str,
    min_size: int,
    max_size: int,
    reset: ConnectionHook,
    init: ConnectionInit = init_connection,
) -> Pool:
    return await asyncpg.create_pool(
        dsn, min_size=min_size, max_size=max_size, init=init, reset=reset
    )


async def _stateless_reset(_connection: Connection) -> None:
    """The API pool keeps no session state (no SET, LISTEN or session lock; asyncpg
    rolls back any open transaction itself), so it skips asyncpg's reset query: one
    round trip fewer per request."""


class Store:
    """Owns the API pool and every statement run on it.

    The fire path's calls (the `ports.Ledger` methods), and those of the probes and
    the metrics, each answer within the link's `statement_seconds` (the wait for a
    connection included) or raise; past the deadline the connection is dropped, not
    returned to the pool, so a silent link never hangs them.
    """

    def __init__(self, pool: Pool, link: Link | None = None) -> None:
        self._pool = pool
        self._link = link or Link()
        self._shared = SharedParts()

    @classmethod
    async def open(
        cls, dsn: str, *, min_size: int = 1, max_size: int = 10, link: Link | None = None
    ) -> Self:
        link = link or Link()

        async def init(connection: Connection) -> None:
            await init_connection(connection)
            await link.tune(connection)  # keepalives: pool connections never heartbeat

        return cls(await create_pool(dsn, min_size, max_size, _stateless_reset, init), link)

    @asynccontextmanager
    async def _bounded(self, seconds: float | None = None) -> AsyncIterator[Connection]:
        """A pool connection for one call that ends within `seconds` (by default the
        link's `statement_seconds`), the wait for the connection included."""
        seconds = seconds or self._link.statement_seconds
        ends_at = time.monotonic() + seconds
        async with self._pool.acquire(timeout=seconds) as connection:
            left = max(ends_at - time.monotonic(), 0.001)
            with deadline(left, connection.terminate, "statement"):
                yield connection

    async def close(self) -> None:
        await self._pool.close()

    async def migrate(self, through: int | None = None) -> int:
        """Apply pending migrations (up to version `through`: a database as an older
        release left it, for tests); return how many were applied."""
        async with self._pool.acquire() as connection:
            return len(await migrate(connection, through))

    async def schema_versions(self) -> set[int]:
        async with self._pool.acquire() as connection:
            return await applied_versions(connection)

    async def clock(self) -> datetime:
        """The database's clock: the one time every replica agrees on."""
        async with self._bounded() as connection:
            now: datetime = await connection.fetchval("SELECT clock_timestamp()")
        return now

    async def schema_version(self, within: float | None = None) -> int:
        """The newest migration applied; doubles as the readiness ping, answered
        `within` seconds."""
        async with self._bounded(within) as connection:
            version: int | None = await connection.fetchval(
                "SELECT max(version) FROM tickgate_schema_migrations"
            )
        return version or 0

    async def job_counts(self) -> dict[JobState, int]:
        async with self._bounded() as connection:
            rows = await connection.fetch(
                "SELECT state, count(*) FROM tickgate_jobs GROUP BY state"
            )
        counts = dict.fromkeys(JobState, 0)
        counts.update({JobState(row["state"]): row["count"] for row in rows})
        return counts

    async def get_job(self, name: str) -> Job | None:
        row = await self._pool.fetchrow(f"SELECT {_JOB} FROM tickgate_jobs j WHERE name = $1", name)
        return job_from_row(row) if row else None

    async def show_job(self, name: str) -> ShownJob | None:
        """The job and its latest run, in one statement."""
        row = await self._pool.fetchrow(f"{_JOBS_WITH_LAST_RUN} WHERE j.name = $1", name)
        return ShownJob.of(row) if row else None

    async def list_jobs(self, limit: int, after: str | None, where: JobFilter) -> list[ShownJob]:
        """Jobs in name order, strictly after `after`, each with its latest run."""
        rows = await self._pool.fetch(
            f"""{_JOBS_WITH_LAST_RUN}
                WHERE ($1::text IS NULL OR j.name > $1)
                  AND ($2::text IS NULL OR j.state = $2)
                  AND ($3::text IS NULL OR j.task = $3)
                  AND ($4::text IS NULL OR starts_with(j.name, $4))
                  AND j.labels @> $6::jsonb
                ORDER BY j.name LIMIT $5""",
            after,
            where.state,
            where.task,
            where.prefix,
            limit,
            dict(where.labels),
        )
        return [ShownJob.of(row) for row in rows]

    async def list_jobs_by_next_tick(
        self, limit: int, after: TickPosition | None, where: JobFilter
    ) -> list[tuple[ShownJob, TickPosition]]:
        """Jobs in the next-tick book's order, strictly after `after`, each with its latest
        run and its place: first the active jobs with a booked tick by (tick, name), then
        every other job by name. Each page is one index range of the book, and a range of
        jobs by name only once the booked ones run out."""
        filters = (where.state, where.task, where.prefix, dict(where.labels))
        rows: list[Any] = []
        if after is None or after.tick is not None:
            start = after or TickPosition(_BEFORE_EVERY_TICK, "")
            rows = await self._pool.fetch(
                _JOBS_BY_NEXT_TICK, start.name, *filters, limit, start.tick
            )
        if len(rows) < limit:
            name = after.name if after is not None and after.tick is None else ""
            rows += await self._pool.fetch(_JOBS_AFTER_TICKS, name, *filters, limit - len(rows))
        return [_placed(ShownJob.of(row), row["booked_tick"]) for row in rows]

    async def file_next_ticks(self, ticks: Sequence[tuple[Job, datetime | None]]) -> None:
        """Book each job's next tick (None: it has none left), for the jobs still active at
        the revision given."""
        await self._pool.execute(chores_sql.FILE_NEXT_TICKS, *_booked(ticks))

    async def file_next_ticks_page(
        self, ticks: Sequence[tuple[Job, datetime | None]], after: str | None, through: str | None
    ) -> None:
        """The overdue check's page: book these active jobs' next ticks, and drop the rows
        of jobs named in (after, through] (None: open) that are no longer active."""
        await self._pool.execute(chores_sql.FILE_NEXT_TICKS_PAGE, *_booked(ticks), after, through)

    async def active_jobs_page(self, after: str | None, limit: int) -> list[Job]:
        """Active jobs in name order, the first `limit` after the name `after`."""
        rows = await self._pool.fetch(chores_sql.ACTIVE_JOBS_PAGE, after, limit)
        return [job_from_row(row) for row in rows]

    async def claim_chore(self, name: str, every_seconds: float) -> bool:
        """Take this round of a cluster-wide chore (`overdue`, `audit`), unless one
        began in the last `every_seconds` (on any replica)."""
        async with self._bounded() as connection:
            taken = await connection.fetchval(chores_sql.CLAIM_CHORE, name, every_seconds)
        return bool(taken)

    async def refresh_cursors(self, takeover: timedelta) -> int:
        """Set `due_at` again where claims moved cursors on (`cursors.refresh`)."""
        async with self._bounded() as connection:
            return await cursors.refresh(connection, takeover)

    async def audit_cursors(self, most: int, runner: str, takeover: Takeover) -> list[Audited]:
        """Audit up to `most` cursors lagging past the takeover time: the ticks they pass
        past reach without a row recorded as misfires, the owed ones returned to claim
        (`cursors.audit`), in one transaction."""
        async with self._bounded() as connection, connection.transaction():
            return await cursors.audit(connection, most, runner, takeover)

    async def read_window(
        self, buckets: frozenset[int] | None, seconds: float, names: Sequence[str] | None = None
    ) -> WindowRead:
        """The active jobs of `buckets` (None: all) whose cursor may fall due in the
        next `seconds`, or the jobs of `names` in any state (`cursors.read_window`),
        each with its cursor; shared parts held once, as by `get_jobs`."""
        async with self._bounded() as connection:
            rows = await cursors.fetch_window(connection, buckets, seconds, names)
        return await rows.read(self._shared.job_from_row)

    async def cursor(self, job: str) -> datetime | None:
        """The job's tick cursor: every scheduled tick before it has its outcome."""
        async with self._bounded() as connection:
            tick: datetime | None = await connection.fetchval(cursor_sql.CURSOR, job)
        return tick

    async def file_overdue(self, ticks: Sequence[tuple[str, datetime]]) -> None:
        """Replace the overdue book with these (job, missed tick) pairs."""
        async with self._pool.acquire() as connection, connection.transaction():
            await connection.execute(chores_sql.CLEAR_BOOK)
            await connection.execute(
                chores_sql.FILE_BOOK, [job for job, _ in ticks], [tick for _, tick in ticks]
            )
            await connection.execute(chores_sql.FINISH_CHORE, "overdue")

    async def overdue_summary(self) -> OverdueSummary:
        async with self._bounded() as connection:
            row = await connection.fetchrow(chores_sql.SUMMARY)
        assert row is not None, "one row: a select of two subqueries"
        return OverdueSummary(row["overdue"], row["checked_at"])

    async def live_members(self) -> list[Member]:
        """The cluster's live members in seed order, as their rows last reported them."""
        async with self._bounded() as connection:
            rows = await connection.fetch(members_sql.LIVE_MEMBERS)
        return [member_from_row(row) for row in rows]

    async def booked_overdue(self) -> list[tuple[Job, datetime]]:
        """The jobs in the overdue book, in name order, with the tick found missed."""
        rows = await self._pool.fetch(chores_sql.BOOKED_JOBS)
        return [(job_from_row(row), row["overdue_tick"]) for row in rows]

    async def active_versions(self) -> dict[str, tuple[UUID, int]]:
        """Name to revision (incarnation, version) of every active job."""
        rows = await self._pool.fetch(
            "SELECT name, incarnation, version FROM tickgate_jobs WHERE state = 'active'"
        )
        return {row["name"]: (row["incarnation"], row["version"]) for row in rows}

    async def get_jobs(self, names: Sequence[str]) -> list[Job]:
        """The jobs of these names that exist. What they have in common is held once."""
        async with self._bounded() as connection:
            rows = await connection.fetch(
                f"SELECT {_JOB} FROM tickgate_jobs j WHERE name = ANY($1::text[])", list(names)
            )
        return [self._shared.job_from_row(row) for row in rows]

    async def get_run(self, run_id: UUID) -> Run | None:
        row = await self._pool.fetchrow(
            f"SELECT {RUN_COLUMNS} FROM tickgate_runs WHERE id = $1", run_id
        )
        return run_from_row(row) if row else None

    async def list_runs(
        self, job: str | None, limit: int, before: RunPosition | None, where: RunFilter | None
    ) -> list[Run]:
        """Runs of `job` (of every job when None), newest first, strictly older than
        `before`. Only the conditions in use reach the statement: a prepared plan stays
        on the index that serves them (per job, or across jobs)."""
        statement, args = _runs_statement(job, before, where or RunFilter())
        rows = await self._pool.fetch(f"{statement} LIMIT ${len(args) + 1}", *args, limit)
        return [run_from_row(row) for row in rows]

    async def last_runs(self, names: Sequence[str]) -> dict[str, Run]:
        rows = await self._pool.fetch(
            f"""SELECT {last_run_columns("last")} FROM unnest($1::text[]) AS n (name)
                CROSS JOIN LATERAL ({_LAST_RUN_OF.format(job="n.name")}) AS last""",
            list(names),
        )
        return {run.job: run for run in map(last_run_from_row, rows) if run is not None}

    async def ticks_without_runs(
        self, ticks: Sequence[tuple[str, datetime]], *, unrun: Sequence[SkipReason] = ()
    ) -> set[tuple[str, datetime]]:
        """Which of these (job, tick) pairs have no ledger row yet; a tick skipped for
        one of the `unrun` reasons counts as having none either (it never ran)."""
        async with self._bounded() as connection:
            rows = await connection.fetch(
                _TICKS_WITHOUT_RUNS,
                [job for job, _ in ticks],
                [tick for _, tick in ticks],
                [reason.value for reason in unrun],
            )
        return {(row["job"], row["tick"]) for row in rows}

    async def finish_run(self, run_id: UUID, end: RunEnd, backend: int) -> Run | None:
        """Record a run's end through the API pool, for a run whose own connection (the
        backend `backend`) is gone, and with it the job's lock. None if the run is no
        longer `running` there: it was recorded already, or the orphan sweep marked it
        `abandoned` or another replica took it over meanwhile."""
        async with self._bounded() as connection:
            [row] = await connection.fetch(
                fire_sql.FINISH, *fire_sql.finish_arguments([(run_id, end, None)], backend)
            )
        return run_from_row(row) if row["id"] is not None else None

    async def record_skips(self, skips: Sequence[Skip], runner: str) -> list[Run]:
        """Record ticks that will not run as `skipped` rows; the skips recorded now (a
        tick that has a row already, or whose job is gone, records nothing)."""
        if not skips:
            return []
        arguments = fire_sql.skip_arguments(skips, runner, [uuid4() for _ in skips])
        async with self._bounded() as connection:
            rows = await connection.fetch(fire_sql.RECORD_SKIPS, *arguments)
        return [run_from_row(row) for row in rows]

    async def orphans(self, most: int) -> list[Orphan]:
        """Runs whose replica is gone (see `ports.Ledger.orphans`)."""
        async with self._bounded() as connection:
            rows = await connection.fetch(fire_sql.ORPHANS, most)
        return [
            Orphan(
                run_from_row(row),
                job_from_row({"job": row["stored_job"]}),
                row["backend_pid"],
                row["locked"],
                row["lock_key"],
                row["orphaned_seconds"],
                row["runner_live"],
            )
            for row in rows
        ]

    async def abandon(self, orphans: Sequence[Orphan]) -> list[Run]:
        """End as `abandoned` those of `orphans` still orphaned; those ended."""
        if not orphans:
            return []
        async with self._bounded() as connection:
            rows = await connection.fetch(
                fire_sql.ABANDON, [o.run.id for o in orphans], fire_sql.ABANDONED_ERROR
            )
        return [run_from_row(row) for row in rows]

    async def note_attempt(self, run_id: UUID, attempt: int) -> None:
        """A retry of a `running` run starts: its row counts the attempt."""
        async with self._bounded() as connection:
            await connection.execute(fire_sql.NOTE_ATTEMPT, run_id, attempt)

    async def prune_runs(self, keep: int, every_seconds: float = 0) -> int:
        """Delete runs beyond the newest `keep` per job, sparing every run younger than
        its job's misfire grace plus 5 minutes (those rows still fence late replicas)
        and every run still `running` (its end is yet to be recorded on it). Return
        how many were deleted: 0 if a replica began a round in the last `every_seconds`.

        One replica per round walks every job, PRUNE_JOBS_PER_STATEMENT at a time, each
        batch in a transaction of its own: a round deletes all that is due, however
        many rows that is, with no statement holding row locks for long."""
        if not await self._pool.fetchval(chores_sql.CLAIM_CHORE, "retention", every_seconds):
            return 0
        pruned, after = 0, None
        while True:
            row = await self._pool.fetchrow(_PRUNE_RUNS, keep, after, PRUNE_JOBS_PER_STATEMENT)
            assert row is not None, "one row: a select of two subqueries"
            pruned += int(row["pruned"])
            if (after := row["last_job"]) is None:
                return pruned

    async def pruned_through(self, job: str) -> datetime | None:
        """The newest tick of `job` whose run retention deleted, if any did."""
        through: datetime | None = await self._pool.fetchval(
            "SELECT through FROM tickgate_pruned WHERE job = $1", job
        )
        return through

    async def reserve_pending(
        self, job: str, tick: datetime, runner: str, expires_in_seconds: float
    ) -> datetime | None:
        """Try to become the one tick of a queue_one job that waits for the run in
        progress; return the tick that holds the slot now (this one if reserved).

        A waiter that died leaves a row that simply expires.
        """
        async with self._bounded() as connection:
            held: datetime | None = await connection.fetchval(
                fire_sql.RESERVE_PENDING, job, tick, runner, expires_in_seconds
            )
        return held

    async def release_pending(self, job: str, tick: datetime) -> None:
        async with self._bounded() as connection:
            await connection.execute(fire_sql.RELEASE_PENDING, job, tick)

    async def ended_jobs(self) -> list[Job]:
        """Active jobs with nothing left to fire, by the database clock: the window
        closed, the run cap is used up, or the one-time tick is past its deadline."""
        rows = await self._pool.fetch(
            f"""SELECT {_JOB} FROM tickgate_jobs j
                WHERE state = 'active' AND (
                    end_at <= clock_timestamp()
                    OR runs_started >= max_runs
                    OR (schedule->>'kind' = 'once'
                        AND (schedule->>'at')::timestamptz + make_interval(
                            secs => misfire_grace_seconds + jitter_seconds)
                            < clock_timestamp()))"""
        )
        return [job_from_row(row) for row in rows]

    async def insert_job(self, job: Job, next_tick: datetime | None = None) -> bool:
        """Create `job`, book its `next_tick` (None: none) and notify the schedulers, in
        one statement; False if a job of that name exists (nothing is written). Conflict
        if its lock_key is taken."""
        try:
            rows = await self._pool.fetch(_INSERT_JOB, *job_values(job), JOBS_CHANNEL, next_tick)
        except asyncpg.UniqueViolationError as error:
            if error.constraint_name == _LOCK_KEY_UNIQUE:
                raise _lock_key_conflict(job.name) from error
            raise
        if rows:
            await _open_cursors(self._pool, [job])
        return bool(rows)

    async def update_jobs(self, updates: Mapping[str, JobUpdateFn]) -> None:
        """Apply each update to its job, if the job still exists, in one transaction.

        Rows are locked in name order, so two replicas updating overlapping sets never
        deadlock; `now` given to each update is the database's clock; the schedulers
        are notified of every job that changed. For updates only: nothing is created
        or deleted here (`mutate_job` does that)."""
        async with self._bounded() as connection, connection.transaction():
            rows = await connection.fetch(_LOCK_JOBS, sorted(updates))
            now: datetime = await connection.fetchval("SELECT clock_timestamp()")
            before = [job_from_row(row) for row in rows]
            changed = [a for b in before if (a := updates[b.name](b, now)) != b]
            if changed:
                await connection.executemany(_UPDATE_JOB, [job_values(job) for job in changed])
                await _open_cursors(connection, changed)
                await connection.execute(_NOTIFY_EACH, JOBS_CHANNEL, [j.name for j in changed])

    async def mutate_job(self, name: str, change: JobChangeFn) -> JobChange:
        """Run `change` on the row-locked current job and write what it returns.

        `change` gets None for a missing job and returns None to delete. It may raise
        to abort; nothing is written then. Every write notifies the schedulers.
        """
        for _ in range(_INSERT_ATTEMPTS):
            try:
                return await self._mutate_once(name, change)
            except asyncpg.UniqueViolationError as error:
                if error.constraint_name == _LOCK_KEY_UNIQUE:
                    raise _lock_key_conflict(name) from error
                # A concurrent create of the same name won; run again on its row.
        raise Conflict(f"job {name!r} is being changed concurrently; retry")

    async def apply_jobs(
        self, names: Sequence[str], plan: JobsPlan, prune: Prune | None, *, dry_run: bool = False
    ) -> JobsApplied:
        """Bring the named jobs to what `plan` makes of them, and with `prune` delete the
        manager's other jobs, all in one transaction of a few set-based statements.

        Rows are locked in name order, as everywhere. A job that `plan` returns equal to
        the stored one is not written, so its version stays and nobody is notified; every
        job created, updated or deleted notifies the schedulers, as a single change does.
        A `dry_run` does all of it, constraint checks included, then rolls back: what it
        answers is what the apply would have done, and nothing changed (its notifications
        are never sent, as PostgreSQL sends them at commit).
        """
        for _ in range(_INSERT_ATTEMPTS):
            try:
                return await self._apply_jobs_once(names, plan, prune, dry_run)
            except _NameTaken:
                pass  # a concurrent create of one of the names won; plan again on its row
            except _RolledBack as rolled_back:
                return rolled_back.applied
        raise Conflict("jobs of this set are being created concurrently; retry")

    async def _apply_jobs_once(
        self, names: Sequence[str], plan: JobsPlan, prune: Prune | None, dry_run: bool
    ) -> JobsApplied:
        async with self._pool.acquire() as connection, connection.transaction():
            rows = await connection.fetch(_LOCK_NAMED_OR_IN_SCOPE, list(names), *_scope(prune))
            stored = {job.name: job for job in map(job_from_row, rows)}
            wanted = plan({name: stored[name] for name in names if name in stored})
            changes = _BulkChanges.between(stored, wanted, pruning=prune is not None)
            await changes.write(connection)
            if dry_run:
                raise _RolledBack(changes.applied)  # leaving the block rolls it all back
        return changes.applied

    async def _mutate_once(self, name: str, change: JobChangeFn) -> JobChange:
        async with self._pool.acquire() as connection, connection.transaction():
            row = await connection.fetchrow(
                f"SELECT {_JOB} FROM tickgate_jobs j WHERE name = $1 FOR NO KEY UPDATE",
                name,
            )
            before = job_from_row(row) if row else None
            after = change(before)
            if after != before:
                await _write_job(connection, name, after, exists=before is not None)
                await _open_cursors(connection, [after] if after else [])
                await connection.execute("SELECT pg_notify($1, $2)", JOBS_CHANNEL, name)
            return JobChange(before, after)


_LOCK_KEY_UNIQUE = "tickgate_jobs_lock_key_unique"
_TICKS_WITHOUT_RUNS = """SELECT t.job, t.tick
    FROM unnest($1::text[], $2::timestamptz[]) AS t (job, tick)
    WHERE NOT EXISTS (SELECT 1 FROM tickgate_runs r
                      WHERE r.job = t.job AND r.scheduled_for = t.tick
                        AND (r.skip_reason IS NULL OR r.skip_reason <> ALL($3::text[])))"""
_JOB = job_document("j")  # every statement that reads whole jobs names the table j
# A job's latest run: one probe of the runs' (job, started_at DESC, id DESC) index.
_LAST_RUN_OF = f"""SELECT {RUN_COLUMNS} FROM tickgate_runs
    WHERE job = {{job}} ORDER BY started_at DESC, id DESC LIMIT 1"""
_JOBS_WITH_LAST_RUN = f"""SELECT {_JOB}, {last_run_columns("last")}
    FROM tickgate_jobs j LEFT JOIN LATERAL ({_LAST_RUN_OF.format(job="j.name")}) AS last ON true"""
# Changes lock job rows FOR NO KEY UPDATE: two changes of a job still take turns, but a
# claim (which holds its jobs' rows FOR KEY SHARE for one statement) never waits for
# one, nor one for a claim; only a delete does.
# The deletion and the watermark move together, in one statement: a backfill that
# finds a pruned tick missing from the ledger finds the watermark covering it too.
# The watermark only moves forward (a row older than it may still be pruned later).
# A row is spared while its tick is within the job's reach (grace + jitter, `Job.reach`)
# and 300 s more: a pruned tick a replica could still fire would run again.
# Jobs are key-share locked in name order, as the API locks them, before their runs:
# a job deleted meanwhile (it locks the job, then its runs) makes this wait, not deadlock.
_PRUNE_RUNS = """WITH batch AS (
        SELECT name, misfire_grace_seconds + jitter_seconds AS reach FROM tickgate_jobs
        WHERE $2::text IS NULL OR name > $2 ORDER BY name LIMIT $3
        FOR KEY SHARE),
    doomed AS (
        SELECT old.id FROM batch j
        CROSS JOIN LATERAL (
            SELECT id, scheduled_for, status FROM tickgate_runs
            WHERE job = j.name ORDER BY scheduled_for DESC OFFSET $1) AS old
        WHERE old.status <> 'running'
          AND old.scheduled_for
              < clock_timestamp() - make_interval(secs => j.reach + 300)),
    deleted AS (
        DELETE FROM tickgate_runs r USING doomed WHERE r.id = doomed.id
        RETURNING r.job, r.scheduled_for),
    marked AS (
        INSERT INTO tickgate_pruned (job, through)
        SELECT job, max(scheduled_for) FROM deleted GROUP BY job
        ON CONFLICT (job) DO UPDATE
            SET through = greatest(tickgate_pruned.through, excluded.through))
    SELECT (SELECT count(*) FROM deleted) AS pruned, (SELECT max(name) FROM batch) AS last_job"""
_UPDATE_JOB = f"UPDATE tickgate_jobs SET ({JOB_COLUMNS}) = ({_JOB_PLACEHOLDERS}) WHERE name = $1"
_LOCK_JOBS = f"""SELECT {_JOB} FROM tickgate_jobs j WHERE name = ANY($1::text[])
    ORDER BY name FOR NO KEY UPDATE"""
_NOTIFY_EACH = "SELECT pg_notify($1, name) FROM unnest($2::text[]) AS name"
# A create that needs no row lock and no transaction: the name's own uniqueness makes
# the loser of a race see "exists"; the notification goes out only if the row went in.
_INSERT_JOB = f"""WITH inserted AS (
        INSERT INTO tickgate_jobs ({JOB_COLUMNS}) VALUES ({_JOB_PLACEHOLDERS})
        ON CONFLICT (name) DO NOTHING
        RETURNING name),
    booked AS (
        INSERT INTO tickgate_next_ticks (job, tick)
        SELECT name, coalesce(${JOB_COLUMNS.count(",") + 3}::timestamptz, 'infinity')
        FROM inserted)
    SELECT pg_notify(${JOB_COLUMNS.count(",") + 2}, name) FROM inserted"""


# The book's order (migration 0012): the active jobs with a tick by (tick, name), after
# the position ($7, $1); then (_JOBS_AFTER_TICKS) every other job by name, after $1.
# The filters are list_jobs' own; $6 is the limit.
_JOB_FILTERS = """($2::text IS NULL OR j.state = $2)
    AND ($3::text IS NULL OR j.task = $3)
    AND ($4::text IS NULL OR starts_with(j.name, $4))
    AND j.labels @> $5::jsonb"""
_JOBS_BY_NEXT_TICK = f"""SELECT {_JOB}, {last_run_columns("last")}, n.tick AS booked_tick
    FROM tickgate_next_ticks n JOIN tickgate_jobs j ON j.name = n.job
    LEFT JOIN LATERAL ({_LAST_RUN_OF.format(job="j.name")}) AS last ON true
    WHERE (n.tick, n.job) > ($7::timestamptz, $1::text) AND n.tick < 'infinity'
      AND j.state = 'active' AND {_JOB_FILTERS}
    ORDER BY n.tick, n.job LIMIT $6"""
_JOBS_AFTER_TICKS = f"""SELECT {_JOB}, {last_run_columns("last")}, NULL::timestamptz AS booked_tick
    FROM tickgate_jobs j LEFT JOIN tickgate_next_ticks n ON n.job = j.name
    LEFT JOIN LATERAL ({_LAST_RUN_OF.format(job="j.name")}) AS last ON true
    WHERE j.name > $1 AND NOT (j.state = 'active' AND coalesce(n.tick < 'infinity', false))
      AND {_JOB_FILTERS}
    ORDER BY j.name LIMIT $6"""
_BEFORE_EVERY_TICK = datetime.min.replace(tzinfo=UTC)


def _placed(shown: ShownJob, booked_tick: datetime | None) -> tuple[ShownJob, TickPosition]:
    return shown, TickPosition(booked_tick, shown.job.name)


async def _open_cursors(connection: Connection | Pool, jobs: Sequence[Job]) -> None:
    """Move the cursors of these jobs, just written, from their threshold to their first
    tick (`cursor_sql.OPEN_CURSORS`)."""
    if jobs:
        await connection.execute(
            cursor_sql.OPEN_CURSORS,
            [job.name for job in jobs],
            [job.incarnation for job in jobs],
            [job.version for job in jobs],
            [job.first_tick for job in jobs],
        )


def _booked(ticks: Sequence[tuple[Job, datetime | None]]) -> tuple[list[object], ...]:
    """FILE_NEXT_TICKS' columns: names, ticks, incarnations, versions."""
    return (
        [job.name for job, _ in ticks],
        [tick for _, tick in ticks],
        [job.incarnation for job, _ in ticks],
        [job.version for job, _ in ticks],
    )


# A bulk apply's rows, locked in name order: the jobs it names and, when it prunes ($2),
# every job in the prune's scope: of the manager $3 (any when NULL) with the labels $4.
_LOCK_NAMED_OR_IN_SCOPE = f"""SELECT {_JOB} FROM tickgate_jobs j
    WHERE name = ANY($1::text[])
       OR ($2::boolean AND ($3::text IS NULL OR managed_by = $3) AND labels @> $4::jsonb)
    ORDER BY name FOR NO KEY UPDATE"""


def _scope(prune: Prune | None) -> tuple[bool, str | None, dict[str, str]]:
    """The arguments $2.. of _LOCK_NAMED_OR_IN_SCOPE."""
    if prune is None:
        return False, None, {}
    return True, prune.managed_by, dict(prune.labels)


_UNNESTED_JOBS = "unnest({}) AS u ({})".format(
    ", ".join(f"${n}::{sql_type}[]" for n, sql_type in enumerate(JOB_COLUMN_TYPES, start=1)),
    JOB_COLUMNS,
)
# The name conflict is the only one skipped: a lock key taken raises, and is named.
_INSERT_JOBS = f"""INSERT INTO tickgate_jobs ({JOB_COLUMNS})
    SELECT * FROM {_UNNESTED_JOBS} ON CONFLICT (name) DO NOTHING RETURNING name"""
_UPDATE_JOBS = f"""UPDATE tickgate_jobs AS j
    SET ({JOB_COLUMNS}) = ({", ".join(f"u.{c}" for c in JOB_COLUMNS.split(", "))})
    FROM {_UNNESTED_JOBS} WHERE j.name = u.name"""
_DELETE_JOBS = "DELETE FROM tickgate_jobs WHERE name = ANY($1::text[])"
_HOLDERS_OF_KEYS = "SELECT lock_key, name FROM tickgate_jobs WHERE lock_key = ANY($1::bigint[])"


@dataclass(frozen=True)
class _BulkChanges:
    """The writes of a bulk apply: the jobs to create and update, the names to delete."""

    created: list[Job]
    updated: list[Job]
    doomed: list[str]
    applied: JobsApplied

    @classmethod
    def between(
        cls, stored: Mapping[str, Job], wanted: Sequence[Job], *, pruning: bool
    ) -> "_BulkChanges":
        created = [job for job in wanted if job.name not in stored]
        updated = [job for job in wanted if job.name in stored and job != stored[job.name]]
        unchanged = [job.name for job in wanted if stored.get(job.name) == job]
        doomed = _pruned(stored, {job.name for job in wanted}) if pruning else []
        applied = JobsApplied(_names(created), _names(updated), tuple(unchanged), tuple(doomed))
        return cls(created, updated, doomed, applied)

    async def write(self, connection: Connection) -> None:
        if self.doomed:  # first: their lock keys are free for the new jobs then
            await connection.execute(_DELETE_JOBS, self.doomed)
        await _insert_jobs(connection, self.created)
        if self.updated:
            await connection.execute(_UPDATE_JOBS, *job_columns(self.updated))
        await _open_cursors(connection, [*self.created, *self.updated])
        changed = [*self.applied.created, *self.applied.updated, *self.doomed]
        if changed:
            await connection.execute(_NOTIFY_EACH, JOBS_CHANNEL, changed)


def _names(jobs: Sequence[Job]) -> tuple[str, ...]:
    return tuple(job.name for job in jobs)


class _NameTaken(Exception):
    """A job of a bulk apply's set was created by someone else meanwhile."""


class _RolledBack(Exception):
    """A dry run's transaction ends so: written and checked, then rolled back."""

    def __init__(self, applied: JobsApplied) -> None:
        super().__init__("dry run")
        self.applied = applied


def _pruned(stored: Mapping[str, Job], named: set[str]) -> list[str]:
    """The stored jobs a pruning apply deletes: those in its scope (the only others it
    locked) that it does not name, unless completed: those are history."""
    return [
        name
        for name, job in stored.items()
        if name not in named and job.state is not JobState.COMPLETED
    ]


async def _insert_jobs(connection: Connection, jobs: Sequence[Job]) -> None:
    if not jobs:
        return
    await _refuse_taken_lock_keys(connection, jobs)
    try:
        rows = await connection.fetch(_INSERT_JOBS, *job_columns(jobs))
    except asyncpg.UniqueViolationError as error:
        if error.constraint_name == _LOCK_KEY_UNIQUE:  # taken by a create since the check
            raise Conflict("a new job's lock_key was taken meanwhile; retry") from error
        raise
    if len(rows) < len(jobs):
        raise _NameTaken


async def _refuse_taken_lock_keys(connection: Connection, jobs: Sequence[Job]) -> None:
    """Conflict naming each new job whose lock key a stored job or another new one holds."""
    holders = {
        row["lock_key"]: row["name"]
        for row in await connection.fetch(_HOLDERS_OF_KEYS, [job.lock_key for job in jobs])
    }
    clashes = []
    for job in jobs:
        holder = holders.setdefault(job.lock_key, job.name)
        if holder != job.name:
            clashes.append(f"job {job.name!r} has the lock_key of job {holder!r}")
    if clashes:
        raise Conflict("; ".join(clashes) + "; choose other names")


def _lock_key_conflict(name: str) -> Conflict:
    return Conflict(f"job {name!r} has the lock_key of an existing job; choose another name")


async def _write_job(connection: Connection, name: str, job: Job | None, *, exists: bool) -> None:
    if job is None:
        await connection.execute("DELETE FROM tickgate_jobs WHERE name = $1", name)
    elif exists:
        await connection.execute(_UPDATE_JOB, *job_values(job))
    else:
        await connection.execute(
            f"""INSERT INTO tickgate_jobs ({JOB_COLUMNS})
                VALUES ({_JOB_PLACEHOLDERS})""",
            *job_values(job),
        )
