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
from collections.abc import Coroutine, Iterable, Iterator, Sequence
from contextlib import AsyncExitStack, contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any

import httpx

from service.domain.cursors import OwedTick
from service.domain.hooks import HookPlan
from service.domain.jobs import Job, Overlap
from service.domain.runs import RunTrigger, SkipReason
from service.metrics import Metrics
from service.scheduler.admission import Admission
from service.scheduler.attempts import Attempts
from service.scheduler.background import Background, log_failure
from service.scheduler.clock import ReplicaClock
from service.scheduler.on_demand import CONTENDED, OnDemand
from service.scheduler.orphans import Orphans
from service.scheduler.running import RunExecutor
from service.scheduler.shielding import run_to_completion
from service.scheduler.skips import Skips
from service.store.ports import (
    Claim,
    ClaimOutcome,
    Following,
    Ledger,
    LockPool,
    NextTick,
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
# Ticks waiting for room here, at most. The window hands over no more while this many
# wait (the rest stay filed there, in its bounded heap, until room frees or their
# deadline passes); ticks that arrive from elsewhere past it (retries, takeovers) are
# let go, undecided, rather than queued without bound: the audit hands them over again.
WAITING_LIMIT = 20_000
_RETRY_AFTER_FAILURE_SECONDS = 0.5
_HELD_BY_NO_RUN = "the job's lock stayed held by a session that ran no tick of it"


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
        self._background = Background()
        self._skips = Skips(
            store=store,
            runner_id=runner_id,
            executor=self._executor,
            metrics=metrics,
            tracing=self._tracing,
            background=self._background,
        )
        # Ticks arrived since the last dispatch.
        self._arrived: list[DueTick] = []
        self._dispatch_planned = False
        self._takeover = timedelta(seconds=takeover_seconds)
        self.takeover_seconds = takeover_seconds
        self.on_demand = OnDemand(
            skips=self._skips,
            side_sessions=side_sessions,
            store=store,
            executor=self._executor,
            clock=self._clock,
            runner_id=runner_id,
            background=self._background,
        )
        self.orphans = Orphans(
            sessions=sessions,
            store=store,
            executor=self._executor,
            clock=self._clock,
            runner_id=runner_id,
            room=room,
            takeover_seconds=takeover_seconds,
            background=self._background,
        )

    @property
    def accepting(self) -> bool:
        """False once a shutdown began: nothing new is claimed or started here."""
        return self._background.accepting

    @accepting.setter
    def accepting(self, accepting: bool) -> None:
        self._background.accepting = accepting

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
            log_failure(f"claim of {len(undecided)} ticks", error)
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
            self._again([tick], RETRY_SECONDS, CONTENDED)
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
            log_failure(f"{what} for {tick.job_name}", error)
            self._again([tick], _RETRY_AFTER_FAILURE_SECONDS, f"{what} kept failing")

    # --- run ----------------------------------------------------------------------

    async def _run_claimed(
        self, session: PinnedSession, job: Job, claim: Claim, claimed: Claimed
    ) -> None:
        try:
            await self._executor.run(session, job, claim, claimed=claimed)
        except Exception as error:  # noqa: BLE001 - logged with its traceback
            # One broken run must never take the scheduler down with it.
            log_failure(f"run of {job.name}", error)
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
        self._skips.submit(skips)

    # --- cancels ------------------------------------------------------------------

    def cancel_asked(self) -> None:
        """A cancel was asked of some run (NOTIFY): look whether it runs here, now."""
        self._executor.cancels.asked()

    # --- shared -------------------------------------------------------------------

    def _claim_of(self, job: Job, scheduled_for: datetime, trigger: RunTrigger) -> TickClaim:
        return TickClaim.of(job, scheduled_for, trigger, self._runner_id)

    def _spawn(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        return self._background.spawn(work)

    async def shutdown(self, grace_seconds: float) -> None:
        """Start nothing new; give runs in flight `grace_seconds`, then cancel them.
        A cancelled run still records `cancelled` and unlocks before its task ends.
        Ticks still waiting here are left to the other replicas."""
        await self._background.land(grace_seconds)
        await self._executor.cancels.close()
