"""Sending the outbox's hook deliveries (#24), on every replica that runs the scheduler.

A delivery was written with the run's end (or the tick's skip) that caused it, so it
outlives the replica that wrote it. Any replica takes due ones for a lease, sends each,
and settles it: `delivered`, `failed` once its retry policy gives up, or `pending` again
after a backoff. A sender that dies mid-send leaves its lease to run out; another takes
the delivery again, with the same `Idempotency-Key` (the delivery's id), so a target
that saw it once can tell. Delivery is at least once, and each is settled once.
"""

import asyncio
import logging
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from pydantic import JsonValue

from service.domain.errors import Conflict, DomainError
from service.domain.hooks import HttpAction, TriggerAction
from service.domain.runs import Run, RunTrigger
from service.metrics import Metrics
from service.scheduler.runner import Runner
from service.store.ports import Outbox, Sending
from service.tasks import SqlTargets, TaskContext, TaskRegistry
from service.tasks.http import redact_args

log = logging.getLogger(__name__)

POLL_SECONDS = 1.0
BATCH = 50
# A sender's lease on a delivery: the action's own timeout and this much more.
LEASE_MARGIN_SECONDS = 30.0


class Undeliverable(Exception):
    """A delivery that no retry can help (the job to trigger is gone, say)."""


@dataclass(frozen=True)
class HookSender:
    store: Outbox
    runner: Runner
    tasks: TaskRegistry
    http: httpx.AsyncClient
    sql: SqlTargets
    metrics: Metrics
    sender: str
    public_url: str = ""
    start_delay: timedelta = timedelta(0)  # a fault a test injects on purpose

    async def send_forever(self) -> None:
        """Take what is due and send it, a batch at a time; look again every
        POLL_SECONDS when there was less than a batch."""
        await asyncio.sleep(self.start_delay.total_seconds())
        while True:
            taken = await self._take()
            await asyncio.gather(*(self._send(one) for one in taken))
            if len(taken) < BATCH:
                await asyncio.sleep(POLL_SECONDS)

    async def _take(self) -> list[Sending]:
        try:
            return await self.store.take_deliveries(BATCH, self.sender, LEASE_MARGIN_SECONDS)
        except Exception as error:  # noqa: BLE001 - logged; the next poll tries again
            log.warning("could not take hook deliveries (%r); trying again", error)
            return []

    async def _send(self, sending: Sending) -> None:
        try:
            answer = await self._deliver(sending)
        except Exception as error:  # noqa: BLE001 - a delivery's failure is its record
            await self._failed(sending, error)
        else:
            await self._settle(sending, "delivered", None, answer)

    async def _failed(self, sending: Sending, error: Exception) -> None:
        delivery = sending.delivery
        text = f"{type(error).__name__}: {error}"
        age = (datetime.now(UTC) - delivery.created_at).total_seconds()
        retry = delivery.retry
        if isinstance(error, Undeliverable) or not retry.allows_attempt(delivery.attempts + 1, age):
            await self._settle(sending, "failed", text, None)
            return
        wait = retry.backoff_seconds(delivery.attempts - 1)
        await self._settle(sending, "pending", text, None, wait)

    async def _settle(
        self,
        sending: Sending,
        status: str,
        error: str | None,
        answer: JsonValue,
        retry_in: float | None = None,
    ) -> None:
        delivery = sending.delivery
        outcome = "retried" if status == "pending" else status
        self.metrics.hook_deliveries.labels(delivery.event.value, outcome).inc()
        level = logging.INFO if status == "delivered" else logging.WARNING
        log.log(level, "hook %s of %s %s: %s", delivery.event, delivery.job, outcome, error or "ok")
        try:
            await self.store.settle_delivery(
                delivery=delivery.id,
                sender=self.sender,
                status=status,
                error=error,
                answer=answer,
                retry_in=retry_in,
            )
        except Exception as failure:  # noqa: BLE001 - the lease runs out; sent again then
            log.warning("hook delivery %s not settled (%r)", delivery.id, failure)

    async def _deliver(self, sending: Sending) -> JsonValue:
        action = sending.delivery.action
        if isinstance(action, TriggerAction):
            return await self._trigger(sending, action)
        return await self._post(sending, action)

    async def _trigger(self, sending: Sending, action: TriggerAction) -> JsonValue:
        """Run the job now, trigger `chain`, through the gate; the target job's args
        unless the hook gives some."""
        jobs = await self.store.get_jobs([action.job])
        if not jobs:
            raise Undeliverable(f"no job named {action.job!r} to trigger")
        try:
            if action.args is not None:
                self.tasks.check_args(jobs[0].task, action.args)
            note = f"{sending.delivery.event.value} of {sending.run.job} (run {sending.run.id})"
            run = await self.runner.on_demand.trigger_now(
                jobs[0], action.args, note, RunTrigger.CHAIN
            )
        except Conflict:
            raise  # the job is running somewhere: tried again after a backoff
        except DomainError as error:
            raise Undeliverable(str(error)) from error
        return {"run_id": str(run.id)}

    async def _post(self, sending: Sending, action: HttpAction) -> JsonValue:
        """The webhook through the http task itself: its guard, allowlist, signing and
        per-host cap; the delivery's id as the Idempotency-Key."""
        definition = self.tasks.get("http")
        if definition is None:
            raise Undeliverable("the http task is not registered here")
        args = self._webhook_args(sending, action)
        parsed = definition.parse_args(args)
        seconds = float(getattr(parsed, "timeout_seconds", 30.0))
        context = self._context(sending, seconds)
        async with asyncio.timeout(seconds + 5):
            result: JsonValue = await definition.run(parsed, context)
        return result

    def _webhook_args(self, sending: Sending, action: HttpAction) -> dict[str, Any]:
        headers = action.args.get("headers")
        shown = dict(headers) if isinstance(headers, dict) else {}
        args: dict[str, Any] = {
            **action.args,
            "headers": {**shown, "X-Tickgate-Event": sending.delivery.event.value},
        }
        args.setdefault("body", self._document(sending))
        return args

    def _document(self, sending: Sending) -> dict[str, JsonValue]:
        """The body of a webhook: the event, the run, its job's name and labels, and
        where to see the run in the dashboard."""
        delivery, run = sending.delivery, sending.run
        link = f"{self.public_url.rstrip('/')}/ui/runs/{run.id}"
        return {
            "event": delivery.event.value,
            "delivery_id": str(delivery.id),
            "job": {"name": run.job, "labels": dict(sending.labels)},
            "run": _shown_run(run),
            "link": link,
        }

    def _context(self, sending: Sending, seconds: float) -> TaskContext:
        delivery = sending.delivery
        extra = {"job": delivery.job, "run_id": str(delivery.run_id), "hook": str(delivery.id)}
        return TaskContext(
            job=delivery.job,
            run_id=delivery.id,
            scheduled_for=sending.run.scheduled_for,
            attempt=delivery.attempts,
            logger=logging.LoggerAdapter(log, extra),
            deadline=datetime.now(UTC) + timedelta(seconds=seconds),
            http=self.http,
            sql=self.sql,
        )


def _shown_run(run: Run) -> dict[str, JsonValue]:
    shown: dict[str, JsonValue] = run.model_dump(mode="json")
    if run.args is not None:
        shown["args"] = redact_args(run.args)
    return shown
