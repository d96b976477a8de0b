"""The fire path's value types, what a replica asks the gate for and what it records:
one definition each, imported from `service.store.ports` everywhere else."""

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from enum import Enum
from typing import Literal, TypeGuard
from uuid import UUID, uuid4

from pydantic import JsonValue

from service.domain.cursors import MissedTicks, OwedTick
from service.domain.hooks import Action, HookCall, HookEvent
from service.domain.jobs import Job, Overlap
from service.domain.retry import RetryPolicy
from service.domain.runs import (
    AttemptTimes,
    EarlierAttempt,
    Run,
    RunStatus,
    RunTrigger,
    SkipReason,
    attempts_of,
)


class Following(Enum):
    """A tick's `following` not known when it was asked for: worked out with the
    statement's arguments."""

    UNKNOWN = "unknown"


# The job's tick after this one (None: none left), where the asker knows it already.
NextTick = datetime | None | Literal[Following.UNKNOWN]


@dataclass(frozen=True)
class TickClaim:
    """What a replica asks the gate for: this tick of this job, as the replica knows
    the job. `lock` takes the job's advisory lock first (every overlap mode but
    "allow"); `any_version` (manual and backfill runs) accepts any version of the same
    incarnation, where a scheduled tick must match the job's revision exactly;
    `while_active` (a backfill begun on an active job) claims only while the job is
    still active, so a pause stops the ticks not yet claimed."""

    job: Job
    scheduled_for: datetime
    trigger: RunTrigger
    runner: str
    run_id: UUID
    lock: bool
    any_version: bool = False
    following: NextTick = Following.UNKNOWN
    while_active: bool = False
    # A manual run's own arguments (None: the job's), and why it was triggered.
    args: dict[str, JsonValue] | None = None
    note: str | None = None

    @classmethod
    def of(
        cls,
        job: Job,
        scheduled_for: datetime,
        trigger: RunTrigger,
        runner: str,
        *,
        any_version: bool = False,
    ) -> "TickClaim":
        """A new claim of the tick, with a run id of its own: it takes the job's lock
        unless the job allows overlapping runs."""
        lock = job.overlap is not Overlap.ALLOW
        return cls(job, scheduled_for, trigger, runner, uuid4(), lock, any_version)

    @property
    def counted(self) -> bool:
        """A claim that counts against the job's `max_runs` (manual runs never do)."""
        return self.job.max_runs is not None and not self.trigger.on_demand


@dataclass(frozen=True)
class KeptRun:
    """A run with what was kept beside it: its last attempt's output, its log, and the
    attempts before its last."""

    run: Run
    output: JsonValue
    log: JsonValue
    earlier: Sequence[EarlierAttempt] = ()

    def attempts(self) -> list[AttemptTimes]:
        """Every attempt, oldest first, with its times."""
        return attempts_of(self.run, self.earlier)


@dataclass(frozen=True)
class RunEnd:
    """How a run ended: what is written to its ledger row."""

    status: RunStatus
    error: str | None
    result: JsonValue
    attempts: int
    # What the last attempt answered (the http task's response), and what the run
    # logged, kept beside the run.
    output: JsonValue = None
    log: JsonValue = None
    # The hook deliveries its end writes to the outbox.
    hooks: tuple[HookCall, ...] = ()


@dataclass(frozen=True)
class Skip:
    """A tick that will not run, and why: recorded as a `skipped` ledger row."""

    job: Job
    scheduled_for: datetime
    trigger: RunTrigger
    reason: SkipReason
    note: str
    missed_ticks: int | None = None
    following: NextTick = Following.UNKNOWN
    # The moment the row says it was skipped (the database's clock), when not the
    # moment it is written: an overlap skip names when the claim saw the other run in
    # progress, which may have ended before the skip's row is written.
    at: datetime | None = None


@dataclass(frozen=True)
class CancelAnswer:
    """What a cancel found: the run as it was; `asked`: it was running, and its replica
    is told; `gone`: its replica is gone too, so the orphan sweep ends it `abandoned`."""

    run: Run
    asked: bool
    gone: bool


@dataclass(frozen=True)
class Delivery:
    """One hook delivery in the outbox: of which hook of the job (`is_default`: of the
    cluster's defaults) for which event, doing what, how far it got."""

    id: UUID
    run_id: UUID
    job: str
    hook: int
    is_default: bool
    event: HookEvent
    action: Action
    retry: RetryPolicy
    status: Literal["pending", "sending", "delivered", "failed"]
    attempts: int
    due_at: datetime
    last_error: str | None
    answer: JsonValue
    created_at: datetime
    delivered_at: datetime | None


@dataclass(frozen=True)
class Sending:
    """A delivery this replica took to send, with its run and its job's labels."""

    delivery: Delivery
    run: Run
    labels: dict[str, str]


# The job a window has ticks filed from, by name, at some revision (None: none).
Filed = Callable[[str], Job | None]


def waits_for_a_tick(cursor: datetime | None) -> TypeGuard[datetime]:
    """Whether a cursor as read stands at a tick: one past its job's last tick is
    'infinity', which asyncpg reads as a naive datetime.max, to compare with nothing."""
    return cursor is not None and cursor.tzinfo is not None


@dataclass(frozen=True)
class WindowRead:
    """What a window read: the database's clock, the window's end, and each job whose
    cursor may fall due before it (as it stands, with its cursor)."""

    now: datetime
    until: datetime
    jobs: list[tuple[Job, datetime]]


@dataclass(frozen=True)
class Audited:
    """One lagging cursor the audit moved: its job as it stands, the runs of ticks it
    recorded missed, and the ticks owed, for the auditing replica to claim."""

    job: Job
    missed: list[MissedTicks]
    owed: list[OwedTick]
