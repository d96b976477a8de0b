"""The fire path of one replica, as one loop: gather due ticks, admit, claim, run, record.

- gather: the window hands over each due tick (`fire`); jitter holds it back on a timer.
- admit: `Admission` gives ticks room in arrival order, one per job per batch, and
  lets one claim per lock session be in flight; ticks past their deadline (due +
  misfire grace) leave it as recorded misfires.
- claim: a batch passes the gate (job lock + ledger row) in one statement on one of
  the replica's few long-lived lock sessions, the one fewest batches use.
- run: claimed ticks run bound to that session, which holds their locks alongside
  those of many other runs (`RunExecutor`).
- record: every tick ends in one ledger row, its run or a skip with its reason. A tick
  the gate could not settle goes round again until it has a row or its deadline
  passes: LOCKED (someone holds the lock, nobody else runs the job: ask again), BUSY
  for a moment (an earlier run may be just ending), STALE (judged again against the
  job as it stands now).

Correctness rests on the lock and the ledger alone: batching, room and retries only
save work, and a replica that gets them wrong costs time, never a tick.
"""

import asyncio
import logging
import random
import time
from collections.abc import Callable, Coroutine, Iterable, Iterator, Sequence
from contextlib import AsyncExitStack, contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID, uuid4

import httpx
from pydantic import JsonValue

from service.domain.cursors import OwedTick
from service.domain.errors import Conflict, NotFound
from service.domain.hooks import HookPlan
from service.domain.jobs import Job, JobState, Overlap
from service.domain.runs import CancelRequest, Run, RunTrigger, SkipReason
from service.metrics import Metrics
from service.scheduler.admission import Admission
from service.scheduler.attempts import Attempts
from service.scheduler.backoff import Backoff
from service.scheduler.clock import ReplicaClock
from service.scheduler.running import RECORD_ELSEWHERE_SECONDS, RunExecutor
from service.scheduler.shielding import run_to_completion
from service.store.coalesce import Coalescer
from service.store.errors import is_unavailable
from service.store.ports import (
    Claim,
    ClaimOutcome,
    Following,
    Ledger,
    LockPool,
    NextTick,
    Orphan,
    PinnedSession,
    Skip,
    TickClaim,
)
from service.tasks import SqlTargets, TaskRegistry
from service.tracing import Claimed, NoTracing, Tracing, now_ns

log = logging.getLogger(__name__)

# Most ticks claimed in one statement. A claim holds its session's turn (ends on it
# wait) and the locks of its ticks for the statement's length; with one claim in
# flight per session, sessions x CLAIM_BATCH ticks are in claims at once.
CLAIM_BATCH = 200
# How soon a tick the gate could not settle asks again. It holds no connection
# meanwhile; a LOCKED tick usually finds its row on the first retry (another replica
# was claiming it).
RETRY_SECONDS = 0.1
# A BUSY tick waits this long (within its grace) before the overlap policy judges it:
# an earlier run may have returned and be just recording its end.
OVERLAP_PATIENCE = timedelta(seconds=0.5)
# How long a claim waits for an open lock session (only while sessions are being
# replaced: the database went away) before it gives up; the ticks go round again.
ACQUIRE_SECONDS = 5.0
# Manual runs and backfills claim outside the room, on lock sessions of their own, so
# the schedule never delays them and they never take a scheduled claim's turn; the
# same wait there ends in a TimeoutError (503).
SIDE_SESSIONS = 1
# Orphans one resume statement takes over at most.
RESUME_BATCH = 200
SIDE_WAIT_SECONDS = 10.0
# A backfill tick waits this long for the job's lock, then the backfill stops.
BACKFILL_WAIT_SECONDS = 30.0
# How often a backfill reads the runs of missed ticks it splits again, when another
# backfill changed them meanwhile, before it gives up (409).
SPLIT_ATTEMPTS = 3
# Ticks waiting for room here, at most. The window hands over no more while this many
# wait (the rest stay filed there, in its bounded heap, until room frees or their
# deadline passes); ticks that arrive from elsewhere past it (retries, takeovers) are
# let go, undecided, rather than queued without bound: the audit hands them over again.
WAITING_LIMIT = 20_000
SKIP_LINGER_SECONDS = 0.01
# A replica that lost a run's session (not its life) records the run's end itself, trying
# for RECORD_ELSEWHERE_SECONDS; the orphan sweep leaves the run to it this long.
ORPHAN_GRACE_SECONDS = RECORD_ELSEWHERE_SECONDS + 5.0
# How long an orphan whose runner is not a member now is given for it to come back as one
# (a PostgreSQL restart ends every member's session too); a dead replica never does.
REJOIN_GRACE_SECONDS = 5.0
# Skips whose record waits for the database to come back, at most (a bound on memory
# through a long outage; what is past it is logged).
UNRECORDED_SKIPS = 100_000
_RETRY_AFTER_FAILURE_SECONDS = 0.5
_HELD_BY_NO_RUN = "the job's lock stayed held by a session that ran no tick of it"
_CONTENDED = "the job's rows stayed held by other statements (edits, skips, the audit)"


