"""The scheduler's ports: exactly the store calls `service/scheduler` makes, as Protocols.

The fire path's three. `LockPool` keeps a handful of long-lived `PinnedSession`s: one
connection each, which owns the advisory locks it takes, so a tick's lock, claim, end
and unlock all go over it, and holds the locks of many runs at once. `Ledger` is what
goes over the API pool: skips, the queue_one slot, the job re-read of a stale tick, a
run's end recorded elsewhere and a job's completion.

Around it: `WindowReads` and `OpenListener` (the window's read of the tick cursors,
and the jobs' changes as they are committed), `CursorAudit` (the audit), `ChoreStore`
(completing jobs, retention, the overdue check), `Outbox` (hook deliveries) and
`JoinCluster` with its `MemberSession` (the membership).

PostgreSQL (`sessions.LockSessions`, `store.Store`, `listener.JobListener`,
`members.MemberSession`) is the implementation, and the truth; `harness/memory.py`
holds an in-memory one of the fire path's and the window's ports with the same
semantics, so races can be replayed step by step in tests. The contracts below are what
both must keep: the scheduler relies on nothing else. Nothing here talks SQL. Which
failure means "the database is away" is `service.store.errors.is_unavailable`, a pure
function of the error, which the scheduler may import (pyproject.toml's contracts).
"""

from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from dataclasses import dataclass
from datetime import datetime, timedelta
from enum import Enum
from typing import Protocol
from uuid import UUID

from pydantic import JsonValue

from service.domain.cursors import Takeover
from service.domain.jobs import Job
from service.domain.ownership import Heartbeat, Member
from service.domain.runs import AttemptEnd, CancelRequest, Run, SkipReason
from service.store.values import (
    Audited,
    Filed,
    Following,
    NextTick,
    RunEnd,
    Sending,
    Skip,
    TickClaim,
    WindowRead,
    waits_for_a_tick,
)

__all__ = [
    "Audited",
    "BackendId",
    "ChoreStore",
    "Claim",
    "ClaimOutcome",
    "CursorAudit",
    "Filed",
    "Following",
    "GateFacts",
    "JobUpdateFn",
    "JoinCluster",
    "Ledger",
    "Listener",
    "LockPool",
    "MemberSession",
    "NextAttempt",
    "NextTick",
    "OpenListener",
    "Orphan",
    "Outbox",
    "PinnedSession",
    "RunEnd",
    "Sending",
    "Skip",
    "TickClaim",
    "WindowRead",
    "WindowReads",
    "waits_for_a_tick",
]

# An update of an existing job, given the store's clock.
JobUpdateFn = Callable[[Job, datetime], Job]


class ClaimOutcome(Enum):
    """What the gate said of one tick.

    CLAIMED: the ledger row is ours, run it. ALREADY_RAN: the tick has its row (a run
    or a recorded skip). LOCKED: the job's lock is held (by another session, or by
    this one for another run) and no other run of the job is in progress: someone is
    claiming this tick, or a foreign holder has the key; not an outcome, ask again.
    BUSY: the lock is held and another run of the job is in progress: the overlap
    policy decides. STALE: the job is not the one the tick was scheduled from (edited,
    or deleted and made anew): judge the tick again against the job as it stands.
    JOB_GONE: no such job. CAPPED: `max_runs` reached. INACTIVE: the claim runs only an
    active job (a backfill begun on one), and the job is paused or completed now.
    CONTENDED: another statement (the audit, a skip, an edit, a claim elsewhere) held
    the job's rows, which a claim never waits for; not an outcome, ask again.
    """

    CLAIMED = "claimed"
    ALREADY_RAN = "already_ran"
    LOCKED = "locked"
    BUSY = "busy"
    STALE = "stale"
    JOB_GONE = "job_gone"
    CAPPED = "capped"
    INACTIVE = "inactive"
    CONTENDED = "contended"


