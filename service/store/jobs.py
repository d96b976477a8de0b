"""The job definitions: create, read, list, change and delete (statements in `jobs_sql`).
Every write opens the cursors of the jobs it makes or reschedules and notifies the
schedulers, in its own transaction."""

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Self
from uuid import UUID

import asyncpg

from service.domain.errors import Conflict
from service.domain.jobs import Job, JobState, done_with_its_tick
from service.domain.runs import DELETED_BY_TICKGATE, JOB_DELETED, Run
from service.store import jobs_sql, session_sql
from service.store.base import StoreBase
from service.store.columns import Statement
from service.store.connection import Connection
from service.store.cursors import open_cursors, supersede
from service.store.ports import JobUpdateFn
from service.store.rows import (
    job_from_row,
    job_values,
    last_run_from_row,
)

_INSERT_ATTEMPTS = 3


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
class JobFilter:
    state: JobState | None = None
    task: str | None = None
    prefix: str | None = None
    labels: Labels = ()  # every one of these (key, value) pairs

    def arguments(self, **more: Any) -> dict[str, Any]:
        """The filters given, by name, with `more` (None is not given)."""
        given = {"state": self.state, "task": self.task, "prefix": self.prefix} | more
        labels = {"labels": dict(self.labels)} if self.labels else {}
        return {name: value for name, value in given.items() if value is not None} | labels

    def admits(self, job: Job) -> bool:
        """The same test as list_jobs' WHERE clause, for jobs already in hand."""
        return (
            (self.state is None or job.state is self.state)
            and (self.task is None or job.task == self.task)
            and (self.prefix is None or job.name.startswith(self.prefix))
            and all(job.labels.get(key) == value for key, value in self.labels)
        )


