"""pgqueuer peer: cron schedules shared through PostgreSQL, and a job queue for bursts.

`prepare` installs pgqueuer's schema and, for a burst, enqueues one job per name with
`execute_after` the burst instant (pgqueuer's one-off at a time: its schedules are cron
only). `run` is one `PgQueuer` process (queue manager and scheduler manager); a steady set
registers one schedule per job, `@pgq.schedule(name, "* * * * * *")` (six fields: the
sixth is seconds), and the processes share each schedule's row, picked with SKIP LOCKED.

pgqueuer hands a schedule's function no nominal tick: the row it gets has already been
moved to the next run. The fire is attributed to the latest cron tick at or before the
moment pgqueuer picked the schedule (the row's `updated`, set by the picking statement).

Run with the pgqueuer peer venv's python; it must not import tickgate.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Awaitable, Callable
from datetime import timedelta

import _wire
import asyncpg
from croniter import croniter
from pgqueuer import PgQueuer, Queries
from pgqueuer.models import Job, Schedule

STEADY_CRON = "* * * * * *"
_EPSILON = timedelta(microseconds=1)


def schedule_tick(schedule: Schedule) -> int:
    """The latest tick of the schedule's cron at or before pgqueuer picked it."""
    picked = schedule.updated + _EPSILON  # croniter's get_prev is strictly earlier
    tick: float = croniter(schedule.expression, start_time=picked).get_prev(float)
    return round(tick)


async def prepare(spec: _wire.Spec) -> None:
    connection = await asyncpg.connect(spec.dsn)
    try:
        queries = Queries.from_asyncpg_connection(connection)
        await queries.install()
        if spec.kind == "burst":
            assert spec.at is not None
            names = spec.names
            delay = timedelta(seconds=spec.at - time.time())
            await queries.enqueue(
                [_wire.FIRE_TASK] * len(names),
                [name.encode() for name in names],
                [0] * len(names),
                [delay] * len(names),
            )
    finally:
        await connection.close()


async def run(spec: _wire.Spec) -> None:
    receiver = _wire.Receiver(spec)
    pool = await asyncpg.create_pool(spec.dsn, min_size=1, max_size=_wire.POOL_MAX)
    try:
        pgq = PgQueuer.from_asyncpg_pool(pool)
        if spec.kind == "steady":
            for name in spec.names:
                pgq.schedule(name, STEADY_CRON)(_scheduled(receiver, name))
        else:

            @pgq.entrypoint(_wire.FIRE_TASK)
            async def fire(job: Job) -> None:
                assert job.payload is not None
                # execute_after is the database's now() plus the delay asked for: the
                # burst instant give or take a few milliseconds
                await receiver.fire(job.payload.decode(), round(job.execute_after.timestamp()))

        _wire.on_stop_signal(pgq.shutdown.set)
        _wire.mark_ready(spec)
        await pgq.run()
    finally:
        await pool.close()
        await receiver.aclose()


def _scheduled(receiver: _wire.Receiver, name: str) -> Callable[[Schedule], Awaitable[None]]:
    async def tick(schedule: Schedule) -> None:
        await receiver.fire(name, schedule_tick(schedule))

    return tick


def main() -> int:
    spec = _wire.parse_args("pgqueuer")
    _wire.run(prepare(spec) if spec.mode == "prepare" else run(spec))
    return 0


if __name__ == "__main__":
    sys.exit(main())
