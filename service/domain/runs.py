"""Runs: one row per executed tick, the ledger that makes each tick run once."""

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field, JsonValue, TypeAdapter


class RunTrigger(StrEnum):
    """What started a run: its schedule, a manual trigger, catch-up after downtime, a
    backfill of past ticks, or another job's trigger hook (chain)."""

    SCHEDULE = "schedule"
    MANUAL = "manual"
    CATCHUP = "catchup"
    BACKFILL = "backfill"
    CHAIN = "chain"

    @property
    def on_demand(self) -> bool:
        """Asked for now (manual, or by another job's hook): no tick's outcome."""
        return self in {RunTrigger.MANUAL, RunTrigger.CHAIN}


class RunStatus(StrEnum):
    """running until it ends; abandoned when its replica died mid-run; skipped for a
    tick that did not run, with its `skip_reason`."""

    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    TIMED_OUT = "timed_out"
    CANCELLED = "cancelled"
    ABANDONED = "abandoned"
    SKIPPED = "skipped"


class SkipReason(StrEnum):
    """Why a nominal tick did not run: it is recorded in the ledger all the same.

    overlap: an earlier run of the job was still in progress (overlap "skip", or a
    "queue_one" job that already had a tick waiting); misfire: no replica could start
    it within its misfire grace; capped: the job had used up its `max_runs`; cancelled:
    it waited under queue_one and someone dropped it (POST /v1/jobs/{name}/queued/cancel);
    superseded: it was still undecided when its job's ticks changed (a new schedule, zone
    or bounds) or the job was paused, so it is no tick of the job as it stands; the edit
    records it."""

    OVERLAP = "overlap"
    MISFIRE = "misfire"
    CAPPED = "capped"
    CANCELLED = "cancelled"
    SUPERSEDED = "superseded"


class Run(BaseModel):
    """One execution of a job for one nominal tick (`scheduled_for`)."""

    model_config = ConfigDict(frozen=True)

    id: UUID
    job: str
    scheduled_for: datetime
    trigger: RunTrigger
    status: RunStatus
    started_at: datetime
    finished_at: datetime | None
    duration_ms: int | None
    attempts: int
    runner: str
    error: str | None
    result: JsonValue
    skip_reason: SkipReason | None = Field(
        None, description="Why the tick did not run; set exactly when status is `skipped`."
    )
    missed_ticks: int | None = Field(
        None,
        description="A `misfire` or `superseded` skip that sums up this many ticks in a"
        " row, ending at this one; the ticks before it that it counts have no row of their"
        " own.",
    )
    args: dict[str, JsonValue] | None = Field(
        None,
        description="The arguments this run ran with instead of its job's, when it was"
        " triggered with some (`POST /v1/jobs/{name}/trigger`); null: the job's.",
    )
    note: str | None = Field(None, description="Why the run was triggered, as its caller said.")

    def args_of(self, job_args: dict[str, JsonValue]) -> dict[str, JsonValue]:
        """What this run runs with: its own arguments, or else its job's."""
        return job_args if self.args is None else self.args


@dataclass(frozen=True)
class AttemptEnd:
    """An attempt that ended and is tried again: the run's row keeps it as the next one
    starts (`waited_seconds`: the backoff since it ended)."""

    attempt: int
    status: RunStatus
    error: str | None
    waited_seconds: float


class AttemptTimes(BaseModel):
    """One attempt of a run: when it started and ended, and how."""

    model_config = ConfigDict(frozen=True)

    attempt: int = Field(description="1 for the first.")
    status: RunStatus = Field(
        description="How it ended (`running`: it runs now; `abandoned`: its replica was"
        " lost during it, and another took the run over)."
    )
    error: str | None = None
    started_at: datetime
    ended_at: datetime | None = Field(
        description="Null: it runs still, or its replica was lost during it."
    )


class EarlierAttempt(BaseModel):
    """An attempt before a run's last, as its row keeps it; it started when the one
    before it was retried (the first, when the run started), and `next_at` is when the
    attempt after it started."""

    model_config = ConfigDict(frozen=True)

    attempt: int
    status: RunStatus
    error: str | None = None
    ended_at: datetime | None
    next_at: datetime


EARLIER_ATTEMPTS = TypeAdapter(list[EarlierAttempt])


def attempts_of(run: Run, earlier: Sequence[EarlierAttempt]) -> list[AttemptTimes]:
    """Every attempt of `run`, oldest first: those its row kept as each retry started,
    then its last, which is the run itself. A skipped tick made none."""
    if run.status is RunStatus.SKIPPED:
        return []
    starts = [run.started_at, *(one.next_at for one in earlier)]
    shown = [
        AttemptTimes(started_at=start, **one.model_dump(exclude={"next_at"}))
        for one, start in zip(earlier, starts, strict=False)
    ]
    last = {"status": run.status, "error": run.error, "ended_at": run.finished_at}
    shown.append(AttemptTimes(attempt=run.attempts, started_at=starts[-1], **last))
    return shown


# Why a delete cancels its job's runs in flight (a delete is a cancel).
JOB_DELETED = "the job was deleted"
# Who deleted it, when nobody said (a write that is not an API request's).
DELETED_BY_TICKGATE = "tickgate"


@dataclass(frozen=True)
class CancelRequest:
    """Someone asked to cancel a running run (POST /v1/runs/{id}/cancel): `by` says who
    (as the API saw the caller), `reason` why, if they said."""

    run_id: UUID
    by: str
    reason: str | None

    def error(self) -> str:
        """What the cancelled run (or dropped tick) records as its error."""
        return f"cancelled by {self.by}" + (f": {self.reason}" if self.reason else "")


@dataclass(frozen=True)
class SqlOutcome:
    """What an SQL task's statement did: its command tag, the rows it affected, and for a
    statement that returns rows, its column names and the first of its rows, each value
    as JSON (`rows_affected` counts them all)."""

    command: str
    rows_affected: int
    columns: tuple[str, ...] = ()
    rows: tuple[tuple[JsonValue, ...], ...] = ()


def storable_text(text: str | None) -> str | None:
    """`text` as PostgreSQL can store it: no NUL, and no lone surrogate (which UTF-8
    cannot encode). What a task returns or raises is never checked before this."""
    if text is None:
        return None
    return text.encode("utf-8", "replace").decode("utf-8").replace("\x00", "\ufffd")


def storable_json(value: JsonValue) -> JsonValue:
    """`value` with every string and key made storable (jsonb refuses \\u0000)."""
    if isinstance(value, str):
        return storable_text(value)
    if isinstance(value, list):
        return [storable_json(item) for item in value]
    if isinstance(value, dict):
        return {str(storable_text(key)): storable_json(item) for key, item in value.items()}
    return value