class JobStore(StoreBase):
    """The job definitions' statements."""

    async def job_counts(self) -> dict[JobState, int]:
        async with self._bounded() as connection:
            rows = await connection.fetch(jobs_sql.COUNTS)
        counts = dict.fromkeys(JobState, 0)
        counts.update({JobState(row["state"]): row["count"] for row in rows})
        return counts

    async def app_last_successes(self) -> dict[str, datetime | None]:
        """Each job an app fires and when a run of it last succeeded (None: never yet)."""
        async with self._bounded() as connection:
            rows = await connection.fetch(jobs_sql.APP_LAST_SUCCESSES)
        return {row["name"]: row["finished_at"] for row in rows}

    async def get_job(self, name: str) -> Job | None:
        row = await self._pool.fetchrow(jobs_sql.GET_JOB, name)
        return job_from_row(row) if row else None

    async def show_job(self, name: str) -> ShownJob | None:
        """The job and its latest run, in one statement."""
        row = await self._pool.fetchrow(jobs_sql.SHOW_JOB, name)
        return ShownJob.of(row) if row else None

    async def list_jobs(self, limit: int, after: str | None, where: JobFilter) -> list[ShownJob]:
        """Jobs in name order, strictly after `after`, each with its latest run."""
        given = where.arguments(after=after, limit=limit)
        statement = jobs_sql.list_jobs(frozenset(given))
        rows = await self._pool.fetch(statement.text, *statement.arguments(**given))
        return [ShownJob.of(row) for row in rows]

    async def list_jobs_by_next_tick(
        self, limit: int, after: TickPosition | None, where: JobFilter
    ) -> list[tuple[ShownJob, TickPosition]]:
        """Jobs in the next-tick book's order, strictly after `after`, each with its latest
        run and its place: first the active jobs with a booked tick by (tick, name), then
        every other job by name. Each page is one index range of the book, and a range of
        jobs by name only once the booked ones run out."""
        rows: list[Any] = []
        if after is None or after.tick is not None:
            start = after or TickPosition(_BEFORE_EVERY_TICK, "")
            rows = await self._page(
                jobs_sql.jobs_by_next_tick, where, after=start.name, limit=limit, tick=start.tick
            )
        if len(rows) < limit:
            name = after.name if after is not None and after.tick is None else ""
            rows += await self._page(
                jobs_sql.jobs_after_ticks, where, after=name, limit=limit - len(rows)
            )
        return [_placed(ShownJob.of(row), row["booked_tick"]) for row in rows]

    async def _page(
        self, statement_of: Callable[[frozenset[str]], Statement], where: JobFilter, **more: Any
    ) -> list[Any]:
        given = where.arguments(**more)
        statement = statement_of(frozenset(given))
        return list(await self._pool.fetch(statement.text, *statement.arguments(**given)))

    async def active_versions(self) -> dict[str, tuple[UUID, int]]:
        """Name to revision (incarnation, version) of every active job."""
        rows = await self._pool.fetch(jobs_sql.ACTIVE_VERSIONS)
        return {row["name"]: (row["incarnation"], row["version"]) for row in rows}

    async def get_jobs(self, names: Sequence[str]) -> list[Job]:
        """The jobs of these names that exist. What they have in common is held once."""
        async with self._bounded() as connection:
            rows = await connection.fetch(
                jobs_sql.GET_JOBS,
                list(names),
            )
        return [self._shared.job_from_row(row) for row in rows]

    async def ended_jobs(self) -> list[Job]:
        """Active jobs with nothing left to fire, by the database clock: the `end_at`
        passed, the run cap is used up, or the one-time tick is past its deadline."""
        async with self._bounded() as connection:
            rows = await connection.fetch(jobs_sql.ENDED_JOBS)
        return [job_from_row(row) for row in rows]

    async def insert_job(self, job: Job, next_tick: datetime | None = None) -> bool:
        """Create `job`, book its `next_tick` (None: none), open its cursor and notify the
        schedulers, in one statement; False if a job of that name exists (nothing is
        written). Conflict if its lock_key is taken."""
        arguments = (jobs_sql.JOBS_CHANNEL, next_tick, job.first_tick)
        try:
            rows = await self._pool.fetch(jobs_sql.INSERT_JOB, *job_values(job), *arguments)
        except asyncpg.UniqueViolationError as error:
            if error.constraint_name == jobs_sql.LOCK_KEY_UNIQUE:
                raise _lock_key_conflict(job.name) from error
            raise
        return bool(rows)

    async def update_jobs(self, updates: Mapping[str, JobUpdateFn]) -> None:
        """Apply each update to its job, if the job still exists, in one transaction.

        Rows are locked in name order, so two replicas updating overlapping sets never
        deadlock; `now` given to each update is the database's clock; the schedulers
        are notified of every job that changed, but for a one-time job completed
        (`done_with_its_tick`): no window has a tick of it left, and a crowd's completions
        would have each owner read back every job of the crowd. For updates only:
        nothing is created or deleted here (`mutate_job` does that)."""
        async with self._bounded() as connection, connection.transaction():
            rows = await connection.fetch(jobs_sql.LOCK_JOBS, sorted(updates))
            now: datetime = await connection.fetchval(session_sql.CLOCK)
            before = [job_from_row(row) for row in rows]
            pairs = [(b, a) for b in before if (a := updates[b.name](b, now)) != b]
            changed = [after for _, after in pairs]
            if changed:
                await supersede(connection, pairs)
                await _update_jobs(connection, changed)
                await open_cursors(connection, changed)
                notified = [job.name for job in changed if not done_with_its_tick(job)]
                await _notify_each(connection, notified)

    async def mutate_job(
        self, name: str, change: JobChangeFn, *, by: str = DELETED_BY_TICKGATE
    ) -> JobChange:
        """Run `change` on the row-locked current job and write what it returns.

        `change` gets None for a missing job and returns None to delete. It may raise
        to abort; nothing is written then. Every write notifies the schedulers. A
        delete cancels the job's runs in flight, asked by `by` (jobs_sql.DETACH_RUNS).
        """
        for _ in range(_INSERT_ATTEMPTS):
            try:
                return await self._mutate_once(name, change, by)
            except asyncpg.UniqueViolationError as error:
                if error.constraint_name == jobs_sql.LOCK_KEY_UNIQUE:
                    raise _lock_key_conflict(name) from error
                # A concurrent create of the same name won; run again on its row.
        raise Conflict(f"job {name!r} is being changed concurrently; retry")

    async def apply_jobs(
        self,
        names: Sequence[str],
        plan: JobsPlan,
        prune: Prune | None,
        *,
        dry_run: bool = False,
        by: str = DELETED_BY_TICKGATE,
    ) -> JobsApplied:
        """Bring the named jobs to what `plan` makes of them, and with `prune` delete the
        manager's other jobs, all in one transaction of a few set-based statements.

        Rows are locked in name order, as everywhere. A job that `plan` returns equal to
        the stored one is not written, so its version stays and nobody is notified; every
        job created, updated or deleted notifies the schedulers, as a single change does.
        A `dry_run` does all of it, constraint checks included, then rolls back: what it
        answers is what the apply would have done, and nothing changed (its notifications
        are never sent, as PostgreSQL sends them at commit). The jobs it prunes have
        their runs in flight cancelled, as a delete does, asked by `by`.
        """
        for _ in range(_INSERT_ATTEMPTS):
            try:
                return await self._apply_jobs_once(names, plan, prune, dry_run, by)
            except _NameTaken:
                pass  # a concurrent create of one of the names won; plan again on its row
            except _RolledBack as rolled_back:
                return rolled_back.applied
        raise Conflict("jobs of this set are being created concurrently; retry")

    async def _apply_jobs_once(
        self, names: Sequence[str], plan: JobsPlan, prune: Prune | None, dry_run: bool, by: str
    ) -> JobsApplied:
        async with self._pool.acquire() as connection, connection.transaction():
            rows = await connection.fetch(
                jobs_sql.LOCK_NAMED_OR_IN_SCOPE, list(names), *_scope(prune)
            )
            stored = {job.name: job for job in map(job_from_row, rows)}
            wanted = plan({name: stored[name] for name in names if name in stored})
            changes = _BulkChanges.between(stored, wanted, pruning=prune is not None)
            await changes.write(connection, stored, by)
            if dry_run:
                raise _RolledBack(changes.applied)  # leaving the block rolls it all back
        return changes.applied

    async def _mutate_once(self, name: str, change: JobChangeFn, by: str) -> JobChange:
        async with self._pool.acquire() as connection, connection.transaction():
            row = await connection.fetchrow(
                jobs_sql.LOCK_JOB,
                name,
            )
            before = job_from_row(row) if row else None
            after = change(before)
            if after != before:
                if before is not None and after is not None:
                    await supersede(connection, [(before, after)])
                await _write_job(connection, name, after, before, by)
                await open_cursors(connection, [after] if after else [])
                await connection.execute(jobs_sql.NOTIFY, jobs_sql.JOBS_CHANNEL, name)
            return JobChange(before, after)


