"""The fire path of one replica: lock gate, ledger gate, run, record, unlock."""

import asyncio
import logging
import random
import time
from collections import Counter, deque
from collections.abc import Callable, Coroutine, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from uuid import uuid4

import httpx

from service.domain.errors import Conflict, NotFound
from service.domain.jobs import Job, Overlap, finish_run, policy_finishes
from service.domain.runs import Run, RunStatus, RunTrigger
from service.metrics import Metrics
from service.scheduler.attempts import Attempts, Outcome, Progress, run_context
from service.scheduler.clock import ReplicaClock
from service.scheduler.shielding import run_to_completion
from service.store import Store
from service.store.coalesce import Coalescer
from service.store.errors import is_unavailable
from service.store.sessions import (
    Claim,
    ClaimOutcome,
    RunEnd,
    RunSession,
    RunSessions,
    TickClaim,
)
from service.tasks import SqlTargets, TaskRegistry

log = logging.getLogger(__name__)

UNLOCK_TIMEOUT_SECONDS = 5.0
# How often a waiting tick (queue_one, backfill) retries the lock; it holds no
# connection between tries.
LOCK_POLL_SECONDS = 0.25
# A run whose own connection died records its end through the API pool; while the
# database is away it retries this long, then leaves the row to the orphan sweep.
RECORD_ELSEWHERE_SECONDS = 20.0
_RECORD_BACKOFF_SECONDS = (0.25, 2.0)
LOCK_LOST = "lock lost: the connection holding the job's lock closed"
# Most ticks claimed in one statement. Their runs share its connection until the
# last one ends, so a batch also bounds what one slow run keeps pinned.
CLAIM_BATCH = 200
ROOM_GATHER_SECONDS = 0.005
JOB_END_LINGER_SECONDS = 0.02
ClaimCallback = Callable[[Claim], None]


@dataclass(frozen=True)
class Gated:
    """How one pass through the gates ended, and the finished run if it ran here."""

    outcome: ClaimOutcome
    run: Run | None = None


