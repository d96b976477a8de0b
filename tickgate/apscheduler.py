"""`GatedExecutor`: APScheduler 3 with Tickgate's promise. Every process runs its own
scheduler with the same jobs; each (job id, scheduled run time) runs once across all of
them.

APScheduler hands an executor a job and the run times it is due for. For each, the gate
takes one connection from its pool for the whole run and claims the tick there: the
job's advisory lock (FNV-1a of the job's id, the key of a Tickgate job or a Go replica of
the same name), then the ledger row unique per (job, tick), so a process that comes late
finds the row and does not run the tick again, which a lock held only while a run lasts
cannot promise. It runs the job, records its end (status, duration, error, this
process as its runner), and releases the lock on the same connection. The jobs appear in
Tickgate's API, dashboard and ledger as jobs fired by an app.

What each process must agree on is the tick: a run time computed from a process's own
clock (an interval with no `start_date`, a `jitter`, a date made from `now()`) is another
tick in every process, so such jobs are refused (`check_job`).
"""

import asyncio
import concurrent.futures
import contextvars
import logging
import os
import re
import socket
import threading
import traceback
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Any
from uuid import UUID

try:
    from apscheduler.events import (
        EVENT_JOB_ERROR,
        EVENT_JOB_EXECUTED,
        EVENT_JOB_MISSED,
        JobExecutionEvent,
    )
    from apscheduler.executors.base import BaseExecutor
    from apscheduler.job import Job as ApJob
    from apscheduler.triggers.date import DateTrigger
    from apscheduler.triggers.interval import IntervalTrigger
    from apscheduler.util import iscoroutinefunction_partial
except ImportError as missing:  # the optional extra
    raise ImportError(
        "tickgate.apscheduler needs APScheduler 3: pip install 'tickgate[apscheduler]'"
    ) from missing
from prometheus_client import REGISTRY, CollectorRegistry, Counter, Gauge

from service.domain.jobs import MAX_TIMEOUT_SECONDS, JobSpec
from service.domain.names import is_valid_job_name, lock_key
from service.domain.runs import RunStatus, SkipReason
from service.domain.schedules import CHECKED
from service.shielding import run_to_completion
from service.store.gate import AppGate, Claim, GateRun, GateSession

__all__ = ["GatedExecutor", "GatedRun", "check_job", "current_run"]

log = logging.getLogger("tickgate.apscheduler")

MAX_ERROR_CHARS = 4000
# The id APScheduler makes when none is given: random in each process.
_RANDOM_ID = re.compile(r"[0-9a-f]{32}")


@dataclass(frozen=True)
class GatedRun:
    """The run a job's function is called for: the job, the tick it runs (the run time
    APScheduler scheduled, the same in every process), and the run's id in Tickgate's
    ledger: one per (job, tick), the idempotency key of the run's side effects."""

    job: str
    scheduled_for: datetime
    id: UUID


_CURRENT: contextvars.ContextVar[GatedRun | None] = contextvars.ContextVar(
    "tickgate_gated_run", default=None
)


def current_run() -> GatedRun | None:
    """The gated run this code runs in (None outside one): from the job's function, a
    coroutine or a plain function alike."""
    return _CURRENT.get()


def check_job(job: ApJob) -> None:
    """Refuse (ValueError) a job whose ticks the processes would not share: its id must
    be given (APScheduler's default is random per process) and be a Tickgate job name,
    and its trigger must compute the same run times in every process."""
    if _RANDOM_ID.fullmatch(job.id):
        raise ValueError(
            f"job {job.name!r} has no id of its own: APScheduler made {job.id!r} at random, "
            "so each process's copy would be another job; give it id=..."
        )
    if not is_valid_job_name(job.id):
        raise ValueError(
            f"job id {job.id!r} is not a Tickgate job name: 1 to 128 of letters, digits, "
            "'.', '_' and '-', starting with a letter or digit"
        )
    for trigger in _triggers(job.trigger):
        _check_trigger(job.id, trigger)


def _triggers(trigger: Any) -> Iterator[Any]:
    """The trigger and, for AndTrigger/OrTrigger, the ones it combines."""
    yield trigger
    for inner in getattr(trigger, "triggers", ()):
        yield from _triggers(inner)


