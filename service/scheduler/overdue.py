"""Overdue jobs: active jobs whose latest tick is past its grace and never ran (no row,
or a recorded misfire).

Finding them takes the schedule math of every active job, too much to do when asked
(3 s per 20,000 jobs, on the event loop that fires ticks). So one replica per round
checks, a page of jobs at a time, and files what it found in the overdue book; a
scrape reads the book's size, and the API lists the jobs in it that are still overdue.

The same walk files every active job's next tick in the next-tick book, the order of
GET /v1/jobs?sort=next_run: the schedule math is the same, and the fire path never
writes it (the API files a job's tick when it changes the job).
"""

import asyncio
from collections.abc import Sequence
from datetime import datetime

from service.domain.jobs import Job, missed_tick
from service.domain.runs import SkipReason
from service.store.ports import ChoreStore

# Jobs judged per page of the check; the event loop gets a turn between pages.
CHECK_PAGE = 100
_UNRUN = [SkipReason.MISFIRE]


async def check_overdue(store: ChoreStore, every_seconds: float) -> bool:
    """File the overdue book anew, unless a replica began doing so in the last
    `every_seconds`. True if this replica did it.

    Judged on the database clock, so whichever replica checks, the answer is the same.
    """
    if not await store.take_chore("overdue", every_seconds):
        return False
    now = await store.clock()
    found: list[tuple[str, datetime]] = []
    after = None
    while page := await store.active_jobs_page(after, CHECK_PAGE):
        found += await _unrun_ticks(store, page, now)
        ticks = [(job, job.next_run_at(now)) for job in page]
        await store.file_next_ticks_page(ticks, after, page[-1].name)
        after = page[-1].name
        await asyncio.sleep(0)
    await store.file_next_ticks_page([], after, None)
    await store.file_overdue(found)
    return True


async def overdue_jobs(store: ChoreStore) -> list[Job]:
    """The jobs the last check found overdue, less those run since (or changed so that
    their latest tick is another), in name order."""
    booked = await store.booked_overdue()
    if not booked:
        return []
    now = await store.clock()
    still = {(job.name, tick) for job, tick in booked if missed_tick(job, now) == tick}
    unrun = await store.ticks_without_runs(list(still), unrun=_UNRUN) if still else set()
    return [job for job, tick in booked if (job.name, tick) in unrun]


async def _unrun_ticks(
    store: ChoreStore, jobs: Sequence[Job], now: datetime
) -> list[tuple[str, datetime]]:
    missed = [(job.name, tick) for job in jobs if (tick := missed_tick(job, now)) is not None]
    if not missed:
        return []
    return sorted(await store.ticks_without_runs(missed, unrun=_UNRUN))
