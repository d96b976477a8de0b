"""Retention and backfill's bounds: no future ticks, no running rows pruned, no rerun
of ticks whose rows retention pruned, and one sweeper pruning at a time."""

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import httpx

from service.store import Store
from service.store.chores import PRUNE_JOBS_PER_STATEMENT

ANCHOR = "2026-01-01T00:00:00Z"
START = datetime(2026, 1, 1, tzinfo=UTC)
JOB: dict[str, Any] = {
    "name": "kept",
    "schedule": {"kind": "interval", "every_seconds": 60, "anchor": ANCHOR},
    "task": "log",
    "args": {"message": "tick"},
}
# The ledger's columns as the runner writes them (tests/integration/test_runner.py).
INSERT_RUN = """INSERT INTO tickgate_runs (id, job, scheduled_for, trigger, status, started_at,
        runner, job_version, lock_key, locked, backend_pid, skip_reason)
    VALUES (gen_random_uuid(), $1, $2, 'schedule', $3, $2, 'x', 1, 0, true, 0, $4)"""


def minute(n: int) -> datetime:
    return START + timedelta(minutes=n)


async def insert_runs(database_url: str, job: str, rows: Sequence[tuple[int, str]]) -> None:
    """Ledger rows of `job` at (minute after START, status): history long past."""
    skip = {"skipped": "overlap"}
    connection = await asyncpg.connect(database_url)
    try:
        await connection.executemany(
            INSERT_RUN, [(job, minute(n), status, skip.get(status)) for n, status in rows]
        )
    finally:
        await connection.close()


async def ledger(client: httpx.AsyncClient, job: str) -> list[tuple[str, str]]:
    """(scheduled_for, status) of the job's rows, oldest tick first."""
    page = (await client.get(f"/v1/jobs/{job}/runs", params={"limit": 1000})).json()
    return sorted((r["scheduled_for"], r["status"]) for r in page["items"])


def iso(n: int) -> str:
    return minute(n).isoformat().replace("+00:00", "Z")


async def test_a_backfill_reaching_into_the_future_is_422(
    client: httpx.AsyncClient, store: Store
) -> None:
    assert (await client.post("/v1/jobs", json=JOB)).status_code == 201
    now = await store.clock()
    body = {
        "from": (now - timedelta(minutes=5)).isoformat(),
        "to": (now + timedelta(minutes=5)).isoformat(),
    }
    response = await client.post("/v1/jobs/kept/backfill", json=body)
    assert response.status_code == 422, response.text
    [problem] = response.json()["errors"]
    assert problem["loc"] == ["body", "to"]
    assert "future" in problem["msg"]
    assert await ledger(client, "kept") == []  # no tick ran early


async def test_retention_spares_running_rows_and_prunes_skipped_ones(
    client: httpx.AsyncClient, store: Store, database_url: str
) -> None:
    await client.post("/v1/jobs", json=JOB)
    history = [(0, "running"), (1, "skipped"), (2, "succeeded"), (3, "running")]
    await insert_runs(database_url, "kept", history + [(n, "succeeded") for n in range(4, 7)])
    # Keep 3 (minutes 4..6): of the older four, the two still running stay.
    assert await store.prune_runs(keep=3) == 2
    assert [status for _, status in await ledger(client, "kept")] == [
        "running",
        "running",
        "succeeded",
        "succeeded",
        "succeeded",
    ]


async def test_retention_spares_the_rows_of_ticks_a_jittered_job_may_still_fire(
    client: httpx.AsyncClient, store: Store, database_url: str
) -> None:
    """A tick fires up to its jitter after it and may start up to the grace after that:
    its row is kept that long and 300 s more, or a replica would find the tick without a
    row and run it again."""
    jittered = JOB | {"name": "jittered", "jitter_seconds": 3600, "misfire_grace_seconds": 60}
    assert (await client.post("/v1/jobs", json=jittered)).status_code == 201
    now = await store.clock()
    ages = {"within the jitter": 50, "past the reach": 70}  # minutes; the reach is 61 + 5
    connection = await asyncpg.connect(database_url)
    try:
        for minutes in ages.values():
            at = now - timedelta(minutes=minutes)
            await connection.execute(INSERT_RUN, "jittered", at, "succeeded", None)
    finally:
        await connection.close()
    assert await store.prune_runs(keep=0) == 1
    page = (await client.get("/v1/jobs/jittered/runs")).json()["items"]
    [kept] = [datetime.fromisoformat(run["scheduled_for"]) for run in page]
    assert now - kept < timedelta(minutes=ages["within the jitter"] + 1)


async def test_a_backfill_over_pruned_ticks_is_409_not_a_rerun(
    client: httpx.AsyncClient, store: Store, database_url: str
) -> None:
    await client.post("/v1/jobs", json=JOB)
    await insert_runs(database_url, "kept", [(n, "succeeded") for n in range(12)])
    assert await store.prune_runs(keep=3) == 9  # minutes 0..8 go; the watermark is 8
    for start in (0, 8):  # over the pruned range, and from the watermark itself
        body = {"from": iso(start), "to": iso(11)}
        response = await client.post("/v1/jobs/kept/backfill", json=body)
        assert response.status_code == 409, response.text
        assert response.json()["detail"] == (
            "runs up to 2026-01-01T00:08:00+00:00 were pruned by retention; backfill from after it"
        )
    later = await client.post(
        "/v1/jobs/kept/backfill", json={"from": "2026-01-01T00:08:01Z", "to": iso(13)}
    )
    assert later.status_code == 200, later.text
    assert [r["scheduled_for"] for r in later.json()["items"]] == [iso(12), iso(13)]
    assert len(await ledger(client, "kept")) == 5  # 9..11 kept, 12..13 backfilled