def _check_trigger(job_id: str, trigger: Any) -> None:
    if getattr(trigger, "jitter", None):
        raise ValueError(
            f"job {job_id!r}: jitter draws another delay in each process, so each would run "
            "its own tick; drop jitter= (Tickgate jobs have jitter_seconds, the same on "
            "every replica)"
        )
    if isinstance(trigger, IntervalTrigger) and trigger.start_date.microsecond:
        raise ValueError(
            f"interval job {job_id!r} has no start_date: APScheduler starts an interval "
            "from each process's start, so every replica would compute other ticks. Set "
            "start_date= (the anchor every tick counts from), a whole second every process "
            "shares, e.g. start_date='2026-01-01 00:00:00'"
        )
    if isinstance(trigger, DateTrigger) and trigger.run_date.microsecond:
        raise ValueError(
            f"date job {job_id!r} runs at {trigger.run_date.isoformat()}, a time with "
            "fractions of a second: one computed from a process's clock, so another in "
            "each process; give run_date= a whole second every process shares"
        )


class _Metrics:
    """The series a Tickgate replica exports for its runs, here for the app's runs (one
    set per registry): alert on the last success as on a replica's."""

    _made: dict[int, "_Metrics"] = {}
    _lock = threading.Lock()

    def __init__(self, registry: CollectorRegistry) -> None:
        self.runs = Counter(
            "tickgate_runs",
            "Runs of gated jobs finished in this process.",
            ["job", "status"],
            registry=registry,
        )
        self.last_success = Gauge(
            "tickgate_job_last_success_timestamp_seconds",
            "Unix time this process last finished a run of the job successfully. Alert on "
            "max() across processes going stale, not only on failures.",
            ["job"],
            registry=registry,
        )

    @classmethod
    def of(cls, registry: CollectorRegistry) -> "_Metrics":
        with cls._lock:
            if id(registry) not in cls._made:
                cls._made[id(registry)] = cls(registry)
            return cls._made[id(registry)]

    def count(self, job: str, status: RunStatus) -> None:
        self.runs.labels(job, status.value).inc()
        if status is RunStatus.SUCCEEDED:
            self.last_success.labels(job).set(datetime.now(UTC).timestamp())


