"""GET /v1/runs: every job's runs newest first, filtered and paged, against real PostgreSQL."""

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import asyncpg
import httpx

START = datetime(2026, 1, 1, tzinfo=UTC)
JOBS = ("alpha", "beta", "gamma")
PLUS_TWO = timezone(timedelta(hours=2))
# The ledger's columns as the runner writes them (tests/integration/test_runner.py).
INSERT_RUN = """INSERT INTO tickgate_runs (id, job, scheduled_for, trigger, status, started_at,
        runner, job_version, lock_key, locked, backend_pid, skip_reason)
    VALUES (gen_random_uuid(), $1, $2, 'schedule', $3, $2, 'x', 1, 0, true, 0, $4)
    RETURNING id"""


def minute(n: int) -> datetime:
    return START + timedelta(minutes=n)


def iso(n: int) -> str:
    """As the API writes a moment."""
    return minute(n).isoformat().replace("+00:00", "Z")


async def add_jobs(client: httpx.AsyncClient, *names: str) -> None:
    for name in names:
        body = {
            "name": name,
            "schedule": {"kind": "cron", "expression": "0 0 1 1 *"},
            "task": "log",
            "args": {"message": "x"},
        }
        assert (await client.post("/v1/jobs", json=body)).status_code == 201


async def insert_runs(
    database_url: str, rows: Sequence[tuple[str, int, str]]
) -> list[tuple[datetime, str]]:
    """Ledger rows (job, minute after START, status); their (started_at, id)."""
    connection = await asyncpg.connect(database_url)
    try:
        inserted = []
        for job, n, status in rows:
            skip = "overlap" if status == "skipped" else None
            run_id = await connection.fetchval(INSERT_RUN, job, minute(n), status, skip)
            inserted.append((minute(n), str(run_id)))
        return inserted
    finally:
        await connection.close()


async def listed(client: httpx.AsyncClient, **params: Any) -> list[dict[str, Any]]:
    response = await client.get("/v1/runs", params=params | {"limit": 1000})
    assert response.status_code == 200, response.text
    assert response.json()["next_cursor"] is None
    items: list[dict[str, Any]] = response.json()["items"]
    return items


def newest_first(runs: list[tuple[datetime, str]]) -> list[str]:
    return [run_id for _, run_id in sorted(runs, reverse=True)]


async def test_pages_cross_jobs_newest_first_losing_and_repeating_nothing(
    client: httpx.AsyncClient, database_url: str
) -> None:
    await add_jobs(client, *JOBS)
    # Every job runs at each even minute: three runs share each started_at, so the
    # order within a moment (id, descending) decides page edges too.
    rows = [(job, n, "succeeded") for n in range(0, 24, 2) for job in JOBS]
    expected = await insert_runs(database_url, rows)
    seen: list[str] = []
    cursor, fresh = None, 0
    while True:
        params: dict[str, Any] = {"limit": 7} | ({"cursor": cursor} if cursor else {})
        page = (await client.get("/v1/runs", params=params)).json()
        seen += [run["id"] for run in page["items"]]
        cursor = page["next_cursor"]
        if cursor is None:
            break
        # While paging: newer runs start (above the cursor: they belong to no later
        # page), and an older tick is backfilled (below it: a later page shows it).
        fresh += 1
        await insert_runs(database_url, [(JOBS[fresh % 3], 1000 + fresh, "running")])
        expected += await insert_runs(database_url, [(JOBS[fresh % 3], -fresh, "failed")])
    assert seen == newest_first(expected)
    assert len(seen) == len(set(seen))
    first = (await client.get("/v1/runs", params={"limit": 1})).json()["items"][0]
    assert first["started_at"] == iso(1000 + fresh)
    assert set(first) >= {"id", "job", "scheduled_for", "status", "trigger", "skip_reason"}


async def test_filters_by_status_job_and_start_time(
    client: httpx.AsyncClient, database_url: str
) -> None:
    await add_jobs(client, "alpha", "beta")
    statuses = ["succeeded", "failed", "timed_out", "skipped", "running", "cancelled"]
    runs = await insert_runs(
        database_url,
        [(job, n, statuses[n % 6]) for n in range(12) for job in ("alpha", "beta")],
    )
    by_id = dict(zip((run_id for _, run_id in runs), runs, strict=True))

    def ids(items: list[dict[str, Any]]) -> list[str]:
        return [item["id"] for item in items]

    failed = await listed(client, status="failed")
    assert [run["status"] for run in failed] == ["failed"] * 4
    assert ids(failed) == newest_first([by_id[i] for i in ids(failed)])
    repeated = await client.get("/v1/runs", params=[("status", "failed"), ("status", "skipped")])
    comma = await listed(client, status="failed,skipped")
    assert ids(repeated.json()["items"]) == ids(comma)
    assert sorted(run["status"] for run in comma) == ["failed"] * 4 + ["skipped"] * 4
    beta = await listed(client, job="beta")
    assert [run["job"] for run in beta] == ["beta"] * 12
    assert await listed(client, job="nobody") == []
    # since is inclusive, until exclusive; any UTC offset reads the same moment.
    since = minute(3).astimezone(PLUS_TWO).isoformat()
    window = await listed(client, since=since, until=minute(6).isoformat())
    assert sorted({run["started_at"] for run in window}) == [iso(n) for n in (3, 4, 5)]
    both = await listed(client, job="alpha", status="running", since=minute(4).isoformat())
    assert [(run["job"], run["started_at"]) for run in both] == [
        ("alpha", iso(10)),
        ("alpha", iso(4)),
    ]


async def test_bad_parameters_are_422_naming_the_parameter(client: httpx.AsyncClient) -> None:
    bad: list[tuple[dict[str, Any], list[Any]]] = [
        ({"status": "exploded"}, ["query", "status", 0]),
        ({"status": "failed,nope"}, ["query", "status", 1]),
        ({"since": "2026-01-01T00:00:00"}, ["query", "since"]),
        ({"until": "yesterday"}, ["query", "until"]),
        ({"since": "9999-12-31T23:00:00-05:00"}, ["query", "since"]),
        ({"limit": 0}, ["query", "limit"]),
        ({"limit": 1001}, ["query", "limit"]),
        ({"job": "no such name!"}, ["query", "job"]),
        ({"cursor": "garbage"}, ["query", "cursor"]),
        ({"colour": "blue"}, ["query", "colour"]),
    ]
    for params, loc in bad:
        response = await client.get("/v1/runs", params=params)
        assert response.status_code == 422, (params, response.text)
        assert [problem["loc"] for problem in response.json()["errors"]] == [loc], params
