"""Backfill called on two replicas at once still runs each tick exactly once, and a
backfill gives way to the job's own scheduled ticks in a real deployment (it runs in
the API's process, the schedule in the scheduler's)."""

import time
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx

from harness.cluster import serve_many
from harness.receiver import receiving
from harness.waiting import eventually

ANCHOR = "2026-01-01T00:00:00Z"
RANGE = {"from": "2026-01-01T00:00:00Z", "to": "2026-01-01T00:39:00Z"}  # 40 ticks


def test_concurrent_backfills_share_the_ticks(database_url: str, tmp_path: Path) -> None:
    with receiving() as receiver, serve_many(tmp_path, 2, database_url=database_url) as replicas:
        job = {
            "name": "refill",
            "schedule": {"kind": "interval", "every_seconds": 60, "anchor": ANCHOR},
            "task": "http",
            "args": {"url": receiver.url_for("/refill", seconds=0.05)},
        }
        assert httpx.post(f"{replicas[0].url}/v1/jobs", json=job, timeout=10).status_code == 201

        def backfill(replica: Any) -> list[dict[str, Any]]:
            response = httpx.post(f"{replica.url}/v1/jobs/refill/backfill", json=RANGE, timeout=120)
            assert response.status_code == 200, response.text
            items: list[dict[str, Any]] = response.json()["items"]
            return items

        with ThreadPoolExecutor(2) as pool:
            made = list(pool.map(backfill, replicas))

    ticks = [run["scheduled_for"] for runs in made for run in runs]
    expected = [f"2026-01-01T00:{minute:02d}:00Z" for minute in range(40)]
    assert sorted(ticks) == expected  # every tick once, between the two calls
    for runs in made:  # each call ran its share in order
        assert [r["scheduled_for"] for r in runs] == sorted(r["scheduled_for"] for r in runs)
    # The job's own schedule (every minute) may fire a tick of today meanwhile.
    backfilled = [
        r for r in receiver.receipts("refill") if (r.scheduled_for or "").startswith("2026-01-01")
    ]
    delivered = [r.scheduled_for for r in backfilled]
    assert sorted(delivered) == expected


def test_a_backfill_gives_way_to_the_scheduled_ticks_that_fall_due_meanwhile(
    database_url: str, tmp_path: Path
) -> None:
    """A job every 2 s whose run takes 0.5 s, with a 3 s misfire grace, and a backfill of
    20 of its past ticks (10 s of back-to-back runs holding the job's lock): each
    scheduled tick that falls due meanwhile runs between two backfill runs, within its
    grace. Before, the backfill waited on a count kept only in the scheduler's process,
    so in a deployment it never paused, and those ticks misfired."""
    with receiving() as receiver, serve_many(tmp_path, 1, database_url=database_url) as [served]:
        job = {
            "name": "busy",
            "schedule": {"kind": "interval", "every_seconds": 2, "anchor": ANCHOR},
            "task": "http",
            "args": {"url": receiver.url_for("/busy", seconds=0.5)},
            "misfire_grace_seconds": 3,
        }
        assert httpx.post(f"{served.url}/v1/jobs", json=job, timeout=10).status_code == 201
        span = {"from": "2026-01-01T00:00:00Z", "to": "2026-01-01T00:00:38Z"}  # 20 ticks
        began = time.time()
        response = httpx.post(f"{served.url}/v1/jobs/busy/backfill", json=span, timeout=120)
        ended = time.time()
        assert response.status_code == 200, response.text
        assert len(response.json()["items"]) == 20

        def scheduled_meanwhile() -> list[tuple[str, str, str | None]]:
            """The scheduled ticks due while the backfill ran, once none is running."""
            runs = httpx.get(f"{served.url}/v1/jobs/busy/runs", params={"limit": 1000}, timeout=10)
            rows = [
                (run["scheduled_for"], run["status"], run["skip_reason"])
                for run in runs.json()["items"]
                if run["trigger"] == "schedule"
                and began + 1 <= _moment(run["scheduled_for"]) <= ended - 1
            ]
            assert all(status != "running" for _, status, _ in rows), rows
            return rows

        scheduled = eventually(scheduled_meanwhile, 30, "the scheduled ticks' runs to end")
    assert {(status, reason) for _, status, reason in scheduled} == {("succeeded", None)}, scheduled
    assert len(scheduled) >= 4, (began, ended, scheduled)  # ticks fell due mid-backfill


def _moment(stamp: str) -> float:
    return datetime.fromisoformat(stamp).timestamp()
