"""Executing one claimed run: its attempts, their deadlines, retries and the outcome."""

import asyncio
import json
import logging
import time
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from pydantic import JsonValue

from service.domain.jobs import Job
from service.domain.runs import Run, RunStatus
from service.tasks import SqlTargets, TaskContext, TaskRegistry

MAX_RESULT_BYTES = 64 * 1024


@dataclass(frozen=True)
class Outcome:
    status: RunStatus
    error: str | None = None
    result: JsonValue = None


@dataclass
class Progress:
    """Attempts made so far; read when a cancelled run is recorded."""

    attempts: int = 0


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


@dataclass(frozen=True)
class Attempts:
    """Runs a claimed run's task until it succeeds or its retry policy gives up."""

    tasks: TaskRegistry
    http: httpx.AsyncClient
    sql: SqlTargets

    async def run(self, job: Job, run: Run, progress: Progress) -> Outcome:
        policy = job.retry
        budget_end = time.monotonic() + (policy.max_retry_seconds or float("inf"))
        logger = RunLogger(logging.getLogger("tickgate.run"), run_context(run))
        while True:
            progress.attempts += 1
            seconds = min(job.timeout_seconds, budget_end - time.monotonic())
            outcome = await self._attempt(job, run, progress.attempts, seconds, logger)
            if outcome.status is RunStatus.SUCCEEDED or progress.attempts >= policy.max_attempts:
                return outcome
            wait = policy.backoff_seconds(progress.attempts - 1)
            if time.monotonic() + wait >= budget_end:
                return outcome
            logger.warning(
                "attempt %d %s; retrying in %.1fs", progress.attempts, outcome.status.value, wait
            )
            await asyncio.sleep(wait)

    async def _attempt(
        self, job: Job, run: Run, attempt: int, seconds: float, logger: RunLogger
    ) -> Outcome:
        definition = self.tasks.get(job.task)
        if definition is None:
            return Outcome(RunStatus.FAILED, f"task {job.task!r} is not registered here")
        deadline = datetime.now(UTC) + timedelta(seconds=seconds)
        context = TaskContext(
            job.name, run.id, run.scheduled_for, attempt, logger, deadline, self.http, self.sql
        )
        try:
            async with asyncio.timeout(seconds):
                result = await definition.run(definition.parse_args(job.args), context)
        except TimeoutError:
            return Outcome(RunStatus.TIMED_OUT, f"attempt {attempt} timed out after {seconds:g}s")
        except Exception as error:  # noqa: BLE001 - a task's failure is the run's result
            # and is recorded on the run; it must never escape into the scheduler.
            return Outcome(RunStatus.FAILED, f"{type(error).__name__}: {error}")
        return _bounded(result)


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
