"""Request and response bodies of the v1 API."""

import base64
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Annotated, Any, Literal, Self
from uuid import UUID

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    JsonValue,
    PlainSerializer,
    WithJsonSchema,
    field_validator,
    model_validator,
)

from service.api.schedule_words import schedule_text
from service.domain.errors import InvalidInput
from service.domain.hooks import Hook, HookEvent, HttpAction
from service.domain.jobs import (
    LABEL_KEY_PATTERN,
    LABEL_VALUE_PATTERN,
    Catchup,
    Job,
    JobName,
    JobSpec,
    JobState,
    ManagerName,
    Overlap,
)
from service.domain.names import is_valid_job_name
from service.domain.ownership import Member
from service.domain.retry import RetryPolicy
from service.domain.runs import AttemptTimes, Run, RunStatus
from service.domain.schedules import DeclaredSchedule, Instant, Schedule, within_range
from service.store import Labels, RunFilter, RunPosition, TickPosition
from service.store.values import Delivery
from service.tasks.http import redact_args

NEXT_RUNS = 10
MAX_BACKFILL_TICKS = 1000
MAX_APPLIED_JOBS = 50_000


# A 64-bit integer sent as a decimal string, as Google's APIs do: JavaScript's numbers
# hold 53 bits, so every JSON parser of a browser would round it.
Int64String = Annotated[
    int,
    PlainSerializer(str, return_type=str, when_used="json"),
    WithJsonSchema(
        {"type": "string", "format": "int64", "pattern": "^-?[0-9]{1,19}$"}, mode="serialization"
    ),
]


# The examples in the OpenAPI document: each is sent to a live app by
# tests/integration/test_api_examples.py, so none goes stale.
JOB_EXAMPLE: dict[str, JsonValue] = {
    "description": "Rebuild the search index at night, Kyiv time.",
    "schedule": {"kind": "cron", "expression": "0 3 * * *"},
    "timezone": "Europe/Kyiv",
    "task": "log",
    "args": {"message": "reindex"},
    "overlap": "skip",
    "timeout_seconds": 600,
    "retry": {"max_attempts": 3, "min_backoff_seconds": 10},
}
NAMED_JOB_EXAMPLE: dict[str, JsonValue] = {"name": "nightly-reindex", **JOB_EXAMPLE}
PATCH_EXAMPLE: dict[str, JsonValue] = {"timeout_seconds": 120, "description": "Reindex nightly."}


class JobCreate(JobSpec):
    """A new job: its name plus everything it declares."""

    model_config = ConfigDict(json_schema_extra={"examples": [NAMED_JOB_EXAMPLE]})

    name: JobName
    schedule: DeclaredSchedule


class JobReplace(JobSpec):
    """The whole declared job; `name` may be given but must equal the one in the path."""

    model_config = ConfigDict(json_schema_extra={"examples": [JOB_EXAMPLE]})

    name: JobName | None = None
    schedule: DeclaredSchedule


class JobsApply(BaseModel):
    """A whole set of jobs, each as a `POST /v1/jobs` body, applied in one transaction."""

    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [{"jobs": [NAMED_JOB_EXAMPLE]}]}
    )

    # Each item is validated by the handler, so that a 422 names every bad job by its
    # index and name; the schema still says what an item is.
    jobs: Annotated[
        list[dict[str, Any]],
        Field(max_length=MAX_APPLIED_JOBS),
        WithJsonSchema(
            {
                "type": "array",
                "items": {"$ref": "#/components/schemas/JobCreate"},
                "maxItems": MAX_APPLIED_JOBS,
            },
        ),
    ]


# `key=value`: the domain's key and value patterns, joined by `=`.
LabelSelector = Annotated[
    str,
    Field(
        pattern=f"^{LABEL_KEY_PATTERN.strip('^$')}={LABEL_VALUE_PATTERN.strip('^$')}$",
        max_length=127,
        examples=["team=billing"],
    ),
]
_LABEL_DESCRIPTION = (
    "Only jobs carrying the label `key=value`; repeat it for several (all must match)."
)


