"""Rows become frozen domain objects the moment they leave the database."""

from collections.abc import Mapping
from typing import Any

from service.domain.jobs import Job
from service.domain.runs import Run

JOB_COLUMNS = (
    "name, lock_key, description, schedule, timezone, task, args, state, overlap,"
    " timeout_seconds, misfire_grace_seconds, created_at, updated_at, fire_after, version,"
    " retry, start_at, end_at, max_runs, jitter_seconds, catchup, pause_note, runs_started"
)
RUN_COLUMNS = (
    "id, job, scheduled_for, trigger, status, started_at, finished_at, duration_ms,"
    " attempts, runner, error, result"
)


def job_from_row(row: Mapping[str, Any]) -> Job:
    return Job.model_validate(dict(row))


def run_from_row(row: Mapping[str, Any]) -> Run:
    return Run.model_validate({key: row[key] for key in Run.model_fields})
