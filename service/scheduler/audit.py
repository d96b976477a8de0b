"""The audit: takeover and accounting from the tick cursors.

A cursor lags when the tick it waits for is due longer ago than the takeover time and
nobody decided it: its owner died or stalls, never loaded the job, all replicas were
down, or a skip could not be written. Every replica audits twice per takeover period,
from the cursors' `due_at` index, a batch of cursors per transaction, each cursor locked
by the one replica auditing it (others skip it): a round costs the lagging jobs and
those whose ticks moved on since the last, never all of them. Per lagging cursor:
- the ticks past the job's reach without a row are recorded, as misfires;
- the ticks owed (within reach, due longer ago than the takeover time) are claimed by
  this replica, through the gate like any: an owner that is only late meets the row;
- a tick waiting under queue_one for the run in progress is its waiter's, however late:
  neither recorded nor taken over; if its waiter left the cluster, this replica takes
  its slot and waits in its place (`Runner.take_over`).
No standby holds the job for this: the cursor in the database is all it takes.
"""

import asyncio
import logging
from collections.abc import Callable

from service.domain.cursors import OwedTick, Takeover
from service.domain.jobs import Job
from service.domain.runs import SkipReason
from service.metrics import Metrics
from service.store.ports import Audited, CursorAudit

log = logging.getLogger(__name__)

# Cursors per transaction, and batches per round at most (the rest wait a round).
AUDIT_BATCH = 50
MOST_BATCHES = 50

TakeOver = Callable[[Job, OwedTick], None]


async def audit_cursors(
    store: CursorAudit, takeover: Takeover, runner: str, metrics: Metrics, take_over: TakeOver
) -> int:
    """Do one round of the audit on this replica; how many lagging cursors it moved."""
    await store.refresh_cursors(takeover.after)
    moved = 0
    for _ in range(MOST_BATCHES):
        audited = await store.audit_cursors(AUDIT_BATCH, runner, takeover)
        for cursor in audited:
            _account(cursor, metrics)
            for owed in cursor.owed:
                take_over(cursor.job, owed)
        moved += len(audited)
        if len(audited) < AUDIT_BATCH:
            break
        await asyncio.sleep(0)  # the walk is CPU work: let ticks fire between batches
    return moved


def _account(cursor: Audited, metrics: Metrics) -> None:
    for missed in cursor.missed:
        log.warning(
            "%d ticks of %s from %s misfired",
            missed.count,
            cursor.job.name,
            missed.first.isoformat(),
        )
        metrics.ticks_skipped.labels(SkipReason.MISFIRE.value).inc(missed.count)
    if cursor.owed:
        metrics.ticks_taken_over.inc(len(cursor.owed))
        log.info(
            "taking over %d ticks of %s from %s",
            len(cursor.owed),
            cursor.job.name,
            cursor.owed[0].tick.isoformat(),
        )
