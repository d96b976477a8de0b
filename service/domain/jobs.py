"""Jobs: what a user declares (JobSpec), what is stored (Job), and every state change.

Each change is a pure function from the current job (or None) to the next one, so the
store can run it inside a row-locked transaction and the rules live in one place.
"""

import json
from datetime import datetime
from enum import StrEnum
from typing import Annotated
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import BaseModel, ConfigDict, Field, JsonValue, ValidationError, field_validator

from service.domain.errors import Conflict, InvalidInput
from service.domain.names import JOB_NAME_PATTERN, lock_key
from service.domain.schedules import (
    OnceSchedule,
    Schedule,
    latest_fire_at_or_before,
    next_fire_after,
    resolve_schedule,
)

MAX_ARGS_BYTES = 64 * 1024
MAX_TIMEOUT_SECONDS = 86_400

JobName = Annotated[str, Field(pattern=JOB_NAME_PATTERN, max_length=128)]


class JobState(StrEnum):
    """active fires; paused does not; completed is a one-time job after its run."""

    ACTIVE = "active"
    PAUSED = "paused"
    COMPLETED = "completed"


class Overlap(StrEnum):
    """skip: never two runs at once across replicas; allow: runs may overlap."""

    SKIP = "skip"
    ALLOW = "allow"


def zone(name: str) -> ZoneInfo:
    """The IANA zone `name`, or ValueError naming it."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as error:
        raise ValueError(f"unknown time zone {name!r}") from error


class JobSpec(BaseModel):
    """The part of a job its owner declares; PUT and PATCH replace exactly this."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    description: str = Field("", max_length=4096)
    schedule: Schedule
    timezone: str = Field("UTC", max_length=64)
    task: str = Field(min_length=1, max_length=128)
    args: dict[str, JsonValue] = Field(default_factory=dict)
    overlap: Overlap = Overlap.SKIP
    timeout_seconds: int = Field(600, gt=0, le=MAX_TIMEOUT_SECONDS)
    misfire_grace_seconds: int = Field(60, ge=0, le=MAX_TIMEOUT_SECONDS)

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, value: str) -> str:
        zone(value)
        return value

    @field_validator("args")
    @classmethod
    def _bounded_args(cls, value: dict[str, JsonValue]) -> dict[str, JsonValue]:
        size = len(json.dumps(value, separators=(",", ":")).encode())
        if size > MAX_ARGS_BYTES:
            raise ValueError(f"args are {size} bytes encoded; the limit is {MAX_ARGS_BYTES}")
        return value

    @property
    def zone(self) -> ZoneInfo:
        return zone(self.timezone)


class Job(JobSpec):
    """A stored job. `fire_after` fences ticks: none at or before it ever fires, so a
    resumed or re-scheduled job does not replay ticks from before the change."""

    name: JobName
    state: JobState
    lock_key: int
    created_at: datetime
    updated_at: datetime
    fire_after: datetime
    version: int = Field(ge=1)

    def spec(self) -> JobSpec:
        return JobSpec.model_validate(self.model_dump(include=set(JobSpec.model_fields)))

    def next_run_at(self, now: datetime) -> datetime | None:
        """The next nominal tick, the same on every replica for the same `now`."""
        if self.state is not JobState.ACTIVE:
            return None
        if isinstance(self.schedule, OnceSchedule):
            return self.schedule.at
        return next_fire_after(self.schedule, self.zone, max(now, self.fire_after))


def missed_tick(job: Job, now: datetime) -> datetime | None:
    """The job's latest nominal tick if it is past the misfire grace: once it has no
    run, no replica will ever run it, and the job is overdue."""
    if job.state is not JobState.ACTIVE:
        return None
    tick = latest_fire_at_or_before(job.schedule, job.zone, now)
    if tick is None or tick <= job.fire_after:
        return None
    late = (now - tick).total_seconds() > job.misfire_grace_seconds
    return tick if late else None