@dataclass(frozen=True)
class Claim:
    """The gate's answer for one tick. `stored_job`: for a claimed manual run or backfill
    (`TickClaim.any_version`), the job as the claim read it, under the same row lock
    as the run's row: what runs, whatever version the caller had read before."""

    outcome: ClaimOutcome
    run: Run | None = None
    holds_lock: bool = False
    stored_job: Job | None = None
    # When the gate looked (the database's clock): for BUSY, a moment the other run was
    # in progress, which an overlap skip's row then names.
    seen_at: datetime | None = None


@dataclass(frozen=True)
class BackendId:
    """A session as the ledger rows of its runs name it: in PostgreSQL a backend, its
    PID and when it started. A PID alone names no backend: PIDs are reused (after a
    restart in a new PID namespace a new backend may get the PID of one that held a
    run). `started_at` None: not known (a row written before migration 0026, or a
    backend whose start this role may not read); such a backend is judged by its PID."""

    pid: int
    started_at: datetime | None = None

    def names(self, other: "BackendId") -> bool:
        """Whether the two name one backend: the same PID, and the same start where
        both are known (as `fire_sql.same_backend`)."""
        if self.started_at is None or other.started_at is None:
            return self.pid == other.pid
        return self == other


@dataclass(frozen=True)
class Orphan:
    """A `running` run whose replica is gone (its backend ended, its lock free), with
    its job as stored. The attempt it was making is lost: a crash costs an attempt,
    not the run, when the job's retry policy allows the next one."""

    run: Run
    job: Job
    backend: BackendId
    locked: bool
    lock_key: int
    # How long ago a sweep first found it orphaned, and whether its runner is alive.
    orphaned_seconds: float = 0.0
    runner_live: bool = False
    # Someone asked to cancel it: it gets no other attempt.
    cancel_requested: bool = False

    def awaits_its_replica(self, rejoin_seconds: float, record_seconds: float) -> bool:
        """Whether sweeps leave it alone yet. Its replica may have lost only the run's
        connection (a PostgreSQL restart, a cut link), not its life: it fenced the run
        and records the end itself. A replica that is a live member gets
        `record_seconds` for that; one that is not yet gets `rejoin_seconds` to come
        back (after a restart every member's session went too), counted from when a
        sweep first found the orphan. A replica that died never comes back."""
        return self.grace_left(rejoin_seconds, record_seconds) >= 0

    def grace_left(self, rejoin_seconds: float, record_seconds: float) -> float:
        """Seconds until sweeps may take it (see `awaits_its_replica`)."""
        grace = record_seconds if self.runner_live else rejoin_seconds
        return grace - self.orphaned_seconds

    def resumable(self, now: datetime) -> bool:
        """Whether the next attempt may start now, by the job's retry policy (the lost
        one counted among `run.attempts`), under the lock its job has now; never for a
        run someone asked to cancel."""
        if self.job.lock_key != self.lock_key or self.cancel_requested:
            return False
        elapsed = max(now - self.run.started_at, timedelta(0)).total_seconds()
        return self.job.retry.allows_attempt(self.run.attempts + 1, elapsed)


def check_orphans(orphans: Sequence[Orphan]) -> None:
    """One resume takes at most one orphan per lock key: a session's locks are
    re-entrant, so a key taken twice in one statement would let two runs through."""
    keys = [orphan.lock_key for orphan in orphans if orphan.locked]
    if len(set(keys)) != len(keys):
        raise ValueError("a resume takes at most one orphan per lock key")


@dataclass(frozen=True)
class NextAttempt:
    """What a run's retry found as its row counted it (`Ledger.note_attempt`): the job as
    stored now, whose definition the attempt runs; or `None` and why it does not start.
    `cancelled`: the run ends `cancelled` saying `why_not` (a cancel was asked, the job
    was deleted or paused); otherwise it ends with its last attempt's outcome (the
    attempt could not be counted, and an attempt not counted is never made)."""

    job: Job | None
    why_not: str = ""
    cancelled: bool = True