def selected_labels(selectors: list[str]) -> Labels:
    """`key=value` selectors as (key, value) pairs; one key asked with two values is a
    422 rather than a selection that can match nothing."""
    pairs = tuple(sorted({tuple(text.split("=", 1)) for text in selectors}))
    keys = [key for key, _ in pairs]
    twice = sorted({key for key in keys if keys.count(key) > 1})
    if twice:
        raise InvalidInput.one(
            ("query", "label"),
            f"label {twice[0]!r} is asked with two values",
            list[JsonValue](selectors),
        )
    return tuple((key, value) for key, value in pairs)


class ApplyQuery(BaseModel):
    """Options of PUT /v1/jobs."""

    model_config = ConfigDict(extra="forbid")

    managed_by: ManagerName | None = Field(
        None,
        description="The manager of the set: set on every job of it (a job naming "
        "another manager is a 422), and the scope of `prune`.",
    )
    prune: bool = Field(
        False,
        description="Delete the active and paused jobs in scope that the set does not "
        "name: those of `managed_by` that carry every `label` given. Needs `managed_by`, "
        "a `label`, or both.",
    )
    label: list[LabelSelector] = Field(
        default_factory=list,
        max_length=16,
        description="`key=value`: with `prune`, only jobs carrying this label are in scope "
        "(repeat for several, all must match). It does not set labels on the set's jobs: "
        "give them the label too, or a later apply will not prune them.",
    )
    dry_run: bool = Field(
        False,
        description="Plan, check and write the whole set exactly as an apply would, in its "
        "transaction, then roll back: the answer (or the 422 or 409) is what the apply "
        "would give, and nothing changes.",
    )


ApplyOutcome = Literal["created", "updated", "unchanged", "deleted"]


class ApplyResult(BaseModel):
    """What PUT /v1/jobs did: counts, and each job's outcome by name (the set's jobs in
    its order, then the deleted ones)."""

    created: int
    updated: int
    unchanged: int
    deleted: int
    outcomes: dict[str, ApplyOutcome]


class RunOut(Run):
    """One execution of a job for one nominal tick."""

    @field_validator("args")
    @classmethod
    def _secrets_masked(cls, args: dict[str, JsonValue] | None) -> dict[str, JsonValue] | None:
        """A run's own arguments show secret header values as "***", as its job's do."""
        return None if args is None else redact_args(args)


class RunDetail(RunOut):
    """One run, with what its last attempt answered."""

    output: JsonValue = Field(
        None,
        description="What the run's last attempt answered, where its task keeps it (null:"
        " nothing kept). The `http` task's: `status`, chosen `headers`, `body` (the first"
        ' `output_bytes` of it: text as `encoding: "text"`, anything else base64), its'
        " `content_type`, the `bytes` received and whether the body was `truncated`; the"
        " job's secret header values, echoed back, read `***`.",
    )
    attempt_times: list[AttemptTimes] = Field(
        default_factory=list,
        description="Every attempt, oldest first, with its times and how it ended; the"
        " last is the run itself (empty for a skipped tick).",
    )


class RunLogLine(BaseModel):
    """One line a run logged."""

    at: datetime
    level: str = Field(description="DEBUG is never kept: INFO, WARNING, ERROR or CRITICAL.")
    message: str = Field(description="As logged, cut at 4,096 characters.")


class RunLogOut(BaseModel):
    """What a run logged through its logger (its task's lines, its retries'), INFO and
    up whatever the replica's log level: at most 1,000 lines and 64 KiB of messages."""

    run_id: UUID
    lines: list[RunLogLine]
    dropped: int = Field(0, description="Lines past the bound, not kept (0: the log is whole).")


class TriggerRequest(BaseModel):
    """Run the job now; optionally with other arguments, for this run only."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [{"args": {"message": "once more, louder"}, "note": "after the fix"}]
        },
    )

    args: dict[str, JsonValue] | None = Field(
        None,
        description="The arguments of this run instead of the job's (the job keeps its"
        " own); checked against the task's schema as a job's are (422 naming the field)."
        ' A secret header sent back as "***" keeps the job\'s value.',
    )
    note: str | None = Field(
        None, max_length=500, description="Why the run was triggered; kept on the run."
    )


class CancelBody(BaseModel):
    """Why a run (or a waiting tick) is cancelled, and who asks."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={"examples": [{"reason": "hung on a dead host", "by": "alice"}]},
    )

    reason: str | None = Field(None, max_length=500, description="Why; kept on the run.")
    by: str | None = Field(
        None,
        max_length=100,
        description="Who asks, as they say; the run records it beside what the API saw "
        "(the caller's address and its token's fingerprint).",
    )


