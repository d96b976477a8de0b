"""The fire path's ports in memory, with the semantics of their SQL (`fire_sql`).

`MemoryDatabase` is the state every replica shares: jobs, the run ledger (one row per
job and tick), the queue_one slots, and advisory locks owned per session (re-entrant,
counted, all dropped when the session closes). Each replica gets its own
`MemoryLockPool` (a few long-lived sessions, shared by its claims and runs) and
`MemoryLedger` over it, as each has its own lock sessions and pool over PostgreSQL.

Sessions close as connections do: `terminate` from within, `terminate_backend` from
outside (pg_terminate_backend); either drops the session's locks and trips its fences.
A claim behaves as the claim statement does: the ledger it judges `ticked` and `busy`
on is the one it began with (PostgreSQL's statement snapshot), the job is read as it
stands when the claim decides (a row lock sees the newest version), and the row is
written only where none is. Every call gives other tasks a turn first, as a round trip
would. `Hooks` can hold a claim after it took its locks, or a run's end before it is
written, so a test can interleave another replica's calls exactly there (`Pause`).

The window's ports too: `MemoryLedger.read_window` reads the tick cursors as
`cursor_sql.WINDOW` and `CURSORED_JOBS` do, and `MemoryDatabase.listen` opens a
`MemoryListener`, told of every job written and every cancel asked (NOTIFY), from the
event loop once the write is done, as a notification comes after its commit.

No SQL, no I/O: time comes from the clock it is given, so tests decide what it reads.
The outbox of hook deliveries is not modelled: ends and skips carry their hook calls,
and only PostgreSQL writes them (tests/integration/test_hooks.py). A cancel asked of a
run is (`request_cancel`), as the fire path reads it.
"""

