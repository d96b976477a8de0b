"""procrastinate peer: periodic tasks deferred by every worker, deduplicated in PostgreSQL.

`prepare` applies procrastinate's schema and, for a burst, defers one job per name with
`schedule_at` the burst instant. `run` is one worker; a steady set registers one periodic
task per job (`@app.periodic(cron="* * * * * *")`, the sixth field being seconds), and each
worker's periodic deferrer tries to defer every tick (the database keeps one per tick).

Run with the procrastinate peer venv's python; it must not import tickgate.
"""

from __future__ import annotations

import sys
from datetime import UTC, datetime

import _wire
import procrastinate

_receiver: _wire.Receiver | None = None


def make_app(spec: _wire.Spec) -> tuple[procrastinate.App, procrastinate.tasks.Task]:
    app = procrastinate.App(
        connector=procrastinate.PsycopgConnector(
            conninfo=spec.dsn, min_size=1, max_size=_wire.POOL_MAX
        )
    )

    @app.task(name=_wire.FIRE_TASK, pass_context=True)
    async def fire(
        context: procrastinate.JobContext, job: str, timestamp: int | None = None
    ) -> None:
        """The task: a periodic defer passes its tick as `timestamp`; a burst job was
        deferred with `schedule_at`, its nominal time."""
        if timestamp is None:
            scheduled = context.job.scheduled_at
            if scheduled is None:
                raise RuntimeError("fired without a scheduled time")
            timestamp = round(scheduled.timestamp())
        assert _receiver is not None
        await _receiver.fire(job, timestamp)

    if spec.kind == "steady" and spec.mode == "run":
        for name in spec.names:
            app.periodic(cron="* * * * * *", periodic_id=name, task_kwargs={"job": name})(fire)
    return app, fire


async def prepare(spec: _wire.Spec) -> None:
    app, fire = make_app(spec)
    async with app.open_async():
        await app.schema_manager.apply_schema_async()
        if spec.kind == "burst":
            assert spec.at is not None
            deferrer = fire.configure(schedule_at=datetime.fromtimestamp(spec.at, UTC))
            await deferrer.batch_defer_async(*({"job": name} for name in spec.names))


async def run(spec: _wire.Spec) -> None:
    global _receiver  # noqa: PLW0603
    _receiver = _wire.Receiver(spec)
    app, _ = make_app(spec)
    try:
        async with app.open_async():
            _wire.mark_ready(spec)
            # install_signal_handlers (the default) stops the worker on SIGTERM/SIGINT
            await app.run_worker_async(
                name=spec.runner,
                concurrency=_wire.CONCURRENCY,
                # jobs deferred with schedule_at wake no worker when they fall due, so
                # polling decides their lateness; the default is 5 s
                fetch_job_polling_interval=1.0,
            )
    finally:
        await _receiver.aclose()


def main() -> int:
    spec = _wire.parse_args("procrastinate")
    _wire.run(prepare(spec) if spec.mode == "prepare" else run(spec))
    return 0


if __name__ == "__main__":
    sys.exit(main())