class CancelOut(BaseModel):
    """A cancel under way. `state`: `cancelling` while the replica running it stops it
    (it ends `cancelled` within seconds: GET /v1/runs/{id}); `abandoning` when that
    replica is gone: the orphan sweep ends it `abandoned` (never resumed), once its lock
    is free."""

    run: RunOut = Field(description="The run as it was when the cancel was asked.")
    state: Literal["cancelling", "abandoning"]
    detail: str


class HookDeliveryOut(BaseModel):
    """One hook delivery: of which hook (its index in the job's `hooks`, or among the
    cluster's defaults), for which event, doing what, and how far it got."""

    id: UUID = Field(description="The delivery's id: its webhook's Idempotency-Key.")
    run_id: UUID
    job: str
    hook: int
    is_default: bool = Field(description="One of the cluster's default hooks.")
    event: HookEvent
    action: JsonValue = Field(description="What it does; secret header values read `***`.")
    status: Literal["pending", "sending", "delivered", "failed"]
    attempts: int
    due_at: datetime = Field(
        description="When it is (or was last) due; while sending, its lease's end."
    )
    last_error: str | None
    answer: JsonValue = Field(
        description="What the target answered (the http task's result), or the run a "
        "trigger started."
    )
    created_at: datetime
    delivered_at: datetime | None = Field(description="When it was delivered, or failed for good.")

    @classmethod
    def of(cls, delivery: Delivery) -> Self:
        action = delivery.action.model_dump(mode="json")
        if isinstance(delivery.action, HttpAction):
            action["args"] = redact_args(delivery.action.args)
        fields = vars(delivery) | {"action": action}
        return cls.model_validate(fields)


class HookDeliveryList(BaseModel):
    items: list[HookDeliveryOut]


class RunQuery(BaseModel):
    """Filters and paging of GET /v1/jobs/{name}/runs."""

    model_config = ConfigDict(extra="forbid")

    limit: int = Field(100, ge=1, le=1000)
    cursor: str | None = Field(None, max_length=400, description="`next_cursor` of a page.")
    status: RunStatus | None = None


def _split_commas(value: object) -> object:
    """`status=a,b` means the same as `status=a&status=b`."""
    items = value if isinstance(value, list) else [value]
    return [
        part for item in items for part in (item.split(",") if isinstance(item, str) else [item])
    ]


Moment = Instant


class AllRunsQuery(BaseModel):
    """Filters and paging of GET /v1/runs."""

    model_config = ConfigDict(extra="forbid")

    limit: int = Field(100, ge=1, le=1000)
    cursor: str | None = Field(None, max_length=400, description="`next_cursor` of a page.")
    status: Annotated[list[RunStatus], BeforeValidator(_split_commas)] = Field(
        [],
        max_length=len(RunStatus),
        description="Only runs in one of these statuses: repeat the parameter or "
        "separate them with commas. Default: every status.",
    )
    job: JobName | None = Field(None, description="Only the runs of this job.")
    since: Moment | None = Field(
        None, description="Only runs started at or after this moment (ISO 8601, with offset)."
    )
    until: Moment | None = Field(
        None, description="Only runs started before this moment (ISO 8601, with offset)."
    )

    def where(self) -> RunFilter:
        return RunFilter(frozenset(self.status), self.since, self.until)


class RunPage(BaseModel):
    """One page of runs, newest first."""

    items: list[RunOut]
    next_cursor: str | None = Field(description="Pass as `cursor` for the next page; null: end.")


