"""Jobs: what a user declares (JobSpec), what is stored (Job), and every state change.

Each change is a pure function from the current job (or None) to the next one, so the
store can run it inside a row-locked transaction and the rules live in one place.
"""

import hashlib
import json
from collections.abc import Mapping
from datetime import datetime, timedelta
from enum import StrEnum
from functools import cached_property
from typing import Annotated, Any, Self
from uuid import UUID, uuid4
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from service.domain.errors import Conflict, InvalidInput
from service.domain.hooks import MAX_HOOKS, Hook
from service.domain.names import JOB_NAME_PATTERN, MANAGER_PATTERN, lock_key
from service.domain.retry import RetryPolicy
from service.domain.schedules import (
    CHECKED,
    AppSchedule,
    Instant,
    OnceSchedule,
    Schedule,
    fire_times,
    latest_fire_at_or_before,
    next_fire_after,
    resolve_schedule,
)

MAX_ARGS_BYTES = 64 * 1024
MAX_TIMEOUT_SECONDS = 86_400

JobName = Annotated[str, Field(pattern=JOB_NAME_PATTERN, max_length=128)]
ManagerName = Annotated[str, Field(pattern=MANAGER_PATTERN, max_length=128)]
# Labels as Kubernetes spells them, less its DNS-prefix rules: a key never holds `=` or
# `,`, so `?label=key=value` splits at the first `=`.
LABEL_KEY_PATTERN = r"^[A-Za-z0-9]([A-Za-z0-9._/-]{0,61}[A-Za-z0-9])?$"
LABEL_VALUE_PATTERN = r"^([A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?)?$"
MAX_LABELS = 64
LabelKey = Annotated[str, Field(pattern=LABEL_KEY_PATTERN, max_length=63)]
LabelValue = Annotated[str, Field(pattern=LABEL_VALUE_PATTERN, max_length=63)]


class JobState(StrEnum):
    """active fires; paused does not; completed is a one-time job after its run."""

    ACTIVE = "active"
    PAUSED = "paused"
    COMPLETED = "completed"


class Overlap(StrEnum):
    """skip: a tick that comes while a run is in progress anywhere is dropped;
    queue_one: at most one such tick waits and runs right after; allow: runs overlap."""

    SKIP = "skip"
    ALLOW = "allow"
    QUEUE_ONE = "queue_one"


class Catchup(StrEnum):
    """latest: at startup, run the latest tick missed within the grace; none: don't."""

    LATEST = "latest"
    NONE = "none"


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
    retry: RetryPolicy = Field(default_factory=RetryPolicy)
    start_at: Instant | None = Field(None, description="No tick before this fires.")
    end_at: Instant | None = Field(
        None, description="No tick after this fires; then the job becomes completed."
    )
    max_runs: int | None = Field(
        None, ge=1, le=1_000_000_000, description="After this many runs: completed."
    )
    jitter_seconds: int = Field(
        0, ge=0, le=3600, description="Delay each fire by a fixed amount derived from the tick."
    )
    catchup: Catchup = Catchup.LATEST
    managed_by: ManagerName | None = Field(
        None,
        description="Who manages the job: a bulk apply with prune may delete the jobs "
        "it manages and does not name.",
    )
    capture: bool = Field(
        True,
        description="Keep what each run's target answered (its output) and what it logged "
        "(its log), shown by GET /v1/runs/{id} and /log; false keeps neither.",
    )
    hooks: list[Hook] = Field(
        default_factory=list,
        max_length=MAX_HOOKS,
        description="What happens when a run ends or a tick is skipped: `{on, action}` "
        "each (see docs/concepts.md#hooks).",
    )
    default_hooks: bool = Field(
        True, description="Whether the cluster's default hooks (TICKGATE_DEFAULT_HOOKS) apply."
    )
    labels: dict[LabelKey, LabelValue] = Field(
        default_factory=dict,
        max_length=MAX_LABELS,
        description="Key-value pairs to select jobs by: `GET /v1/jobs?label=key=value` "
        "lists the jobs carrying them, and they scope a pruning bulk apply.",
    )

    @model_validator(mode="after")
    def _ordered_bounds(self) -> "JobSpec":
        if self.start_at and self.end_at and self.end_at <= self.start_at:
            raise ValueError("end_at must be after start_at")
        return self

    @field_validator("timezone")
    @classmethod
    def _known_zone(cls, value: str) -> str:
        zone(value)
        return value

    @field_validator("args")
    @classmethod
    def _bounded_args(
        cls, value: dict[str, JsonValue], info: ValidationInfo
    ) -> dict[str, JsonValue]:
        if info.context and info.context.get(CHECKED):
            return value  # a window reads 100k of these; a bulk apply makes 10k
        size = len(json.dumps(value, separators=(",", ":")).encode())
        if size > MAX_ARGS_BYTES:
            raise ValueError(f"args are {size} bytes encoded; the limit is {MAX_ARGS_BYTES}")
        return value

    @property
    def zone(self) -> ZoneInfo:
        return zone(self.timezone)

    def spec(self) -> "JobSpec":
        """Just the declared part (of a stored job, or of a request body that extends
        JobSpec). Its values are valid already, so their content is not checked again."""
        return JobSpec.model_validate(_declared_fields(self), context={CHECKED: True})