@dataclass(frozen=True)
class GateFacts:
    """What the gate found out about one tick (see `fire_sql.claim_statement`), from
    which its Claim follows. Every implementation of the gate reports these.

    got: the lock was taken (or the tick takes none); never one the claiming session
    held already. job_exists: a job of its name is
    there. same_incarnation / same_revision: of the tick's incarnation / (incarnation,
    version). capped: its run cap is used up, for a tick that counts. inactive: a tick
    claimed `while_active` found the job not active. ticked: not
    claimed, and the tick had a row when the claim began (for a backfill, a row other
    than a skip, which it may claim). busy: not claimed, and either
    the lock was not taken while another run of the job, not a backfill, was in
    progress when the claim began, or an earlier tick of the job holds its queue_one
    slot. released: the lock was taken and given back, the tick not being claimed.
    run: the row claimed, if it was. stored_job: the job as the claim read it, for a
    claimed tick that takes any version. contended: the lock was taken, but the job's
    rows were held by another statement (the audit, a skip, an edit, a claim
    elsewhere), which the claim does not wait for: the lock was given back; ask again.
    seen_at: when the claim began (the database's clock), what `ticked` and `busy` say of.
    """

    got: bool
    job_exists: bool
    same_incarnation: bool
    same_revision: bool
    capped: bool
    ticked: bool
    busy: bool
    released: bool
    run: Run | None
    stored_job: Job | None = None
    inactive: bool = False
    contended: bool = False
    seen_at: datetime | None = None

    def claim(self, tick: TickClaim) -> Claim:
        holds = tick.lock and self.got and not self.released
        return Claim(self._outcome(tick), self.run, holds, self.stored_job, self.seen_at)

    def _outcome(self, tick: TickClaim) -> ClaimOutcome:  # noqa: PLR0911
        # One answer per condition of the gate, in the order they apply.
        if self.run is not None:
            return ClaimOutcome.CLAIMED
        if not self.job_exists:
            return ClaimOutcome.JOB_GONE
        if self.ticked:
            return ClaimOutcome.ALREADY_RAN
        if self.contended:
            return ClaimOutcome.CONTENDED
        if not self.same_incarnation or not (self.same_revision or tick.any_version):
            return ClaimOutcome.STALE  # judged again as the job stands, before any policy
        if self.inactive:
            return ClaimOutcome.INACTIVE
        if self.busy:
            return ClaimOutcome.BUSY
        if not self.got:
            return ClaimOutcome.LOCKED
        if self.capped:
            return ClaimOutcome.CAPPED
        # Lost the race for the row to a claim that committed after this one began.
        return ClaimOutcome.ALREADY_RAN