class Runner:
    """Runs ticks through both gates. One per replica; the API's manual trigger and
    backfill, and the scheduler mirror, all come through here."""

    def __init__(
        self,
        *,
        sessions: RunSessions,
        store: Store,
        tasks: TaskRegistry,
        http: httpx.AsyncClient,
        sql: SqlTargets,
        runner_id: str,
        metrics: Metrics,
        fire_delay: timedelta = timedelta(0),
        clock: ReplicaClock | None = None,
        max_in_flight: int = 32,
    ) -> None:
        self._sessions = sessions
        self._store = store
        self._attempts = Attempts(tasks, http, sql)
        self._runner_id = runner_id
        self._fire_delay = fire_delay
        self._clock = clock or ReplicaClock()
        self._metrics = metrics
        self._tasks_in_flight: set[asyncio.Task[None]] = set()
        self._runs_by_job: Counter[str] = Counter()
        # Scheduled ticks due now: `_arrived` since the last dispatch, in the order
        # APScheduler produced them; `_waiting` for room under `max_in_flight`.
        self._arrived: list[TickClaim] = []
        self._waiting: deque[TickClaim] = deque()
        self._room = max_in_flight
        self._dispatch_planned = False
        # Runs that may complete their job (once, max_runs, end_at) record it together.
        self._job_ends = Coalescer(self._finish_jobs, lambda: JOB_END_LINGER_SECONDS)
        self.accepting = True

    @property
    def runs_in_flight(self) -> int:
        return self._runs_by_job.total()

    def fire(self, job: Job, scheduled_for: datetime, trigger: RunTrigger) -> None:
        """Start the scheduled fire of one tick in the background. Never raises.

        Ticks that fall due at the same moment (one wake-up of APScheduler) are claimed
        together, in batches: one statement and one connection per batch instead of
        per tick. Each replica claims them in its own random order, so when the
        replicas race for a crowd of ticks, each wins a share of them."""
        if self._hold_back_seconds(job, scheduled_for) > 0:
            self._spawn(self._fire_later(job, scheduled_for, trigger))
        else:
            self._arrive(job, scheduled_for, trigger)

    async def trigger_now(self, job: Job) -> Run:
        """A manual run through the same gates; returns once the ledger row exists and
        leaves the run going. Conflict if a "skip" job is running anywhere."""
        decided: asyncio.Future[Claim] = asyncio.get_running_loop().create_future()
        tick = self._tick(job, self._clock.now(), RunTrigger.MANUAL, any_version=True)
        task = self._spawn(self._discard(self._gated(tick, decided.set_result)))
        either: set[asyncio.Future[Any]] = {decided, task}
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        if not decided.done():
            task.result()  # the gate failed before deciding: raise its error
            raise Conflict(f"job {job.name!r} could not be started")
        return _claimed_run(job, decided.result())

    async def backfill(self, job: Job, ticks: Sequence[datetime]) -> list[Run]:
        """Run each tick that has no run yet, in order, one after another; return the
        runs this call made. Another replica backfilling the same range at once takes
        some ticks itself: the ledger lets each through exactly once."""
        made = []
        for tick in ticks:
            claim = self._tick(job, tick, RunTrigger.BACKFILL, any_version=True)
            gated = await self._gated_when_free(claim, deadline=float("inf"))
            if gated.outcome is ClaimOutcome.JOB_GONE:
                raise NotFound(f"no job named {job.name!r}")
            if gated.run is not None:
                made.append(gated.run)
        return made

    async def shutdown(self, grace_seconds: float) -> None:
        """Start nothing new; give runs in flight `grace_seconds`, then cancel them.
        A cancelled run still records `cancelled` and unlocks before its task ends."""
        self.accepting = False
        pending = set(self._tasks_in_flight)
        if pending:
            log.info("waiting up to %ss for %d runs in flight", grace_seconds, len(pending))
            _, pending = await asyncio.wait(pending, timeout=grace_seconds)
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)

    def _spawn(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.create_task(work)
        self._tasks_in_flight.add(task)
        task.add_done_callback(self._tasks_in_flight.discard)
        return task

    async def _discard(self, work: Coroutine[Any, Any, Gated]) -> None:
        await work

    async def _fire_later(self, job: Job, scheduled_for: datetime, trigger: RunTrigger) -> None:
        await asyncio.sleep(self._hold_back_seconds(job, scheduled_for))
        self._arrive(job, scheduled_for, trigger)

    def _hold_back_seconds(self, job: Job, scheduled_for: datetime) -> float:
        """Jitter spreads a job's fires the same way on every replica; the test-only
        delay makes this replica late on purpose. Due is by this replica's clock."""
        due = scheduled_for + timedelta(seconds=job.jitter_seconds_for(scheduled_for))
        wait = max(0.0, (due - self._clock.now()).total_seconds())
        return wait + self._fire_delay.total_seconds()

    def _arrive(self, job: Job, scheduled_for: datetime, trigger: RunTrigger) -> None:
        if self.accepting and not self._misfired(job, scheduled_for):
            self._arrived.append(self._tick(job, scheduled_for, trigger))
            self._plan_dispatch()

    def _plan_dispatch(self, after: float = 0.0) -> None:
        # Dispatch once the current wake-up has handed over every tick due in it.
        if not self._dispatch_planned:
            self._dispatch_planned = True
            asyncio.get_running_loop().call_later(after, self._dispatch)

    def _dispatch(self) -> None:
        """Claim waiting ticks while this replica has room for their runs; the rest
        wait for room (other replicas, with room, take them meanwhile)."""
        self._dispatch_planned = False
        random.shuffle(self._arrived)
        self._waiting.extend(self._arrived)
        self._arrived = []
        while self._waiting and self._room > 0 and self.accepting:
            batch = self._next_batch(min(self._room, CLAIM_BATCH))
            self._room -= len(batch)
            if len(batch) == 1 and batch[0].job.max_runs is not None:
                self._spawn(self._fire_alone(batch[0]))
            elif batch:
                self._spawn(self._fire_together(batch))

    def _next_batch(self, size: int) -> list[TickClaim]:
        """Up to `size` waiting ticks still in grace, one per job. A job with a run cap
        goes alone: its claim counts the run against the cap."""
        batch: list[TickClaim] = []
        names: set[str] = set()
        while self._waiting and len(batch) < size:
            tick = self._waiting[0]
            counted = tick.job.max_runs is not None
            if tick.job.name in names or (counted and batch):
                break
            self._waiting.popleft()
            if not self._misfired(tick.job, tick.scheduled_for):
                batch.append(tick)
                names.add(tick.job.name)
                if counted:
                    break
        return batch

    def _room_freed(self) -> None:
        self._room += 1
        if self._waiting:
            # Runs end one by one; a moment's wait lets the room of several gather,
            # so waiting ticks are claimed in batches rather than one at a time.
            self._plan_dispatch(after=ROOM_GATHER_SECONDS)

    async def _fire_alone(self, tick: TickClaim) -> None:
        try:
            with _failures_logged(tick):
                self._queue_if_locked(tick, await self._gated(tick, self._skip_counter(tick.job)))
        finally:
            self._room_freed()

    async def _fire_together(self, ticks: list[TickClaim]) -> None:
        claims: list[Claim] = []
        try:
            async with self._sessions.session() as session:
                claims = await session.claim_together(ticks)
                pairs = zip(ticks, claims, strict=True)
                await asyncio.gather(*(self._settle_together(session, *pair) for pair in pairs))
        except Exception as error:  # noqa: BLE001 - logged with its traceback
            # One broken claim must never take the scheduler down with it.
            _log_failure(f"{len(ticks)} ticks due together", error)
        finally:
            if not claims:  # once claimed, each tick's settling frees its own room
                for _ in ticks:
                    self._room_freed()

    async def _settle_together(self, session: RunSession, tick: TickClaim, claim: Claim) -> None:
        try:
            with _failures_logged(tick):
                gated = await self._settle(session, tick, claim, self._skip_counter(tick.job))
                self._queue_if_locked(tick, gated)
        finally:
            self._room_freed()

    def _queue_if_locked(self, tick: TickClaim, gated: Gated) -> None:
        queued = tick.job.overlap is Overlap.QUEUE_ONE and self.accepting
        if gated.outcome is ClaimOutcome.LOCKED and queued:
            self._spawn(self._queued(tick))

    async def _queued(self, tick: TickClaim) -> None:
        with _failures_logged(tick):
            await self._queue(tick.job, tick)

    def _misfired(self, job: Job, scheduled_for: datetime) -> bool:
        due = scheduled_for + timedelta(seconds=job.jitter_seconds_for(scheduled_for))
        lateness = self._clock.now() - due
        if lateness <= timedelta(seconds=job.misfire_grace_seconds):
            return False
        self._metrics.ticks_skipped.labels("misfire").inc()
        log.warning(
            "dropped tick %s of %s: %.1fs late, grace is %ss",
            scheduled_for.isoformat(),
            job.name,
            lateness.total_seconds(),
            job.misfire_grace_seconds,
        )
        return True

    async def _queue(self, job: Job, tick: TickClaim) -> None:
        """queue_one: this tick waits for the run in progress, unless another already
        does (then it is dropped). The wait holds no connection: it polls the lock."""
        longest = job.retry.worst_case_seconds(job.timeout_seconds) + job.misfire_grace_seconds
        name, at = job.name, tick.scheduled_for
        if not await self._store.reserve_pending(name, at, self._runner_id, longest):
            self._metrics.ticks_skipped.labels("overlap").inc()
            return
        try:
            await self._gated_when_free(tick, deadline=time.monotonic() + longest)
        finally:
            await run_to_completion(self._store.release_pending(name, at))

    async def _gated_when_free(self, tick: TickClaim, deadline: float) -> Gated:
        """Pass the gates, retrying while another session holds the job's lock."""
        while True:
            gated = await self._gated(tick, self._skip_counter(tick.job, quiet_lock=True))
            given_up = time.monotonic() > deadline or not self.accepting
            if gated.outcome is not ClaimOutcome.LOCKED or given_up:
                return gated
            await asyncio.sleep(LOCK_POLL_SECONDS)

    def _tick(
        self, job: Job, scheduled_for: datetime, trigger: RunTrigger, *, any_version: bool = False
    ) -> TickClaim:
        lock = job.overlap is not Overlap.ALLOW
        return TickClaim(job, scheduled_for, trigger, self._runner_id, uuid4(), lock, any_version)

    async def _gated(self, tick: TickClaim, on_claim: ClaimCallback) -> Gated:
        """Lock gate, then ledger gate, then the run, all on one pinned connection."""
        if not self.accepting:
            return Gated(ClaimOutcome.LOCKED)
        async with self._sessions.session() as session:
            return await self._settle(session, tick, await session.claim(tick), on_claim)

    async def _settle(
        self, session: RunSession, tick: TickClaim, claim: Claim, on_claim: ClaimCallback
    ) -> Gated:
        """Run a claimed tick; whatever happens, release the job's lock if still held."""
        pinned = Pinned(session, LockHold(tick.job.lock_key, claim.holds_lock))
        try:
            on_claim(claim)
            if claim.run is None:
                return Gated(claim.outcome)
            return Gated(claim.outcome, await self._run(pinned, tick.job, claim.run))
        finally:
            if pinned.hold.held:
                await run_to_completion(self._unlock(session, pinned.hold))

    async def _unlock(self, session: RunSession, hold: "LockHold") -> None:
        """Release the job's lock, or kill the session: a connection must never go
        back to the pool still holding an advisory lock."""
        hold.held = False
        try:
            async with asyncio.timeout(UNLOCK_TIMEOUT_SECONDS):
                if await session.unlock(hold.key):
                    return
            log.error("advisory lock %d was not held at unlock; closing the session", hold.key)
        except Exception:
            log.exception("unlock of advisory lock %d failed; closing the session", hold.key)
        session.terminate()

    async def _run(self, pinned: "Pinned", job: Job, run: Run) -> Run | None:
        if run.trigger is not RunTrigger.MANUAL:
            lag = run.started_at - run.scheduled_for
            self._metrics.fire_lag.observe(max(0.0, lag.total_seconds()))
        self._runs_by_job[job.name] += 1
        self._metrics.runs_in_flight.inc()
        progress = Progress()
        attempts = asyncio.create_task(self._attempts.run(job, run, progress))
        fence = LockFence(run, attempts)
        try:
            # The lock-lost fence: if the session holding the job's lock dies mid-run,
            # the lock is gone and another replica may start the next tick, so this
            # run must stop at once rather than overlap it.
            with pinned.session.fenced(fence.trip) if pinned.hold.held else nullcontext():
                outcome = await attempts
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if not fence.tripped or (current is not None and current.cancelling()):
                cancelled = Outcome(RunStatus.CANCELLED, "cancelled: the replica shut down")
                await run_to_completion(self._record(pinned, job, run, cancelled, progress))
                raise
            outcome = Outcome(RunStatus.CANCELLED, LOCK_LOST)  # only the attempts stopped
        finally:
            self._runs_by_job -= Counter({job.name: 1})
            self._metrics.runs_in_flight.dec()
        return await run_to_completion(self._record(pinned, job, run, outcome, progress))

    async def _record(
        self, pinned: "Pinned", job: Job, run: Run, outcome: Outcome, progress: Progress
    ) -> Run | None:
        end = RunEnd(outcome.status, outcome.error, outcome.result, max(1, progress.attempts))
        finished = await self._finish(pinned, run, end)
        self._metrics.runs.labels(job.name, outcome.status.value).inc()
        if outcome.status is RunStatus.SUCCEEDED and finished and finished.finished_at:
            self._metrics.last_success.labels(job.name).set(finished.finished_at.timestamp())
        log.info("run %s: %s", outcome.status.value, outcome.error or "ok", extra=run_context(run))
        if policy_finishes(job) and run.trigger is not RunTrigger.MANUAL:
            await self._job_ends.submit((job.name, run.scheduled_for))
        return finished

    async def _finish_jobs(self, ends: Sequence[tuple[str, datetime]]) -> list[None]:
        """Complete the jobs these runs finished (a one-time job's tick, the last run
        a cap allows, the window's end), all in one transaction. Whether a window has
        closed is judged on the database's clock."""
        ticks: dict[str, list[datetime]] = {}
        for name, tick in ends:
            ticks.setdefault(name, []).append(tick)
        await self._store.update_jobs({name: _finishing(ts) for name, ts in ticks.items()})
        return [None] * len(ends)

    async def _finish(self, pinned: "Pinned", run: Run, end: RunEnd) -> Run | None:
        """Record the run's end and release the lock in one statement on the pinned
        connection; if that connection is gone, record through the API pool."""
        session, hold = pinned.session, pinned.hold
        if not session.closed:
            try:
                finished, released = await session.finish(
                    run.id, end, hold.key if hold.held else None
                )
            except Exception as error:
                if not (is_unavailable(error) and session.closed):
                    raise
            else:
                hold.held = hold.held and not released
                return finished
        # The session died, and its lock with it: there is nothing to unlock, and a
        # dead connection is never unlocked on. Terminating it only tidies up.
        hold.held = False
        session.terminate()
        return await self._finish_elsewhere(run, end)

    async def _finish_elsewhere(self, run: Run, end: RunEnd) -> Run | None:
        """Record the end of a run whose own connection died, through the API pool,
        retrying while the database is away (a restart). If it stays away longer than
        RECORD_ELSEWHERE_SECONDS the row is left `running`: the orphan sweep marks it
        `abandoned` once no session holds the job's lock and its backend is gone."""
        deadline = time.monotonic() + RECORD_ELSEWHERE_SECONDS
        backoff, most = _RECORD_BACKOFF_SECONDS
        while True:
            try:
                return await self._store.finish_run(run.id, end)
            except Exception as error:
                if not is_unavailable(error):
                    raise
                if time.monotonic() + backoff > deadline:
                    log.warning(
                        "run %s not recorded (%r); the orphan sweep will mark it abandoned",
                        end.status.value,
                        error,
                        extra=run_context(run),
                    )
                    return None
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, most)

    def _skip_counter(self, job: Job, *, quiet_lock: bool = False) -> ClaimCallback:
        def count(claim: Claim) -> None:
            if claim.outcome is ClaimOutcome.CLAIMED:
                return
            if claim.outcome is ClaimOutcome.LOCKED and quiet_lock:
                return  # a waiting tick polls the lock; each try is no skip
            reason = claim.outcome.value
            if claim.outcome is ClaimOutcome.LOCKED and self._runs_by_job[job.name]:
                reason = "overlap"  # our own run of this job still holds the lock
            self._metrics.ticks_skipped.labels(reason).inc()
            # Expected on every replica but one, for every tick: DEBUG, not WARNING.
            log.debug("tick of %s skipped: %s", job.name, reason)

        return count