_SPEC_FIELDS = tuple(JobSpec.model_fields)


def _declared_fields(spec: JobSpec) -> dict[str, object]:
    """The declared fields of `spec` (or of a Job, or a request body) by name, their
    values as they are: nested models stay models."""
    values = vars(spec)
    return {name: values[name] for name in _SPEC_FIELDS}


class Job(JobSpec):
    """A stored job. `fire_after` is its threshold: no tick at or before it fires, so a
    resumed or re-scheduled job does not replay ticks from before the change.

    `version` counts changes from 1 and starts again when a name is deleted and made
    anew; `incarnation` never repeats, so (incarnation, version), the `revision`, tells
    every state of every job apart."""

    name: JobName
    incarnation: UUID
    state: JobState
    lock_key: int
    created_at: datetime
    updated_at: datetime
    fire_after: datetime
    version: int = Field(ge=1)
    pause_note: str | None = None
    runs_started: int = 0

    @property
    def revision(self) -> tuple[UUID, int]:
        return self.incarnation, self.version

    def tick_after(self, after: datetime) -> datetime | None:
        """The first nominal tick strictly after `after` that may fire: past the threshold,
        inside its bounds, [start_at, end_at]."""
        floor = max(after, self.fire_after)
        if self.start_at and self.start_at > floor:
            floor = self.start_at - _INSTANT
        tick = next_fire_after(self.schedule, self.zone, floor)
        return None if tick is None or (self.end_at and tick > self.end_at) else tick

    @cached_property
    def first_tick(self) -> datetime | None:
        """The job's first nominal tick after its threshold: the one a cursor still at the
        threshold waits for. Worked out once per job read (`model_copy` forgets it)."""
        return self.tick_after(self.fire_after)

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        copied = super().model_copy(update=update, deep=deep)
        copied.__dict__.pop("first_tick", None)  # its schedule or threshold may be another
        return copied

    def tick_at_or_before(self, at: datetime) -> datetime | None:
        """The latest nominal tick at or before `at` that may fire."""
        ceiling = min(at, self.end_at) if self.end_at else at
        tick = latest_fire_at_or_before(self.schedule, self.zone, ceiling)
        if tick is None or tick <= self.fire_after:
            return None
        return None if self.start_at and tick < self.start_at else tick

    def is_tick(self, tick: datetime) -> bool:
        """Whether `tick` is a nominal tick this job, as it stands, may fire."""
        return self.state is JobState.ACTIVE and self.tick_after(tick - _INSTANT) == tick

    def due(self, tick: datetime) -> datetime:
        """When `tick` fires: the tick, moved by the job's jitter."""
        return tick + timedelta(seconds=self.jitter_seconds_for(tick))

    def deadline(self, tick: datetime) -> datetime:
        """The last moment `tick` may start: its misfire grace counts from when it is due."""
        return self.due(tick) + timedelta(seconds=self.misfire_grace_seconds)

    def tick_in_grace(self, now: datetime) -> datetime | None:
        """The latest nominal tick that may fire and is at most the misfire grace
        before `now`, or None. Most jobs have none: a forward search from the grace's
        start says so several times faster than searching back from `now`."""
        start = now - self.reach - _INSTANT
        first = self.tick_after(start)
        if first is None or first > now:
            return None
        tick = self.tick_at_or_before(now)
        return tick if tick is not None and self.deadline(tick) >= now else None

    @property
    def reach(self) -> timedelta:
        """How far back a tick may still be due: a jittered tick fires up to
        `jitter_seconds` after it, and may start up to the grace after that."""
        return timedelta(seconds=self.misfire_grace_seconds + self.jitter_seconds)

    def upcoming(self, now: datetime, count: int) -> list[datetime]:
        """The next `count` nominal ticks, the same on every replica for the same `now`."""
        if self.state is not JobState.ACTIVE:
            return []
        if isinstance(self.schedule, OnceSchedule):
            return [self.schedule.at]
        ticks: list[datetime] = []
        while len(ticks) < count and (tick := self.tick_after(ticks[-1] if ticks else now)):
            ticks.append(tick)
        return ticks

    def next_run_at(self, now: datetime) -> datetime | None:
        upcoming = self.upcoming(now, 1)
        return upcoming[0] if upcoming else None

    def jitter_seconds_for(self, tick: datetime) -> float:
        """A delay in [0, jitter_seconds) that every replica derives alike from (job, tick)."""
        if not self.jitter_seconds:
            return 0.0
        digest = hashlib.sha256(f"{self.name}|{tick.isoformat()}".encode()).digest()
        return int.from_bytes(digest[:8]) / 2**64 * self.jitter_seconds


