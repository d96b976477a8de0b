"""Executing one claimed run: its attempts, their deadlines, retries and the outcome."""

import asyncio
import json
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from pydantic import JsonValue

from service.domain.jobs import Job
from service.domain.runs import AttemptEnd, Run, RunStatus
from service.store.ports import NextAttempt
from service.tasks import SqlTargets, TaskContext, TaskDefinition, TaskRegistry
from service.tracing import NoTracing, Traced, Tracing

MAX_RESULT_BYTES = 64 * 1024
MAX_LOG_LINES = 1000
MAX_LOG_CHARS = 64 * 1024
MAX_LOG_LINE_CHARS = 4096
# A task told to stop (its attempt timed out, its run's lock was lost, the replica shuts
# down) gets this long to end. One that ignores the cancellation must not pin the run's
# lock and connection for as long as it likes.
STOP_GRACE_SECONDS = 5.0
LEFT_RUNNING = "ignored cancellation and was left running"


@dataclass(frozen=True)
class Outcome:
    status: RunStatus
    error: str | None = None
    result: JsonValue = None
    output: JsonValue = None  # what the attempt's target answered, if its task kept it


async def _unnoted(ended: AttemptEnd, job: Job) -> NextAttempt:
    return NextAttempt(job)


class RunLog:
    """The lines logged through a run's logger (its task's, and its retries'), INFO and
    up whatever the replica's log level, kept for the run (GET /v1/runs/{id}/log):
    at most MAX_LOG_LINES lines and MAX_LOG_CHARS characters of messages, each cut at
    MAX_LOG_LINE_CHARS; what is past that is counted as `dropped`."""

    def __init__(self) -> None:
        self.lines: list[dict[str, JsonValue]] = []
        self.dropped = 0
        self._chars = 0

    def add(self, level: int, message: str) -> None:
        message = message[:MAX_LOG_LINE_CHARS]
        if len(self.lines) >= MAX_LOG_LINES or self._chars + len(message) > MAX_LOG_CHARS:
            self.dropped += 1
            return
        self._chars += len(message)
        at = datetime.now(UTC).isoformat()
        self.lines.append({"at": at, "level": logging.getLevelName(level), "message": message})

    def stored(self) -> JsonValue:
        """As the run keeps it; None when nothing was logged."""
        if not self.lines and not self.dropped:
            return None
        lines: list[JsonValue] = list(self.lines)
        return {"lines": lines, "dropped": self.dropped}


@dataclass
class Progress:
    """Attempts made so far (for a resumed run, those its lost replica made too); read
    when a cancelled run is recorded. `spent_seconds`: how long the run had been going
    when these attempts began, against `max_retry_seconds`. `note` hears of each retry
    before it starts (the attempt that ended, and the job it ran), so the row counts it
    and keeps its times, and answers the job as stored now, whose definition the retry
    runs, or why it does not start. `job`: the definition of the last attempt started
    (None: the claim's). `log`: what the run logged, kept with it."""

    attempts: int = 0
    spent_seconds: float = 0.0
    note: Callable[[AttemptEnd, Job], Awaitable[NextAttempt]] = _unnoted
    log: RunLog = field(default_factory=RunLog)
    job: Job | None = None


def run_context(run: Run) -> dict[str, str]:
    """The fields every log record about a run carries."""
    return {
        "job": run.job,
        "run_id": str(run.id),
        "scheduled_for": run.scheduled_for.isoformat(),
        "runner": run.runner,
    }


class RunLogger(logging.LoggerAdapter[logging.Logger]):
    """Tags every record a task logs with its run's job, run id, tick and runner, and
    keeps INFO and up in the run's log (`kept`), whatever the replica's log level."""

    def __init__(self, logger: logging.Logger, extra: dict[str, str], kept: RunLog) -> None:
        super().__init__(logger, extra)
        self.kept = kept

    def process(self, msg: object, kwargs: Any) -> tuple[object, Any]:
        kwargs["extra"] = {**(self.extra or {}), **kwargs.get("extra", {})}
        return msg, kwargs

    def log(self, level: int, msg: object, *args: object, **kwargs: Any) -> None:
        if level >= logging.INFO:
            self.kept.add(level, _message(msg, args))
        super().log(level, msg, *args, **kwargs)


def _message(msg: object, args: tuple[object, ...]) -> str:
    """The message as logging would write it; a bad format is kept as given."""
    try:
        return str(msg) % args if args else str(msg)
    except (TypeError, ValueError):
        return f"{msg} {args}"