class GatedExecutor(BaseExecutor):  # type: ignore[misc]
    """An APScheduler 3 executor for `AsyncIOScheduler` and `BackgroundScheduler` (and
    the other thread-based schedulers): coroutine functions run on the scheduler's event
    loop (or the executor's own), plain functions in its thread pool.

    `dsn`: the PostgreSQL of the ledger, a Tickgate server's database or one of its own
    (its tables are made or brought up to date at the first run unless `migrate=False`).
    `runner`: this process in the ledger (default `app:<host>:<pid>`). `timeout`: seconds
    a run may last (None: no limit); a coroutine past it is cancelled, a thread is waited
    for, and the run ends `timed_out`. `threads`: the pool for plain functions. `pool_size`:
    the database connections, one per run in progress. `registry`: where the run metrics
    go (default: prometheus_client's)."""

    def __init__(
        self,
        dsn: str,
        *,
        runner: str | None = None,
        timeout: float | None = None,
        threads: int = 10,
        pool_size: int = 10,
        migrate: bool = True,
        registry: CollectorRegistry | None = None,
    ) -> None:
        super().__init__()
        self._dsn = dsn
        self.runner = runner or f"app:{socket.gethostname()}:{os.getpid()}"
        self._timeout = timeout
        self._threads = ThreadPoolExecutor(threads, thread_name_prefix="tickgate-gate")
        self._pool_size = pool_size
        self._migrate = migrate
        self._metrics = _Metrics.of(registry if registry is not None else REGISTRY)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._own_loop: threading.Thread | None = None
        self._gate: asyncio.Future[AppGate] | None = None
        self._registered: dict[str, JobSpec] = {}
        self._futures: set[Future[list[JobExecutionEvent]]] = set()

    # --- APScheduler's executor interface ------------------------------------------

    def start(self, scheduler: Any, alias: str) -> None:
        """Check the jobs already added for this executor (a bad one fails the
        scheduler's start), and find the loop runs are made on."""
        super().start(scheduler, alias)
        for job in scheduler.get_jobs():
            if job.executor == alias:
                check_job(job)
        self._loop = getattr(scheduler, "_eventloop", None) or self._start_own_loop()

    def shutdown(self, wait: bool = True) -> None:
        """Stop: runs in progress are waited for (`wait`, on the executor's own loop) or
        cancelled; a cancelled run still records its end (`cancelled`) and releases its
        lock. On the scheduler's own loop (AsyncIOScheduler, which shuts down on that
        loop) runs are always cancelled, as APScheduler's AsyncIOExecutor does: waiting
        there would block the loop they need."""
        if wait and self._own_loop is not None:
            concurrent.futures.wait(list(self._futures))
        for future in list(self._futures):
            future.cancel()
        if self._loop is not None and self._gate is not None:
            self._close_gate(wait)
        self._threads.shutdown(wait=wait)
        if self._own_loop is not None and self._loop is not None:
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._own_loop.join(5)

    def _do_submit_job(self, job: ApJob, run_times: list[datetime]) -> None:
        check_job(job)  # raised: APScheduler logs "Error submitting job" and runs nothing
        assert self._loop is not None, "GatedExecutor.start was not called"
        future = asyncio.run_coroutine_threadsafe(self._run_times(job, run_times), self._loop)
        self._futures.add(future)
        future.add_done_callback(partial(self._done, job.id))

    def _done(self, job_id: str, future: "Future[list[JobExecutionEvent]]") -> None:
        self._futures.discard(future)
        if future.cancelled():
            self._run_job_error(job_id, asyncio.CancelledError())
        elif (error := future.exception()) is not None:
            self._run_job_error(job_id, error, error.__traceback__)
        else:
            self._run_job_success(job_id, future.result())

    # --- the gate ----------------------------------------------------------------------

    async def _run_times(self, job: ApJob, run_times: list[datetime]) -> list[JobExecutionEvent]:
        gate = await self._opened()
        await self._register(gate, job)
        events = [await self._run_time(gate, job, run_time) for run_time in run_times]
        return [event for event in events if event is not None]

    async def _run_time(
        self, gate: AppGate, job: ApJob, run_time: datetime
    ) -> JobExecutionEvent | None:
        """One tick: skipped as a misfire past its grace, else claimed and run here, or
        left to the process that has it (None: no event in this process)."""
        alias = job._jobstore_alias
        async with gate.session() as session:
            if _misfired(job, run_time):
                await session.skip(
                    job.id,
                    run_time,
                    SkipReason.MISFIRE,
                    "no process started it within misfire_grace_time",
                )
                log.warning("run time %s of job %r was missed", run_time, job.id)
                return JobExecutionEvent(EVENT_JOB_MISSED, job.id, alias, run_time)
            claim, run = await self._claim(gate, session, job, run_time)
            if claim is Claim.HELD:
                await session.skip(
                    job.id,
                    run_time,
                    SkipReason.OVERLAP,
                    "an earlier run of the job was in progress",
                )
            if run is None:
                return None
            return await self._run(session, job, run)

    async def _claim(
        self, gate: AppGate, session: GateSession, job: ApJob, tick: datetime
    ) -> tuple[Claim, GateRun | None]:
        """Claim the tick; a job deleted from the API is registered again first (the app
        still schedules it). `max_instances` of 1 holds the lock over the run, so no two
        runs of the job overlap in the cluster; more let runs overlap, one per tick."""
        key = lock_key(job.id) if job.max_instances == 1 else None
        claim, run = await session.claim(job.id, tick, lock_key=key)
        if claim is Claim.UNKNOWN:
            self._registered.pop(job.id, None)
            await self._register(gate, job)
            claim, run = await session.claim(job.id, tick, lock_key=key)
        return claim, run

    async def _run(self, session: GateSession, job: ApJob, run: GateRun) -> JobExecutionEvent:
        """Run the job, then record its end and release its lock, shielded: a run
        cancelled (the scheduler shut down) still leaves its row ended."""
        alias = job._jobstore_alias
        try:
            retval = await self._call(job, run)
        except BaseException as error:
            status = _status_of(error)
            await run_to_completion(self._record(session, run, status, _error_text(error)))
            if status is RunStatus.CANCELLED:
                raise
            log.exception("job %r raised an exception", job.id)
            text = "".join(traceback.format_tb(error.__traceback__))
            return JobExecutionEvent(
                EVENT_JOB_ERROR, job.id, alias, run.tick, exception=error, traceback=text
            )
        await run_to_completion(self._record(session, run, RunStatus.SUCCEEDED, None))
        return JobExecutionEvent(EVENT_JOB_EXECUTED, job.id, alias, run.tick, retval=retval)

    async def _record(
        self, session: GateSession, run: GateRun, status: RunStatus, error: str | None
    ) -> None:
        await session.finish(run, status, error)
        await session.unlock()
        self._metrics.count(run.job, status)

    async def _call(self, job: ApJob, run: GateRun) -> Any:
        """The job's function: a coroutine function on this loop, under the timeout; a
        plain one in the thread pool, waited for to its end (a thread cannot be stopped),
        `timed_out` if that was past the timeout."""
        _CURRENT.set(GatedRun(run.job, run.tick, run.id))  # this run's task only
        if iscoroutinefunction_partial(job.func):
            async with asyncio.timeout(self._timeout):
                return await job.func(*job.args, **job.kwargs)
        loop = asyncio.get_running_loop()
        began = loop.time()
        call = partial(contextvars.copy_context().run, job.func, *job.args, **job.kwargs)
        work = loop.run_in_executor(self._threads, call)
        result = await asyncio.shield(work)
        if self._timeout is not None and loop.time() - began > self._timeout:
            raise TimeoutError(f"the run took longer than its timeout of {self._timeout:g}s")
        return result

    async def _register(self, gate: AppGate, job: ApJob) -> None:
        """Make or update the job in Tickgate when its definition changed here."""
        spec = _spec(job, self._timeout)
        if self._registered.get(job.id) != spec:
            await gate.register(job.id, spec)
            self._registered[job.id] = spec

    async def _opened(self) -> AppGate:
        """The gate, opened once, on the loop the runs are made on."""
        if self._gate is None:
            opening = AppGate.open(
                self._dsn, self.runner, max_size=self._pool_size, migrate=self._migrate
            )
            self._gate = asyncio.ensure_future(opening)
        try:
            return await asyncio.shield(self._gate)
        except Exception:
            self._gate = None  # the next run tries again (the database may be back)
            raise

    def _start_own_loop(self) -> asyncio.AbstractEventLoop:
        loop = asyncio.new_event_loop()
        self._own_loop = threading.Thread(
            target=loop.run_forever, name="tickgate-gate-loop", daemon=True
        )
        self._own_loop.start()
        return loop

    def _close_gate(self, wait: bool) -> None:
        assert self._loop is not None
        assert self._gate is not None
        gate = self._gate

        async def close() -> None:
            if gate.done() and not gate.cancelled() and gate.exception() is None:
                await gate.result().close()

        closing = asyncio.run_coroutine_threadsafe(close(), self._loop)
        if wait and self._own_loop is not None:
            closing.result(10)


