"""Recording the ticks that will not run: each a `skipped` row with its reason, in
batches (a crowd's misfires are one statement), retried while the database is away (an
outage is when misfires pile up), and counted, traced and logged once recorded."""

import asyncio
import logging
from collections.abc import Sequence

from service.domain.runs import Run, SkipReason
from service.metrics import Metrics
from service.scheduler.background import Background, log_failure
from service.scheduler.backoff import Backoff
from service.scheduler.running import RunExecutor
from service.store.coalesce import Coalescer
from service.store.errors import is_unavailable
from service.store.ports import Ledger, Skip
from service.tracing import Tracing

log = logging.getLogger(__name__)

# How long a skip waits for others to share its statement.
SKIP_LINGER_SECONDS = 0.01
# Skips whose record waits for the database to come back, at most (a bound on memory
# through a long outage; what is past it is logged).
UNRECORDED_SKIPS = 100_000


class Skips:
    def __init__(
        self,
        *,
        store: Ledger,
        runner_id: str,
        executor: RunExecutor,
        metrics: Metrics,
        tracing: Tracing,
        background: Background,
    ) -> None:
        self._store = store
        self._runner_id = runner_id
        self._executor = executor
        self._metrics = metrics
        self._tracing = tracing
        self._background = background
        self._batches = Coalescer(self._record, lambda: SKIP_LINGER_SECONDS)
        self._unrecorded = 0  # skips waiting for the database to come back

    def submit(self, skips: list[Skip]) -> None:
        """Record the skips in the background; the caller has settled their ticks."""
        self._background.spawn(self._submit(skips))

    async def _submit(self, skips: list[Skip]) -> None:
        """Record the skips, again and again while the database is away: the ledger's
        uniqueness makes a repeat harmless, and a tick settled here has no other way to
        its row. At most UNRECORDED_SKIPS wait for the database at once; past that, and
        on any other error, they are logged."""
        backoff = Backoff()
        while True:
            try:
                await asyncio.gather(*(self._batches.submit(skip) for skip in skips))
                return
            except Exception as error:  # noqa: BLE001 - retried while the database is away
                if not self._may_retry(skips, error):
                    log_failure(f"record of {len(skips)} skipped ticks", error)
                    return
            self._unrecorded += len(skips)
            try:
                await backoff.pause()
            finally:
                self._unrecorded -= len(skips)

    def _may_retry(self, skips: list[Skip], error: Exception) -> bool:
        fits = self._unrecorded + len(skips) <= UNRECORDED_SKIPS
        return is_unavailable(error) and self._background.accepting and fits

    async def _record(self, skips: Sequence[Skip]) -> list[None]:
        await self.record(skips)
        return [None] * len(skips)

    async def record(self, skips: Sequence[Skip]) -> list[Run]:
        """Record the skips now; those recorded (a tick with a row already records none)."""
        jobs = {skip.job.name: skip.job for skip in skips}
        recorded = await self._store.record_skips(skips, self._runner_id)
        for run in recorded:
            reason = run.skip_reason or SkipReason.MISFIRE
            self._metrics.ticks_skipped.labels(reason.value).inc()
            self._tracing.skipped(run)
            # A misfire is a tick nobody could run; the others are the job's policies.
            level = logging.WARNING if reason is SkipReason.MISFIRE else logging.INFO
            at = run.scheduled_for.isoformat()
            log.log(level, "tick %s of %s skipped: %s (%s)", at, run.job, reason, run.error)
        await asyncio.gather(
            *(self._executor.tick_ended(jobs[run.job], run.scheduled_for) for run in recorded)
        )
        return recorded