class ListedJob(BaseModel):
    """A job as stored, with its next nominal tick and its latest run: an item of a
    listing (GET /v1/jobs/{name} adds the next ticks)."""

    name: str
    description: str
    schedule: Schedule
    schedule_text: str = Field(description="The schedule in words, for people.")
    timezone: str
    task: str
    args: dict[str, JsonValue]
    state: JobState
    overlap: Overlap
    timeout_seconds: int
    misfire_grace_seconds: int
    retry: RetryPolicy
    start_at: datetime | None
    end_at: datetime | None
    max_runs: int | None
    jitter_seconds: int
    catchup: Catchup
    managed_by: str | None = Field(description="Who manages the job (PUT /v1/jobs).")
    labels: dict[str, str] = Field(description="The job's labels.")
    capture: bool = Field(description="Whether runs keep their output and log.")
    hooks: list[Hook] = Field(description="The job's hooks; secret header values read `***`.")
    default_hooks: bool = Field(description="Whether the cluster's default hooks apply.")
    pause_note: str | None = Field(description="Why the job was paused; cleared on resume.")
    runs_started: int = Field(description="Scheduled runs claimed so far (counted with max_runs).")
    lock_key: Int64String = Field(
        description="Signed FNV-1a 64 of the name, the advisory-lock key: a signed 64-bit "
        "integer, sent as a decimal string (JavaScript numbers would round it)."
    )
    next_run_at: datetime | None
    last_run: RunOut | None
    created_at: datetime
    updated_at: datetime
    version: int

    @classmethod
    def of(cls, job: Job, now: datetime, last_run: Run | None = None) -> Self:
        """A listing computes one tick per job, never the next NEXT_RUNS."""
        return cls.model_validate(_shown(job, job.upcoming(now, 1), last_run))


class JobOut(ListedJob):
    """A job as stored, with its next nominal ticks and its latest run."""

    next_runs: list[datetime] = Field(description="The next 10 nominal ticks.")

    @classmethod
    def of(cls, job: Job, now: datetime, last_run: Run | None = None) -> Self:
        ticks = job.upcoming(now, NEXT_RUNS)
        return cls.model_validate(_shown(job, ticks, last_run) | {"next_runs": ticks})


# What a job shows of itself as stored; the rest is computed when it is shown.
_STORED_SHOWN = tuple(name for name in ListedJob.model_fields if name in Job.model_fields)


def _shown(job: Job, ticks: list[datetime], last_run: Run | None) -> dict[str, object]:
    """The fields of a shown job: stored values as they are (nested models are not
    dumped and validated again), secret headers masked, the next tick and the last run."""
    stored = vars(job)
    fields: dict[str, object] = {name: stored[name] for name in _STORED_SHOWN}
    fields["schedule_text"] = schedule_text(job.schedule)
    if job.task == "http":
        fields["args"] = redact_args(job.args)
    fields["hooks"] = shown_hooks(job.hooks)
    fields["next_run_at"] = ticks[0] if ticks else None
    fields["last_run"] = last_run.model_dump() if last_run else None
    return fields


def shown_spec(job: Job) -> JobSpec:
    """The job's declared fields as an answer shows them: secret header values "***"."""
    spec = job.spec()
    args = redact_args(spec.args) if spec.task == "http" else spec.args
    return spec.model_copy(update={"args": args, "hooks": shown_hooks(spec.hooks)})


def shown_hooks(hooks: Sequence[Hook]) -> list[Hook]:
    """The hooks with every http action's secret header values as "***"."""
    return [with_args(hook, redact_args) for hook in hooks]


def with_args(hook: Hook, change: Callable[[dict[str, JsonValue]], dict[str, JsonValue]]) -> Hook:
    """The hook with its http action's args changed (any other hook as it is)."""
    if not isinstance(hook.action, HttpAction):
        return hook
    action = hook.action.model_copy(update={"args": change(hook.action.args)})
    return hook.model_copy(update={"action": action})


class WhoAmI(BaseModel):
    """What the presented token may do."""

    scopes: list[Literal["read", "write"]] = Field(
        description="The token's scopes; both when the server has no tokens configured."
    )
    tokens_required: bool = Field(description="Whether this server asks for a bearer token.")


