"""Backfill called on two replicas at once still runs each tick exactly once."""

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from harness.cluster import serve_many
from harness.receiver import receiving

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
