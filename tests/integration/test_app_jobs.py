"""Jobs fired by an app (the APScheduler gate, service/store/gate.py) as the ledger and
the API see them: each tick claimed once, whoever asks; their runs listed; read-only in
the API except pause, resume and delete; never fired by a replica."""

import asyncio
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from service.domain.errors import Conflict
from service.domain.jobs import JobSpec
from service.domain.names import lock_key
from service.domain.runs import RunStatus, SkipReason
from service.domain.schedules import CHECKED
from service.store.gate import AppGate, Claim

TICK = datetime(2026, 12, 7, 12, 0, 0, tzinfo=UTC)


def app_spec(trigger: str = "cron[second='*']") -> JobSpec:
    return JobSpec.model_validate(
        {
            "schedule": {"kind": "app", "trigger": trigger},
            "task": "app:reports:nightly",
            "default_hooks": False,
        },
        context={CHECKED: True},
    )


@pytest.fixture
async def gate(database_url: str) -> AsyncIterator[AppGate]:
    opened = await AppGate.open(database_url, "app:test:1", max_size=6, migrate=False)
    try:
        yield opened
    finally:
        await opened.close()


async def claim(gate: AppGate, name: str, tick: datetime, *, locked: bool = True) -> Claim:
    async with gate.session() as session:
        found, run = await session.claim(name, tick, lock_key=lock_key(name) if locked else None)
        if run is not None:
            await session.finish(run, RunStatus.SUCCEEDED, None)
            await session.unlock()
        return found


async def test_each_tick_is_claimed_once_among_racing_processes(database_url: str) -> None:
    gates = [await AppGate.open(database_url, f"app:p{i}", migrate=False) for i in range(4)]
    try:
        await gates[0].register("report", app_spec())
        for second in range(5):
            tick = TICK + timedelta(seconds=second)
            answers = await asyncio.gather(*(claim(g, "report", tick) for g in gates))
            # One process runs the tick; the others find its lock or its row.
            assert answers.count(Claim.CLAIMED) == 1, answers
            assert set(answers) <= {Claim.CLAIMED, Claim.DECIDED, Claim.HELD}
        # A process that comes late finds the row: the tick is not run again.
        assert await claim(gates[3], "report", TICK) is Claim.DECIDED
    finally:
        for g in gates:
            await g.close()


async def test_a_held_lock_is_an_overlap_only_behind_a_live_earlier_run(gate: AppGate) -> None:
    await gate.register("report", app_spec())
    async with gate.session() as first:
        found, run = await first.claim("report", TICK, lock_key=lock_key("report"))
        assert found is Claim.CLAIMED
        async with gate.session() as second:
            later = TICK + timedelta(seconds=1)
            assert (await second.claim("report", later, lock_key=lock_key("report")))[
                0
            ] is Claim.HELD
            assert await second.skip("report", later, SkipReason.OVERLAP, "behind")
            # The tick being claimed by the lock's holder itself is not skipped.
            assert not await second.skip("report", TICK, SkipReason.OVERLAP, "behind")
        assert run is not None
        await first.finish(run, RunStatus.SUCCEEDED, None)
        await first.unlock()


async def test_a_run_whose_process_died_is_abandoned_not_run_again(
    gate: AppGate, database_url: str
) -> None:
    await gate.register("report", app_spec())
    dying = await AppGate.open(database_url, "app:dies", migrate=False)
    try:
        async with dying.session() as session:
            found, _ = await session.claim("report", TICK, lock_key=lock_key("report"))
            assert found is Claim.CLAIMED
            # The process dies mid-run: its backend goes, and its lock with it (the
            # call waits until the backend has exited).
            async with gate.session() as killer:
                await killer._connection.execute(
                    "SELECT pg_terminate_backend(backend_pid, 10000) FROM tickgate_runs"
                )
    finally:
        await dying.close()
    assert await claim(gate, "report", TICK) is Claim.DECIDED
    assert await claim(gate, "report", TICK + timedelta(seconds=1)) is Claim.CLAIMED
    async with gate.session() as probe:
        rows = await probe._connection.fetch(
            "SELECT scheduled_for, status, error FROM tickgate_runs ORDER BY scheduled_for"
        )
    assert [(r["status"]) for r in rows] == ["abandoned", "succeeded"]
    assert "stopped without finishing" in rows[0]["error"]


