"""Concurrent writers: one consistent row per job, and a mirror that matches the rows."""

import asyncio
from typing import Any

import httpx

from harness.waiting import eventually_async
from service.app import create_app
from service.config import Settings


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


async def test_concurrent_creates_and_deletes_leave_no_orphan_mirror_entry(
    settings: Settings,
) -> None:
    app = create_app(settings.model_copy(update={"scheduler": True}))
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://t") as client,
    ):
        names = [f"churn-{i % 5}" for i in range(60)]

        async def churn(name: str, i: int) -> None:
            if i % 2:
                await client.delete(f"/v1/jobs/{name}")
            else:
                await client.put(f"/v1/jobs/{name}", json=body(i))

        await asyncio.gather(*(churn(name, i) for i, name in enumerate(names)))
        mirror = app.state.services.mirror

        async def matches() -> bool:
            revisions = await app.state.services.store.active_versions()
            return bool(mirror.mirrored() == revisions)

        await eventually_async(matches, 30, "the mirror to match the rows exactly")
