"""GET /v1/jobs?sort=next_run: every job once across pages, soonest next tick first, from the
next-tick book that the API and the overdue check file, against real PostgreSQL."""

import random
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import httpx

from service.scheduler.overdue import CHECK_PAGE, check_overdue
from service.store import Store

START = datetime.now(UTC).replace(microsecond=0) + timedelta(days=1)
LOG = {"task": "log", "args": {"message": "x"}}


def once(hours: int) -> dict[str, Any]:
    return {"kind": "once", "at": (START + timedelta(hours=hours)).isoformat()}


async def create(
    client: httpx.AsyncClient, name: str, schedule: dict[str, Any], **fields: Any
) -> None:
    body = {"name": name, "schedule": schedule, **LOG, **fields}
    created = await client.post("/v1/jobs", json=body)
    assert created.status_code == 201, created.text


async def every_page(client: httpx.AsyncClient, limit: int, **params: str) -> list[dict[str, Any]]:
    """Every job in next-run order, `limit` a page, following the cursors."""
    items: list[dict[str, Any]] = []
    cursor = None
    while True:
        query = {"sort": "next_run", "limit": str(limit), **params}
        page = await client.get("/v1/jobs", params=query | ({"cursor": cursor} if cursor else {}))
        assert page.status_code == 200, page.text
        items += page.json()["items"]
        cursor = page.json()["next_cursor"]
        if cursor is None:
            return items


def next_run_order(items: list[dict[str, Any]]) -> list[str]:
    """The names as ordered by each job's own next_run_at (none last), then by name."""
    return [item["name"] for item in sorted(items, key=_by_next_run)]


def _by_next_run(item: dict[str, Any]) -> tuple[datetime, str]:
    tick = item["next_run_at"]
    return (datetime.fromisoformat(tick) if tick else datetime.max.replace(tzinfo=UTC)), item[
        "name"
    ]


async def test_pages_list_every_job_once_soonest_first(client: httpx.AsyncClient) -> None:
    hours = list(range(40))
    random.Random(14).shuffle(hours)
    for index, hour in enumerate(hours):
        await create(client, f"once-{index:02d}", once(hour))
    # Two jobs due at the same moment: their names decide.
    await create(client, "same-b", once(5))
    await create(client, "same-a", once(5))
    await create(client, "yearly", {"kind": "cron", "expression": "0 0 1 1 *"})
    await create(client, "paused", once(1))
    assert (await client.post("/v1/jobs/paused/pause")).status_code == 200

    items = await every_page(client, limit=7)
    names = [item["name"] for item in items]
    assert len(names) == len(set(names)) == 44, "each job exactly once"
    assert names == next_run_order(items)
    assert names[-1] == "paused"  # no next tick: after every job that has one
    assert names.index("same-a") + 1 == names.index("same-b")

    # A change through the API moves the job at once: the API files its tick.
    first = names[0]
    soonest = {"schedule": once(-12)}
    assert (await client.patch("/v1/jobs/once-39", json=soonest)).status_code == 200
    assert (await client.post("/v1/jobs/paused/resume")).status_code == 200
    items = await every_page(client, limit=10)
    names = [item["name"] for item in items]
    assert names == next_run_order(items)
    assert names[0] == "once-39" != first
    assert names[-1] == "yearly"  # "paused" is back among the ones due tomorrow


async def test_the_overdue_check_files_jobs_the_api_did_not(
    client: httpx.AsyncClient, store: Store, database_url: str
) -> None:
    """A bulk apply books no tick (it would slow it by half): its jobs follow the booked
    ones, by name, until the overdue check files them; it also drops the rows of jobs no
    longer active."""
    bulk = [
        {"name": f"bulk-{index:03d}", "schedule": once(200 - index), **LOG}
        for index in range(CHECK_PAGE + 20)
    ]
    assert (await client.put("/v1/jobs", json={"jobs": bulk})).status_code == 200
    await create(client, "single", once(300))
    await create(client, "soon", once(1))
    assert (await client.post("/v1/jobs/soon/pause")).status_code == 200
    before = [item["name"] for item in await every_page(client, limit=50)]
    assert before[0] == "single"  # the only booked active job
    assert before[1:] == sorted(before[1:]), "then the rest by name"
    assert len(before) == len(bulk) + 2

    assert await check_overdue(store, 0)
    items = await every_page(client, limit=50)
    names = [item["name"] for item in items]
    assert names == next_run_order(items)
    assert names[0] == f"bulk-{len(bulk) - 1:03d}"
    assert names[-2:] == ["single", "soon"]
    connection = await asyncpg.connect(database_url)
    try:
        booked = await connection.fetchval("SELECT count(*) FROM tickgate_next_ticks")
        paused = await connection.fetchval(
            "SELECT count(*) FROM tickgate_next_ticks WHERE job = 'soon'"
        )
    finally:
        await connection.close()
    assert (booked, paused) == (len(bulk) + 1, 0)


async def test_filters_apply_and_foreign_cursors_are_refused(client: httpx.AsyncClient) -> None:
    for index in range(5):
        await create(client, f"keep-{index}", once(10 - index), labels={"team": "a"})
        await create(client, f"drop-{index}", once(index), labels={"team": "b"})
    items = await every_page(client, limit=2, prefix="keep-")
    assert [item["name"] for item in items] == [f"keep-{index}" for index in range(4, -1, -1)]
    items = await every_page(client, limit=3, label="team=b")
    assert [item["name"] for item in items] == [f"drop-{index}" for index in range(5)]
    by_name = (await client.get("/v1/jobs", params={"limit": 1})).json()["next_cursor"]
    refused = await client.get("/v1/jobs", params={"sort": "next_run", "cursor": by_name})
    assert refused.status_code == 422
    both = await client.get("/v1/jobs", params={"sort": "next_run", "overdue": "true"})
    assert both.status_code == 422
    assert (await client.get("/v1/jobs", params={"sort": "soonest"})).status_code == 422