_INSTANT = timedelta(microseconds=1)


def ticks_between(job: Job, start: datetime, end: datetime, limit: int) -> list[datetime]:
    """The schedule's nominal ticks in [start, end], at most `limit` of them. Backfill
    asks for these: the threshold and the bounds don't apply to ticks asked for by name."""
    ticks = fire_times(job.schedule, job.zone, start - _INSTANT, limit)
    return [tick for tick in ticks if tick <= end]


def missed_tick(job: Job, now: datetime) -> datetime | None:
    """The job's latest nominal tick if it is past the misfire grace: once it has no
    run, no replica will ever run it, and the job is overdue."""
    if job.state is not JobState.ACTIVE:
        return None
    tick = job.tick_at_or_before(now)
    if tick is None:
        return None
    return tick if now > job.deadline(tick) else None


def create_job(name: str, spec: JobSpec, now: datetime) -> Job:
    resolved = _resolved(spec, now, previous=None)
    return Job.model_validate(
        _declared_fields(resolved)
        | {
            "name": name,
            "state": JobState.ACTIVE,
            "lock_key": lock_key(name),
            "created_at": now,
            "updated_at": now,
            "fire_after": now,
            "version": 1,
            "incarnation": uuid4(),
        },
        context={CHECKED: True},
    )


def replace_job(current: Job, spec: JobSpec, now: datetime) -> Job:
    """Declarative apply: a spec equal to the stored one changes nothing, version included."""
    refuse_if_fired_by_app(current, "changed")
    resolved = _resolved(spec, now, previous=current)
    if _declared_fields(resolved) == _declared_fields(current):
        return current
    if not ticks_moved(current, resolved):
        return _changed(current, now, **_declared_fields(resolved))
    # Another set of ticks (schedule, zone or bounds) is a new threshold: ticks between the
    # old one and now, new to this definition, must not read as missed, and the cursor
    # starts again there, at the new definition's first tick. A completed job with a
    # tick left to fire is active again.
    changed = _changed(current, now, **_declared_fields(resolved), fire_after=now)
    if current.state is JobState.COMPLETED:
        reopened = changed.model_copy(update={"state": JobState.ACTIVE})
        return changed if is_over(reopened, now) else reopened
    return changed


def fired_by_app(job: JobSpec) -> bool:
    """Whether an app's own scheduler fires the job through the gate (its ticks are the
    app's; no Tickgate replica fires it)."""
    return isinstance(job.schedule, AppSchedule)


def refuse_if_fired_by_app(job: Job, action: str) -> None:
    """An app's job is defined, triggered and cancelled in the app: here it can only be
    paused, resumed and deleted (409 otherwise)."""
    if fired_by_app(job):
        raise Conflict(
            f"job {job.name!r} is fired by an app ({_scheduler_of(job)}) and cannot be "
            f"{action} here: change it in the app; here it can be paused, resumed or deleted"
        )


def _scheduler_of(job: Job) -> str:
    return job.schedule.scheduler if isinstance(job.schedule, AppSchedule) else "tickgate"


def app_job(current: Job | None, name: str, spec: JobSpec, now: datetime) -> Job:
    """The job an app's gate registers under `name` (`spec` holds an AppSchedule): made,
    or brought up to date, keeping its state (a pause set here holds) and its history. A
    name Tickgate itself fires is refused: two definitions would share one lock key."""
    if current is None:
        return create_job(name, spec, now)
    if not fired_by_app(current):
        raise Conflict(
            f"job {name!r} is a job Tickgate fires itself; give the app's job another id"
        )
    declared = _declared_fields(spec)
    return current if declared == _declared_fields(current) else _changed(current, now, **declared)


def ticks_moved(current: JobSpec, spec: JobSpec) -> bool:
    """Whether `spec` names other ticks than `current`: another schedule, zone (it moves
    the ticks as much), or bounds (`start_at`, `end_at`)."""
    return (
        spec.schedule != current.schedule
        or spec.timezone != current.timezone
        or spec.start_at != current.start_at
        or spec.end_at != current.end_at
    )