class PauseRequest(BaseModel):
    """Why the job is paused; kept on the job until it resumes."""

    model_config = ConfigDict(
        extra="forbid", json_schema_extra={"examples": [{"note": "paused for the migration"}]}
    )

    note: str | None = Field(None, max_length=1024)


class BackfillRequest(BaseModel):
    """Run every nominal tick in [from, to] that has no run yet, once each, in order."""

    model_config = ConfigDict(
        extra="forbid",
        populate_by_name=True,
        json_schema_extra={
            "examples": [{"from": "2026-11-30T00:00:00Z", "to": "2026-11-30T23:59:59Z"}]
        },
    )

    start: Instant = Field(alias="from")
    end: Instant = Field(alias="to")


class RunList(BaseModel):
    """Runs, oldest first."""

    items: list[RunOut]


# PostgreSQL text cannot hold a NUL character: a filter carrying one is refused (422)
# rather than sent to the database.
NO_NUL = r"^[^\x00]*$"


class JobQuery(BaseModel):
    """Filters and paging of GET /v1/jobs."""

    model_config = ConfigDict(extra="forbid")

    limit: int = Field(100, ge=1, le=1000)
    cursor: str | None = Field(None, max_length=400, description="`next_cursor` of a page.")
    state: JobState | None = None
    task: str | None = Field(None, max_length=128, pattern=NO_NUL)
    prefix: str | None = Field(
        None, max_length=128, pattern=NO_NUL, description="Only names starting so."
    )
    overdue: bool = Field(
        False,
        description="Only active jobs whose latest tick is past its misfire grace and never "
        "ran: those the last overdue check found (once per reconcile round) that still are. "
        "Listed in name order only.",
    )
    label: list[LabelSelector] = Field(
        default_factory=list, max_length=16, description=_LABEL_DESCRIPTION
    )
    sort: Literal["name", "next_run"] = Field(
        "name",
        description="`name`: by name. `next_run`: by next tick, soonest first, then by name; "
        "jobs with no next tick (paused, completed, or none left) follow, by name. The order "
        "is that of the next-tick book, not of `next_run_at`: each active job's next tick as "
        "the overdue check last filed it (one replica walks every active job once per "
        "reconcile round, TICKGATE_RECONCILE_SECONDS) or as the API filed it when the job "
        "was last created, changed, paused or resumed, whichever came later. So a job that "
        "fired since sits where its previous tick was, until the next round; a job changed "
        "by the scheduler itself (completed, its end_at passed) moves after the round too. "
        "Each item's `next_run_at` is computed when the page is read. Paging by `cursor` "
        "lists every job exactly once while the book holds still between pages.",
    )

    @model_validator(mode="after")
    def _overdue_by_name(self) -> Self:
        if self.overdue and self.sort != "name":
            raise ValueError("overdue jobs are listed in name order only (sort=name)")
        return self


class JobPage(BaseModel):
    """One page of jobs in the order asked for."""

    items: list[ListedJob]
    next_cursor: str | None = Field(
        description="Pass as `cursor` for the next page; null at the end."
    )


class PreviewRequest(BaseModel):
    """A schedule to try out, in a zone, from a moment."""

    model_config = ConfigDict(
        extra="forbid",
        json_schema_extra={
            "examples": [
                {
                    "schedule": {"kind": "cron", "expression": "0 9 * * 1-5"},
                    "timezone": "America/New_York",
                    "count": 5,
                }
            ]
        },
    )

    schedule: DeclaredSchedule
    timezone: str = Field("UTC", max_length=64)
    after: Instant | None = Field(None, description="Default: now.")
    count: Annotated[int, Field(ge=1, le=100)] = 10


class PreviewResponse(BaseModel):
    """The nominal ticks the schedule would fire at, in UTC, and the schedule in words."""

    fire_times: list[datetime]
    schedule_text: str = Field(description="The schedule in words, as a job shows it.")


class TaskOut(BaseModel):
    """A task a job may run, with the JSON schema its `args` must fit."""

    name: str
    description: str
    args_schema: dict[str, JsonValue]


class TaskList(BaseModel):
    """Every task registered on this server."""

    items: list[TaskOut]