def create_job(name: str, spec: JobSpec, now: datetime) -> Job:
    resolved = _resolved(spec, now, previous=None)
    fields = resolved.model_dump()
    return Job(
        **fields,
        name=name,
        state=JobState.ACTIVE,
        lock_key=lock_key(name),
        created_at=now,
        updated_at=now,
        fire_after=now,
        version=1,
    )


def replace_job(current: Job, spec: JobSpec, now: datetime) -> Job:
    """Declarative apply: a spec equal to the stored one changes nothing, version included."""
    resolved = _resolved(spec, now, previous=current)
    if resolved == current.spec():
        return current
    rescheduled = resolved.schedule != current.schedule
    state = current.state
    if rescheduled and state is JobState.COMPLETED:
        state = JobState.ACTIVE
    return _changed(
        current,
        now,
        **resolved.model_dump(),
        state=state,
        fire_after=now if rescheduled else current.fire_after,
    )


def patch_job(current: Job, patch: dict[str, JsonValue], now: datetime) -> Job:
    """JSON merge patch (RFC 7396) of the declared fields. A schedule of another kind
    replaces the old one whole: merging an interval into a cron makes no sense."""
    if "name" in patch and patch["name"] != current.name:
        raise InvalidInput.one(("body", "name"), "the name of a job cannot change", patch["name"])
    patch = {k: v for k, v in patch.items() if k != "name"}
    base = current.spec().model_dump(mode="json")
    new_schedule = patch.get("schedule")
    new_kind = new_schedule.get("kind") if isinstance(new_schedule, dict) else None
    if new_kind not in {None, base["schedule"]["kind"]}:
        base["schedule"] = {}
    try:
        spec = JobSpec.model_validate(merge_patch(base, patch))
    except ValidationError as error:
        raise InvalidInput.from_validation(error, ("body",)) from error
    return replace_job(current, spec, now)


def pause_job(current: Job, now: datetime) -> Job:
    if current.state is JobState.COMPLETED:
        raise Conflict(f"job {current.name!r} is completed and cannot be paused")
    if current.state is JobState.PAUSED:
        return current
    return _changed(current, now, state=JobState.PAUSED)


def resume_job(current: Job, now: datetime) -> Job:
    """Resume from now on: ticks missed while paused are not replayed."""
    if current.state is JobState.COMPLETED:
        raise Conflict(f"job {current.name!r} is completed and cannot be resumed")
    if current.state is JobState.ACTIVE:
        return current
    return _changed(current, now, state=JobState.ACTIVE, fire_after=now)


def complete_job(current: Job, now: datetime) -> Job:
    if current.state is JobState.COMPLETED:
        return current
    return _changed(current, now, state=JobState.COMPLETED)


def finish_once(current: Job, tick: datetime, now: datetime) -> Job:
    """A one-time job whose own tick has run is completed; anything else is unchanged
    (a manual run of it, or a job re-scheduled while the run was in flight)."""
    if isinstance(current.schedule, OnceSchedule) and current.schedule.at == tick:
        return complete_job(current, now)
    return current


def merge_patch(target: JsonValue, patch: JsonValue) -> JsonValue:
    """RFC 7396: objects merge recursively, null deletes, anything else replaces."""
    if not isinstance(patch, dict):
        return patch
    merged = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = merge_patch(merged.get(key), value)
    return merged


def _resolved(spec: JobSpec, now: datetime, previous: Job | None) -> JobSpec:
    schedule = resolve_schedule(
        spec.schedule, spec.zone, now, previous.schedule if previous else None
    )
    changed = previous is None or schedule != previous.schedule
    if changed and isinstance(schedule, OnceSchedule) and schedule.at <= now:
        raise InvalidInput.one(
            ("body", "schedule", "at"), "a one-time job must be in the future", str(schedule.at)
        )
    return spec.model_copy(update={"schedule": schedule})


def _changed(current: Job, now: datetime, **changes: object) -> Job:
    fields = current.model_dump() | changes
    fields.update(updated_at=now, version=current.version + 1)
    return Job.model_validate(fields)