@dataclass(frozen=True)
class DueTick:
    """A scheduled tick on its way through the loop. `deadline` (this replica's clock)
    is when it becomes a misfire; `queued` ticks hold their queue_one job's slot."""

    claim: TickClaim
    deadline: datetime
    patience_until: datetime
    queued: bool = False
    # When a claim last found another run of the job in progress (the database's clock).
    busy_at: datetime | None = None
    # When the window handed it over (wall clock, ns): its trace starts there.
    handed_over: int = field(default_factory=now_ns)

    @property
    def job(self) -> Job:
        return self.claim.job

    @property
    def job_name(self) -> str:
        return self.claim.job.name

    @property
    def scheduled_for(self) -> datetime:
        return self.claim.scheduled_for

    @property
    def alone(self) -> bool:
        return self.claim.counted


class Runner:
    """Runs ticks through the gate. One per replica: the window's scheduled ticks, and
    the API's manual triggers and backfills, all come through here."""

    def __init__(
        self,
        *,
        sessions: LockPool,
        side_sessions: LockPool,
        store: Ledger,
        tasks: TaskRegistry,
        http: httpx.AsyncClient,
        sql: SqlTargets,
        runner_id: str,
        metrics: Metrics,
        fire_delay: timedelta = timedelta(0),
        record_delay: timedelta = timedelta(0),
        clock: ReplicaClock | None = None,
        room: int = 32,
        takeover_seconds: float = 3.0,
        waiting_limit: int = WAITING_LIMIT,
        tracing: Tracing | None = None,
        hooks: HookPlan | None = None,
    ) -> None:
        self._sessions = sessions
        self._side_sessions = side_sessions
        self._store = store
        self._runner_id = runner_id
        self._fire_delay = fire_delay
        self._clock = clock or ReplicaClock()
        self._metrics = metrics
        self._tracing = tracing or NoTracing()
        self._executor = RunExecutor(
            runner_id=runner_id,
            store=store,
            attempts=Attempts(tasks, http, sql, self._tracing),
            metrics=metrics,
            record_delay=record_delay,
            tracing=self._tracing,
            hooks=hooks,
        )
        self._admission: Admission[DueTick] = Admission(
            room, claims=sessions.size, limit=waiting_limit
        )
        self._waiting_limit = waiting_limit
        self._skips = Coalescer(self._record_skips, lambda: SKIP_LINGER_SECONDS)
        self._tasks_in_flight: set[asyncio.Task[None]] = set()
        # Ticks arrived since the last dispatch.
        self._arrived: list[DueTick] = []
        self._dispatch_planned = False
        self._takeover = timedelta(seconds=takeover_seconds)
        self.takeover_seconds = takeover_seconds
        # How often the orphan sweep runs: twice per takeover period.
        self.orphan_sweep_seconds = takeover_seconds / 2
        self._room = room
        self._resuming: set[UUID] = set()  # orphans being resumed here
        self._unrecorded_skips = 0  # skips waiting for the database to come back
        self.accepting = True

    def job_deleted(self, name: str) -> None:
        """The job is gone from the database: forget what this replica knew of it."""
        self._executor.forget_job(name)

    def owns(self, buckets: frozenset[int] | None) -> None:
        """This replica reads and fires `buckets` now (None: all): forget, after a while,
        what it keeps of the jobs of other buckets (their metric series)."""
        self._metrics.forget_unowned(buckets)

    def remembers(self, name: str) -> bool:
        """Whether this replica keeps something of the job (its metric series) that its
        deletion must take away, though the job is not in a bucket it reads."""
        return self._metrics.counts(name)

    @property
    def runs_in_flight(self) -> int:
        return self._executor.in_flight

    @property
    def behind(self) -> bool:
        """The tick that has waited longest here fell due more than half a takeover
        period ago: this replica has its own ticks to catch up with, and takes over no
        other's (overload is not spread by moving it around)."""
        oldest = self._admission.oldest
        if oldest is None:
            return False
        return oldest.job.due(oldest.scheduled_for) + self._takeover / 2 < self._clock.now()

    @property
    def full(self) -> bool:
        """As many ticks wait for room here as may: hand over no more for now."""
        return len(self._admission) + len(self._arrived) >= self._waiting_limit

    @property
    def runner_id(self) -> str:
        return self._runner_id

    @property
    def metrics(self) -> Metrics:
        return self._metrics

    # --- gather -------------------------------------------------------------------

    def fire(
        self,
        job: Job,
        scheduled_for: datetime,
        trigger: RunTrigger,
        *,
        following: NextTick = Following.UNKNOWN,
    ) -> None:
        """Hand over one due tick of `job`; it is claimed once it is due here. Never
        raises. Ticks that fall due together are claimed together, in batches, in this
        replica's own random order, so racing replicas each win a share."""
        tick = self._due_tick(job, scheduled_for, trigger, following)
        wait = self._hold_back_seconds(job, scheduled_for)
        if wait > 0:
            asyncio.get_running_loop().call_later(wait, self._arrive, tick)
        else:
            self._arrive(tick)

    def _due_tick(
        self, job: Job, scheduled_for: datetime, trigger: RunTrigger, following: NextTick
    ) -> DueTick:
        deadline = job.deadline(scheduled_for)
        patience = min(job.due(scheduled_for) + OVERLAP_PATIENCE, deadline)
        claim = replace(self._claim_of(job, scheduled_for, trigger), following=following)
        return DueTick(claim, deadline, patience)

    def _hold_back_seconds(self, job: Job, scheduled_for: datetime) -> float:
        """Jitter spreads a job's fires the same way on every replica; the test-only
        delay makes this replica late on purpose. Due is by this replica's clock."""
        wait = (job.due(scheduled_for) - self._clock.now()).total_seconds()
        return max(0.0, wait) + self._fire_delay.total_seconds()

    def take_over(self, job: Job, owed: OwedTick) -> None:
        """Claim a tick its owner left (the audit found its cursor lagging). A run of
        the job in progress then most likely means the owner is alive, only late (a
        stall, a clock behind this replica's), and will claim this tick itself once
        that run ends: the overlap policy judges a BUSY tick only after the takeover
        time again. A queue_one tick whose waiter is gone (`owed.waits_seconds`) waits
        here in its place, in its slot, for as long as the slot has left."""
        tick = self._due_tick(job, owed.tick, RunTrigger.SCHEDULE, owed.following)
        now = self._clock.now()
        if owed.waits_seconds is not None:
            deadline = now + timedelta(seconds=owed.waits_seconds)
            self._arrive(replace(tick, queued=True, deadline=deadline))
            return
        patience = now + max(OVERLAP_PATIENCE, self._takeover)
        self._arrive(replace(tick, patience_until=min(patience, tick.deadline)))

    def _arrive(self, tick: DueTick) -> None:
        if not self.accepting:
            # Another replica takes it; this one is stopping. A tick waiting under
            # queue_one keeps its slot: the audit of a live replica waits in its place.
            if not tick.queued:
                self._settled(tick)
            return
        self._arrived.append(tick)
        self._plan_dispatch()

    def _plan_dispatch(self) -> None:
        # Dispatch once the current wake-up has handed over every tick due in it (and
        # every run ending in it has freed its room).
        if not self._dispatch_planned:
            self._dispatch_planned = True
            asyncio.get_running_loop().call_soon(self._dispatch)

    # --- admit --------------------------------------------------------------------

    def _dispatch(self) -> None:
        """Admit the arrivals, drop what waited past its deadline, and claim batches
        while there is room and a claim may go out; the rest waits (other replicas,
        with room, race for it) and goes in the next batch, whole, as soon as a claim
        answers or runs end."""
        self._dispatch_planned = False
        random.shuffle(self._arrived)
        arrived, self._arrived = self._arrived, []
        self._let_go(self._admission.offer(arrived))
        self._misfire(self._admission.expired(self._clock.now()), "no room in time")
        while self.accepting and (batch := self._admission.take(CLAIM_BATCH)):
            self._spawn(self._claim_and_run(batch))

    def _room_freed(self, count: int = 1) -> None:
        self._admission.free(count)
        if len(self._admission):
            self._plan_dispatch()

    def _claim_ended(self) -> None:
        self._admission.claim_ended()
        if len(self._admission):
            self._plan_dispatch()

    # --- claim --------------------------------------------------------------------

    async def _claim_and_run(self, batch: list[DueTick]) -> None:
        """Claim a batch on one lock session, and run what it won there: the session
        holds their locks, and is held for them until the last has ended."""
        async with AsyncExitStack() as holding:
            runs = await self._claim(batch, holding)
            await asyncio.gather(*runs)

    async def _claim(
        self, batch: list[DueTick], holding: AsyncExitStack
    ) -> list[Coroutine[Any, Any, None]]:
        """Pass the batch through the gate on a session `holding` keeps; the runs it
        won, to start. The claim is no longer in flight once its statement answered."""
        undecided = batch
        try:
            session = await holding.enter_async_context(self._sessions.session(ACQUIRE_SECONDS))
            undecided = self._in_time(batch)
            sent = now_ns()
            claims = await session.claim([t.claim for t in undecided]) if undecided else []
            decided, undecided = undecided, []
            answered = now_ns()
            runs = [
                self._settle(session, t, c, Claimed(t.handed_over, sent, answered, len(decided)))
                for t, c in zip(decided, claims, strict=True)
            ]
            return [run for run in runs if run is not None]
        except Exception as error:  # noqa: BLE001 - logged; the ticks go round again
            # A failed claim decided nothing: no tick of it may be lost to it.
            _log_failure(f"claim of {len(undecided)} ticks", error)
            self._again(undecided, _RETRY_AFTER_FAILURE_SECONDS, "its claims kept failing")
            return []
        finally:
            if undecided:
                self._room_freed(len(undecided))
            self._claim_ended()

    def _in_time(self, batch: list[DueTick]) -> list[DueTick]:
        """The ticks of `batch` still before their deadline, after the wait for an
        open session; the others are misfires."""
        now = self._clock.now()
        late = [tick for tick in batch if tick.deadline < now]
        if late:
            self._misfire(late, "no connection in time")
            self._room_freed(len(late))
        return [tick for tick in batch if tick.deadline >= now]

    def _settle(
        self, session: PinnedSession, tick: DueTick, claim: Claim, claimed: Claimed
    ) -> Coroutine[Any, Any, None] | None:
        """What the gate's answer means for the tick: a run, an outcome, or another round."""
        if claim.outcome is ClaimOutcome.CLAIMED:
            self._settled(tick)
            return self._run_claimed(session, tick.job, claim, claimed)
        self._room_freed()
        if claim.outcome is ClaimOutcome.LOCKED:
            self._again([tick], RETRY_SECONDS, _HELD_BY_NO_RUN)
        elif claim.outcome is ClaimOutcome.CONTENDED:
            self._again([tick], RETRY_SECONDS, _CONTENDED)
        elif claim.outcome is ClaimOutcome.BUSY:
            self._overlapped(replace(tick, busy_at=claim.seen_at))
        elif claim.outcome is ClaimOutcome.STALE:
            self._spawn(self._judge_again(tick))
        elif claim.outcome is ClaimOutcome.CAPPED:
            self._skip([tick], SkipReason.CAPPED, "the job had used up its max_runs")
        else:  # ALREADY_RAN, JOB_GONE: the tick has its outcome, or no job has it
            self._settled(tick)
        return None

    def _again(self, ticks: Iterable[DueTick], after: float, why: str) -> None:
        """Send ticks round the loop again after `after` seconds, within their deadline;
        `why` a tick past it never ran."""
        now = self._clock.now()
        for tick in ticks:
            if tick.deadline < now:
                self._misfire([tick], why)
            else:
                asyncio.get_running_loop().call_later(after, self._arrive, tick)

    def _overlapped(self, tick: DueTick) -> None:
        """Another run of the job is in progress: after a moment's patience, the
        overlap policy decides. Whoever sees that records the skip, once."""
        if tick.queued or self._clock.now() < tick.patience_until:
            self._again([tick], RETRY_SECONDS, "an earlier run was still in progress")
        elif tick.job.overlap is Overlap.QUEUE_ONE:
            self._spawn(self._queue(tick))
        else:
            self._skip([tick], SkipReason.OVERLAP, "an earlier run was still in progress")

    async def _queue(self, tick: DueTick) -> None:
        """queue_one: this tick waits for the run in progress, unless another tick
        already does (then it is skipped). Waiting holds no connection."""
        job = tick.job
        longest = job.retry.worst_case_seconds(job.timeout_seconds) + job.misfire_grace_seconds
        with self._round_again_on_failure(tick, "queue_one slot"):
            held = await self._store.reserve_pending(
                job.name, tick.scheduled_for, self._runner_id, longest
            )
            if held is None or held == tick.scheduled_for:
                deadline = self._clock.now() + timedelta(seconds=longest)
                queued = replace(tick, queued=True, deadline=deadline)
                self._again([queued], RETRY_SECONDS, "the run it waited for outlasted its wait")
            else:
                self._skip([tick], SkipReason.OVERLAP, "another tick already waited for the run")

    async def _judge_again(self, tick: DueTick) -> None:
        """The job changed since the tick was scheduled: a tick the job, as it stands
        now, still has goes round again with that definition; any other is no tick."""
        with self._round_again_on_failure(tick, "reading the changed job"):
            jobs = await self._store.get_jobs([tick.job_name])
            current = jobs[0] if jobs else None
            if current is not None and current.is_tick(tick.scheduled_for):
                claim = replace(tick.claim, job=current, following=Following.UNKNOWN)
                again = replace(tick, claim=claim)
                self._again([again], 0.0, "the job kept changing")
            else:
                self._settled(tick)

    @contextmanager
    def _round_again_on_failure(self, tick: DueTick, what: str) -> Iterator[None]:
        try:
            yield
        except Exception as error:  # noqa: BLE001 - logged; the tick goes round again
            _log_failure(f"{what} for {tick.job_name}", error)
            self._again([tick], _RETRY_AFTER_FAILURE_SECONDS, f"{what} kept failing")

    # --- run ----------------------------------------------------------------------

    async def _run_claimed(
        self, session: PinnedSession, job: Job, claim: Claim, claimed: Claimed
    ) -> None:
        try:
            await self._executor.run(session, job, claim, claimed=claimed)
        except Exception as error:  # noqa: BLE001 - logged with its traceback
            # One broken run must never take the scheduler down with it.
            _log_failure(f"run of {job.name}", error)
        finally:
            self._room_freed()

    # --- record -------------------------------------------------------------------

    def _settled(self, tick: DueTick) -> None:
        """The tick has its outcome here, or needs none."""
        if tick.queued:
            self._spawn(self._release_slot(tick))

    async def _release_slot(self, tick: DueTick) -> None:
        await run_to_completion(self._store.release_pending(tick.job_name, tick.scheduled_for))

    def _let_go(self, ticks: Sequence[DueTick]) -> None:
        """Ticks beyond the waiting limit: the window holds back while the runner is
        full, but retries and takeovers arrive anyway. They are left undecided, not
        recorded: each is at or past its job's cursor, so the audit hands it over again
        (to a replica with room, maybe this one later) or records it a misfire once it
        is past its reach; a replica merely full never decides a tick's outcome."""
        if ticks:
            log.warning("%d ticks left for the audit to hand over: no room here", len(ticks))
            for tick in ticks:
                self._settled(tick)

    def _misfire(self, ticks: Sequence[DueTick], why: str) -> None:
        if ticks:
            self._skip(ticks, SkipReason.MISFIRE, f"not started within its misfire grace: {why}")

    def _skip(self, ticks: Sequence[DueTick], reason: SkipReason, note: str) -> None:
        for tick in ticks:
            self._settled(tick)
        # An overlap skip's row says when the claim saw the run it gave way to, not when
        # the row is written: by then (a crowd, a slow database) that run may have ended.
        overlap = reason is SkipReason.OVERLAP
        skips = [
            Skip(
                t.job,
                t.scheduled_for,
                t.claim.trigger,
                reason,
                note,
                following=t.claim.following,
                at=t.busy_at if overlap else None,
            )
            for t in ticks
        ]
        self._spawn(self._submit_skips(skips))

    async def _submit_skips(self, skips: list[Skip]) -> None:
        """Record the skips, again and again while the database is away (an outage is
        when misfires pile up): the ledger's uniqueness makes a repeat harmless, and a
        tick settled here has no other way to its row. At most UNRECORDED_SKIPS wait
        for the database at once; past that, and on any other error, they are logged."""
        backoff = Backoff()
        while True:
            try:
                await asyncio.gather(*(self._skips.submit(skip) for skip in skips))
                return
            except Exception as error:  # noqa: BLE001 - retried while the database is away
                if not self._may_retry_skips(skips, error):
                    _log_failure(f"record of {len(skips)} skipped ticks", error)
                    return
            self._unrecorded_skips += len(skips)
            try:
                await backoff.pause()
            finally:
                self._unrecorded_skips -= len(skips)

    def _may_retry_skips(self, skips: list[Skip], error: Exception) -> bool:
        fits = self._unrecorded_skips + len(skips) <= UNRECORDED_SKIPS
        return is_unavailable(error) and self.accepting and fits

    async def _record_skips(self, skips: Sequence[Skip]) -> list[None]:
        await self._recorded_skips(skips)
        return [None] * len(skips)

    async def _recorded_skips(self, skips: Sequence[Skip]) -> list[Run]:
        """Record the skips; those recorded now (a tick with a row already records none)."""
        jobs = {skip.job.name: skip.job for skip in skips}
        recorded = await self._store.record_skips(skips, self._runner_id)
        for run in recorded:
            reason = run.skip_reason or SkipReason.MISFIRE
            self._metrics.ticks_skipped.labels(reason.value).inc()
            self._tracing.skipped(run)
            # A misfire is a tick nobody could run; the others are the job's policies.
            level = logging.WARNING if reason is SkipReason.MISFIRE else logging.INFO
            at = run.scheduled_for.isoformat()
            log.log(level, "tick %s of %s skipped: %s (%s)", at, run.job, reason, run.error)
        await asyncio.gather(
            *(self._executor.tick_ended(jobs[run.job], run.scheduled_for) for run in recorded)
        )
        return recorded

    # --- cancels ------------------------------------------------------------------

    def cancel_asked(self) -> None:
        """A cancel was asked of some run (NOTIFY): look whether it runs here, now."""
        self._executor.cancels.asked()

    async def cancel_queued(self, job: Job, request: CancelRequest) -> Run | None:
        """Drop the tick waiting under queue_one: it is recorded skipped, `cancelled`,
        and its slot freed. None if no tick waits, or it was claimed meanwhile (its
        run is then the one to cancel). The replica that holds it finds its row."""
        tick = await self._store.pending_tick(job.name)
        if tick is None:
            return None
        note = request.error()
        skip = Skip(job, tick, RunTrigger.SCHEDULE, SkipReason.CANCELLED, note)
        recorded = await self._recorded_skips([skip])
        await self._store.release_pending(job.name, tick)
        return recorded[0] if recorded else None

    # --- manual runs and backfills ------------------------------------------------

    async def trigger_now(
        self,
        job: Job,
        args: dict[str, JsonValue] | None = None,
        note: str | None = None,
        trigger: RunTrigger = RunTrigger.MANUAL,
    ) -> Run:
        """A manual run (or a hook's `chain` run) through the same gate, with `args`
        instead of the job's if given (checked already) and the caller's `note`, both kept
        on its row; returns once the row exists and leaves the run going. Conflict if a
        "skip" job is running anywhere."""
        assert trigger.on_demand, "a tick's run is claimed by the loop, not asked for"
        decided: asyncio.Future[Claim] = asyncio.get_running_loop().create_future()
        now = self._clock.now()
        tick = self._claim_of(job, now, trigger, any_version=True)
        tick = replace(tick, args=args, note=note)
        task = self._spawn(self._discard(self._on_the_side(tick, decided.set_result)))
        either: set[asyncio.Future[Any]] = {decided, task}
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        if not decided.done():
            task.result()  # the gate failed before deciding: raise its error
            raise Conflict(f"job {job.name!r} could not be started")
        return _claimed_run(job, decided.result())

    async def backfill(self, job: Job, ticks: Sequence[datetime]) -> list[Run]:
        """Run each tick that has no run yet, in order, one after another; return the
        runs this call made. Scheduled ticks of the job go first. A job active when it
        began that is paused or completed meanwhile stops it (Conflict): the gate claims
        no tick for it after that. Another replica backfilling the same range at once
        takes some ticks itself: the ledger lets each through exactly once."""
        made = []
        while_active = job.state is JobState.ACTIVE  # a pause meanwhile stops the rest
        await self._split_missed(job, ticks)
        for at in ticks:
            tick = self._claim_of(job, at, RunTrigger.BACKFILL, any_version=True)
            run = await self._backfill_one(replace(tick, while_active=while_active))
            if run is not None:
                made.append(run)
        return made

    async def _split_missed(self, job: Job, ticks: Sequence[datetime]) -> None:
        """Give each tick a misfire row counts among its run of missed ticks a row of its
        own first, so it keeps exactly one outcome whether or not the backfill gets to
        it. Another backfill splitting the same run at once makes this one read again."""
        for _ in range(SPLIT_ATTEMPTS):
            if await self._store.split_missed(job, ticks):
                return
        raise Conflict(f"backfill of {job.name!r}: its missed ticks kept changing; try again")

    async def _backfill_one(self, tick: TickClaim) -> Run | None:
        """Claim and run one backfill tick, giving way to the job's scheduled ticks and
        waiting a bounded time for its lock."""
        deadline = time.monotonic() + BACKFILL_WAIT_SECONDS
        while True:
            await self._give_way(tick.job, deadline)
            claims: list[Claim] = []
            run = await self._on_the_side(tick, claims.append)
            if claims[0].outcome is ClaimOutcome.JOB_GONE:
                raise NotFound(f"no job named {tick.job.name!r}")
            if claims[0].outcome is ClaimOutcome.INACTIVE:
                raise Conflict(
                    f"backfill of {tick.job.name!r} stopped at {tick.scheduled_for.isoformat()}:"
                    " the job was paused or completed meanwhile; the ticks before it ran"
                )
            if claims[0].outcome not in {
                ClaimOutcome.LOCKED,
                ClaimOutcome.CONTENDED,
                ClaimOutcome.BUSY,
            }:
                return run
            if time.monotonic() > deadline or not self.accepting:
                raise Conflict(
                    f"backfill of {tick.job.name!r} stopped at {tick.scheduled_for.isoformat()}:"
                    f" the job's lock stayed held for {BACKFILL_WAIT_SECONDS:g}s"
                )
            await asyncio.sleep(RETRY_SECONDS)

    async def _give_way(self, job: Job, deadline: float) -> None:
        """Wait, until `deadline`, while the job has a scheduled tick due now and still
        without a ledger row: the scheduler is claiming it, and goes first. The ledger
        says so wherever the scheduler runs (backfills run in the API's process, or on
        another replica), so it is polled, like the lock."""
        while time.monotonic() < deadline and await self._scheduled_tick_waits(job):  # noqa: ASYNC110
            await asyncio.sleep(RETRY_SECONDS)

    async def _scheduled_tick_waits(self, job: Job) -> bool:
        now = self._clock.now()
        tick = job.tick_in_grace(now)
        if tick is None or not job.is_tick(tick) or job.due(tick) > now:
            return False
        return bool(await self._store.ticks_without_runs([(job.name, tick)]))

    async def _claimed_on_the_side(self, session: PinnedSession, tick: TickClaim) -> Claim:
        """The gate's answer, asked again while another statement holds the job's rows
        (a moment, as a claim would have waited for them), for up to SIDE_WAIT_SECONDS."""
        deadline = time.monotonic() + SIDE_WAIT_SECONDS
        [claim] = await session.claim([tick])
        while claim.outcome is ClaimOutcome.CONTENDED and time.monotonic() < deadline:
            await asyncio.sleep(RETRY_SECONDS)
            [claim] = await session.claim([tick])
        return claim

    async def _on_the_side(self, tick: TickClaim, on_claim: Callable[[Claim], None]) -> Run | None:
        """Claim one tick on a side session, outside the room, and run it if claimed;
        `on_claim` hears the claim as soon as there is one."""
        if not self.accepting:
            on_claim(Claim(ClaimOutcome.LOCKED))
            return None
        async with self._side_sessions.session(SIDE_WAIT_SECONDS) as session:
            sent = now_ns()
            claim = await self._claimed_on_the_side(session, tick)
            claimed = Claimed(sent, sent, now_ns(), 1)
            on_claim(claim)
            if claim.run is None:
                return None
            # The job as the claim read it: an edit since the caller read it applies.
            job = claim.stored_job or tick.job
            return await self._executor.run(session, job, claim, claimed=claimed)

    async def _discard(self, work: Coroutine[Any, Any, object]) -> None:
        await work

    # --- orphans ------------------------------------------------------------------

    async def sweep_orphans(self) -> float | None:
        """Runs whose replica died: each whose retry policy allows another attempt gets
        it here, the same run (id, Idempotency-Key) moved to this replica; the others
        end `abandoned`. A run whose runner is alive (it lost only the run's session) is
        left to it for ORPHAN_GRACE_SECONDS, and one whose runner is not a member now
        for REJOIN_GRACE_SECONDS (see `Orphan.awaits_its_replica`). Replicas sweep at
        once and each takes a share, the row's compare-and-set deciding; at most `_room`
        resumed runs go at a time here, and the rest wait for the next sweep. Returns
        in how many seconds the first orphan left to its replica may be taken (None:
        none is), for the next sweep to come no later."""
        room = self._room - len(self._resuming)
        found = await self._store.orphans(max(room, 1) * 4)
        graces = (REJOIN_GRACE_SECONDS, ORPHAN_GRACE_SECONDS)
        left = [orphan.grace_left(*graces) for orphan in found]
        orphans = [orphan for orphan, grace in zip(found, left, strict=True) if grace < 0]
        waiting = [grace for grace in left if grace >= 0]
        now = self._clock.now()
        for run in await self._store.abandon([o for o in orphans if not o.resumable(now)]):
            log.warning("run %s of %s abandoned by runner %s", run.id, run.job, run.runner)
        resumable = [o for o in orphans if o.resumable(now) and o.run.id not in self._resuming]
        random.shuffle(resumable)  # racing replicas each win a share, not the same ones
        if self.accepting:
            for batch in _resume_batches(resumable[: max(room, 0)]):
                self._resuming.update(orphan.run.id for orphan in batch)
                self._spawn(self._resume(batch, now))
        return min(waiting, default=None)

    async def _resume(self, batch: list[Orphan], now: datetime) -> None:
        """Take the orphans' runs over on a lock session, in one statement, and make their
        next attempts there; one another replica took first, or that ended meanwhile, is
        left alone. (A crash mid-crowd leaves a thousand orphans: a statement each kept
        the last of them waiting for seconds.)"""
        try:
            async with self._sessions.session(SIDE_WAIT_SECONDS) as session:
                claims = await session.resume(batch, self._runner_id)
                answers = list(zip(batch, claims, strict=True))
                resumed = [(orphan, claim) for orphan, claim in answers if claim.run is not None]
                # Those not taken here may be found again by the next sweep.
                self._resuming.difference_update(o.run.id for o, c in answers if c.run is None)
                await asyncio.gather(*(self._resumed(session, o, c, now) for o, c in resumed))
        except Exception as error:  # noqa: BLE001 - logged; the next sweep finds them again
            _log_failure(f"taking over {len(batch)} orphaned runs", error)
        finally:
            self._resuming.difference_update(orphan.run.id for orphan in batch)

    async def _resumed(
        self, session: PinnedSession, orphan: Orphan, claim: Claim, now: datetime
    ) -> None:
        """Make the next attempts of an orphan's run this session took over."""
        assert claim.run is not None
        log.warning(
            "run %s resumed here at attempt %d: runner %s stopped mid-run",
            claim.run.id,
            claim.run.attempts,
            orphan.run.runner,
            extra={"job": orphan.run.job},
        )
        try:
            spent = (now - orphan.run.started_at).total_seconds()
            await self._executor.run(session, orphan.job, claim, spent)
        except Exception as error:  # noqa: BLE001 - logged; the batch's other runs go on
            _log_failure(f"resumed run {orphan.run.id}", error)
        finally:
            self._resuming.discard(orphan.run.id)

    # --- shared -------------------------------------------------------------------

    def _claim_of(
        self, job: Job, scheduled_for: datetime, trigger: RunTrigger, *, any_version: bool = False
    ) -> TickClaim:
        lock = job.overlap is not Overlap.ALLOW
        return TickClaim(job, scheduled_for, trigger, self._runner_id, uuid4(), lock, any_version)

    def _spawn(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.create_task(work)
        self._tasks_in_flight.add(task)
        task.add_done_callback(self._tasks_in_flight.discard)
        return task

    async def shutdown(self, grace_seconds: float) -> None:
        """Start nothing new; give runs in flight `grace_seconds`, then cancel them.
        A cancelled run still records `cancelled` and unlocks before its task ends.
        Ticks still waiting here are left to the other replicas."""
        self.accepting = False
        pending = set(self._tasks_in_flight)
        if pending:
            log.info("waiting up to %ss for %d runs in flight", grace_seconds, len(pending))
            _, pending = await asyncio.wait(pending, timeout=grace_seconds)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)
        await self._executor.cancels.close()