def encode_cursor(last_name: str) -> str:
    return _b64(last_name)


def decode_cursor(cursor: str) -> str:
    """The job name a cursor continues after; a 422 for anything we did not issue."""
    try:
        name = _unb64(cursor)
    except ValueError:
        name = ""
    if not is_valid_job_name(name):
        raise InvalidInput.one(("query", "cursor"), "malformed cursor", cursor)
    return name


# A next-run cursor: "t|<booked tick, ISO 8601>|<name>", the tick empty past every tick.
_TICK_CURSOR = "t"


def encode_tick_cursor(last: TickPosition) -> str:
    tick = last.tick.isoformat() if last.tick else ""
    return _b64(f"{_TICK_CURSOR}|{tick}|{last.name}")


def decode_tick_cursor(cursor: str) -> TickPosition:
    """Where a next-run page stopped; a 422 for anything we did not issue (a name-order
    cursor included)."""
    try:
        kind, tick, name = _unb64(cursor).split("|")
        position = TickPosition(within_range(datetime.fromisoformat(tick)) if tick else None, name)
    except ValueError:
        kind, position = "", TickPosition(None, "")
    if kind != _TICK_CURSOR or not is_valid_job_name(position.name):
        raise InvalidInput.one(("query", "cursor"), "malformed cursor for sort=next_run", cursor)
    return position


def encode_run_cursor(last: Run) -> str:
    return _b64(f"{last.started_at.isoformat()}|{last.id}")


def decode_run_cursor(cursor: str) -> RunPosition:
    try:
        started_at, run_id = _unb64(cursor).split("|")
        return RunPosition(within_range(datetime.fromisoformat(started_at)), UUID(run_id))
    except ValueError as error:
        raise InvalidInput.one(("query", "cursor"), "malformed cursor", cursor) from error


def _b64(text: str) -> str:
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


def _unb64(text: str) -> str:
    """Raises ValueError (binascii.Error and UnicodeDecodeError are ValueErrors)."""
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4)).decode()


class ClusterMember(BaseModel):
    """A live replica, as its membership row last reported it (every second)."""

    runner_id: str = Field(description="The replica's name (TICKGATE_RUNNER_ID).")
    version: str = Field(description="The Tickgate version it runs.")
    tzdata: str = Field(description="The time-zone database it computes ticks with.")
    started_at: datetime = Field(
        description="When it first joined the cluster; kept when it joins again after "
        "losing its membership's connection (a PostgreSQL restart, a slow heartbeat)."
    )
    heartbeat_at: datetime = Field(description="Its latest heartbeat.")
    heartbeat_age_seconds: float = Field(description="`as_of` minus `heartbeat_at`.")
    runs_in_flight: int = Field(description="Runs executing on it at its latest heartbeat.")
    last_sync: datetime | None = Field(
        description="When its scheduler last brought its jobs up to date (null: not yet)."
    )
    last_sync_age_seconds: float | None = Field(description="`as_of` minus `last_sync`.")

    @classmethod
    def of(cls, member: Member, as_of: datetime) -> Self:
        return cls(
            runner_id=member.runner_id,
            version=member.version,
            tzdata=member.tzdata,
            started_at=member.started_at,
            heartbeat_at=member.heartbeat_at,
            heartbeat_age_seconds=_seconds(as_of - member.heartbeat_at),
            runs_in_flight=member.runs_in_flight,
            last_sync=member.last_sync,
            last_sync_age_seconds=_seconds(as_of - member.last_sync) if member.last_sync else None,
        )


class OverdueOut(BaseModel):
    """What the last overdue check found (one replica checks per reconcile round)."""

    count: int = Field(description="Active jobs whose latest tick is past its grace, unrun.")
    checked_at: datetime | None = Field(description="When that check finished (null: never).")


class ClusterOut(BaseModel):
    """The replicas that are up, and the overdue count."""

    as_of: datetime = Field(description="The database's clock when this was read.")
    members: list[ClusterMember] = Field(description="The live replicas, oldest membership first.")
    overdue: OverdueOut


def _seconds(age: timedelta) -> float:
    return round(age.total_seconds(), 3)
