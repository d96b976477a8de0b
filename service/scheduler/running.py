"""Run a claimed tick bound to the lock session that claimed it, then record its end.

The session holds the job's advisory lock for the whole run (and the locks of many
other runs with it). The end record, then the unlock, go on it in one turn; if it
died meanwhile (the lock with it), the run is fenced (cancelled at once) and its end is
recorded through the API pool.
"""

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from datetime import datetime, timedelta
from uuid import UUID

from service.domain.hooks import HookPlan, events_of_end
from service.domain.jobs import Job, finish_run, policy_finishes
from service.domain.runs import (
    AttemptEnd,
    CancelRequest,
    Run,
    RunStatus,
    storable_json,
    storable_text,
)
from service.metrics import Metrics
from service.scheduler.attempts import Attempts, Outcome, Progress, run_context
from service.scheduler.cancels import Cancels
from service.shielding import run_to_completion
from service.store.coalesce import Coalescer
from service.store.errors import is_unavailable
from service.store.ports import BackendId, Claim, Ledger, NextAttempt, PinnedSession, RunEnd
from service.tracing import GateTimes, NoTracing, Tracing

log = logging.getLogger(__name__)

UNLOCK_TIMEOUT_SECONDS = 5.0
# A run whose own connection died records its end through the API pool; while the
# database is away it retries this long, then leaves the row to the orphan sweep.
RECORD_ELSEWHERE_SECONDS = 20.0
_RECORD_BACKOFF_SECONDS = (0.25, 2.0)
LOCK_LOST = "lock lost: the connection holding the job's lock closed"
# How long a retry's count is asked for while the database is away; then the retry is
# not made (an attempt not counted is never made).
NOTE_ATTEMPT_SECONDS = 10.0
JOB_END_LINGER_SECONDS = 0.02


class RunsInFlight:
    """The runs in flight on this replica, in all and per job. A start and an end each
    cost O(1), whatever the number of jobs in flight (a Counter's `-=` rebuilds the
    whole table, and `total()` sums it: O(jobs in flight) per run end)."""

    def __init__(self) -> None:
        self._per_job: dict[str, int] = {}
        self.total = 0

    def started(self, job: str) -> None:
        self._per_job[job] = self._per_job.get(job, 0) + 1
        self.total += 1

    def ended(self, job: str) -> None:
        left = self._per_job.pop(job) - 1
        if left:
            self._per_job[job] = left
        self.total -= 1

    def of(self, job: str) -> int:
        return self._per_job.get(job, 0)

    def __len__(self) -> int:
        """How many jobs have a run in flight."""
        return len(self._per_job)