def _log_failure(what: str, error: Exception) -> None:
    if is_unavailable(error):
        log.warning("%s failed: database unavailable (%r)", what, error)
    else:
        log.exception("%s failed", what, exc_info=error)


def _resume_batches(orphans: list[Orphan]) -> Iterator[list[Orphan]]:
    """The orphans in batches of at most RESUME_BATCH, one orphan per lock key each
    (a session's locks are re-entrant: a key taken twice in one statement would let
    two runs of a job through)."""
    while orphans:
        batch: list[Orphan] = []
        keys: set[int] = set()
        rest = []
        for orphan in orphans:
            if len(batch) == RESUME_BATCH or (orphan.locked and orphan.lock_key in keys):
                rest.append(orphan)
                continue
            batch.append(orphan)
            if orphan.locked:
                keys.add(orphan.lock_key)
        yield batch
        orphans = rest


def _claimed_run(job: Job, claim: Claim) -> Run:
    if claim.run is not None:
        return claim.run
    if claim.outcome is ClaimOutcome.JOB_GONE:
        raise NotFound(f"no job named {job.name!r}")
    if claim.outcome is ClaimOutcome.CONTENDED:
        raise Conflict(f"job {job.name!r} could not be started: {_CONTENDED}")
    raise Conflict(f"job {job.name!r} is running somewhere; overlap is '{job.overlap.value}'")