def _misfired(job: ApJob, run_time: datetime) -> bool:
    """APScheduler's own rule: late by more than `misfire_grace_time` (None: never)."""
    grace = job.misfire_grace_time
    return grace is not None and datetime.now(UTC) - run_time > timedelta(seconds=grace)


def _status_of(error: BaseException) -> RunStatus:
    if isinstance(error, asyncio.CancelledError):
        return RunStatus.CANCELLED
    return RunStatus.TIMED_OUT if isinstance(error, TimeoutError) else RunStatus.FAILED


def _error_text(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
    return text[:MAX_ERROR_CHARS]


def _spec(job: ApJob, timeout: float | None) -> JobSpec:
    """The job as Tickgate shows it: its trigger in APScheduler's words, its function,
    and the options that mean the same here. Its args are not stored: they are the
    app's, and may hold secrets."""
    zone = getattr(job.trigger, "timezone", None)
    grace = job.misfire_grace_time
    fields: dict[str, Any] = {
        "description": f"APScheduler job {job.name}"[:4096],
        "schedule": {"kind": "app", "trigger": str(job.trigger)[:1024]},
        "timezone": getattr(zone, "key", None) or "UTC",
        "task": f"app:{job.func_ref}"[:128],
        "overlap": "skip" if job.max_instances == 1 else "allow",
        "timeout_seconds": _seconds(timeout),
        "misfire_grace_seconds": _seconds(grace) if grace is not None else MAX_TIMEOUT_SECONDS,
        "default_hooks": False,
        "capture": False,
    }
    return JobSpec.model_validate(fields, context={CHECKED: True})


def _seconds(value: float | None) -> int:
    if value is None:
        return MAX_TIMEOUT_SECONDS
    return min(max(1, round(value)), MAX_TIMEOUT_SECONDS)
