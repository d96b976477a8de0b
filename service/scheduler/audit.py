"""The audit: the tick cursors that lag past their job's reach move on, and every tick
they pass without a ledger row is recorded, as a misfire.

A cursor lags when a tick it waits for was decided by nobody: all replicas were down
past the grace, a job's owner and its standby went together, a loop stalled, or a skip
could not be written. No replica may start such a tick any more, so once it is past
the reach (misfire grace + jitter) only its record is missing; the audit writes it.
One replica per round audits (a chore, as the overdue check), a batch of cursors per
transaction, from the cursors' `overdue_at` index: a round costs the lagging jobs,
not all of them. Whoever audits, on the database's clock, the rows are the same.
"""

import asyncio
import logging

from service.domain.runs import SkipReason
from service.metrics import Metrics
from service.store import Store

log = logging.getLogger(__name__)

# Cursors per transaction, and batches per round at most (the rest wait a round).
AUDIT_BATCH = 50
MOST_BATCHES = 50


async def audit_cursors(store: Store, every_seconds: float, runner: str, metrics: Metrics) -> int:
    """Do this round of the audit, unless a replica began one in the last
    `every_seconds`; how many cursors it moved."""
    if not await store.claim_chore("audit", every_seconds):
        return 0
    moved = 0
    for _ in range(MOST_BATCHES):
        audited = await store.audit_cursors(AUDIT_BATCH, runner)
        for cursor in audited:
            for missed in cursor.missed:
                log.warning(
                    "%d ticks of %s from %s misfired",
                    missed.count,
                    cursor.job,
                    missed.first.isoformat(),
                )
                metrics.ticks_skipped.labels(SkipReason.MISFIRE.value).inc(missed.count)
        moved += len(audited)
        if len(audited) < AUDIT_BATCH:
            break
        await asyncio.sleep(0)  # the walk is CPU work: let ticks fire between batches
    return moved