import asyncio
import logging
from collections import Counter
from collections.abc import (
    AsyncIterator,
    Awaitable,
    Callable,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from decimal import ROUND_HALF_UP, Decimal
from itertools import count
from typing import Generic, TypeVar
from uuid import UUID, uuid4

from service.domain.gaps import GapSplit, Outcome, split_gaps
from service.domain.jobs import Job, JobState
from service.domain.ownership import bucket_of
from service.domain.runs import (
    DELETED_BY_TICKGATE,
    JOB_DELETED,
    AttemptEnd,
    CancelRequest,
    Run,
    RunStatus,
    RunTrigger,
)
from service.store.fire_sql import ABANDONED_ERROR
from service.store.moves import cursor_moves
from service.store.ports import (
    BackendId,
    Claim,
    ClaimOutcome,
    Filed,
    GateFacts,
    JobUpdateFn,
    Ledger,
    Listener,
    LockPool,
    NextAttempt,
    Orphan,
    PinnedSession,
    RunEnd,
    Skip,
    TickClaim,
    WindowRead,
    check_orphans,
)

__all__ = [
    "Clock",
    "Hooks",
    "MemoryDatabase",
    "MemoryLedger",
    "MemoryListener",
    "MemoryLockPool",
    "MemorySession",
    "NoSuchJobError",
    "Pause",
    "SessionClosedError",
]

log = logging.getLogger(__name__)

Clock = Callable[[], datetime]
T = TypeVar("T")
ClaimHook = Callable[[Sequence[TickClaim]], Awaitable[None]]
FinishHook = Callable[[Sequence[UUID]], Awaitable[None]]
_Tick = tuple[str, datetime]
ORPHAN_AGE = timedelta(seconds=2)  # as the orphan statements' `interval '2 seconds'`


class SessionClosedError(ConnectionError):
    """A call on a session that is gone: what a dead connection answers (unavailable)."""


class NoSuchJobError(LookupError):
    """A queue_one slot for a job that does not exist (the slot's foreign key)."""


@dataclass
class Hooks:
    """Where a test may hold a call mid-flight. `before_deciding`: a claim, after it
    took its ticks' locks and before it reads the jobs and writes rows (called with
    the ticks that took theirs, if any). `before_finishing`:
    a run's end on its pinned session, before it is written and its lock released."""

    before_deciding: ClaimHook | None = None
    before_finishing: FinishHook | None = None


class Pause(Generic[T]):
    """A hook that holds every call with an item `matches` accepts until `resume`."""

    def __init__(self, matches: Callable[[T], bool]) -> None:
        self._matches = matches
        self._resumed = asyncio.Event()
        self._arrival = asyncio.Condition()
        self.arrivals = 0

    async def __call__(self, items: Sequence[T]) -> None:
        if not any(self._matches(item) for item in items):
            return
        async with self._arrival:
            self.arrivals += 1
            self._arrival.notify_all()
        await self._resumed.wait()

    async def reached(self, arrivals: int = 1) -> None:
        """Wait until `arrivals` calls are held here (or were)."""
        async with self._arrival:
            await self._arrival.wait_for(lambda: self.arrivals >= arrivals)

    def resume(self) -> None:
        self._resumed.set()


@dataclass(frozen=True)
class _Statement:
    """One claim as a whole: whose session, the ledger as it began, the runner its
    rows name, and whether it counts runs (then it has one tick)."""

    session: int
    began: Mapping["_Tick", Run]
    runner: str
    counted: bool
    seen_at: datetime

    def counts(self, run: Run) -> bool:
        return self.counted and not run.trigger.on_demand


@dataclass(frozen=True)
class _Slot:
    scheduled_for: datetime
    runner: str
    expires_at: datetime


class MemoryDatabase:
    """What every replica shares. Jobs are written with `put_job` / `delete_job` (the
    API's writes; a delete takes the job's slot and ended runs with it, and detaches its
    running ones, as `jobs_sql.DETACH_RUNS` does); the fire path reaches the rest
    through the pools and ledgers over it."""

    def __init__(self, *, clock: Clock, hooks: Hooks | None = None) -> None:
        self.clock = clock
        self.hooks = hooks or Hooks()
        self._jobs: dict[str, Job] = {}
        self._runs: dict[_Tick, Run] = {}
        self._run_ticks: dict[UUID, _Tick] = {}
        # Each running run's session, whether it locks, and its key (its row's
        # backend_pid, locked and lock_key). No id is given to two sessions here, so
        # the id tells whether the session is open; the rows name its start too
        # (`backend`), as PostgreSQL's, whose PIDs are reused, must.
        self._backends: dict[UUID, tuple[int, bool, int]] = {}
        self._orphaned_at: dict[UUID, datetime] = {}  # the orphans' stamps
        self._slots: dict[str, _Slot] = {}
        self._cancels: dict[UUID, CancelRequest] = {}  # asked of running runs
        self._detached: dict[UUID, int] = {}  # runs a delete left, and their lock keys
        # Each job's tick cursor (migration 0014): every scheduled tick before it is decided.
        self._cursors: dict[str, datetime] = {}
        self._locks: dict[int, tuple[int, int]] = {}  # key: (session, times taken)
        self._session_ids = count(1)
        self._session_starts: dict[int, datetime] = {}  # every session's, open or not
        self._sessions: dict[int, MemorySession] = {}  # open ones
        self._listeners: list[MemoryListener] = []  # open ones
        # Cleared while the database refuses new connections (a test's fault).
        self.accepting = asyncio.Event()
        self.accepting.set()

    # --- what the API and tests do -------------------------------------------------

    def put_job(self, job: Job) -> None:
        self._write_job(job)
        self._notify(job.name)

    def delete_job(self, name: str, by: str = DELETED_BY_TICKGATE) -> None:
        """As a delete and `jobs_sql.DETACH_RUNS`: a running run stays, detached from the
        name, with its cancel asked by `by`; the others go."""
        job = self._jobs.pop(name, None)
        self._notify(name)
        self._slots.pop(name, None)
        self._cursors.pop(name, None)
        for tick in [tick for tick in self._runs if tick[0] == name]:
            run = self._runs.pop(tick)
            del self._run_ticks[run.id]
            if job is not None and run.status is RunStatus.RUNNING:
                self._write(run.model_copy(update={"job": f"{name}@deleted:{job.incarnation}"}))
                self._cancels.setdefault(run.id, CancelRequest(run.id, by, JOB_DELETED))
                self._detached[run.id] = self._backends[run.id][2]

    def job(self, name: str) -> Job | None:
        return self._jobs.get(name)

    def request_cancel(self, request: CancelRequest) -> bool:
        """As `fire_sql.REQUEST_CANCEL`: kept if the run is running; whether it was."""
        tick = self._run_ticks.get(request.run_id)
        running = tick is not None and self._runs[tick].status is RunStatus.RUNNING
        if running:
            self._cancels[request.run_id] = request
            for listener in self._listeners:
                listener.cancel_asked()
        return running

    def cursor(self, name: str) -> datetime | None:
        return self._cursors.get(name)

    def _write_job(self, job: Job) -> None:
        """Store `job`; a new threshold (a new job, schedule or resume) starts its cursor
        again there, as the jobs table's trigger does, and an active job's cursor at its
        threshold moves on to its first tick (`cursor_sql.OPEN_CURSORS`)."""
        before = self._jobs.get(job.name)
        if before is None or before.fire_after != job.fire_after:
            self._cursors[job.name] = job.fire_after
        if job.state is JobState.ACTIVE and self._cursors[job.name] == job.fire_after:
            # (tick_after, not the cached `first_tick`: the job is the caller's object)
            self._cursors[job.name] = job.tick_after(job.fire_after) or _NO_TICK_LEFT
        self._jobs[job.name] = job

    def runs(self, job: str) -> list[Run]:
        """The job's ledger rows, newest first (as `Store.list_runs`)."""
        rows = [run for (name, _), run in self._runs.items() if name == job]
        return sorted(rows, key=lambda run: (run.started_at, run.id), reverse=True)

    def slot(self, job: str) -> datetime | None:
        """The tick holding the job's queue_one slot, expired or not."""
        slot = self._slots.get(job)
        return slot.scheduled_for if slot else None

    def lock_holders(self, key: int) -> int:
        """Sessions holding `key` (as pg_locks counts them): 0 or 1."""
        return int(key in self._locks)

    def lock_owner(self, key: int) -> int | None:
        """The session holding `key`, if one does."""
        held = self._locks.get(key)
        return held[0] if held else None

    def advisory_locks(self) -> tuple[int, int]:
        """Keys held, and how many sessions hold them (as pg_locks counts them)."""
        return len(self._locks), len({owner for owner, _ in self._locks.values()})

    def connect(self) -> "MemorySession":
        """A new session: of a lock pool, or of no pool (a foreign lock holder, say)."""
        if not self.accepting.is_set():
            raise SessionClosedError("the database refuses new connections")
        session = MemorySession(self, next(self._session_ids))
        self._sessions[session.id] = session
        self._session_starts[session.id] = self.clock()
        return session

    def backend(self, session: int) -> BackendId:
        """The session as the rows of its runs name it: its id and when it opened."""
        return BackendId(session, self._session_starts[session])

    def terminate_backend(self, session: int) -> bool:
        """What pg_terminate_backend does to a session: it closes, its locks with it."""
        found = self._sessions.get(session)
        if found is not None:
            found.terminate()
        return found is not None

    def disconnected(self, session: int) -> None:
        self._sessions.pop(session, None)
        self.unlock_all(session)

    # --- the window's ports ---------------------------------------------------------

    async def listen(
        self,
        on_change: Callable[[str], None],
        on_lost: Callable[[], None],
        on_cancel: Callable[[], None],
    ) -> "MemoryListener":
        """`OpenListener`: a listener of its own connection, heard of every job written
        and every cancel asked from now on."""
        await _round_trip()
        if not self.accepting.is_set():
            raise SessionClosedError("the database refuses new connections")
        listener = MemoryListener(on_change, on_lost, on_cancel, self._listeners.remove)
        self._listeners.append(listener)
        return listener

    def lose_listeners(self) -> int:
        """Close every listener's connection from the outside (a restart, a cut link);
        how many were open."""
        listeners = list(self._listeners)
        for listener in listeners:
            listener.lose()
        return len(listeners)

    def _notify(self, name: str) -> None:
        for listener in self._listeners:
            listener.changed(name)

    def read_window(
        self,
        buckets: frozenset[int] | None,
        seconds: float,
        names: Sequence[str] | None,
        filed: Filed,
    ) -> WindowRead:
        """As `cursors.fetch_window`: by `names`, the jobs that exist in any state; else
        the active jobs of `buckets` whose cursor is due before the window's end (those
        `filed` at the revision stored, as filed). A cursor past the last tick reads as
        asyncpg reads 'infinity'."""
        now = self.clock()
        until = now + timedelta(seconds=seconds)
        if names is not None:
            found = [self._jobs[name] for name in dict.fromkeys(names) if name in self._jobs]
        else:
            found = [
                job
                for job in self._jobs.values()
                if job.state is JobState.ACTIVE
                and (buckets is None or bucket_of(job.lock_key) in buckets)
                and self._cursors[job.name] < until
            ]
        jobs = [(_as_filed(job, filed), _as_read(self._cursors[job.name])) for job in found]
        return WindowRead(now, until, jobs)

    # --- advisory locks ------------------------------------------------------------

    def try_lock(self, session: int, key: int) -> bool:
        owner, taken = self._locks.get(key, (session, 0))
        if owner != session:
            return False
        self._locks[key] = (session, taken + 1)
        return True

    def unlock(self, session: int, key: int) -> bool:
        held = self._locks.get(key)
        if held is None or held[0] != session:
            return False
        if held[1] > 1:
            self._locks[key] = (session, held[1] - 1)
        else:
            del self._locks[key]
        return True

    def locks_of(self, session: int) -> int:
        """How many keys `session` holds."""
        return sum(1 for owner, _ in self._locks.values() if owner == session)

    def unlock_all(self, session: int) -> int:
        """Drop every lock of `session` (it closed); how many keys it held."""
        keys = [key for key, (owner, _) in self._locks.items() if owner == session]
        for key in keys:
            del self._locks[key]
        return len(keys)

    # --- the claim -----------------------------------------------------------------

    async def claim(self, session: "MemorySession", ticks: Sequence[TickClaim]) -> list[Claim]:
        _check_batch(ticks)
        session.check_open()
        began = dict(self._runs)  # what `ticked` and `busy` are judged on
        seen_at = self.clock()
        # A claim never takes a lock its session holds already (for another run of
        # the job): re-entered, it would let two runs of the job through.
        got = [
            not tick.lock
            or (
                self.lock_owner(tick.job.lock_key) is None
                and self.try_lock(session.id, tick.job.lock_key)
            )
            for tick in ticks
        ]
        # Only ticks that took their lock go on to the job's rows, where PostgreSQL may
        # hold a claim; the others are answered at once. (A statement here is atomic
        # past this point: no claim ever finds another's rows held, none is contended.)
        taken = [tick for tick, took in zip(ticks, got, strict=True) if took]
        if self.hooks.before_deciding is not None and taken:
            await self.hooks.before_deciding(taken)
        session.check_open()  # a session closed meanwhile failed its statement
        counted = any(tick.counted for tick in ticks)
        runner = ticks[0].runner if ticks else ""
        statement = _Statement(session.id, began, runner, counted, seen_at)
        current = {tick.job.name: self._jobs.get(tick.job.name) for tick in ticks}
        return [
            self._gate(statement, tick, took, current[tick.job.name])
            for tick, took in zip(ticks, got, strict=True)
        ]

    def _gate(self, statement: "_Statement", tick: TickClaim, got: bool, job: Job | None) -> Claim:
        """One tick's way through the gate: one row of the claim statement."""
        queued_before = self._queued_before(tick)
        passed = self._passed(tick.job.name, tick.scheduled_for, tick.trigger)
        claimed = got and _admits(tick, job) and not queued_before and not passed
        run = self._insert_claimed(tick, job, statement.runner) if claimed else None
        if claimed:  # the tick has a row now: this claim's, or the one that kept it out
            self._advance(tick.job, tick.scheduled_for, tick.trigger, opens=True)
        if run is not None and job is not None and statement.counts(run):
            self._jobs[job.name] = job.model_copy(update={"runs_started": job.runs_started + 1})
        if run is not None:
            self.release_slot(run.job, run.scheduled_for)  # whoever held the slot
            self._backends[run.id] = (statement.session, tick.lock, tick.job.lock_key)
        key = tick.job.lock_key
        released = got and tick.lock and run is None and self.unlock(statement.session, key)
        facts = GateFacts(
            got=got,
            job_exists=job is not None,
            same_incarnation=job is not None and job.incarnation == tick.job.incarnation,
            same_revision=job is not None and job.revision == tick.job.revision,
            capped=_capped(tick, job),
            inactive=_inactive(tick, job),
            ticked=run is None and (_has_outcome(tick, statement.began) or passed),
            busy=(not got and (_busy(tick, statement.began.values()) or self._detached_holds(tick)))
            or (run is None and queued_before),
            released=released,
            run=run,
            stored_job=job if run is not None and tick.any_version else None,
            seen_at=statement.seen_at,
        )
        return facts.claim(tick)

    def _detached_holds(self, tick: TickClaim) -> bool:
        """A run a delete detached holds the tick's lock key: a run of the job in progress."""
        return tick.lock and any(
            key == tick.job.lock_key
            and (run := self._runs.get(self._run_ticks[run_id])) is not None
            and run.status is RunStatus.RUNNING
            for run_id, key in self._detached.items()
        )

    def _passed(self, job: str, at: datetime, trigger: RunTrigger) -> bool:
        """A scheduled tick before its job's cursor has its outcome."""
        cursor = self._cursors.get(job)
        scheduled = trigger in {RunTrigger.SCHEDULE, RunTrigger.CATCHUP}
        return scheduled and cursor is not None and _utc(at) < cursor

    def _advance(self, job: Job, at: datetime, trigger: RunTrigger, *, opens: bool) -> None:
        """The cursor standing at the scheduled tick `at`, which has its row now, moves on
        (`opens`: the tick, if the job's first, may move it from the threshold; see
        fire_sql._advance)."""
        following, first = cursor_moves(job, at, trigger)
        cursor, current = self._cursors.get(job.name), self._jobs.get(job.name)
        at_threshold = opens and first and current is not None and cursor == current.fire_after
        if trigger in {RunTrigger.SCHEDULE, RunTrigger.CATCHUP} and (
            cursor == _utc(at) or at_threshold
        ):
            self._cursors[job.name] = following or _NO_TICK_LEFT

    def _queued_before(self, tick: TickClaim) -> bool:
        """An earlier tick of the job holds its queue_one slot: this one may not pass it."""
        slot = self._waiting(tick.job.name)
        return slot is not None and slot.scheduled_for < _utc(tick.scheduled_for)

    def _waiting(self, job: str) -> "_Slot | None":
        """The job's queue_one slot, if it still holds its tick (`fire_sql._waits`): the
        waiter's time has not run out and the tick is undecided (at or after the
        cursor, without a row)."""
        slot = self._slots.get(job)
        if slot is None or slot.expires_at <= self.clock():
            return None
        cursor = self._cursors.get(job)
        undecided = cursor is not None and cursor <= slot.scheduled_for
        return slot if undecided and (job, slot.scheduled_for) not in self._runs else None

    def _insert_claimed(self, tick: TickClaim, job: Job | None, runner: str) -> Run | None:
        """The claim's row, where the tick has none; a backfill also takes a skipped
        row over, keeping its id."""
        assert job is not None, "only an admitted tick is inserted"
        existing = self._runs.get(_tick_of(tick))
        fields: dict[str, object] = {
            "id": tick.run_id,
            "trigger": tick.trigger,
            "status": RunStatus.RUNNING,
            "started_at": self.clock(),
            "finished_at": None,
            "attempts": 1,
            "runner": runner,
            "error": None,
            "skip_reason": None,
            "missed_ticks": None,
            "result": None,
            "duration_ms": None,
            "args": tick.args,
            "note": tick.note,
        }
        if existing is None:
            new = {"job": job.name, "scheduled_for": _utc(tick.scheduled_for)}
            run = Run.model_validate({**new, **fields})
        elif existing.status is RunStatus.SKIPPED and tick.trigger is RunTrigger.BACKFILL:
            # The row keeps its id: the skip's hook deliveries name it.
            run = existing.model_copy(update={**fields, "id": existing.id})
        else:
            return None
        return self._write(run, replacing=existing)

    def _write(self, run: Run, replacing: Run | None = None) -> Run:
        if replacing is not None:
            del self._run_ticks[replacing.id]
        tick = (run.job, run.scheduled_for)
        self._runs[tick] = run
        self._run_ticks[run.id] = tick
        return run

    # --- orphans ---------------------------------------------------------------------

    def orphans(self, most: int) -> list[Orphan]:
        """As `fire_sql.ORPHANS`: running on a closed session, the job's lock free,
        older than 2 seconds; the oldest first."""
        now = self.clock()
        runs = [
            run
            for run in self._runs.values()
            if run.status is RunStatus.RUNNING
            and run.started_at < now - ORPHAN_AGE
            and self._orphaned(run)
            and run.job in self._jobs  # as ORPHANS joins its job: a detached run has none
        ]
        found = []
        for run in sorted(runs, key=lambda run: run.started_at)[:most]:
            session, locked, key = self._backends[run.id]
            since = self._orphaned_at.setdefault(run.id, now)
            age = (now - since).total_seconds()
            # No members here: every runner counts as gone.
            asked = run.id in self._cancels
            found.append(
                Orphan(
                    run, self._jobs[run.job], self.backend(session), locked, key, age, False, asked
                )
            )
        return found

    def _orphaned(self, run: Run) -> bool:
        session, locked, key = self._backends[run.id]
        free = not locked or self.lock_owner(key) is None
        return session not in self._sessions and free

    def abandon(self, orphans: Sequence[Orphan]) -> list[Run]:
        return [
            ended
            for orphan in orphans
            if self._still_orphaned(orphan.run.id)
            and (ended := self.finish(orphan.run.id, self._abandoned(orphan), keep_attempts=True))
            is not None
        ]

    def _abandoned(self, orphan: Orphan) -> RunEnd:
        asked = self._cancels.get(orphan.run.id)
        error = ABANDONED_ERROR if asked is None else f"{ABANDONED_ERROR}; {asked.error()}"
        return RunEnd(RunStatus.ABANDONED, error, None, 0)

    def _still_orphaned(self, run_id: UUID) -> bool:
        run = self._runs.get(self._run_ticks.get(run_id, ("", self.clock())))
        return run is not None and run.status is RunStatus.RUNNING and self._orphaned(run)

    def resume(self, session: int, orphan: Orphan, runner: str) -> Claim:
        """As `fire_sql.RESUME`, with the claim's rule for a lock this session holds."""
        key = orphan.lock_key
        if orphan.locked and (self.lock_owner(key) is not None or not self.try_lock(session, key)):
            return Claim(ClaimOutcome.LOCKED)
        run = self._runs.get(self._run_ticks.get(orphan.run.id, ("", self.clock())))
        moved = (
            run is not None
            and run.status is RunStatus.RUNNING
            and self.backend(self._backends[run.id][0]) == orphan.backend
            and orphan.backend.pid not in self._sessions
            and run.id not in self._cancels
        )
        if run is None or not moved:
            if orphan.locked:
                self.unlock(session, key)
            return Claim(ClaimOutcome.ALREADY_RAN)
        self._backends[run.id] = (session, orphan.locked, key)
        self._orphaned_at.pop(run.id, None)
        resumed = self._write(
            run.model_copy(update={"runner": runner, "attempts": run.attempts + 1})
        )
        return Claim(ClaimOutcome.CLAIMED, resumed, orphan.locked)

    def note_attempt(self, run_id: UUID, job: Job, ended: AttemptEnd) -> NextAttempt:
        """Counts it, as `fire_sql.NOTE_ATTEMPT` does, with the job as stored; the
        attempts' times are not modelled (PostgreSQL's tests cover them)."""
        tick = self._run_ticks.get(run_id)
        run = self._runs.get(tick) if tick else None
        stored = self._jobs.get(job.name)
        attempt = ended.attempt + 1
        if run is None or run.status is not RunStatus.RUNNING:
            ended_elsewhere = f"cancelled: the run was ended elsewhere before attempt {attempt}"
            return NextAttempt(None, ended_elsewhere)
        if run_id in self._cancels:
            return NextAttempt(None, self._cancels[run_id].error())
        if stored is None or stored.incarnation != job.incarnation:
            return NextAttempt(None, f"cancelled: the job was deleted before attempt {attempt}")
        if stored.state is JobState.PAUSED and job.state is not JobState.PAUSED:
            return NextAttempt(None, f"cancelled: the job was paused before attempt {attempt}")
        self._write(run.model_copy(update={"attempts": attempt, "job_version": stored.version}))
        return NextAttempt(stored)

    # --- ends, skips, slots, jobs --------------------------------------------------

    def finish(
        self,
        run_id: UUID,
        end: RunEnd,
        *,
        keep_attempts: bool = False,
        backend: BackendId | None = None,
    ) -> Run | None:
        """Record a run's end if it is still running (on `backend`, if given);
        `keep_attempts`: as the row counts them, for an end nobody ran to."""
        tick = self._run_ticks.get(run_id)
        run = self._runs.get(tick) if tick else None
        if run is None or run.status is not RunStatus.RUNNING:
            return None
        if backend is not None and not backend.names(self.backend(self._backends[run_id][0])):
            return None
        # Two readings of the clock, as the statement takes them: the end, then the duration.
        finished_at = self.clock()
        duration_ms = _milliseconds(self.clock() - run.started_at)
        ended = {"status": end.status, "error": end.error, "result": end.result}
        attempts = run.attempts if keep_attempts else end.attempts
        timing = {"finished_at": finished_at, "duration_ms": duration_ms, "attempts": attempts}
        self._backends.pop(run_id, None)
        return self._write(run.model_copy(update={**ended, **timing}))

    def record_skips(self, skips: Sequence[Skip], runner: str) -> list[Run]:
        ordered = sorted(skips, key=lambda skip: (skip.job.name, skip.scheduled_for))
        return [run for skip in ordered if (run := self._record_skip(skip, runner))]

    def _record_skip(self, skip: Skip, runner: str) -> Run | None:
        job = self._jobs.get(skip.job.name)
        tick = (skip.job.name, _utc(skip.scheduled_for))
        if job is None or job.incarnation != skip.job.incarnation:
            return None
        if self._passed(job.name, tick[1], skip.trigger):
            return None
        # Only a skip worked out from the threshold as it stands knows where the cursor
        # goes next (RECORD_SKIPS).
        same_fence = skip.job.fire_after == job.fire_after
        if tick in self._runs:  # decided already: the cursor may pass it all the same
            if same_fence:
                self._advance(skip.job, tick[1], skip.trigger, opens=True)
            return None
        started = finished = skip.at or self.clock()
        run = self._write(
            Run(
                id=uuid4(),
                job=job.name,
                scheduled_for=tick[1],
                trigger=skip.trigger,
                status=RunStatus.SKIPPED,
                started_at=started,
                finished_at=finished,
                duration_ms=0,
                attempts=0,
                runner=runner,
                error=skip.note,
                result=None,
                skip_reason=skip.reason,
                missed_ticks=skip.missed_ticks,
            )
        )
        if same_fence:
            self._advance(skip.job, tick[1], skip.trigger, opens=True)
        return run

    def reserve_slot(self, job: str, tick: datetime, runner: str, expires_in: float) -> datetime:
        if job not in self._jobs:
            raise NoSuchJobError(f"no job named {job!r} to hold a slot for")
        # The statement reads the clock twice: for the new expiry, then to judge the old.
        expires_at = self.clock() + timedelta(seconds=expires_in)
        slot = self._waiting(job)
        if slot is None:
            slot = _Slot(_utc(tick), runner, expires_at)
            self._slots[job] = slot
        return slot.scheduled_for

    def release_slot(self, job: str, tick: datetime) -> None:
        slot = self._slots.get(job)
        if slot is not None and slot.scheduled_for == tick:
            del self._slots[job]

    def slot_tick(self, job: str) -> datetime | None:
        slot = self._waiting(job)
        return slot.scheduled_for if slot else None

    def cancels_asked(self, runner: str) -> list[CancelRequest]:
        running = (self._runs.get(tick) for tick in map(self._run_ticks.get, self._cancels) if tick)
        return [
            self._cancels[run.id]
            for run in running
            if run is not None and run.status is RunStatus.RUNNING and run.runner == runner
        ]

    def get_jobs(self, names: Sequence[str]) -> list[Job]:
        return [self._jobs[name] for name in dict.fromkeys(names) if name in self._jobs]

    def ticks_without_runs(self, ticks: Sequence[_Tick]) -> set[_Tick]:
        return {(job, tick) for job, tick in ticks if (job, _utc(tick)) not in self._runs}

    def split_missed(self, job: Job, ticks: Sequence[datetime]) -> bool:
        """As `backfill_sql.GAP_ROWS` then `SPLIT_GAPS`, in one step."""
        if not ticks:
            return True
        first, last = _utc(min(ticks)), _utc(max(ticks))
        rows = sorted(
            (run for (name, at), run in self._runs.items() if name == job.name and at >= first),
            key=lambda run: run.scheduled_for,
        )
        rows = [run for run in rows if not run.trigger.on_demand]
        read = [run for run in rows if run.scheduled_for <= last] + [
            run for run in rows if run.scheduled_for > last
        ][:1]
        outcomes = [Outcome(run.scheduled_for, run.missed_ticks) for run in read]
        for split in split_gaps(job, [_utc(tick) for tick in ticks], outcomes):
            self._split(job.name, split)
        return True

    def _split(self, job: str, split: GapSplit) -> None:
        gap = self._runs[(job, split.gap)]
        self._write(gap.model_copy(update={"missed_ticks": _count(split.keeps)}), replacing=gap)
        for tick, missed in split.parts:
            if (job, tick) not in self._runs:
                part = {"id": uuid4(), "scheduled_for": tick, "missed_ticks": _count(missed)}
                self._write(gap.model_copy(update=part))

    def update_jobs(self, updates: Mapping[str, JobUpdateFn]) -> None:
        now = self.clock()
        for name in sorted(updates):
            if (job := self._jobs.get(name)) is not None:
                self._write_job(updates[name](job, now))
                self._notify(name)


class MemoryListener(Listener):
    """A listener's connection: told of changes from the event loop, as NOTIFY comes
    after the commit; lost from the outside (`MemoryDatabase.lose_listeners`)."""

    def __init__(
        self,
        on_change: Callable[[str], None],
        on_lost: Callable[[], None],
        on_cancel: Callable[[], None],
        forget: Callable[["MemoryListener"], None],
    ) -> None:
        self._on_change = on_change
        self._on_lost = on_lost
        self._on_cancel = on_cancel
        self._forget = forget
        self._alive = True

    @property
    def alive(self) -> bool:
        return self._alive

    async def close(self) -> None:
        if self._alive:
            self._alive = False
            self._forget(self)

    def changed(self, name: str) -> None:
        asyncio.get_running_loop().call_soon(self._tell, self._on_change, name)

    def cancel_asked(self) -> None:
        asyncio.get_running_loop().call_soon(self._tell, self._on_cancel)

    def lose(self) -> None:
        if self._alive:
            self._alive = False
            self._forget(self)
            asyncio.get_running_loop().call_soon(self._on_lost)

    def _tell(self, callback: Callable[..., None], *args: str) -> None:
        if self._alive:  # a notification not yet delivered dies with its connection
            callback(*args)


class MemorySession(PinnedSession):
    """One pinned session: its id owns the locks it takes. Its calls take turns, as
    statements on one connection do."""

    def __init__(self, database: MemoryDatabase, session_id: int) -> None:
        self._database = database
        self.id = session_id
        self._closed = False
        self._listeners: list[Callable[[], None]] = []
        self._turn = asyncio.Lock()

    @property
    def pid(self) -> int:
        return self.id

    @property
    def backend(self) -> BackendId:
        return self._database.backend(self.id)

    @property
    def closed(self) -> bool:
        return self._closed

    def check_open(self) -> None:
        if self._closed:
            raise SessionClosedError(f"session {self.id} is closed")

    @contextmanager
    def fenced(self, on_lost: Callable[[], None]) -> Iterator[None]:
        if self._closed:
            on_lost()  # it died before the fence went up
        else:
            self._listeners.append(on_lost)
        try:
            yield
        finally:
            if on_lost in self._listeners:
                self._listeners.remove(on_lost)

    async def claim(self, ticks: Sequence[TickClaim]) -> list[Claim]:
        await _round_trip()
        async with self._turn:
            return await self._database.claim(self, ticks)

    async def finish(
        self, run_id: UUID, outcome: RunEnd, release_lock: int | None
    ) -> tuple[Run | None, bool]:
        await _round_trip()
        async with self._turn:
            if self._database.hooks.before_finishing is not None:
                await self._database.hooks.before_finishing([run_id])
            self.check_open()
            finished = self._database.finish(run_id, outcome)
            released = release_lock is not None and self._database.unlock(self.id, release_lock)
            return finished, released

    async def unlock(self, key: int) -> bool:
        await _round_trip()
        async with self._turn:
            self.check_open()
            return self._database.unlock(self.id, key)

    async def resume(self, orphans: Sequence[Orphan], runner: str) -> list[Claim]:
        check_orphans(orphans)
        await _round_trip()
        async with self._turn:
            self.check_open()
            return [self._database.resume(self.id, orphan, runner) for orphan in orphans]

    def try_lock(self, key: int) -> bool:
        """pg_try_advisory_lock on this session: what a foreign lock holder does."""
        self.check_open()
        return self._database.try_lock(self.id, key)

    def terminate(self) -> None:
        """Close the session, dropping its locks; the fences hear of it from the loop."""
        self._closed = True
        self._database.disconnected(self.id)
        listeners, self._listeners = self._listeners, []
        for listener in listeners:
            asyncio.get_running_loop().call_soon(listener)


class MemoryLockPool(LockPool):
    """One replica's lock pool: `size` long-lived sessions, shared by the blocks that
    hold them; one that closed is replaced while the database accepts connections."""

    def __init__(self, database: MemoryDatabase, size: int = 8) -> None:
        self._database = database
        self._sessions = [database.connect() for _ in range(size)]
        self._holders: Counter[int] = Counter()

    @property
    def size(self) -> int:
        return len(self._sessions)

    async def fill(self) -> None:
        await _round_trip()
        self._replace_closed()
        if any(session.closed for session in self._sessions):
            raise SessionClosedError("the database refuses new connections")

    @asynccontextmanager
    async def session(self, wait_seconds: float) -> AsyncIterator[MemorySession]:
        async with asyncio.timeout(wait_seconds):
            session = await self._least_held()
        self._holders[session.id] += 1
        try:
            yield session
        finally:
            self._holders[session.id] -= 1
            if not self._holders[session.id]:
                del self._holders[session.id]
                self._left(session)

    async def _least_held(self) -> MemorySession:
        await _round_trip()
        while True:
            self._replace_closed()
            open_ones = [session for session in self._sessions if not session.closed]
            if open_ones:
                return min(open_ones, key=lambda session: self._holders[session.id])
            await self._database.accepting.wait()

    def _replace_closed(self) -> None:
        for index, session in enumerate(self._sessions):
            if session.closed and self._database.accepting.is_set():
                self._sessions[index] = self._database.connect()

    def _left(self, session: MemorySession) -> None:
        # The real pool's safety net: no block holds the session, so a lock it still
        # holds belongs to no run.
        if not session.closed and self._database.locks_of(session.id):
            log.error("session %d was left holding a lock; closing it", session.id)
            session.terminate()


class MemoryLedger(Ledger):
    """One replica's calls over the API pool."""

    def __init__(self, database: MemoryDatabase) -> None:
        self._database = database

    async def record_skips(self, skips: Sequence[Skip], runner: str) -> list[Run]:
        await _round_trip()
        return self._database.record_skips(skips, runner)

    async def reserve_slot(
        self, job: str, tick: datetime, runner: str, expires_in_seconds: float
    ) -> datetime | None:
        await _round_trip()
        return self._database.reserve_slot(job, tick, runner, expires_in_seconds)

    async def release_slot(self, job: str, tick: datetime) -> None:
        await _round_trip()
        self._database.release_slot(job, tick)

    async def slot_tick(self, job: str) -> datetime | None:
        await _round_trip()
        return self._database.slot_tick(job)

    async def cancels_asked(self, runner: str) -> list[CancelRequest]:
        await _round_trip()
        return self._database.cancels_asked(runner)

    async def get_jobs(self, names: Sequence[str]) -> list[Job]:
        await _round_trip()
        return self._database.get_jobs(names)

    async def ticks_without_runs(self, ticks: Sequence[_Tick]) -> set[_Tick]:
        await _round_trip()
        return self._database.ticks_without_runs(ticks)

    async def split_missed(self, job: Job, ticks: Sequence[datetime]) -> bool:
        await _round_trip()
        return self._database.split_missed(job, ticks)

    async def finish_run(self, run_id: UUID, end: RunEnd, backend: BackendId) -> Run | None:
        await _round_trip()
        return self._database.finish(run_id, end, backend=backend)

    async def update_jobs(self, updates: Mapping[str, JobUpdateFn]) -> None:
        await _round_trip()
        self._database.update_jobs(updates)

    async def note_attempt(self, run: Run, job: Job, ended: AttemptEnd) -> NextAttempt:
        await _round_trip()
        return self._database.note_attempt(run.id, job, ended)

    async def orphans(self, most: int) -> list[Orphan]:
        await _round_trip()
        return self._database.orphans(most)

    async def abandon(self, orphans: Sequence[Orphan]) -> list[Run]:
        await _round_trip()
        return self._database.abandon(orphans)

    async def read_window(
        self,
        buckets: frozenset[int] | None,
        seconds: float,
        names: Sequence[str] | None = None,
        filed: Filed = lambda _: None,
    ) -> WindowRead:
        await _round_trip()
        return self._database.read_window(buckets, seconds, names, filed)


async def _round_trip() -> None:
    # A statement's round trip: other tasks run meanwhile, as they would over a socket.
    await asyncio.sleep(0)


def _check_batch(ticks: Sequence[TickClaim]) -> None:
    if len({tick.job.name for tick in ticks}) != len(ticks):
        raise ValueError("a claim takes at most one tick per job")
    if len(ticks) > 1 and any(tick.counted for tick in ticks):
        raise ValueError("a claim that counts runs goes alone")


# A cursor past the job's last tick ('infinity' in PostgreSQL).
_NO_TICK_LEFT = datetime.max.replace(tzinfo=UTC)


def _admits(tick: TickClaim, job: Job | None) -> bool:
    """The job is the tick's incarnation, its version unless any will do, and a run
    cap leaves room."""
    if job is None or job.incarnation != tick.job.incarnation:
        return False
    if not tick.any_version and (
        job.version != tick.job.version or job.state is not JobState.ACTIVE
    ):
        return False
    if _inactive(tick, job):
        return False
    return job.max_runs is None or job.runs_started < job.max_runs or tick.trigger.on_demand


def _inactive(tick: TickClaim, job: Job | None) -> bool:
    """A claim that runs only an active job found it paused or completed."""
    return tick.while_active and job is not None and job.state is not JobState.ACTIVE


def _capped(tick: TickClaim, job: Job | None) -> bool:
    if job is None or job.max_runs is None or tick.trigger.on_demand:
        return False
    return job.runs_started >= job.max_runs


def _busy(tick: TickClaim, runs: Iterable[Run]) -> bool:
    """Another run of the job, not a backfill, is in progress."""
    return any(
        run.job == tick.job.name
        and run.status is RunStatus.RUNNING
        and run.scheduled_for != tick.scheduled_for
        and run.trigger is not RunTrigger.BACKFILL
        for run in runs
    )


def _tick_of(tick: TickClaim) -> _Tick:
    return tick.job.name, _utc(tick.scheduled_for)


def _has_outcome(tick: TickClaim, ledger: Mapping[_Tick, Run]) -> bool:
    """The tick has a row that is its outcome; a skip is none to a backfill, which may
    claim it once it has the lock."""
    row = ledger.get(_tick_of(tick))
    backfill = tick.trigger is RunTrigger.BACKFILL
    return row is not None and not (backfill and row.status is RunStatus.SKIPPED)


def _as_filed(job: Job, filed: Filed) -> Job:
    """The job as a window filed it, if at the revision stored: read no further."""
    kept = filed(job.name)
    return kept if kept is not None and kept.revision == job.revision else job


def _as_read(cursor: datetime) -> datetime:
    """A cursor as asyncpg reads it: 'infinity' as a naive datetime.max."""
    return datetime.max if cursor == _NO_TICK_LEFT else cursor


def _count(missed: int) -> int | None:
    """A row's `missed_ticks`: none for the tick's own alone."""
    return missed if missed > 1 else None


def _utc(moment: datetime) -> datetime:
    # timestamptz comes back in UTC whatever zone it went in with.
    return moment.astimezone(UTC)


def _milliseconds(elapsed: timedelta) -> int:
    """round(extract(epoch FROM elapsed) * 1000): halves away from zero."""
    micros = Decimal(elapsed // timedelta(microseconds=1))
    return int((micros / 1000).quantize(Decimal(1), rounding=ROUND_HALF_UP))
