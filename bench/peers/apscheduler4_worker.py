"""APScheduler 4 (pre-release) peer: schedulers sharing a PostgreSQL data store.

`prepare` creates APScheduler's tables (SQLAlchemyDataStore over asyncpg) and adds one
schedule per job: CronTrigger(second="*") for a steady set, DateTrigger(at) for a burst.
`run` is one scheduler process (role both: it turns due schedules into jobs and runs jobs);
start several against the same database. Events travel by AsyncpgEventBroker (NOTIFY).

Run with the apscheduler4 peer venv's python; it must not import tickgate.
"""

from __future__ import annotations

import asyncio
import math
import sys
import time
from datetime import UTC, datetime
from functools import partial

import _wire
import asyncpg
from apscheduler import AsyncScheduler, CoalescePolicy, ConflictPolicy, current_job
from apscheduler.datastores.sqlalchemy import SQLAlchemyDataStore
from apscheduler.eventbrokers.asyncpg import AsyncpgEventBroker
from apscheduler.executors.async_ import AsyncJobExecutor
from apscheduler.triggers.cron import CronTrigger
from apscheduler.triggers.date import DateTrigger
from sqlalchemy.ext.asyncio import create_async_engine

_receiver: _wire.Receiver | None = None


async def fire(job: str) -> None:
    """The task: report the nominal tick APScheduler computed for this job."""
    scheduled = current_job.get().original_scheduled_time  # scheduled_fire_time - jitter
    if scheduled is None or _receiver is None:
        raise RuntimeError("fired outside a schedule")
    await _receiver.fire(job, int(scheduled.timestamp()))


def make_scheduler(spec: _wire.Spec) -> AsyncScheduler:
    # An engine over asyncpg.connect(dsn) accepts every libpq DSN asyncpg does (unix
    # sockets in ?host= included) without SQLAlchemy re-parsing it.
    engine = create_async_engine(
        "postgresql+asyncpg://",
        async_creator=partial(asyncpg.connect, spec.dsn),
        pool_size=_wire.POOL_MAX // 2,
        max_overflow=_wire.POOL_MAX // 2,
    )
    return AsyncScheduler(
        SQLAlchemyDataStore(engine),
        AsyncpgEventBroker(dsn=spec.dsn),
        identity=spec.runner,
        job_executors={"async": AsyncJobExecutor()},
        # the library default; kept
        max_concurrent_jobs=100,
    )


async def prepare(spec: _wire.Spec) -> None:
    async with make_scheduler(spec) as scheduler:
        # max_running_jobs=None: the default (1) lets one job of the task run at a time
        # across the whole cluster.
        await scheduler.configure_task(
            _wire.FIRE_TASK,
            func=fire,
            max_running_jobs=None,
            misfire_grace_time=_wire.MISFIRE_GRACE_SECONDS,
        )
        # CronTrigger keeps start_time's microseconds in every fire time (the default,
        # now(), gives ticks at x.345614 s); start on a whole second for whole-second ticks
        first = datetime.fromtimestamp(math.ceil(time.time()), UTC)
        for name in spec.names:
            if spec.kind == "steady":
                trigger: CronTrigger | DateTrigger = CronTrigger(
                    second="*", timezone="UTC", start_time=first
                )
            else:
                assert spec.at is not None
                trigger = DateTrigger(datetime.fromtimestamp(spec.at, UTC))
            await scheduler.add_schedule(
                _wire.FIRE_TASK,
                trigger,
                id=name,
                kwargs={"job": name},
                # every tick, like Tickgate's coalesce=False; late ones still bounded by
                # the misfire grace
                coalesce=CoalescePolicy.all,
                conflict_policy=ConflictPolicy.replace,
            )


async def run(spec: _wire.Spec) -> None:
    global _receiver  # noqa: PLW0603
    _receiver = _wire.Receiver(spec)
    try:
        async with make_scheduler(spec) as scheduler:
            await scheduler.configure_task(_wire.FIRE_TASK, func=fire)  # the local callable
            _wire.on_stop_signal(lambda: asyncio.ensure_future(scheduler.stop()))
            await scheduler.start_in_background()
            _wire.mark_ready(spec)
            await scheduler.wait_until_stopped()
    finally:
        await _receiver.aclose()


def main() -> int:
    spec = _wire.parse_args("apscheduler4")
    _wire.run(prepare(spec) if spec.mode == "prepare" else run(spec))
    return 0


if __name__ == "__main__":
    sys.exit(main())
