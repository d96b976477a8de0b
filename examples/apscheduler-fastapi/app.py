"""A FastAPI app that schedules its own jobs with APScheduler 3, gated by Tickgate: run
it as several replicas and each tick of each job runs in one of them.

    pip install 'tickgate[apscheduler]' fastapi uvicorn
    DATABASE_URL=postgresql://... uvicorn app:app --port 8001   # and 8002, 8003

The three lines that differ from the ungated app are marked. /metrics shows the runs'
series; /runs the runs this replica made (`current_run()` inside the job says which tick
it runs, and the run's id: the idempotency key of its side effects).
"""

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from apscheduler.schedulers.asyncio import AsyncIOScheduler
from fastapi import FastAPI, Response
from prometheus_client import generate_latest

from tickgate.apscheduler import GatedExecutor, current_run  # 1: the gate

made: list[dict[str, str]] = []

scheduler = AsyncIOScheduler(
    timezone="UTC",
    executors={"default": GatedExecutor(os.environ["DATABASE_URL"])},  # 2: its executor
)


async def send_report() -> None:
    run = current_run()
    assert run is not None
    made.append({"job": run.job, "tick": run.scheduled_for.isoformat(), "run": str(run.id)})


def refresh_cache() -> None:
    run = current_run()
    assert run is not None
    made.append({"job": run.job, "tick": run.scheduled_for.isoformat(), "run": str(run.id)})


@asynccontextmanager
async def lifespan(_: FastAPI) -> AsyncIterator[None]:
    scheduler.add_job(send_report, "cron", second="*/2", id="report", replace_existing=True)
    scheduler.add_job(
        refresh_cache,
        "interval",
        seconds=3,
        id="refresh-cache",
        start_date="2026-01-01 00:00:00",  # 3: the anchor every replica shares
        replace_existing=True,
    )
    scheduler.start()
    yield
    scheduler.shutdown()


app = FastAPI(lifespan=lifespan)


@app.get("/runs")
def runs() -> list[dict[str, str]]:
    return made


@app.get("/metrics")
def metrics() -> Response:
    return Response(generate_latest(), media_type="text/plain; version=0.0.4")