_BEFORE_EVERY_TICK = datetime.min.replace(tzinfo=UTC)


def _placed(shown: ShownJob, booked_tick: datetime | None) -> tuple[ShownJob, TickPosition]:
    return shown, TickPosition(booked_tick, shown.job.name)


def _scope(prune: Prune | None) -> tuple[bool, str | None, dict[str, str]]:
    """The arguments $2.. of jobs_sql.LOCK_NAMED_OR_IN_SCOPE."""
    if prune is None:
        return False, None, {}
    return True, prune.managed_by, dict(prune.labels)


@dataclass(frozen=True)
class _BulkChanges:
    """The writes of a bulk apply: the jobs to create and update, the names to delete."""

    created: list[Job]
    updated: list[Job]
    doomed: list[Job]
    applied: JobsApplied

    @classmethod
    def between(
        cls, stored: Mapping[str, Job], wanted: Sequence[Job], *, pruning: bool
    ) -> "_BulkChanges":
        created = [job for job in wanted if job.name not in stored]
        updated = [job for job in wanted if job.name in stored and job != stored[job.name]]
        unchanged = [job.name for job in wanted if stored.get(job.name) == job]
        doomed = _pruned(stored, {job.name for job in wanted}) if pruning else []
        applied = JobsApplied(_names(created), _names(updated), tuple(unchanged), _names(doomed))
        return cls(created, updated, doomed, applied)

    async def write(self, connection: Connection, stored: Mapping[str, Job], by: str) -> None:
        if self.doomed:  # first: their lock keys are free for the new jobs then
            await connection.execute(jobs_sql.DELETE_JOBS, list(self.applied.deleted))
            await _detach_runs(connection, self.doomed, by)
        await _insert_jobs(connection, self.created)
        if self.updated:
            await supersede(connection, [(stored[job.name], job) for job in self.updated])
            await _update_jobs(connection, self.updated)
        await open_cursors(connection, [*self.created, *self.updated])
        changed = [*self.applied.created, *self.applied.updated, *self.applied.deleted]
        if changed:
            await _notify_each(connection, changed)


