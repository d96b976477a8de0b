"""An edit of a job's ticks and its cursor (issue 41): a change of window (`start_at`,
`end_at`) moves the cursor as a change of schedule does, every writer's; the ticks of
the old definition still undecided at the edit (or a pause) are recorded `superseded`.
A skip worked out from an older definition: tests/integration/test_fire_ports.py."""

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import uuid4

import asyncpg
import httpx
import pytest

from harness.accounting import OUTCOMES, judge_cursors
from harness.waiting import eventually_async
from service.app import create_app
from service.config import Settings
from service.domain.jobs import Job, JobSpec, create_job
from service.domain.runs import RunStatus, RunTrigger
from service.store import Store
from service.store.ports import RunEnd, TickClaim
from service.store.sessions import LockSessions
from tests.support.fire import EVERY_SECOND, runs_of

SECOND = timedelta(seconds=1)
SUCCEEDED = RunEnd(RunStatus.SUCCEEDED, None, None, 1)
EVERY_SECOND_JSON = {"kind": "cron", "expression": "* * * * * *"}


@asynccontextmanager
async def scheduling(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    """The app with its scheduler on, in-process."""
    app = create_app(settings.model_copy(update={"scheduler": True, "reconcile_seconds": 1}))
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://localhost") as http,
    ):
        yield http


def _job(name: str, **fields: Any) -> dict[str, Any]:
    args = {"message": name}
    return {"name": name, "schedule": EVERY_SECOND_JSON, "task": "log", "args": args} | fields


