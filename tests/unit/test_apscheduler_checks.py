"""What `GatedExecutor` refuses before anything runs: jobs whose ticks the processes would
not share (tickgate/apscheduler.py, `check_job`)."""

import pytest
from apscheduler.schedulers.asyncio import AsyncIOScheduler

from tickgate.apscheduler import GatedExecutor, check_job

# Never connected to: the checks come before the first run opens the gate.
DSN = "postgresql://nobody@127.0.0.1:1/none"


async def job() -> None:
    return None


async def test_an_interval_without_start_date_fails_the_schedulers_start() -> None:
    scheduler = AsyncIOScheduler(executors={"default": GatedExecutor(DSN)}, timezone="UTC")
    scheduler.add_job(job, "interval", seconds=5, id="no-anchor")
    with pytest.raises(ValueError, match="interval job 'no-anchor' has no start_date") as refused:
        scheduler.start()
    assert "Set start_date= (the anchor every tick counts from)" in str(refused.value)


async def test_an_interval_with_a_shared_start_date_is_taken() -> None:
    scheduler = AsyncIOScheduler(executors={"default": GatedExecutor(DSN)}, timezone="UTC")
    scheduler.add_job(job, "interval", seconds=5, start_date="2026-01-01 00:00:00", id="anchored")
    scheduler.add_job(job, "cron", minute="*/5", id="cron-job")
    scheduler.start(paused=True)
    scheduler.shutdown(wait=False)


@pytest.mark.parametrize(
    ("options", "refusal"),
    [
        ({"trigger": "cron", "second": "*", "jitter": 3, "id": "jittery"}, "jitter draws"),
        ({"trigger": "cron", "second": "*"}, "has no id of its own"),
        ({"trigger": "cron", "second": "*", "id": "with space"}, "not a Tickgate job name"),
        ({"trigger": "date", "run_date": "2026-12-24 18:00:00.250000", "id": "eve"}, "fractions"),
    ],
)
async def test_ticks_a_process_computes_for_itself_are_refused(
    options: dict[str, object], refusal: str
) -> None:
    scheduler = AsyncIOScheduler(timezone="UTC")
    added = scheduler.add_job(job, **options)
    with pytest.raises(ValueError, match=refusal):
        check_job(added)
