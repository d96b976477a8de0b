"""The outbox of hook deliveries (#24) on the API pool: senders take and settle them,
the API lists a run's. Statements in `hooks_sql`."""

from collections.abc import Mapping
from typing import Any
from uuid import UUID

from pydantic import JsonValue

from service.domain.hooks import ACTION, HOOKS, HookEvent, chain_targets
from service.domain.retry import RetryPolicy
from service.store import hooks_sql
from service.store.base import StoreBase
from service.store.rows import run_from_row
from service.store.values import Delivery, Sending


class OutboxStore(StoreBase):
    async def take_deliveries(self, most: int, sender: str, lease_margin: float) -> list[Sending]:
        """Up to `most` due deliveries, now `sending` for `sender` (see `hooks_sql.TAKE`)."""
        async with self._bounded() as connection:
            taking = hooks_sql.TAKE
            arguments = taking.arguments(most=most, sender=sender, lease_margin=lease_margin)
            rows = await connection.fetch(taking.text, *arguments)
        return [Sending(_delivery(row), run_from_row(row), dict(row["labels"])) for row in rows]

    async def settle_delivery(
        self,
        *,
        delivery: UUID,
        sender: str,
        status: str,
        error: str | None,
        answer: JsonValue,
        retry_in: float | None = None,
    ) -> None:
        settling = hooks_sql.SETTLE
        arguments = settling.arguments(
            id=delivery, sender=sender, status=status, error=error, answer=answer, retry_in=retry_in
        )
        async with self._bounded() as connection:
            await connection.execute(settling.text, *arguments)

    async def run_deliveries(self, run_id: UUID) -> list[Delivery] | None:
        """The run's deliveries, oldest first; None if there is no such run."""
        async with self._bounded() as connection:
            rows = await connection.fetch(hooks_sql.OF_RUN, run_id)
        if not rows:
            return None
        return [_delivery(row) for row in rows if row["delivery_id"] is not None]

    async def job_deliveries(self, job: str, most: int) -> list[Delivery]:
        """The newest `most` deliveries of the job's runs, newest first."""
        async with self._bounded() as connection:
            rows = await connection.fetch(hooks_sql.OF_JOB, job, most)
        return [_delivery(row) for row in rows]

    async def chain_edges(self) -> dict[str, set[str]]:
        """Each job with trigger hooks, and the jobs they trigger."""
        async with self._bounded() as connection:
            rows = await connection.fetch(hooks_sql.CHAIN_EDGES)
        return {row["name"]: chain_targets(HOOKS.validate_python(row["hooks"])) for row in rows}


def _delivery(row: Mapping[str, Any]) -> Delivery:
    return Delivery(
        id=row["delivery_id"],
        run_id=row["run_id"],
        job=row["delivery_job"],
        hook=row["hook"],
        is_default=row["is_default"],
        event=HookEvent(row["event"]),
        action=ACTION.validate_python(row["action"]),
        retry=RetryPolicy.model_validate(row["retry"]),
        status=row["delivery_status"],
        attempts=row["delivery_attempts"],
        due_at=row["due_at"],
        last_error=row["last_error"],
        answer=row["answer"],
        created_at=row["created_at"],
        delivered_at=row["delivered_at"],
    )