class PinnedSession(Protocol):
    """One connection of the lock pool. Advisory locks belong to the session that
    took them: re-entrant within it (taken twice, released twice), invisible to any
    other, and all gone the moment the session closes. Its calls take turns, as
    statements on one connection do; many runs share it, each holding its own lock."""

    @property
    def pid(self) -> int:
        """The session's number, for the logs (the backend's PID in PostgreSQL)."""
        ...

    @property
    def backend(self) -> BackendId:
        """Which session this is, as the ledger rows of its runs name it: what orphan
        detection asks about."""
        ...

    @property
    def closed(self) -> bool:
        """The session is gone (closed by the server, the network or `terminate`),
        and every lock it held with it. Calls on a closed session raise an error that
        `errors.is_unavailable` recognises."""
        ...

    def fenced(self, on_lost: Callable[[], None]) -> AbstractContextManager[None]:
        """While the block runs, call `on_lost` (soon, from the event loop) if the
        session closes; at once if it is closed already."""
        ...

    async def claim(self, ticks: Sequence[TickClaim]) -> list[Claim]:
        """Pass ticks through the gate at once; one Claim per tick, in order.

        At most one tick per job, and a tick that counts against `max_runs` goes
        alone (ValueError otherwise). Per tick: try the job's lock if it `lock`s, never
        waiting, and never taking again one this session holds (its locks are
        re-entrant; the gate is not: a run of the job here holds it, as if another
        session did); read the job as it stands; write a `running` ledger row if the job is
        the tick's incarnation and (unless `any_version`) its active version, a cap
        leaves room, and the tick has no row yet (a backfill may take over a `skipped`
        row; nothing else may replace a row). A counting claim counts its run. A lock
        taken for a tick not claimed is given back in the same call, so only CLAIMED
        ticks may hold one (`holds_lock`). `ticked` and `busy` are judged on the
        ledger as it was when the claim began (see GateFacts).

        A claim that fails once it began, its fate unknown (the link broke), may have
        left locks it cannot name: the session is closed, and the runs whose locks it
        held are fenced. One still waiting for its turn when it fails (cancelled)
        leaves the session as it was, and so does one the database ended at its
        timeout (`errors.TIMED_OUT`) or refused with an error: it wrote nothing, gives
        back the locks it took, and raises; the session's other runs go on."""
        ...

    async def finish(
        self, run_id: UUID, outcome: RunEnd, release_lock: int | None
    ) -> tuple[Run | None, bool]:
        """Record how a `running` run ended (times from the store's clock) and then,
        in the same step, release `release_lock` once if given: only once the end is
        recorded (an end that fails to be recorded leaves the lock held). The
        finished run, or None if it was not `running` (the lock is released all the
        same); and whether this session held the lock to release."""
        ...

    async def resume(self, orphans: Sequence[Orphan], runner: str) -> list[Claim]:
        """Make each orphan's next attempt this session's, for `runner`, in one
        statement (at most one orphan per lock key: `check_orphans`): take the job's
        lock if the run holds one (never waiting), then the row, only while it is
        `running` and still names the backend that was lost, counting one more attempt.
        Per orphan, in order: CLAIMED (holding the lock, if any) with the row as it is
        now; otherwise LOCKED (the lock is held: whoever holds it is running the job) or
        ALREADY_RAN (another session resumed it, or it ended), holding nothing."""
        ...

    async def unlock(self, key: int) -> bool:
        """Release `key` once; False if this session did not hold it."""
        ...

    def terminate(self) -> None:
        """Close the session hard, dropping every lock it holds. Safe to repeat."""
        ...


class LockPool(Protocol):
    """A replica's lock sessions: `size` long-lived PinnedSessions, shared by every
    claim and run that goes through the pool."""

    @property
    def size(self) -> int:
        """How many sessions the pool keeps: one claim in flight each is the most
        that keeps none waiting for another's turn."""
        ...

    async def fill(self) -> None:
        """Open every session that is not open now; an error if one cannot be."""
        ...

    def session(self, wait_seconds: float) -> AbstractAsyncContextManager[PinnedSession]:
        """A live session for the block, shared with other blocks: of the open ones,
        the one fewest blocks hold (the first of equals). A block holds it for a
        claim and the runs it won, which end (and unlock) on it. A session that
        closed is replaced by a new one; TimeoutError if no session is open and none
        can be opened within `wait_seconds`. A session is never closed under a block
        that holds it, except by a failure; one that its last block leaves still
        holding a lock (a bug in the caller, and logged) is closed, its locks with it.
        Closing the pool closes every session, releasing their locks."""
        ...