async def test_a_paused_job_is_not_run_and_a_deleted_one_is_unknown(
    gate: AppGate, client: httpx.AsyncClient
) -> None:
    await gate.register("report", app_spec())
    assert (
        await client.post("/v1/jobs/report/pause", json={"note": "quarter end"})
    ).status_code == 200
    assert await claim(gate, "report", TICK) is Claim.INACTIVE
    assert (await client.post("/v1/jobs/report/resume")).status_code == 200
    assert await claim(gate, "report", TICK) is Claim.CLAIMED
    assert (await client.delete("/v1/jobs/report")).status_code == 204
    assert await claim(gate, "report", TICK + timedelta(seconds=1)) is Claim.UNKNOWN


async def test_the_api_shows_app_jobs_and_their_runs_and_changes_none(
    gate: AppGate, client: httpx.AsyncClient
) -> None:
    await gate.register("report", app_spec("interval[0:00:05]"))
    assert await claim(gate, "report", TICK) is Claim.CLAIMED
    shown = (await client.get("/v1/jobs/report")).json()
    assert shown["schedule"] == {
        "kind": "app",
        "trigger": "interval[0:00:05]",
        "scheduler": "apscheduler",
    }
    assert shown["schedule_text"] == "Fired by an app (apscheduler): interval[0:00:05]"
    assert shown["next_run_at"] is None
    runs = (await client.get("/v1/jobs/report/runs")).json()["items"]
    assert [(r["status"], r["runner"], r["scheduled_for"]) for r in runs] == [
        ("succeeded", "app:test:1", "2026-12-07T12:00:00Z")
    ]
    body = {
        "schedule": {"kind": "cron", "expression": "* * * * *"},
        "task": "log",
        "args": {"message": "hi"},
    }
    for response in (
        await client.put("/v1/jobs/report", json=body),
        await client.patch("/v1/jobs/report", json={"description": "x"}),
        await client.post("/v1/jobs/report/trigger"),
        await client.post(
            "/v1/jobs/report/backfill",
            json={"from": "2026-12-07T11:00:00Z", "to": "2026-12-07T11:00:10Z"},
        ),
        await client.post(f"/v1/runs/{runs[0]['id']}/cancel"),
    ):
        assert response.status_code == 409, response.text
        assert "fired by an app" in response.json()["detail"]
    assert (await client.get("/v1/jobs/report")).json()["version"] == shown["version"]


async def test_the_api_refuses_to_declare_an_app_schedule(client: httpx.AsyncClient) -> None:
    body = {
        "name": "sneaky",
        "schedule": {"kind": "app", "trigger": "x"},
        "task": "log",
        "args": {"message": "hi"},
    }
    response = await client.post("/v1/jobs", json=body)
    assert response.status_code == 422
    patch = {"schedule": {"kind": "app", "trigger": "x"}}
    assert (
        await client.post(
            "/v1/jobs", json=body | {"schedule": {"kind": "cron", "expression": "* * * * *"}}
        )
    ).status_code == 201
    response = await client.patch("/v1/jobs/sneaky", json=patch)
    assert response.status_code == 422
    assert "written by an app's gate" in response.text


async def test_an_app_job_cannot_take_a_name_tickgate_fires(
    gate: AppGate, client: httpx.AsyncClient
) -> None:
    body = {
        "name": "report",
        "schedule": {"kind": "cron", "expression": "* * * * *"},
        "task": "log",
        "args": {"message": "hi"},
    }
    assert (await client.post("/v1/jobs", json=body)).status_code == 201
    with pytest.raises(Conflict, match="a job Tickgate fires itself"):
        await gate.register("report", app_spec())


async def test_metrics_show_the_last_success_of_an_app_job(
    gate: AppGate, client: httpx.AsyncClient
) -> None:
    """The series a replica exports for its own runs, for the app's job from the ledger:
    the alert on a stale last success covers it."""
    await gate.register("report", app_spec())
    series = 'tickgate_job_last_success_timestamp_seconds{job="report"}'
    assert series not in (await client.get("/metrics")).text  # no success yet
    assert await claim(gate, "report", TICK) is Claim.CLAIMED
    exposition = (await client.get("/metrics")).text
    [line] = [line for line in exposition.splitlines() if line.startswith(series)]
    async with gate.session() as probe:
        finished = await probe._connection.fetchval(
            "SELECT finished_at FROM tickgate_runs WHERE job = 'report'"
        )
    assert float(line.split()[-1]) == finished.timestamp()
    assert (await client.delete("/v1/jobs/report")).status_code == 204
    assert series not in (await client.get("/metrics")).text