class RunExecutor:
    """Runs claimed ticks. One per replica; it knows which jobs run here now."""

    def __init__(
        self,
        *,
        runner_id: str,
        store: Ledger,
        attempts: Attempts,
        metrics: Metrics,
        record_delay: timedelta = timedelta(0),
        tracing: Tracing | None = None,
        hooks: HookPlan | None = None,
    ) -> None:
        self._store = store
        self._hooks = hooks or HookPlan()
        self._tracing = tracing or NoTracing()
        self._record_delay = record_delay.total_seconds()
        self._attempts = attempts
        self._metrics = metrics
        self._runs = RunsInFlight()
        self._stops: dict[UUID, RunStop] = {}  # the runs in flight here, by id
        self.cancels = Cancels(store, runner_id, self.cancel, lambda: bool(self._stops))
        # Deleted jobs with runs still in flight here: their ends are not counted, or
        # they would bring back the series `forget_job` dropped.
        self._deleted: set[str] = set()
        # Runs that may complete their job (once, max_runs, end_at) record it together.
        self._job_ends = Coalescer(self._finish_jobs, lambda: JOB_END_LINGER_SECONDS)

    @property
    def in_flight(self) -> int:
        return self._runs.total

    def cancel(self, request: CancelRequest) -> None:
        """Someone asked to cancel the run: if it is in flight here, stop its attempts
        the way a timeout does (the task gets its grace to end) and record it
        `cancelled`, saying who asked and why. Asked again, nothing more happens."""
        stop = self._stops.get(request.run_id)
        if stop is not None:
            stop.trip(Outcome(RunStatus.CANCELLED, request.error()))

    def forget_job(self, name: str) -> None:
        """The job was deleted: drop its metric series."""
        self._metrics.forget_job(name)
        if self._runs.of(name):
            self._deleted.add(name)

    async def run(
        self,
        session: PinnedSession,
        job: Job,
        claim: Claim,
        spent_seconds: float = 0.0,
        claimed: GateTimes | None = None,
    ) -> Run | None:
        """Run a claimed tick as `job` stands; whatever happens, record its end and
        release the job's lock if this session still holds it. A resumed run (its row
        counting the attempts made before, `spent_seconds` into the run) makes the
        attempts its retry policy has left. `claimed`: how the tick came through the
        loop, for its trace."""
        assert claim.run is not None, "only a claimed tick runs"
        pinned = Pinned(session, LockHold(job.lock_key, claim.holds_lock))
        progress = Progress(claim.run.attempts - 1, spent_seconds, self._noting(claim.run))
        with self._tracing.run(claim.run, claimed):
            try:
                return await self._run(pinned, job, claim.run, progress)
            finally:
                if pinned.hold.held:
                    await run_to_completion(self._unlock(session, pinned.hold))

    async def _unlock(self, session: PinnedSession, hold: "LockHold") -> None:
        """Release the job's lock, or kill the session: a session must never go on
        holding the lock of a run that ended (the job's next ticks would find it held).
        Killing it fences the other runs on it too, so it is the last resort."""
        hold.held = False
        try:
            async with asyncio.timeout(UNLOCK_TIMEOUT_SECONDS):
                if await session.unlock(hold.key):
                    return
            log.error("advisory lock %d was not held at unlock; closing the session", hold.key)
        except Exception:
            log.exception("unlock of advisory lock %d failed; closing the session", hold.key)
        session.terminate()

    def _noting(self, run: Run) -> Callable[[AttemptEnd, Job], Awaitable[NextAttempt]]:
        async def note(ended: AttemptEnd, job: Job) -> NextAttempt:
            # An attempt is counted on the row before it starts, or it does not start:
            # a replica resuming the run after a crash then makes no more attempts
            # than the policy allows. The database may be away a moment: asked again
            # for NOTE_ATTEMPT_SECONDS, each ask bounded (the store's deadline).
            deadline = time.monotonic() + NOTE_ATTEMPT_SECONDS
            backoff, most = _RECORD_BACKOFF_SECONDS
            while True:
                try:
                    return await self._store.note_attempt(run, job, ended)
                except Exception as error:  # noqa: BLE001 - asked again, then logged
                    if time.monotonic() + backoff > deadline:
                        attempt, extra = ended.attempt + 1, run_context(run)
                        log.warning("attempt %d not counted (%r)", attempt, error, extra=extra)
                        return NextAttempt(None, f"it could not be counted ({error!r})", False)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, most)

        return note

    async def _run(self, pinned: "Pinned", job: Job, run: Run, progress: Progress) -> Run | None:
        if not run.trigger.on_demand:
            lag = run.started_at - run.scheduled_for
            self._metrics.fire_lag.observe(max(0.0, lag.total_seconds()))
        self._runs.started(job.name)
        self._metrics.runs_in_flight.inc()
        attempts = asyncio.create_task(self._attempts.run(job, run, progress))
        stop = self._stops[run.id] = RunStop(run, attempts)
        self.cancels.follow()
        try:
            # The lock-lost fence: if the session holding the job's lock dies mid-run,
            # the lock is gone and another replica may start the next tick, so this
            # run must stop at once rather than overlap it.
            with pinned.session.fenced(stop.lock_lost) if pinned.hold.held else nullcontext():
                outcome = await attempts
            returned = time.monotonic()
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if stop.outcome is None or (current is not None and current.cancelling()):
                cancelled = Outcome(RunStatus.CANCELLED, "cancelled: the replica shut down")
                await run_to_completion(self._record(pinned, job, run, cancelled, progress))
                raise
            outcome = stop.outcome  # only the attempts stopped
            returned = time.monotonic()
        finally:
            self._stops.pop(run.id, None)
            self._runs.ended(job.name)
            self._metrics.runs_in_flight.dec()
        # An edit that reached a retry: the run ends as the job it last ran says.
        job = progress.job or job
        return await run_to_completion(
            self._record(pinned, job, run, outcome, progress, returned=returned)
        )

    async def _record(
        self,
        pinned: "Pinned",
        job: Job,
        run: Run,
        outcome: Outcome,
        progress: Progress,
        *,
        returned: float | None = None,
    ) -> Run | None:
        if self._record_delay:
            await asyncio.sleep(self._record_delay)  # a fault a test injects on purpose
        kept = job.capture  # a job may keep neither its runs' output nor their log
        end = RunEnd(
            outcome.status,
            storable_text(outcome.error),
            storable_json(outcome.result),
            max(1, progress.attempts),
            storable_json(outcome.output) if kept else None,
            storable_json(progress.log.stored()) if kept else None,
            self._hooks.calls(job.hooks, job.default_hooks, events_of_end(outcome.status)),
        )
        with self._tracing.record(run) as traced:
            finished = await self._finish(pinned, run, end)
            traced.ended(outcome.status.value, outcome.error)
        if returned is not None:
            self._metrics.lock_held_after_return.observe(time.monotonic() - returned)
        if job.name not in self._deleted:
            finished_at = finished.finished_at if finished else None
            self._metrics.count_run(job.name, job.lock_key, outcome.status, finished_at)
        elif not self._runs.of(job.name):
            self._deleted.discard(job.name)  # its last run here has ended
        log.info("run %s: %s", outcome.status.value, outcome.error or "ok", extra=run_context(run))
        if not run.trigger.on_demand:
            await self.tick_ended(job, run.scheduled_for)
        return finished

    async def tick_ended(self, job: Job, tick: datetime) -> None:
        """A scheduled tick of `job` has its outcome (run or skip): complete the job if
        that was its last (a one-time job's tick, the last run a cap allows, the
        window's end)."""
        if policy_finishes(job):
            await self._job_ends.submit((job.name, tick))

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
        """Record the run's end, then release the lock, on the pinned
        connection; if that connection is gone, record through the API pool."""
        session, hold = pinned.session, pinned.hold
        if not session.closed:
            try:
                finished, released = await session.finish(
                    run.id, end, hold.key if hold.held else None
                )
            except Exception as error:
                if not is_unavailable(error):
                    raise
                if not session.closed:
                    # The server ended the statement at its timeout (a row lock held
                    # elsewhere, say): nothing was recorded or released. The end goes
                    # through the API pool; the lock stays held until then (`run`
                    # releases it), so no later tick finds the run still `running`.
                    return await self._finish_elsewhere(run, end, session.backend)
            else:
                hold.held = hold.held and not released
                return finished
        # The session died, and its lock with it: there is nothing to unlock, and a
        # dead connection is never unlocked on. Terminating it only tidies up.
        hold.held = False
        session.terminate()
        return await self._finish_elsewhere(run, end, session.backend)

    async def _finish_elsewhere(self, run: Run, end: RunEnd, backend: BackendId) -> Run | None:
        """Record the end of a run whose own connection died, through the API pool,
        retrying while the database is away (a restart). If it stays away longer than
        RECORD_ELSEWHERE_SECONDS the row is left `running`: the orphan sweep marks it
        `abandoned` once no session holds the job's lock and its backend is gone."""
        deadline = time.monotonic() + RECORD_ELSEWHERE_SECONDS
        backoff, most = _RECORD_BACKOFF_SECONDS
        while True:
            try:
                return await self._store.finish_run(run.id, end, backend)
            except Exception as error:  # noqa: BLE001 - retried, then logged
                # Whatever went wrong (a pool connection caught mid-break by the same
                # outage raises asyncpg's internal errors too), the end is worth
                # another try: a row left `running` makes the job look busy.
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


class RunStop:
    """Stops a run's attempts from outside, with the outcome to record: its session died
    (the lock-lost fence), or someone cancelled it. The first reason stands."""

    def __init__(self, run: Run, attempts: "asyncio.Task[Outcome]") -> None:
        self._run = run
        self._attempts = attempts
        self.outcome: Outcome | None = None

    def lock_lost(self) -> None:
        self.trip(Outcome(RunStatus.CANCELLED, LOCK_LOST))

    def trip(self, outcome: Outcome) -> None:
        if self.outcome is None and not self._attempts.done():
            self.outcome = outcome
            log.warning("%s; cancelling the run", outcome.error, extra=run_context(self._run))
            self._attempts.cancel()


@dataclass
class LockHold:
    """Whether this session still holds the job's advisory lock."""

    key: int
    held: bool = False


@dataclass(frozen=True)
class Pinned:
    """The connection a run is pinned to, and the lock it holds there."""

    session: PinnedSession
    hold: LockHold


def _finishing(ticks: list[datetime]) -> Callable[[Job, datetime], Job]:
    def change(current: Job, now: datetime) -> Job:
        for tick in ticks:
            current = finish_run(current, tick, now)
        return current

    return change