class Ledger(Protocol):
    """The fire path's calls over the API pool: none holds a lock."""

    async def record_skips(self, skips: Sequence[Skip], runner: str) -> list[Run]:
        """Record ticks that will not run as `skipped` rows (attempts 0, duration 0, the
        note as the error); return those recorded now. A tick that has a row already,
        or whose job is gone or of another incarnation, records nothing."""
        ...

    async def reserve_slot(
        self, job: str, tick: datetime, runner: str, expires_in_seconds: float
    ) -> datetime | None:
        """queue_one: take the job's one waiting slot for `tick` unless another tick
        holds it and it has not expired; return the tick that holds it now. Holding it
        already does not extend its expiry. The job must exist (else an error)."""
        ...

    async def release_slot(self, job: str, tick: datetime) -> None:
        """Give the slot back, if `tick` holds it."""
        ...

    async def slot_tick(self, job: str) -> datetime | None:
        """The tick holding the job's slot, unless its wait has expired."""
        ...

    async def cancels_asked(self, runner: str) -> list[CancelRequest]:
        """The cancels asked (POST /v1/runs/{id}/cancel) of runs `running` on `runner`;
        each stays asked until its run ends."""
        ...

    async def get_jobs(self, names: Sequence[str]) -> list[Job]:
        """The jobs of these names that exist, each once, in no particular order."""
        ...

    async def ticks_without_runs(
        self, ticks: Sequence[tuple[str, datetime]]
    ) -> set[tuple[str, datetime]]:
        """Which of these (job, tick) pairs have no ledger row yet, of any kind."""
        ...

    async def split_missed(self, job: Job, ticks: Sequence[datetime]) -> bool:
        """Before a backfill of `ticks` claims them: each of them that a misfire row
        counts among its run of missed ticks gets a misfire row of its own, and the run
        is split around them (`domain.gaps`), so every tick keeps exactly one outcome
        whether the backfill gets to it or not. False if another statement changed one
        of those runs meanwhile (nothing of it was split): ask again."""
        ...

    async def finish_run(self, run_id: UUID, end: RunEnd, backend: BackendId) -> Run | None:
        """`PinnedSession.finish` without a lock: for a run whose session (`backend`)
        is gone; only while the row still names that session, since a session that
        resumed the orphan records its end itself."""
        ...

    async def note_attempt(self, run: Run, job: Job, ended: AttemptEnd) -> NextAttempt:
        """The attempt after `ended` of a `running` run is to start: its row counts it,
        keeps `ended` with its times (GET /v1/runs/{id} shows them) and names the job's
        version now stored, which the attempt runs (an edit reaches the next attempt).
        It is not counted, and does not start, if the run is no longer `running`, a
        cancel was asked of it, or its job (`job`'s incarnation) is gone, or paused
        since `job` was read (a manual run of a paused job makes its retries).
        Raises if the database could not answer: the attempt is then not counted."""
        ...

    async def orphans(self, most: int) -> list[Orphan]:
        """Up to `most` runs that are `running` on a session that is gone, with no
        session holding the job's lock, and that began more than 2 seconds ago; the
        oldest first."""
        ...

    async def abandon(self, orphans: Sequence[Orphan]) -> list[Run]:
        """End as `abandoned` those of `orphans` that are orphaned still; those ended."""
        ...

    async def update_jobs(self, updates: Mapping[str, JobUpdateFn]) -> None:
        """Apply each update to its job, if the job still exists, all at once; each
        is given the store's clock. What they return is stored as it is."""
        ...


def _nothing_filed(_name: str) -> Job | None:
    return None


class WindowReads(Protocol):
    """The window's read of the tick cursors (`scheduler/window.py`)."""

    async def read_window(
        self,
        buckets: frozenset[int] | None,
        seconds: float,
        names: Sequence[str] | None = None,
        filed: Filed = _nothing_filed,
    ) -> WindowRead:
        """The active jobs of `buckets` (None: all) whose cursor may fall due in the
        next `seconds` by the store's clock, each with its cursor (a job `filed` at the
        revision stored may be returned as filed); or, given `names`, the jobs of those
        names that exist, in any state, with cursors that may stand past the last tick
        (`waits_for_a_tick` says which do not)."""
        ...


class Listener(Protocol):
    """Job changes heard as they are committed, until the listener is lost or closed."""

    @property
    def alive(self) -> bool:
        """Still hearing: a listener lost (its connection closed) hears nothing more,
        and changes committed meanwhile are not told again."""
        ...

    async def close(self) -> None:
        """Stop hearing. Safe on a listener lost already."""
        ...


class OpenListener(Protocol):
    """Opens a `Listener`: `on_change(name)` for every job written (created, changed,
    deleted) once it is open, `on_cancel()` for every cancel asked of a run, and
    `on_lost()` (from the event loop) when it is lost."""

    def __call__(
        self,
        on_change: Callable[[str], None],
        on_lost: Callable[[], None],
        on_cancel: Callable[[], None],
    ) -> Awaitable[Listener]: ...


