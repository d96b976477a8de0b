"""Overdue jobs: active jobs whose latest tick is past its grace and never ran (no row,
or a recorded misfire)."""

from service.domain.jobs import Job, missed_tick
from service.domain.runs import SkipReason
from service.store import Store


async def overdue_jobs(store: Store) -> list[Job]:
    """Judged on the database clock, so every replica gives the same answer."""
    now = await store.clock()
    missed = {}
    for job in await store.active_jobs():
        tick = missed_tick(job, now)
        if tick is not None:
            missed[(job.name, tick)] = job
    if not missed:
        return []
    unrun = await store.ticks_without_runs(list(missed), unrun=[SkipReason.MISFIRE])
    return sorted((missed[key] for key in unrun), key=lambda job: job.name)