async def test_the_watermark_only_moves_forward_and_goes_with_its_job(
    client: httpx.AsyncClient, store: Store, database_url: str
) -> None:
    await client.post("/v1/jobs", json=JOB)
    await insert_runs(database_url, "kept", [(n, "succeeded") for n in range(10, 16)])
    assert await store.prune_runs(keep=2) == 4  # through minute 13
    await insert_runs(database_url, "kept", [(n, "succeeded") for n in range(0, 3)])
    # Rows older than the watermark (written by a backfill-like path) prune without
    # moving it back.
    assert await store.prune_runs(keep=2) == 3
    response = await client.post("/v1/jobs/kept/backfill", json={"from": iso(12), "to": iso(20)})
    assert "2026-01-01T00:13:00+00:00" in response.json()["detail"]
    # A job deleted and created again starts without history, so without a watermark.
    assert (await client.delete("/v1/jobs/kept")).status_code == 204
    await client.post("/v1/jobs", json=JOB)
    again = await client.post("/v1/jobs/kept/backfill", json={"from": iso(0), "to": iso(1)})
    assert again.status_code == 200, again.text


async def test_one_replica_prunes_per_round(
    client: httpx.AsyncClient, store: Store, database_url: str
) -> None:
    await client.post("/v1/jobs", json=JOB)
    await insert_runs(database_url, "kept", [(n, "succeeded") for n in range(8)])
    assert await store.prune_runs(keep=3, every_seconds=3600) == 5
    await insert_runs(database_url, "kept", [(n, "succeeded") for n in range(100, 108)])
    # Another replica's sweep, moments later: the round is taken.
    assert await store.prune_runs(keep=3, every_seconds=3600) == 0
    assert len(await ledger(client, "kept")) == 11
    assert await store.prune_runs(keep=3, every_seconds=0) == 8


async def test_a_round_prunes_all_that_is_due_across_every_job(
    client: httpx.AsyncClient, store: Store, database_url: str
) -> None:
    """Far more rows than one statement's batch, over more jobs than one batch holds:
    a round still leaves each job its newest rows and nothing more, so retention keeps
    up with any fire rate (the rate itself is in BENCHMARKS.md)."""
    names = [f"busy-{n:03}" for n in range(PRUNE_JOBS_PER_STATEMENT + 50)]
    for name in names:
        await client.post("/v1/jobs", json=JOB | {"name": name})
    connection = await asyncpg.connect(database_url)
    try:
        await connection.execute(
            """INSERT INTO tickgate_runs (id, job, scheduled_for, trigger, status, started_at,
                   runner, job_version, lock_key, locked, backend_pid)
               SELECT gen_random_uuid(), j.name, $1::timestamptz + make_interval(mins => n),
                   'schedule', 'succeeded', $1, 'x', 1, 0, true, 0
               FROM tickgate_jobs j CROSS JOIN generate_series(0, 99) AS n""",
            START,
        )
        assert await store.prune_runs(keep=5) == len(names) * 95
        per_job = await connection.fetch(
            "SELECT job, count(*) AS n FROM tickgate_runs GROUP BY job"
        )
    finally:
        await connection.close()
    assert {row["n"] for row in per_job} == {5}
    assert len(per_job) == len(names)


async def test_a_job_keeps_its_newest_outputs_within_its_byte_budget(
    client: httpx.AsyncClient, store: Store, database_url: str
) -> None:
    """TICKGATE_OUTPUT_BYTES_PER_JOB (#42): past it, the outputs and logs of a job's
    oldest runs are dropped (the runs stay); another job's are its own budget."""
    for name in ("chatty", "quiet"):
        assert (await client.post("/v1/jobs", json=JOB | {"name": name})).status_code == 201
    await insert_runs(database_url, "chatty", [(n, "succeeded") for n in range(10)])
    await insert_runs(database_url, "quiet", [(n, "succeeded") for n in range(2)])
    connection = await asyncpg.connect(database_url)
    try:
        # About 100 kB of text each, random so that they compress alike.
        await connection.execute(
            """INSERT INTO tickgate_run_outputs (run_id, output)
               SELECT id, jsonb_build_object('body', (SELECT string_agg(md5(random()::text), '')
                                                      FROM generate_series(1, 3125)))
               FROM tickgate_runs"""
        )
        size = await connection.fetchval(
            "SELECT max(pg_column_size(output)) FROM tickgate_run_outputs"
        )
        budget = int(size * 3.5)  # room for three
        assert await store.prune_runs(keep=1000, output_bytes=budget) == 0
        kept = await connection.fetch(
            """SELECT r.job, extract(minute FROM r.scheduled_for)::int AS minute,
                      o.output IS NOT NULL AS has_output
               FROM tickgate_runs r JOIN tickgate_run_outputs o ON o.run_id = r.id
               ORDER BY r.job, r.scheduled_for"""
        )
    finally:
        await connection.close()
    chatty = {row["minute"]: row["has_output"] for row in kept if row["job"] == "chatty"}
    quiet = [row["has_output"] for row in kept if row["job"] == "quiet"]
    assert chatty == {n: n >= 7 for n in range(10)}, chatty  # the newest three fit
    assert quiet == [True, True]
    assert len(await ledger(client, "chatty")) == 10  # the runs themselves stay