class CursorAudit(Protocol):
    """The audit's calls (`scheduler/audit.py`)."""

    async def refresh_cursors(self, takeover: timedelta) -> int:
        """Set cursors' `due_at` again where claims moved them on; how many."""
        ...

    async def audit_cursors(self, most: int, runner: str, takeover: Takeover) -> list[Audited]:
        """Audit up to `most` cursors lagging past the takeover time, in one
        transaction: the ticks past reach without a row are recorded as misfires, and
        the owed ones returned, for `runner` to claim."""
        ...


class ChoreStore(CursorAudit, Protocol):
    """The chores' calls: the audit's, and completing jobs, retention and the overdue
    check (`scheduler/chores.py`, `scheduler/overdue.py`)."""

    async def clock(self) -> datetime:
        """The store's clock."""
        ...

    async def ended_jobs(self) -> list[Job]:
        """The active jobs with no tick left to fire, by the store's clock."""
        ...

    async def record_skips(self, skips: Sequence[Skip], runner: str) -> list[Run]:
        """As `Ledger.record_skips`."""
        ...

    async def update_jobs(self, updates: Mapping[str, JobUpdateFn]) -> None:
        """As `Ledger.update_jobs`."""
        ...

    async def prune_runs(
        self, keep: int, every_seconds: float = 0, output_bytes: int | None = None
    ) -> int:
        """Delete each job's runs beyond its newest `keep` (and outputs past
        `output_bytes`), unless a replica began a round in the last `every_seconds`;
        how many were deleted."""
        ...

    async def take_chore(self, name: str, every_seconds: float) -> bool:
        """Take the chore `name` unless a replica began it in the last `every_seconds`."""
        ...

    async def active_jobs_page(self, after: str | None, limit: int) -> list[Job]:
        """Up to `limit` active jobs named after `after`, in name order."""
        ...

    async def file_next_ticks_page(
        self, ticks: Sequence[tuple[Job, datetime | None]], after: str | None, through: str | None
    ) -> None:
        """File these jobs' next ticks as the page (`after`, `through`] of the book."""
        ...

    async def file_overdue(self, ticks: Sequence[tuple[str, datetime]]) -> None:
        """The overdue book anew: these jobs with their ticks never run."""
        ...

    async def booked_overdue(self) -> list[tuple[Job, datetime]]:
        """The overdue book, with each job as it stands."""
        ...

    async def ticks_without_runs(
        self, ticks: Sequence[tuple[str, datetime]], *, unrun: Sequence[SkipReason] = ()
    ) -> set[tuple[str, datetime]]:
        """As `Ledger.ticks_without_runs`, a skip for one of `unrun` counting as no row."""
        ...


class Outbox(Protocol):
    """The hook sender's calls (`scheduler/hooks.py`)."""

    async def take_deliveries(self, most: int, sender: str, lease_margin: float) -> list[Sending]:
        """Up to `most` due deliveries, leased to `sender` for their action's timeout
        and `lease_margin` seconds more."""
        ...

    async def settle_delivery(
        self,
        *,
        delivery: UUID,
        sender: str,
        status: str,
        error: str | None,
        answer: JsonValue,
        retry_in: float | None = None,
    ) -> None:
        """Settle a delivery `sender` holds the lease of; `pending` again after `retry_in`."""
        ...

    async def get_jobs(self, names: Sequence[str]) -> list[Job]:
        """As `Ledger.get_jobs`."""
        ...


class MemberSession(Protocol):
    """One membership of the cluster, live while its session is."""

    @property
    def seed(self) -> int:
        """The member's number, which ranks it for ownership."""
        ...

    @property
    def started_at(self) -> datetime:
        """When the member first joined (a rejoin keeps it), on the store's clock."""
        ...

    @property
    def closed(self) -> bool:
        """The membership is over: closed here, or its session died."""
        ...

    async def heartbeat(self, beat: Heartbeat) -> list[Member]:
        """Report `beat`; the live members in seed order, this one among them."""
        ...

    async def close(self) -> None:
        """Leave the cluster. Safe on a membership over already."""
        ...


class JoinCluster(Protocol):
    """Joins the cluster as a new member; `since`: when this replica first joined,
    for a rejoin (None: a first join)."""

    def __call__(self, *, since: datetime | None) -> Awaitable[MemberSession]: ...