@dataclass(frozen=True)
class Attempts:
    """Runs a claimed run's task until it succeeds or its retry policy gives up."""

    tasks: TaskRegistry
    http: httpx.AsyncClient
    sql: SqlTargets
    tracing: Tracing = field(default_factory=NoTracing)
    stop_grace_seconds: float = STOP_GRACE_SECONDS
    # Tasks that ignored cancellation and still run; see `_stop`.
    left_running: set["asyncio.Future[JsonValue]"] = field(default_factory=set)

    async def run(self, job: Job, run: Run, progress: Progress) -> Outcome:
        """Attempts until one succeeds or the retry policy gives up. Each retry is counted
        on the run's row before it starts, and runs the job as stored then (an edit
        reaches it); one that could not be counted, or whose job was deleted or paused
        meanwhile, or whose run someone cancelled, does not start."""
        begun = time.monotonic() - progress.spent_seconds
        logger = RunLogger(logging.getLogger("tickgate.run"), run_context(run), progress.log)
        # The first attempt is counted by its claim (or resume).
        outcome = await self._counted(job, run, progress, begun, logger)
        while (wait := _retry_wait(job, progress.attempts, outcome, begun)) is not None:
            logger.warning(
                "attempt %d %s; retrying in %.1fs", progress.attempts, outcome.status.value, wait
            )
            stopped = time.monotonic()
            await asyncio.sleep(wait)
            waited = time.monotonic() - stopped
            ended = AttemptEnd(progress.attempts, outcome.status, outcome.error, waited)
            following = await progress.note(ended, job)
            if following.job is None:
                return _not_started(outcome, following, progress.attempts + 1)
            job = progress.job = following.job
            if progress.attempts >= job.retry.max_attempts:  # an edit left it no attempt
                return outcome
            outcome = await self._counted(job, run, progress, begun, logger)
        return outcome

    async def _counted(
        self, job: Job, run: Run, progress: Progress, begun: float, logger: RunLogger
    ) -> Outcome:
        """One attempt, counted already, within its timeout and the run's retry budget."""
        progress.attempts += 1
        budget_end = begun + (job.retry.max_retry_seconds or float("inf"))
        seconds = min(job.timeout_seconds, budget_end - time.monotonic())
        with self.tracing.attempt(run, progress.attempts) as traced:
            outcome = await self._attempt(
                job, run, progress.attempts, seconds, logger, traced=traced
            )
            traced.ended(outcome.status.value, outcome.error)
        return outcome

    async def _attempt(
        self, job: Job, run: Run, attempt: int, seconds: float, logger: RunLogger, *, traced: Traced
    ) -> Outcome:
        definition = self.tasks.get(job.task)
        if definition is None:
            return Outcome(RunStatus.FAILED, f"task {job.task!r} is not registered here")
        deadline = datetime.now(UTC) + timedelta(seconds=seconds)
        context = TaskContext(
            job.name,
            run.id,
            run.scheduled_for,
            attempt,
            logger,
            deadline,
            self.http,
            self.sql,
            traced.headers,
        )
        outcome = await self._run_task(definition, run.args_of(job.args), context, seconds)
        return replace(outcome, output=context.output.kept)

    async def _run_task(
        self,
        definition: TaskDefinition[Any],
        args: dict[str, JsonValue],
        context: TaskContext,
        seconds: float,
    ) -> Outcome:
        """The task's outcome within `seconds`: its result, its failure, or a timeout."""
        try:
            work = asyncio.ensure_future(definition.run(definition.parse_args(args), context))
        except Exception as error:  # noqa: BLE001 - see below
            return _failed(error)
        try:
            done, _ = await asyncio.wait({work}, timeout=seconds)
        except asyncio.CancelledError:  # the lock was lost, or the replica shuts down
            await self._stop(work, context.logger)
            raise
        if not done:
            left = "" if await self._stop(work, context.logger) else f"; {LEFT_RUNNING}"
            return Outcome(
                RunStatus.TIMED_OUT,
                f"attempt {context.attempt} timed out after {seconds:g}s{left}",
            )
        try:
            return _bounded(work.result())
        except Exception as error:  # noqa: BLE001 - see _failed
            return _failed(error)

    async def _stop(
        self, work: "asyncio.Future[JsonValue]", logger: logging.LoggerAdapter[logging.Logger]
    ) -> bool:
        """Cancel the task and give it `stop_grace_seconds` to end. False if it did not:
        it is left running (held here, so it is not collected mid-flight), and the run
        goes on to be recorded and its lock released, rather than wait on it forever."""
        work.cancel()
        done, _ = await asyncio.wait({work}, timeout=self.stop_grace_seconds)
        if done:
            if not work.cancelled():
                work.exception()  # retrieved: an error on the way out changes nothing now
            return True
        logger.error("the task %s for %gs", LEFT_RUNNING, self.stop_grace_seconds)
        self.left_running.add(work)
        work.add_done_callback(self.left_running.discard)
        return False


def _retry_wait(job: Job, attempts: int, outcome: Outcome, begun: float) -> float | None:
    """How long to wait before the next attempt; None if there is none: the last
    succeeded, or the job's retry policy (as it stands) has no attempt or time left."""
    policy = job.retry
    if outcome.status is RunStatus.SUCCEEDED or attempts >= policy.max_attempts:
        return None
    wait = policy.backoff_seconds(attempts - 1)
    budget_end = begun + (policy.max_retry_seconds or float("inf"))
    return None if time.monotonic() + wait >= budget_end else wait


def _not_started(last: Outcome, following: NextAttempt, attempt: int) -> Outcome:
    """The run's outcome when its next attempt does not start: cancelled (asked, or its
    job deleted or paused), or else the last attempt's, saying why no other followed."""
    if following.cancelled:
        return Outcome(RunStatus.CANCELLED, following.why_not, output=last.output)
    error = f"{last.error}; attempt {attempt} was not started: {following.why_not}"
    return replace(last, error=error)


def _failed(error: Exception) -> Outcome:
    """A task's failure is the run's result, recorded on the run; it must never escape
    into the scheduler."""
    return Outcome(RunStatus.FAILED, f"{type(error).__name__}: {error}")


def _bounded(result: JsonValue) -> Outcome:
    """A result is stored when it is JSON and at most 64 KiB encoded."""
    try:
        size = len(json.dumps(result, allow_nan=False).encode())
    except (TypeError, ValueError, RecursionError) as error:
        # RecursionError: nested deeper than JSON can be written here (or stored).
        return Outcome(RunStatus.FAILED, f"the task returned a result that is not JSON: {error}")
    if size > MAX_RESULT_BYTES:
        return Outcome(RunStatus.SUCCEEDED, result={"truncated": True, "bytes": size})
    return Outcome(RunStatus.SUCCEEDED, result=result)