class LockFence:
    """Trips when the run's session dies: the run's attempts are cancelled."""

    def __init__(self, run: Run, attempts: "asyncio.Task[Outcome]") -> None:
        self._run = run
        self._attempts = attempts
        self.tripped = False

    def trip(self) -> None:
        if not self._attempts.done():
            self.tripped = True
            log.warning("%s; cancelling the run", LOCK_LOST, extra=run_context(self._run))
            self._attempts.cancel()


@dataclass
class LockHold:
    """Whether this session still holds the job's advisory lock."""

    key: int
    held: bool = False


@dataclass(frozen=True)
class Pinned:
    """The connection a run is pinned to, and the lock it holds there."""

    session: RunSession
    hold: LockHold


@contextmanager
def _failures_logged(tick: TickClaim) -> Iterator[None]:
    try:
        yield
    except Exception as error:  # noqa: BLE001 - logged with its traceback
        # One broken tick must never take the scheduler down with it.
        _log_failure(f"tick {tick.job.name} at {tick.scheduled_for.isoformat()}", error)


def _log_failure(what: str, error: Exception) -> None:
    if is_unavailable(error):
        log.warning("%s not run: database unavailable (%r)", what, error)
    else:
        log.exception("%s failed", what, exc_info=error)


def _finishing(ticks: list[datetime]) -> Callable[[Job, datetime], Job]:
    def change(current: Job, now: datetime) -> Job:
        for tick in ticks:
            current = finish_run(current, tick, now)
        return current

    return change


def _claimed_run(job: Job, claim: Claim) -> Run:
    if claim.run is not None:
        return claim.run
    if claim.outcome is ClaimOutcome.JOB_GONE:
        raise NotFound(f"no job named {job.name!r}")
    raise Conflict(f"job {job.name!r} is running somewhere; overlap is '{job.overlap.value}'")