def _names(jobs: Sequence[Job]) -> tuple[str, ...]:
    return tuple(job.name for job in jobs)


class _NameTaken(Exception):
    """A job of a bulk apply's set was created by someone else meanwhile."""


class _RolledBack(Exception):
    """A dry run's transaction ends so: written and checked, then rolled back."""

    def __init__(self, applied: JobsApplied) -> None:
        super().__init__("dry run")
        self.applied = applied


def _pruned(stored: Mapping[str, Job], named: set[str]) -> list[Job]:
    """The stored jobs a pruning apply deletes: those in its scope (the only others it
    locked) that it does not name, unless completed: those are history."""
    return [
        job
        for name, job in stored.items()
        if name not in named and job.state is not JobState.COMPLETED
    ]


async def _insert_jobs(connection: Connection, jobs: Sequence[Job]) -> None:
    if not jobs:
        return
    await _refuse_taken_lock_keys(connection, jobs)
    try:
        inserting = jobs_sql.INSERT_JOBS
        rows = await connection.fetch(inserting.text, *inserting.arguments(jobs=jobs))
    except asyncpg.UniqueViolationError as error:
        if error.constraint_name == jobs_sql.LOCK_KEY_UNIQUE:  # taken by a create since the check
            raise Conflict("a new job's lock_key was taken meanwhile; retry") from error
        raise
    if len(rows) < len(jobs):
        raise _NameTaken


async def _refuse_taken_lock_keys(connection: Connection, jobs: Sequence[Job]) -> None:
    """Conflict naming each new job whose lock key a stored job or another new one holds."""
    holders = {
        row["lock_key"]: row["name"]
        for row in await connection.fetch(jobs_sql.HOLDERS_OF_KEYS, [job.lock_key for job in jobs])
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


async def _write_job(
    connection: Connection, name: str, job: Job | None, before: Job | None, by: str
) -> None:
    if job is None:
        await connection.execute(jobs_sql.DELETE, name)
        await _detach_runs(connection, [before] if before else [], by)
    elif before is not None:
        await connection.execute(jobs_sql.UPDATE_JOB, *job_values(job))
    else:
        await connection.execute(jobs_sql.INSERT, *job_values(job))


async def _update_jobs(connection: Connection, jobs: Sequence[Job]) -> None:
    await connection.execute(jobs_sql.UPDATE_JOBS.text, *jobs_sql.UPDATE_JOBS.arguments(jobs=jobs))


async def _notify_each(connection: Connection, names: Sequence[str]) -> None:
    """One notification of a change on the jobs' channel per name."""
    notifying = jobs_sql.NOTIFY_EACH
    arguments = notifying.arguments(channel=jobs_sql.JOBS_CHANNEL, names=names)
    await connection.execute(notifying.text, *arguments)


async def _detach_runs(connection: Connection, deleted: Sequence[Job], by: str) -> None:
    """The deleted jobs' ended runs go; their runs in flight are cancelled, asked by `by`
    (a statement after the delete's own: see jobs_sql.DETACH_RUNS)."""
    gone = [(job.name, job.incarnation) for job in deleted]
    detaching = jobs_sql.DETACH_RUNS
    await connection.execute(
        detaching.text, *detaching.arguments(jobs=gone, by=by, reason=JOB_DELETED)
    )
    await connection.execute(jobs_sql.DELETE_ENDED_RUNS, [job.name for job in deleted])
