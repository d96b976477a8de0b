"""Rows become frozen domain objects the moment they leave the database."""

import json
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, TypeVar

from service.domain.hooks import HOOKS, HookCall
from service.domain.jobs import Job
from service.domain.ownership import Member
from service.domain.runs import Run
from service.domain.schedules import CHECKED, DailySchedule
from service.store.columns import Column, Columns


@dataclass(frozen=True)
class Encoded:
    """A JSON value encoded already. A JSON array must go so where a statement takes
    the column as an array of rows: asyncpg would read a list as one more dimension."""

    text: str


def encoded_calls(calls: Sequence[HookCall]) -> Encoded | None:
    """Calls as `hooks_sql.deliveries` takes them, one element of a jsonb[]: a JSON array
    encoded already (a list would be one more dimension of the array), or NULL for none."""
    return Encoded(json.dumps([call.stored() for call in calls])) if calls else None


# The one column table of tickgate_jobs: the statements' column lists, the values
# written, their SQL types (for statements that take a column as an array)
# and the rows read all derive from it, so they cannot drift apart.
JOB_TABLE: Columns[Job] = Columns(
    Column("name", "text", lambda job: job.name),
    Column("lock_key", "bigint", lambda job: job.lock_key),
    Column("description", "text", lambda job: job.description),
    Column("schedule", "jsonb", lambda job: job.schedule.model_dump(mode="json")),
    Column("timezone", "text", lambda job: job.timezone),
    Column("task", "text", lambda job: job.task),
    Column("args", "jsonb", lambda job: job.args),
    Column("state", "text", lambda job: job.state.value),
    Column("overlap", "text", lambda job: job.overlap.value),
    Column("timeout_seconds", "integer", lambda job: job.timeout_seconds),
    Column("misfire_grace_seconds", "integer", lambda job: job.misfire_grace_seconds),
    Column("created_at", "timestamptz", lambda job: job.created_at),
    Column("updated_at", "timestamptz", lambda job: job.updated_at),
    Column("fire_after", "timestamptz", lambda job: job.fire_after),
    Column("version", "bigint", lambda job: job.version),
    Column("retry", "jsonb", lambda job: job.retry.model_dump(mode="json")),
    Column("start_at", "timestamptz", lambda job: job.start_at),
    Column("end_at", "timestamptz", lambda job: job.end_at),
    Column("max_runs", "bigint", lambda job: job.max_runs),
    Column("jitter_seconds", "integer", lambda job: job.jitter_seconds),
    Column("catchup", "text", lambda job: job.catchup.value),
    Column("pause_note", "text", lambda job: job.pause_note),
    Column("runs_started", "bigint", lambda job: job.runs_started),
    Column("incarnation", "uuid", lambda job: job.incarnation),
    Column("managed_by", "text", lambda job: job.managed_by),
    Column("labels", "jsonb", lambda job: job.labels),
    Column("capture", "boolean", lambda job: job.capture),
    Column("hooks", "jsonb", lambda job: Encoded(HOOKS.dump_json(job.hooks).decode())),
    Column("default_hooks", "boolean", lambda job: job.default_hooks),
)
JOB_COLUMNS = JOB_TABLE.names
# Instants as text in UTC, whatever the session's TimeZone: `2026-11-29T20:00:00.123456Z`.
_UTC_INSTANT = """'YYYY-MM-DD"T"HH24:MI:SS.US"Z"'"""


def job_document(table: str, name: str | None = "job") -> str:
    """A select-list item: the job in a row of `table` as one JSON text, named `name`
    (None: an expression, unnamed).

    Jobs are read this way because one JSON text parsed and validated in a single pass
    (job_from_row) costs a third of two dozen columns decoded one by one, three of them
    JSON, and then validated."""
    members = ", ".join(
        f"'{column.name}', "
        + (
            f"to_char({table}.{column.name} AT TIME ZONE 'UTC', {_UTC_INSTANT})"
            if column.sql_type == "timestamptz"
            else f"{table}.{column.name}"
        )
        for column in JOB_TABLE.columns
    )
    document = f"json_build_object({members})::text"
    return document if name is None else f"{document} AS {name}"


def job_values(job: Job) -> tuple[object, ...]:
    """`job` as the values of JOB_COLUMNS, in order."""
    return JOB_TABLE.values(job)


RUN_COLUMNS = (
    "id, job, scheduled_for, trigger, status, started_at, finished_at, duration_ms,"
    " attempts, runner, error, result, skip_reason, missed_ticks, args, note"
)
_LAST_RUN = "last_run_"


def last_run_columns(table: str) -> str:
    """RUN_COLUMNS of `table`, named apart from a job's columns in the same row."""
    return ", ".join(
        f"{table}.{column} AS {_LAST_RUN}{column}" for column in RUN_COLUMNS.split(", ")
    )


T = TypeVar("T")

# One empty set shared by every job read from the database, in place of pydantic's
# per-instance set of field names (~2 KB of a ~4.5 KB job). Stored jobs are frozen, so
# pydantic never adds to it, and model_copy copies it before changing the copy's.
_NO_FIELDS_SET: set[str] = set()


def job_from_row(row: Mapping[str, Any]) -> Job:
    """The job in the `job` column of `row` (selected with job_document)."""
    job = Job.model_validate_json(row["job"], context={CHECKED: True})
    object.__setattr__(job, "__pydantic_fields_set__", _NO_FIELDS_SET)
    return job


class SharedParts:
    """One copy of the equal, immutable parts of many jobs: schedule, retry policy,
    timezone, task and args. A window holding 100k jobs then holds each distinct
    value once instead of once per job (about a third of each job's memory). Bounded:
    past LIMIT distinct values it forgets them all and starts over."""

    LIMIT = 50_000

    def __init__(self) -> None:
        self._seen: dict[Hashable, Any] = {}

    def job_from_row(self, row: Mapping[str, Any]) -> Job:
        job = job_from_row(row)
        for name in ("schedule", "retry", "timezone", "task"):
            value = getattr(job, name)
            object.__setattr__(job, name, self._one(_shared_key(value), value))
        # Never mutated: every change of a job's args builds a new dict.
        args_key = ("args", json.dumps(job.args, sort_keys=True))
        object.__setattr__(job, "args", self._one(args_key, job.args))
        return job

    def _one(self, key: Hashable, value: T) -> T:
        if len(self._seen) >= self.LIMIT:
            self._seen.clear()
        kept: T = self._seen.setdefault(key, value)
        return kept


def _shared_key(value: Hashable | DailySchedule) -> Hashable:
    """A daily schedule holds a list of times, so it cannot be hashed: its JSON can."""
    if isinstance(value, DailySchedule):
        return ("daily", value.model_dump_json())
    return value


def run_from_row(row: Mapping[str, Any]) -> Run:
    return Run.model_validate({key: row[key] for key in Run.model_fields})


def last_run_from_row(row: Mapping[str, Any]) -> Run | None:
    """The run read with `last_run_columns` in a job's row; None if the job has none."""
    if row[f"{_LAST_RUN}id"] is None:
        return None
    return Run.model_validate({key: row[f"{_LAST_RUN}{key}"] for key in Run.model_fields})


def member_from_row(row: Mapping[str, Any]) -> Member:
    # members_sql.MEMBER_COLUMNS reads exactly Member's fields.
    return Member(**{field.name: row[field.name] for field in fields(Member)})
