"""An app that schedules its own jobs with APScheduler 3 through `GatedExecutor`, as the
APScheduler gate's test runs it in several processes at once:

    python -m tests.acceptance.gated_app DSN LOG {asyncio|background}

Its jobs: `every-second` (cron, a coroutine), `every-two` (an interval from a shared
start_date, a plain function: it runs in a thread), `fails` (cron every 2 s, raises) and
`slow` (cron every 3 s, takes 2 s: a process killed mid-run is killed in one). Each run
appends `<job> <scheduled tick, epoch seconds> <pid> start|end` to LOG, so the test counts
runs as the jobs saw them, not as the ledger has them.
"""

import asyncio
import os
import signal
import sys
import threading
import time
from pathlib import Path

from apscheduler.schedulers.asyncio import AsyncIOScheduler
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.schedulers.base import BaseScheduler

from tickgate.apscheduler import GatedExecutor, current_run

_write = threading.Lock()


def note(event: str) -> None:
    run = current_run()
    assert run is not None, "called outside a gated run"
    line = f"{run.job} {run.scheduled_for.timestamp():.0f} {os.getpid()} {event}\n"
    with _write, Path(sys.argv[2]).open("a") as log:
        log.write(line)


async def every_second() -> None:
    note("start")


def every_two() -> None:
    note("start")


async def fails() -> None:
    note("start")
    raise RuntimeError("this job always fails")


async def slow() -> None:
    note("start")
    await asyncio.sleep(2)
    note("end")


def add_jobs(scheduler: BaseScheduler) -> None:
    # A grace wide enough that a busy two-core box never turns a late run into a misfire.
    common = {"misfire_grace_time": 30, "replace_existing": True}
    scheduler.add_job(every_second, "cron", second="*", id="every-second", **common)
    start = "2026-01-01 00:00:00"
    scheduler.add_job(every_two, "interval", seconds=2, start_date=start, id="every-two", **common)
    scheduler.add_job(fails, "cron", second="*/2", id="fails", **common)
    scheduler.add_job(slow, "cron", second="*/3", id="slow", **common)


def executor() -> GatedExecutor:
    return GatedExecutor(sys.argv[1], runner=f"app:test:{os.getpid()}")


async def run_asyncio() -> None:
    scheduler = AsyncIOScheduler(executors={"default": executor()}, timezone="UTC")
    add_jobs(scheduler)
    scheduler.start()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    print("started", flush=True)
    await stop.wait()
    scheduler.shutdown()


def run_background() -> None:
    scheduler = BackgroundScheduler(executors={"default": executor()}, timezone="UTC")
    add_jobs(scheduler)
    scheduler.start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print("started", flush=True)
    while not stop.wait(0.2):
        time.sleep(0)
    scheduler.shutdown()


if __name__ == "__main__":
    if sys.argv[3] == "asyncio":
        asyncio.run(run_asyncio())
    else:
        run_background()
