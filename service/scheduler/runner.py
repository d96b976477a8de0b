"""The fire path of one replica, as one loop: gather due ticks, admit, claim, run, record.

- gather: the window fires each due tick (`fire`); jitter holds it back on a timer.
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
from collections.abc import Coroutine, Iterable, Sequence
from contextlib import AsyncExitStack
from dataclasses import replace
from datetime import datetime, timedelta
from typing import Any

import httpx

from service.domain.cursors import OwedTick
from service.domain.hooks import HookPlan
from service.domain.jobs import Job
from service.domain.runs import RunTrigger, SkipReason
from service.metrics import Metrics
from service.scheduler.admission import Admission
from service.scheduler.attempts import Attempts
from service.scheduler.background import Background, log_failure
from service.scheduler.clock import ReplicaClock
from service.scheduler.due import RETRY_AFTER_FAILURE_SECONDS, RETRY_SECONDS, DueTick
from service.scheduler.judging import Judge
from service.scheduler.on_demand import CONTENDED, OnDemand
from service.scheduler.orphans import Orphans
from service.scheduler.running import RunExecutor
from service.scheduler.skips import Skips
from service.store.ports import (
    Claim,
    ClaimOutcome,
    Following,
    Ledger,
    LockPool,
    NextTick,
    PinnedSession,
    TickClaim,
)
from service.tasks import SqlTargets, TaskRegistry
from service.tracing import GateTimes, NoTracing, Tracing, now_ns

log = logging.getLogger(__name__)

# Most ticks claimed in one statement. A claim holds its session's turn (ends on it
# wait) and the locks of its ticks for the statement's length; with one claim in
# flight per session, sessions x CLAIM_BATCH ticks are in claims at once.
CLAIM_BATCH = 200
# How long a claim waits for an open lock session (only while sessions are being
# replaced: the database went away) before it gives up; the ticks go round again.
ACQUIRE_SECONDS = 5.0
# Ticks waiting for room here, at most. The window fires no more while this many
# wait (the rest stay filed there, in its bounded heap, until room frees or their
# deadline passes); ticks that arrive from elsewhere past it (retries, takeovers) are
# let go, undecided, rather than queued without bound: the audit hands them over again.
WAITING_LIMIT = 20_000
_HELD_BY_NO_RUN = "the job's lock stayed held by a session that ran no tick of it"


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
        self.runner_id = runner_id
        self._fire_delay = fire_delay
        self._clock = clock or ReplicaClock()
        self.metrics = metrics
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
        self._judge = Judge(self, store, self._clock, runner_id)
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
        """As many ticks wait for room here as may: fire no more for now."""
        return len(self._admission) + len(self._arrived) >= self._waiting_limit

    # --- gather -------------------------------------------------------------------

    def fire(
        self,
        job: Job,
        scheduled_for: datetime,
        trigger: RunTrigger,
        *,
        following: NextTick = Following.UNKNOWN,
    ) -> None:
        """Fire one due tick of `job`; it is claimed once it is due here. Never
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
        claim = TickClaim.of(job, scheduled_for, trigger, self.runner_id)
        return DueTick.of(replace(claim, following=following))

    def _hold_back_seconds(self, job: Job, scheduled_for: datetime) -> float:
        """Jitter spreads a job's fires the same way on every replica; the test-only
        delay makes this replica late on purpose. Due is by this replica's clock."""
        wait = (job.due(scheduled_for) - self._clock.now()).total_seconds()
        return max(0.0, wait) + self._fire_delay.total_seconds()

    def take_over(self, job: Job, owed: OwedTick) -> None:
        """Claim a tick its owner left (the audit found its cursor lagging), with the
        patience or the slot `DueTick.taken_over` gives it."""
        tick = self._due_tick(job, owed.tick, RunTrigger.SCHEDULE, owed.following)
        self._arrive(tick.taken_over(owed, self._clock.now(), self._takeover))

    def _arrive(self, tick: DueTick) -> None:
        if not self.accepting:
            # Another replica takes it; this one is stopping. A tick waiting under
            # queue_one keeps its slot: the audit of a live replica waits in its place.
            if not tick.queued:
                self._judge.settled(tick)
            return
        self._arrived.append(tick)
        self._plan_dispatch()

    def _plan_dispatch(self) -> None:
        # Dispatch once the current wake-up has fired every tick due in it (and
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
            self.spawn(self._claim_and_run(batch))

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
                self._settle(session, t, c, GateTimes(t.fired, sent, answered, len(decided)))
                for t, c in zip(decided, claims, strict=True)
            ]
            return [run for run in runs if run is not None]
        except Exception as error:  # noqa: BLE001 - logged; the ticks go round again
            # A failed claim decided nothing: no tick of it may be lost to it.
            log_failure(f"claim of {len(undecided)} ticks", error)
            self.again(undecided, RETRY_AFTER_FAILURE_SECONDS, "its claims kept failing")
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
        self, session: PinnedSession, tick: DueTick, claim: Claim, claimed: GateTimes
    ) -> Coroutine[Any, Any, None] | None:
        """What the gate's answer means for the tick: a run, an outcome, or another round."""
        if claim.outcome is ClaimOutcome.CLAIMED:
            self._judge.settled(tick)
            return self._run_claimed(session, tick.job, claim, claimed)
        self._room_freed()
        if claim.outcome is ClaimOutcome.LOCKED:
            self.again([tick], RETRY_SECONDS, _HELD_BY_NO_RUN)
        elif claim.outcome is ClaimOutcome.CONTENDED:
            self.again([tick], RETRY_SECONDS, CONTENDED)
        elif claim.outcome is ClaimOutcome.BUSY:
            self._judge.busy(replace(tick, busy_at=claim.seen_at))
        elif claim.outcome is ClaimOutcome.STALE:
            self._judge.stale(tick)
        elif claim.outcome is ClaimOutcome.CAPPED:
            self.skip([tick], SkipReason.CAPPED, "the job had used up its max_runs")
        else:  # ALREADY_RAN, JOB_GONE: the tick has its outcome, or no job has it
            self._judge.settled(tick)
        return None

    def again(self, ticks: Iterable[DueTick], after: float, why: str) -> None:
        """Send ticks round the loop again after `after` seconds, within their deadline;
        `why` a tick past it never ran."""
        now = self._clock.now()
        for tick in ticks:
            if tick.deadline < now:
                self._misfire([tick], why)
            else:
                asyncio.get_running_loop().call_later(after, self._arrive, tick)

    # --- run ----------------------------------------------------------------------

    async def _run_claimed(
        self, session: PinnedSession, job: Job, claim: Claim, claimed: GateTimes
    ) -> None:
        try:
            await self._executor.run(session, job, claim, claimed=claimed)
        except Exception as error:  # noqa: BLE001 - logged with its traceback
            # One broken run must never take the scheduler down with it.
            log_failure(f"run of {job.name}", error)
        finally:
            self._room_freed()

    # --- record -------------------------------------------------------------------

    def _let_go(self, ticks: Sequence[DueTick]) -> None:
        """Ticks beyond the waiting limit: the window holds back while the runner is
        full, but retries and takeovers arrive anyway. They are left undecided, not
        recorded: each is at or past its job's cursor, so the audit hands it over again
        (to a replica with room, maybe this one later) or records it a misfire once it
        is past its reach; a replica merely full never decides a tick's outcome."""
        if ticks:
            log.warning("%d ticks left for the audit to take over: no room here", len(ticks))
            for tick in ticks:
                self._judge.settled(tick)

    def _misfire(self, ticks: Sequence[DueTick], why: str) -> None:
        if ticks:
            self.skip(ticks, SkipReason.MISFIRE, f"not started within its misfire grace: {why}")

    def skip(self, ticks: Sequence[DueTick], reason: SkipReason, note: str) -> None:
        for tick in ticks:
            self._judge.settled(tick)
        self._skips.submit([tick.skip(reason, note) for tick in ticks])

    # --- cancels ------------------------------------------------------------------

    def cancel_asked(self) -> None:
        """A cancel was asked of some run (NOTIFY): look whether it runs here, now."""
        self._executor.cancels.asked()

    # --- shared -------------------------------------------------------------------

    def spawn(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        return self._background.spawn(work)

    async def shutdown(self, grace_seconds: float) -> None:
        """Start nothing new; give runs in flight `grace_seconds`, then cancel them.
        A cancelled run still records `cancelled` and unlocks before its task ends.
        Ticks still waiting here are left to the other replicas."""
        await self._background.land(grace_seconds)
        await self._executor.cancels.close()