def patched_spec(name: str, shown: JobSpec, patch: dict[str, JsonValue]) -> JobSpec:
    """JSON merge patch (RFC 7396) of the declared fields of job `name`, applied to the
    job as `shown` to the caller (secrets masked: a patch merges into what its author
    could read, so a secret is kept only where the rules for kept secrets say). A
    schedule of another kind replaces the old one whole: merging an interval into a cron
    makes no sense."""
    if "name" in patch and patch["name"] != name:
        raise InvalidInput.one(("body", "name"), "the name of a job cannot change", patch["name"])
    patch = {k: v for k, v in patch.items() if k != "name"}
    base = shown.model_dump(mode="json")
    new_schedule = patch.get("schedule")
    new_kind = new_schedule.get("kind") if isinstance(new_schedule, dict) else None
    if new_kind not in {None, base["schedule"]["kind"]}:
        base["schedule"] = {}
    try:
        return JobSpec.model_validate(merge_patch(base, patch))
    except ValidationError as error:
        raise InvalidInput.from_validation(error, ("body",)) from error


def pause_job(current: Job, now: datetime, note: str | None = None) -> Job:
    """Pause; `note` (why, who) is kept on the job until it resumes."""
    if current.state is JobState.COMPLETED:
        raise Conflict(f"job {current.name!r} is completed and cannot be paused")
    if current.state is JobState.PAUSED and note in {None, current.pause_note}:
        return current
    return _changed(current, now, state=JobState.PAUSED, pause_note=note or current.pause_note)


def resume_job(current: Job, now: datetime) -> Job:
    """Resume from now on: ticks missed while paused are not replayed."""
    if current.state is JobState.COMPLETED:
        raise Conflict(f"job {current.name!r} is completed and cannot be resumed")
    if current.state is JobState.ACTIVE:
        return current
    return _changed(current, now, state=JobState.ACTIVE, fire_after=now, pause_note=None)


def complete_job(current: Job, now: datetime) -> Job:
    if current.state is JobState.COMPLETED:
        return current
    return _changed(current, now, state=JobState.COMPLETED)


def finish_run(current: Job, tick: datetime, now: datetime) -> Job:
    """After a scheduled run: a one-time job whose own tick ran, a job that reached
    `max_runs`, or one whose `end_at` passed, is completed; anything else is unchanged."""
    once_done = isinstance(current.schedule, OnceSchedule) and current.schedule.at == tick
    capped = current.max_runs is not None and current.runs_started >= current.max_runs
    if once_done or capped or ends_by(current, now):
        return complete_job(current, now)
    return current


def complete_if_ended(current: Job, now: datetime) -> Job:
    """An active job with nothing left to fire is completed: its `end_at` passed, its run
    cap is used up (its last run's replica may have died before completing it), or its
    one-time tick is past its deadline (it ran, or misfired)."""
    if current.state is JobState.ACTIVE and is_over(current, now):
        return complete_job(current, now)
    return current


def is_over(job: Job, now: datetime) -> bool:
    used_up = job.max_runs is not None and job.runs_started >= job.max_runs
    once = job.schedule if isinstance(job.schedule, OnceSchedule) else None
    return used_up or (once is not None and job.deadline(once.at) < now) or ends_by(job, now)


def ends_by(job: Job, now: datetime) -> bool:
    """Its `end_at` passed and no tick is left before it."""
    return job.end_at is not None and job.end_at <= now and job.tick_after(now) is None


def done_with_its_tick(job: Job) -> bool:
    """A one-time job completed: its one tick has its outcome, or will have it from the
    audit, and no window holds another tick of it to fire."""
    return isinstance(job.schedule, OnceSchedule) and job.state is JobState.COMPLETED


def policy_finishes(job: Job) -> bool:
    """Whether a scheduled run may complete the job, so the runner must look after it."""
    return isinstance(job.schedule, OnceSchedule) or job.max_runs is not None


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
    changed = (
        previous is None or schedule != previous.schedule or spec.timezone != previous.timezone
    )
    if changed and isinstance(schedule, OnceSchedule) and schedule.at <= now:
        raise InvalidInput.one(
            ("body", "schedule", "at"), "a one-time job must be in the future", str(schedule.at)
        )
    return spec.model_copy(update={"schedule": schedule})


def _changed(current: Job, now: datetime, **changes: object) -> Job:
    """`current` with `changes` (values of validated models, or of the request's own
    checks), as its next version."""
    fields = vars(current) | changes | {"updated_at": now, "version": current.version + 1}
    return Job.model_validate(fields, context={CHECKED: True})
