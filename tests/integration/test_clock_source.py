"""What a write stores about time is judged on the database's clock, as the gate judges
ticks, not on the clock of the API replica that took the request: an API pod whose clock
runs a minute ahead must not shift anchors, thresholds or the one-time check."""

from collections.abc import AsyncIterator
from datetime import datetime, timedelta

import httpx
import pytest

from service.app import create_app
from service.config import Settings
from service.faults import Faults
from service.store import Store

AHEAD = timedelta(seconds=60)
# Two clocks read a few statements apart on a loaded box.
CLOSE = timedelta(seconds=10)


@pytest.fixture
async def fast_clock_client(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    """The API, on a replica whose clock runs AHEAD of the database's."""
    app = create_app(settings, faults=Faults(clock_offset=AHEAD))
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://localhost") as http,
    ):
        yield http


def job(name: str, schedule: dict[str, object], **more: object) -> dict[str, object]:
    return {"name": name, "schedule": schedule, "task": "log", "args": {"message": name}} | more


async def created(http: httpx.AsyncClient, body: dict[str, object]) -> dict[str, object]:
    response = await http.post("/v1/jobs", json=body)
    assert response.status_code == 201, response.text
    answer: dict[str, object] = response.json()
    return answer


async def test_an_interval_anchor_is_the_database_time(
    fast_clock_client: httpx.AsyncClient, store: Store
) -> None:
    answer = await created(
        fast_clock_client, job("every-5m", {"kind": "interval", "every_seconds": 300})
    )
    schedule = answer["schedule"]
    assert isinstance(schedule, dict)
    anchor = datetime.fromisoformat(schedule["anchor"])
    assert abs(anchor - await store.clock()) < CLOSE


async def test_the_fence_of_a_new_job_is_the_database_time(
    fast_clock_client: httpx.AsyncClient, store: Store
) -> None:
    await created(fast_clock_client, job("hourly", {"kind": "cron", "expression": "0 * * * *"}))
    stored = await store.get_job("hourly")
    assert stored is not None
    assert abs(stored.fire_after - await store.clock()) < CLOSE


async def test_a_one_time_job_due_before_the_replica_clock_reads_is_accepted(
    fast_clock_client: httpx.AsyncClient, store: Store
) -> None:
    """Due in 30 s by the database: in the future, though the replica's clock has
    already passed it."""
    at = await store.clock() + AHEAD / 2
    await created(fast_clock_client, job("soon", {"kind": "once", "at": at.isoformat()}))


async def test_a_timezone_only_edit_moves_the_threshold(
    client: httpx.AsyncClient, store: Store
) -> None:
    """The same cron in another zone fires at other instants: the ticks between the old
    threshold and now are new to it, never missed, so the threshold moves as for a new schedule."""
    await created(client, job("nine", {"kind": "cron", "expression": "0 9 * * *"}))
    before = await store.get_job("nine")
    assert before is not None
    response = await client.patch("/v1/jobs/nine", json={"timezone": "Asia/Tokyo"})
    assert response.status_code == 200, response.text
    after = await store.get_job("nine")
    assert after is not None
    assert after.timezone == "Asia/Tokyo"
    assert after.fire_after > before.fire_after
    assert abs(after.fire_after - await store.clock()) < CLOSE
