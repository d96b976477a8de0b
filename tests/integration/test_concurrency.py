"""Concurrent writers: one consistent row per job, and a mirror that matches the rows."""

import asyncio
from datetime import UTC, datetime
from typing import Any

import asyncpg
import httpx
import pytest

from harness.waiting import eventually_async
from service.app import create_app
from service.config import Settings
from service.store import Store
from tests.support.db import blocks_someone


def body(i: int) -> dict[str, Any]:
    return {
        "schedule": {"kind": "cron", "expression": "0 0 1 1 *"},
        "task": "log",
        "args": {"message": f"m{i % 7}"},
    }


async def test_fifty_concurrent_puts_leave_one_consistent_row(client: httpx.AsyncClient) -> None:
    responses = await asyncio.gather(
        *(client.put("/v1/jobs/contended", json=body(i)) for i in range(50))
    )
    assert all(r.status_code in {200, 201} for r in responses), [r.text for r in responses]
    assert sum(r.status_code == 201 for r in responses) == 1
    versions = sorted({r.json()["version"] for r in responses})
    # Each effective change got the next version; none was lost or applied twice.
    assert versions == list(range(1, len(versions) + 1))
    stored = (await client.get("/v1/jobs/contended")).json()
    assert stored["version"] == versions[-1]
    final_bodies = [r.json()["args"] for r in responses if r.json()["version"] == versions[-1]]
    assert all(args == stored["args"] for args in final_bodies)


async def test_concurrent_creates_and_deletes_leave_no_orphan_window_entry(
    settings: Settings,
) -> None:
    """Jobs due every second, put and deleted at once over and over: the window comes
    to hold exactly the jobs that stand, each as it stands."""
    app = create_app(settings.model_copy(update={"scheduler": True}))
    every_second = {"schedule": {"kind": "interval", "every_seconds": 1}}
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(
            transport=httpx.ASGITransport(app), base_url="http://localhost"
        ) as client,
    ):
        names = [f"churn-{i % 5}" for i in range(60)]

        async def churn(name: str, i: int) -> None:
            if i % 2:
                await client.delete(f"/v1/jobs/{name}")
            else:
                await client.put(f"/v1/jobs/{name}", json=body(i) | every_second)

        await asyncio.gather(*(churn(name, i) for i, name in enumerate(names)))
        window = app.state.services.window

        async def matches() -> bool:
            revisions = await app.state.services.store.active_versions()
            return bool(revisions) and bool(window.filed() == revisions)

        await eventually_async(matches, 30, "the window to match the rows exactly")


@pytest.mark.parametrize("delete_commits", [True, False])
async def test_a_put_filing_its_next_tick_while_a_delete_commits_neither_fails_nor_orphans(
    client: httpx.AsyncClient, store: Store, database_url: str, delete_commits: bool
) -> None:
    """The interleaving of a PUT racing a DELETE of the same name, driven step by step: the
    PUT has stored its job and files the job's next tick, while a DELETE of the job, begun
    meanwhile, holds the job's row. When the DELETE commits, the filing files nothing (the
    job is gone) rather than failing the PUT on the book's foreign key; when it rolls back,
    the tick is filed."""
    assert (await client.put("/v1/jobs/raced", json=body(0))).status_code == 201
    job = await store.get_job("raced")
    assert job is not None
    await store.file_next_ticks([(job, None)])  # booked at another tick: the filing writes
    deleter = await asyncpg.connect(database_url)
    try:
        delete = deleter.transaction()
        await delete.start()
        await deleter.execute("DELETE FROM tickgate_jobs WHERE name = 'raced'")
        tick = job.next_run_at(datetime.now(UTC))
        filing = asyncio.create_task(store.file_next_ticks([(job, tick)]))
        await eventually_async(lambda: blocks_someone(deleter), 30, "the filing to wait on the row")
        await (delete.commit() if delete_commits else delete.rollback())
        await filing
        booked = await deleter.fetchval(
            "SELECT count(*) FROM tickgate_next_ticks WHERE job = 'raced'"
        )
    finally:
        await deleter.close()
    assert booked == (0 if delete_commits else 1)
