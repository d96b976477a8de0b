"""POST /v1/schedules/preview and GET /v1/tasks."""

import itertools
from datetime import UTC, datetime, timedelta

import httpx


async def test_preview_cron_in_a_zone(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/v1/schedules/preview",
        json={
            "schedule": {"kind": "cron", "expression": "30 2 * * *"},
            "timezone": "America/New_York",
            "after": "2026-03-07T12:00:00Z",
            "count": 3,
        },
    )
    assert response.status_code == 200, response.text
    times = [datetime.fromisoformat(t) for t in response.json()["fire_times"]]
    # 02:30 does not exist on 2026-03-08: it fires right after the jump, 03:00 EDT.
    assert times == [
        datetime(2026, 3, 8, 7, 0, tzinfo=UTC),
        datetime(2026, 3, 9, 6, 30, tzinfo=UTC),
        datetime(2026, 3, 10, 6, 30, tzinfo=UTC),
    ]


async def test_preview_interval_follows_anchor(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/v1/schedules/preview",
        json={
            "schedule": {"kind": "interval", "every_seconds": 90, "anchor": "2026-01-01T00:00:00Z"},
            "after": "2026-01-01T00:02:00Z",
            "count": 2,
        },
    )
    assert response.json()["fire_times"] == ["2026-01-01T00:03:00Z", "2026-01-01T00:04:30Z"]


async def test_preview_defaults_to_ten_from_now(client: httpx.AsyncClient) -> None:
    response = await client.post(
        "/v1/schedules/preview", json={"schedule": {"kind": "cron", "expression": "* * * * * *"}}
    )
    times = [datetime.fromisoformat(t) for t in response.json()["fire_times"]]
    assert len(times) == 10
    assert times[0] > datetime.now(UTC) - timedelta(seconds=5)
    assert all((b - a).total_seconds() == 1 for a, b in itertools.pairwise(times))


async def test_preview_rejects_bad_input(client: httpx.AsyncClient) -> None:
    for body in [
        {"schedule": {"kind": "cron", "expression": "* * *"}},
        {"schedule": {"kind": "cron", "expression": "* * * * *"}, "timezone": "No/Where"},
        {"schedule": {"kind": "cron", "expression": "* * * * *"}, "count": 101},
        {"schedule": {"kind": "cron", "expression": "* * * * *"}, "count": 0},
        {"schedule": {"kind": "cron", "expression": "* * * * *"}, "after": "2026-01-01T00:00:00"},
        {"schedule": {"kind": "cron", "expression": "* * * * *"}, "extra": 1},
    ]:
        response = await client.post("/v1/schedules/preview", json=body)
        assert response.status_code == 422, (body, response.text)


async def test_tasks_list_builtins_with_args_schema(client: httpx.AsyncClient) -> None:
    response = await client.get("/v1/tasks")
    assert response.status_code == 200
    tasks = {t["name"]: t for t in response.json()["items"]}
    assert {"http", "log", "sql"} <= set(tasks)
    assert tasks["log"]["args_schema"]["required"] == ["message"]
    assert "url" in tasks["http"]["args_schema"]["properties"]
    assert tasks["http"]["description"]
