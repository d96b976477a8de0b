"""The fire path of one replica: lock gate, ledger gate, run, record, unlock."""

import asyncio
import logging
from collections import Counter
from collections.abc import Callable, Coroutine
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import uuid4

import httpx
from pydantic import JsonValue

from service.domain.errors import Conflict, NotFound
from service.domain.jobs import Job, Overlap, finish_once
from service.domain.runs import Run, RunStatus, RunTrigger
from service.domain.schedules import OnceSchedule
from service.metrics import Metrics
from service.scheduler.shielding import run_to_completion
from service.store import Store
from service.store.errors import is_unavailable
from service.store.sessions import Claim, ClaimOutcome, RunSession, RunSessions, TickClaim
from service.tasks import TaskContext, TaskRegistry

log = logging.getLogger(__name__)

UNLOCK_TIMEOUT_SECONDS = 5.0
Outcome = tuple[RunStatus, str | None, JsonValue]
ClaimCallback = Callable[[Claim], None]


def utc_now() -> datetime:
    return datetime.now(UTC)


class Runner:
    """Runs ticks through both gates. One per replica; the API's manual trigger and the
    scheduler mirror both come through here."""

    def __init__(
        self,
        *,
        sessions: RunSessions,
        store: Store,
        tasks: TaskRegistry,
        http: httpx.AsyncClient,
        runner_id: str,
        metrics: Metrics,
        fire_delay: timedelta = timedelta(0),
    ) -> None:
        self._sessions = sessions
        self._store = store
        self._tasks = tasks
        self._http = http
        self._runner_id = runner_id
        self._fire_delay = fire_delay
        self._metrics = metrics
        self._tasks_in_flight: set[asyncio.Task[None]] = set()
        self._runs_by_job: Counter[str] = Counter()
        self.accepting = True

    @property
    def runs_in_flight(self) -> int:
        return self._runs_by_job.total()

    def fire(self, job: Job, scheduled_for: datetime, trigger: RunTrigger) -> None:
        """Start the scheduled fire of one tick in the background. Never raises."""
        self._spawn(self._fire(job, scheduled_for, trigger))

    async def trigger_now(self, job: Job) -> Run:
        """A manual run through the same gates; returns once the ledger row exists and
        leaves the run going. Conflict if a "skip" job is running anywhere."""
        decided: asyncio.Future[Claim] = asyncio.get_running_loop().create_future()
        tick = self._tick(job, utc_now(), RunTrigger.MANUAL, any_version=True)
        task = self._spawn(self._gated(tick, decided.set_result))
        either: set[asyncio.Future[Any]] = {decided, task}
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        if not decided.done():
            task.result()  # the gate failed before deciding: raise its error
            raise Conflict(f"job {job.name!r} could not be started")
        return _claimed_run(job, decided.result())

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

    async def _fire(self, job: Job, scheduled_for: datetime, trigger: RunTrigger) -> None:
        try:
            if self._fire_delay:
                await asyncio.sleep(self._fire_delay.total_seconds())
            if self._misfired(job, scheduled_for):
                return
            await self._gated(self._tick(job, scheduled_for, trigger), self._skip_counter(job))
        except Exception as error:
            # One broken tick must never take the scheduler down with it.
            tick = f"{job.name} at {scheduled_for.isoformat()}"
            if is_unavailable(error):
                log.warning("tick %s not run: database unavailable (%r)", tick, error)
            else:
                log.exception("tick %s failed", tick)

    def _misfired(self, job: Job, scheduled_for: datetime) -> bool:
        lateness = utc_now() - scheduled_for
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

    def _tick(
        self, job: Job, scheduled_for: datetime, trigger: RunTrigger, *, any_version: bool = False
    ) -> TickClaim:
        return TickClaim(job, scheduled_for, trigger, self._runner_id, uuid4(), False, any_version)

    async def _gated(self, tick: TickClaim, on_claim: ClaimCallback) -> None:
        """Lock gate, then ledger gate, then the run, all on one pinned connection."""
        if not self.accepting:
            return
        job = tick.job
        async with self._sessions.session() as session:
            locking = job.overlap is Overlap.SKIP
            if locking and not await session.try_lock(job.lock_key):
                on_claim(Claim(ClaimOutcome.LOCKED))
                return
            try:
                claim = await session.claim(replace(tick, locked=locking))
                on_claim(claim)
                if claim.run is not None:
                    await self._run(session, job, claim.run)
            finally:
                if locking:
                    await run_to_completion(self._unlock(session, job.lock_key))

    async def _unlock(self, session: RunSession, key: int) -> None:
        """Release the job's lock, or kill the session: a connection must never go
        back to the pool still holding an advisory lock."""
        try:
            async with asyncio.timeout(UNLOCK_TIMEOUT_SECONDS):
                if await session.unlock(key):
                    return
            log.error("advisory lock %d was not held at unlock; closing the session", key)
        except Exception:
            log.exception("unlock of advisory lock %d failed; closing the session", key)
        session.terminate()

    async def _run(self, session: RunSession, job: Job, run: Run) -> None:
        if run.trigger is not RunTrigger.MANUAL:
            lag = run.started_at - run.scheduled_for
            self._metrics.fire_lag.observe(max(0.0, lag.total_seconds()))
        self._runs_by_job[job.name] += 1
        self._metrics.runs_in_flight.inc()
        try:
            outcome = await self._attempt(job, run)
        except asyncio.CancelledError:
            outcome = (RunStatus.CANCELLED, "cancelled: the replica shut down", None)
            await run_to_completion(self._record(session, job, run, outcome))
            raise
        finally:
            self._runs_by_job -= Counter({job.name: 1})
            self._metrics.runs_in_flight.dec()
        await run_to_completion(self._record(session, job, run, outcome))

    async def _attempt(self, job: Job, run: Run) -> Outcome:
        definition = self._tasks.get(job.task)
        if definition is None:
            return RunStatus.FAILED, f"task {job.task!r} is not registered here", None
        context = self._context(job, run)
        try:
            async with asyncio.timeout(job.timeout_seconds):
                result = await definition.run(definition.parse_args(job.args), context)
        except TimeoutError:
            return RunStatus.TIMED_OUT, f"timed out after {job.timeout_seconds}s", None
        except Exception as error:  # noqa: BLE001 - a task's failure is the run's result
            # and is recorded on the run; it must never escape into the scheduler.
            context.logger.warning("run failed: %s", error)
            return RunStatus.FAILED, f"{type(error).__name__}: {error}", None
        return RunStatus.SUCCEEDED, None, result

    def _context(self, job: Job, run: Run) -> TaskContext:
        logger = RunLogger(logging.getLogger("tickgate.run"), run_context(run))
        return TaskContext(job.name, run.id, run.scheduled_for, run.attempts, logger, self._http)

    async def _record(self, session: RunSession, job: Job, run: Run, outcome: Outcome) -> None:
        status, error, result = outcome
        finished = await session.finish(run.id, status, error, result)
        self._metrics.runs.labels(job.name, status.value).inc()
        if status is RunStatus.SUCCEEDED and finished and finished.finished_at:
            self._metrics.last_success.labels(job.name).set(finished.finished_at.timestamp())
        log.info("run %s: %s", status.value, error or "ok", extra=run_context(run))
        if isinstance(job.schedule, OnceSchedule) and run.trigger is not RunTrigger.MANUAL:
            await self._store.mutate_job(job.name, _completing(run.scheduled_for, utc_now()))

    def _skip_counter(self, job: Job) -> ClaimCallback:
        def count(claim: Claim) -> None:
            if claim.outcome is ClaimOutcome.CLAIMED:
                return
            reason = claim.outcome.value
            if claim.outcome is ClaimOutcome.LOCKED and self._runs_by_job[job.name]:
                reason = "overlap"  # our own run of this job still holds the lock
            self._metrics.ticks_skipped.labels(reason).inc()
            # Expected on every replica but one, for every tick: DEBUG, not WARNING.
            log.debug("tick of %s skipped: %s", job.name, reason)

        return count


def run_context(run: Run) -> dict[str, str]:
    """The fields every log record about a run carries."""
    return {
        "job": run.job,
        "run_id": str(run.id),
        "scheduled_for": run.scheduled_for.isoformat(),
        "runner": run.runner,
    }


class RunLogger(logging.LoggerAdapter[logging.Logger]):
    """Tags every record a task logs with its run's job, run id, tick and runner."""

    def process(self, msg: object, kwargs: Any) -> tuple[object, Any]:
        kwargs["extra"] = {**(self.extra or {}), **kwargs.get("extra", {})}
        return msg, kwargs


def _completing(tick: datetime, now: datetime) -> Callable[[Job | None], Job | None]:
    def change(current: Job | None) -> Job | None:
        return finish_once(current, tick, now) if current else None

    return change


def _claimed_run(job: Job, claim: Claim) -> Run:
    if claim.run is not None:
        return claim.run
    if claim.outcome is ClaimOutcome.JOB_GONE:
        raise NotFound(f"no job named {job.name!r}")
    raise Conflict(f"job {job.name!r} is running somewhere; overlap is 'skip'")
