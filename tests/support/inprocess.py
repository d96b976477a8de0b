"""The app in-process, lifespan included, spoken to through httpx; and a manual run
followed to its end."""

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx

from harness.waiting import eventually_async
from service.app import create_app
from service.config import Settings
from service.tasks import TaskRegistry


@asynccontextmanager
async def served(
    settings: Settings, registry: TaskRegistry | None = None
) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings, registry)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://localhost") as http,
    ):
        yield http


async def triggered_run(client: httpx.AsyncClient, name: str) -> dict[str, Any]:
    """Trigger the job once and return its run once it has ended."""
    started = await client.post(f"/v1/jobs/{name}/trigger")
    assert started.status_code == 202, started.text
    return await ended_run(client, started.json()["id"])


async def ended_run(client: httpx.AsyncClient, run_id: str) -> dict[str, Any]:
    """The run (GET /v1/runs/{id}) once it is no longer `running`."""
    shown: dict[str, Any] = {}

    async def done() -> bool:
        shown.update((await client.get(f"/v1/runs/{run_id}")).json())
        return shown["status"] != "running"

    await eventually_async(done, 30, f"run {run_id} to end")
    return shown