async def _scheduled_runs(client: httpx.AsyncClient, name: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = (await client.get(f"/v1/jobs/{name}/runs")).json()["items"]
    return [run for run in items if run["trigger"] in {"schedule", "catchup"}]


async def test_a_start_moved_earlier_fires_from_the_next_tick(settings: Settings) -> None:
    """A job made to start in an hour, patched to start now (and one whose start is
    removed), fires within seconds; at 1fbbe32 its cursor stayed at the old start."""
    later = (datetime.now(UTC) + timedelta(hours=1)).replace(microsecond=0)
    async with scheduling(settings) as client:
        for name in ("moved", "unbounded"):
            made = await client.post("/v1/jobs", json=_job(name, start_at=later.isoformat()))
            assert made.status_code == 201
        now = datetime.now(UTC)
        patches = {"moved": {"start_at": now.isoformat()}, "unbounded": {"start_at": None}}
        for name, patch in patches.items():
            patched = await client.patch(f"/v1/jobs/{name}", json=patch)
            assert patched.status_code == 200
            assert datetime.fromisoformat(patched.json()["next_run_at"]) < later

        async def both_fired() -> bool:
            return all([await _scheduled_runs(client, name) for name in patches])

        await eventually_async(both_fired, 20, "both jobs to fire before their old start")


async def test_a_completed_job_whose_end_is_extended_fires_again(settings: Settings) -> None:
    """A job whose end passed (completed by the completion chore) and whose `end_at` is then
    moved a day on is active again and fires; at 1fbbe32 it stayed completed."""
    end = datetime.now(UTC).replace(microsecond=0) + 2 * SECOND
    async with scheduling(settings) as client:
        assert (
            await client.post("/v1/jobs", json=_job("ended", end_at=end.isoformat()))
        ).is_success

        async def completed() -> bool:
            return bool((await client.get("/v1/jobs/ended")).json()["state"] == "completed")

        await eventually_async(completed, 30, "the job to complete after its window")
        extended = (datetime.now(UTC) + timedelta(days=1)).isoformat()
        patched = await client.patch("/v1/jobs/ended", json={"end_at": extended})
        assert patched.json()["state"] == "active"

        async def fired_after_its_old_end() -> bool:
            runs = await _scheduled_runs(client, "ended")
            return any(datetime.fromisoformat(run["scheduled_for"]) > end for run in runs)

        await eventually_async(fired_after_its_old_end, 20, "a tick after the old end to fire")


async def test_an_end_extended_after_the_last_tick_opens_the_cursor_at_the_next(
    client: httpx.AsyncClient, store: Store, sessions: LockSessions
) -> None:
    """A minutely job whose window ends before its second tick: once its first tick ran
    (the cursor parks past its last tick) and while it is still active, `end_at` moves a
    day on, by PATCH, by PUT and by a bulk apply. Its cursor then waits for the next
    tick, the one the API shows; at 1fbbe32 it stayed parked, and the job never fired
    again."""
    now = await store.clock()
    anchor = now.replace(microsecond=0) - SECOND
    schedule = {"kind": "interval", "every_seconds": 60, "anchor": anchor.isoformat()}
    end = anchor + 30 * SECOND
    later = (end + timedelta(days=1)).isoformat()
    names = ("patched", "put", "applied")
    for name in names:
        fields = _job(name, schedule=schedule, end_at=end.isoformat())
        spec = JobSpec.model_validate({k: v for k, v in fields.items() if k != "name"})
        made = create_job(name, spec, anchor - SECOND)  # a moment before its first tick
        job = (await store.mutate_job(name, lambda _, made=made: made)).after
        assert job is not None
        await _run_tick(sessions, job, anchor)
        assert await store.cursor(name) != anchor + 60 * SECOND  # parked past its last tick
    assert (await client.patch("/v1/jobs/patched", json={"end_at": later})).status_code == 200
    put = _job("put", schedule=schedule, end_at=later)
    assert (await client.put("/v1/jobs/put", json=put)).status_code == 200
    applied = await client.put(
        "/v1/jobs", json={"jobs": [_job("applied", schedule=schedule, end_at=later)]}
    )
    assert applied.status_code == 200, applied.text
    for name in names:
        shown = (await client.get(f"/v1/jobs/{name}")).json()
        assert shown["state"] == "active"
        assert datetime.fromisoformat(shown["next_run_at"]) == anchor + 60 * SECOND
        assert await store.cursor(name) == anchor + 60 * SECOND, name


async def _run_tick(sessions: LockSessions, job: Job, tick: datetime) -> None:
    """Claim and finish `tick`, as the replica owning the job would."""
    async with sessions.session(5) as session:
        [claimed] = await session.claim([_claim(job, tick)])
        assert claimed.run is not None
        await session.finish(claimed.run.id, SUCCEEDED, job.lock_key)


def _claim(job: Job, at: datetime) -> TickClaim:
    return TickClaim(job, at, RunTrigger.SCHEDULE, "r", uuid4(), True)


@pytest.mark.parametrize("writer", ["patch", "put", "bulk"])
async def test_the_ticks_undecided_at_a_schedule_change_are_recorded_superseded(
    client: httpx.AsyncClient,
    store: Store,
    sessions: LockSessions,
    database_url: str,
    writer: str,
) -> None:
    """A 1 s job whose last 20 s nobody decided (no replica up), but one tick in the
    middle, is given another schedule (by PATCH, PUT or a bulk apply): its old ticks up to
    the edit end with one outcome each, two `superseded` rows counting the runs of ticks
    without a row; the accounting of the old definition, up to the edit, holds. At
    1fbbe32 they had none."""
    made = await store.clock() - 20 * SECOND
    spec = JobSpec(schedule=EVERY_SECOND, task="log", args={"message": "changed"})
    job = (await store.mutate_job("changed", lambda _: create_job("changed", spec, made))).after
    assert job is not None
    assert job.first_tick is not None
    middle = job.first_tick + 10 * SECOND
    await _run_tick(sessions, job, middle)
    hourly = {"kind": "cron", "expression": "0 * * * *"}
    declared = _job("changed", schedule=hourly, args={"message": "changed"})
    if writer == "patch":
        written = await client.patch("/v1/jobs/changed", json={"schedule": hourly})
    elif writer == "put":
        written = await client.put("/v1/jobs/changed", json=declared)
    else:
        written = await client.put("/v1/jobs", json={"jobs": [declared]})
    assert written.status_code == 200, written.text
    edited = await store.get_job("changed")
    assert edited is not None
    skips = [run for run in await runs_of(store, "changed") if run.status is RunStatus.SKIPPED]
    assert {run.skip_reason and run.skip_reason.value for run in skips} == {"superseded"}
    assert sum(run.missed_ticks or 1 for run in skips) >= 19
    last = max(run.scheduled_for for run in skips)
    # Through the moment the edit locked the cursor (when its rows are written): on a
    # starved machine that can be seconds after the moment its new definition starts.
    assert all(run.scheduled_for <= run.started_at for run in skips)
    assert edited.fire_after - last < SECOND  # the last old tick before the edit
    period = {"changed": 1}
    old = [{"job": "changed", "threshold": made.timestamp(), "cursor": last.timestamp() + 0.5}]
    assert judge_cursors(old, await _outcomes(database_url, "changed"), period) == []
    # The new definition's cursor waits for its own first tick.
    assert await store.cursor("changed") == edited.first_tick


async def _outcomes(database_url: str, job: str) -> list[Any]:
    connection = await asyncpg.connect(database_url)
    try:
        return list(await connection.fetch(OUTCOMES, [job]))
    finally:
        await connection.close()


async def test_the_ticks_undecided_at_a_pause_are_recorded_superseded(
    client: httpx.AsyncClient, store: Store, database_url: str
) -> None:
    """A 1 s job whose last 10 s nobody decided is paused: those ticks end with one
    outcome, one `superseded` row counting them; at 1fbbe32 they had none, and the
    resume started the cursor again past them."""
    made = await store.clock() - 10 * SECOND
    spec = JobSpec(schedule=EVERY_SECOND, task="log", args={"message": "paused"})
    job = (await store.mutate_job("paused", lambda _: create_job("paused", spec, made))).after
    assert job is not None
    assert (await client.post("/v1/jobs/paused/pause")).status_code == 200
    rows = await runs_of(store, "paused")
    assert [(r.status.value, r.skip_reason and r.skip_reason.value) for r in rows] == [
        ("skipped", "superseded")
    ]
    [skip] = rows
    assert skip.missed_ticks is not None
    assert skip.missed_ticks >= 9
    cursor = skip.scheduled_for.timestamp() + 0.5  # the old ticks, up to the pause
    old = [{"job": "paused", "threshold": made.timestamp(), "cursor": cursor}]
    assert judge_cursors(old, await _outcomes(database_url, "paused"), {"paused": 1}) == []


# A claim's row as the claim statement writes it, for a transaction that stands in for a
# claim holding the cursor (the claim locks it for the statement that inserts the row).
_CLAIMED_ROW = """INSERT INTO tickgate_runs (id, job, scheduled_for, trigger, status,
        started_at, finished_at, duration_ms, attempts, runner, job_version, lock_key,
        locked, backend_pid)
    SELECT gen_random_uuid(), name, $2, 'schedule', 'succeeded', clock_timestamp(),
        clock_timestamp(), 0, 1, 'claimer', version, lock_key, true, pg_backend_pid()
    FROM tickgate_jobs WHERE name = $1"""


async def test_an_edit_waits_for_a_claim_holding_the_cursor_and_leaves_its_tick_alone(
    client: httpx.AsyncClient, store: Store, database_url: str
) -> None:
    """A claim of the tick at the cursor holds the cursor when the schedule changes: the
    edit waits for it, then finds its row and supersedes only the ticks after it. The
    first writer of a tick wins; no tick ends with two outcomes, or none."""
    made = await store.clock() - 5 * SECOND
    spec = JobSpec(schedule=EVERY_SECOND, task="log", args={"message": "raced"})
    job = (await store.mutate_job("raced", lambda _: create_job("raced", spec, made))).after
    assert job is not None
    assert job.first_tick is not None
    claimer = await asyncpg.connect(database_url)
    try:
        claim = claimer.transaction()
        await claim.start()
        await claimer.execute(
            "SELECT 1 FROM tickgate_cursors WHERE job = 'raced' FOR NO KEY UPDATE"
        )
        body = {"schedule": {"expression": "0 * * * *"}}
        edit = asyncio.create_task(client.patch("/v1/jobs/raced", json=body))

        async def edit_waits() -> bool:
            waiting = "SELECT count(*) FROM pg_locks WHERE NOT granted AND locktype <> 'advisory'"
            return bool(await claimer.fetchval(waiting))

        await eventually_async(edit_waits, 10, "the edit to wait for the cursor")
        await claimer.execute(_CLAIMED_ROW, "raced", job.first_tick)
        await claim.commit()
        assert (await asyncio.wait_for(edit, 10)).status_code == 200
    finally:
        await claimer.close()
    rows = await runs_of(store, "raced")
    claimed = [r for r in rows if r.runner == "claimer"]
    assert [r.scheduled_for for r in claimed] == [job.first_tick]
    skips = [r for r in rows if r.status is RunStatus.SKIPPED]
    assert skips
    assert min(r.scheduled_for for r in skips) > job.first_tick
    last = max(r.scheduled_for for r in skips)
    old = [{"job": "raced", "threshold": made.timestamp(), "cursor": last.timestamp() + 0.5}]
    assert judge_cursors(old, await _outcomes(database_url, "raced"), {"raced": 1}) == []
