"""queue_one and the audit (#41, finding 3): a tick waiting in its job's slot runs after
the run it waits for, however long past its grace that is; the audit neither records it
a misfire nor hands it over while its waiter lives, and waits in the place of a waiter
that is gone, so its slot never keeps the job's later ticks out."""

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import asyncpg
import httpx

from harness.receiver import Receiver
from harness.waiting import eventually_async
from service.app import create_app
from service.config import Settings
from service.domain.cursors import OwedTick, Takeover
from service.domain.jobs import Job, JobSpec, create_job
from service.metrics import Metrics
from service.scheduler.audit import audit_cursors
from service.store import Store
from service.store.members_sql import JOIN
from tests.support.fire import EVERY_SECOND

SECOND = timedelta(seconds=1)
EVERY_SECOND_SPEC = {"kind": "cron", "expression": "* * * * * *"}
TAKEOVER = Takeover.anytime(SECOND)


@asynccontextmanager
async def scheduling(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    """The app with its scheduler on, in-process."""
    app = create_app(settings.model_copy(update={"scheduler": True, "reconcile_seconds": 1}))
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://localhost") as http,
    ):
        yield http


async def _runs(client: httpx.AsyncClient, job: str) -> list[dict[str, Any]]:
    answer = await client.get(f"/v1/jobs/{job}/runs", params={"limit": 200})
    items: list[dict[str, Any]] = answer.json()["items"]
    return items


def _when(text: str | None) -> datetime:
    assert text is not None
    return datetime.fromisoformat(text)


async def test_a_queue_one_tick_waiting_past_its_grace_runs_after_the_run(
    settings: Settings, receiver: Receiver
) -> None:
    """Each run takes 5 s; the grace is 1 s, the takeover 3 s. The tick after the first
    waits for it, 4 s past its grace: it runs once the first run has ended, a run and
    not a misfire, and once. Before, the audit recorded it a misfire at 3 s."""
    receiver.respond("/slow", delay=5)
    job = {
        "name": "waits",
        "schedule": EVERY_SECOND_SPEC,
        "task": "http",
        "overlap": "queue_one",
        "misfire_grace_seconds": 1,
        "args": {"url": f"{receiver.url}/slow"},
    }
    async with scheduling(settings) as client:
        assert (await client.post("/v1/jobs", json=job)).status_code == 201

        async def two_ran() -> bool:
            ran = [r for r in await _runs(client, "waits") if r["status"] != "skipped"]
            return len(ran) >= 2

        await eventually_async(two_ran, 30, "the waiting tick's run")
        await client.post("/v1/jobs/waits/pause")
        rows = sorted(await _runs(client, "waits"), key=lambda r: r["scheduled_for"])
    first = next(r for r in rows if r["status"] != "skipped")
    waiting = _when(first["scheduled_for"]) + SECOND
    [row] = [r for r in rows if _when(r["scheduled_for"]) == waiting]
    assert (row["status"], row["skip_reason"]) != ("skipped", "misfire"), row
    assert row["status"] in {"running", "succeeded"}, row
    assert _when(row["started_at"]) >= _when(first["finished_at"])
    delivered = [r for r in receiver.receipts("waits") if r.tick == waiting.timestamp()]
    assert len(delivered) == 1


async def test_the_audit_leaves_the_tick_a_live_waiter_holds_to_it(
    store: Store, database_url: str
) -> None:
    """A queue_one tick past its reach, waiting in a slot whose waiter is a live member:
    the audit records no misfire, hands nothing over, and leaves the cursor at it."""
    job = await _made(store, "held", timedelta(seconds=20), misfire_grace_seconds=1)
    waiting = job.first_tick
    assert waiting is not None
    handed: list[datetime] = []

    def take_over(_: Job, owed: OwedTick) -> None:
        handed.append(owed.tick)

    async with _member(database_url, "waiter"):
        await _slot(database_url, "held", waiting, "waiter")
        for _ in range(2):
            await audit_cursors(store, TAKEOVER, "auditor", Metrics(), take_over)
        assert handed == []
        assert await store.cursor("held") == waiting
        assert await _rows(database_url, "held") == []
        assert await _slot_of(database_url, "held") == (waiting, "waiter")


async def test_the_audit_waits_in_the_place_of_a_waiter_gone(
    store: Store, database_url: str
) -> None:
    """The same, with a waiter that is no live member (it died, or restarted under its
    name): the auditing replica takes the slot and the tick, to wait in its place for
    the time the slot has left; a replica behind with its own ticks leaves it."""
    job = await _made(store, "orphaned", timedelta(seconds=20), misfire_grace_seconds=1)
    waiting = job.first_tick
    assert waiting is not None
    handed: list[OwedTick] = []

    def take_over(_: Job, owed: OwedTick) -> None:
        handed.append(owed)

    await _slot(database_url, "orphaned", waiting, "gone")
    async with _member(database_url, "gone"):  # restarted under its name since
        behind = Takeover(SECOND, TAKEOVER.since, taking=False)
        await audit_cursors(store, behind, "busy", Metrics(), take_over)
        assert handed == []
        assert await _rows(database_url, "orphaned") == []

        async def adopted() -> bool:  # the audit looks again a takeover period later
            await audit_cursors(store, TAKEOVER, "auditor", Metrics(), take_over)
            return bool(handed)

        await eventually_async(adopted, 10, "the audit to wait in the gone waiter's place")
    [owed] = handed
    assert owed.tick == waiting
    assert owed.waits_seconds is not None
    assert 500 < owed.waits_seconds <= 600
    assert await _slot_of(database_url, "orphaned") == (waiting, "auditor")
    assert await store.cursor("orphaned") == waiting
    assert await _rows(database_url, "orphaned") == []


async def test_a_waiter_gone_never_keeps_the_job_s_later_ticks_out(
    settings: Settings, store: Store, database_url: str
) -> None:
    """A queue_one job's slot holds a tick, past its grace, for a replica that is gone
    (for ten minutes more). The audit waits in its place: the tick runs, its slot is
    freed, and the job's later ticks run. Before, the tick was recorded a misfire and
    every later tick an `overlap` skip until the slot expired."""
    job = await _made(store, "stuck", timedelta(seconds=5), misfire_grace_seconds=1)
    waiting = job.first_tick
    assert waiting is not None
    await _slot(database_url, "stuck", waiting, "gone")
    started = datetime.now(UTC)
    async with scheduling(settings) as client:

        async def later_ticks_ran() -> bool:
            rows = await _runs(client, "stuck")
            later = [r for r in rows if _when(r["scheduled_for"]) > started + SECOND]
            return sum(r["status"] == "succeeded" for r in later) >= 3

        await eventually_async(later_ticks_ran, 20, "the job's later ticks to run")
        rows = await _runs(client, "stuck")
    [row] = [r for r in rows if _when(r["scheduled_for"]) == waiting]
    assert (row["status"], row["trigger"]) == ("succeeded", "schedule"), row
    assert await _slot_of(database_url, "stuck") is None


async def _made(store: Store, name: str, ago: timedelta, **spec: Any) -> Job:
    """A 1 s queue_one job made `ago`, with no replica up since."""
    fields: dict[str, Any] = {
        "schedule": EVERY_SECOND,
        "task": "log",
        "args": {"message": name},
        "overlap": "queue_one",
    } | spec
    made = create_job(name, JobSpec(**fields), datetime.now(UTC) - ago)
    change = await store.mutate_job(name, lambda _: made)
    assert change.after is not None
    return change.after


@asynccontextmanager
async def _member(database_url: str, runner: str) -> AsyncIterator[None]:
    """A live member named `runner`, while this lasts (its session holds its lock)."""
    connection = await asyncpg.connect(database_url)
    try:
        assert await connection.fetchval(JOIN, runner, "test", "test", None) is not None
        yield
    finally:
        await connection.close()


async def _slot(database_url: str, job: str, tick: datetime, runner: str) -> None:
    """`runner` took the job's queue_one slot for `tick`, a moment ago, for 10 minutes."""
    connection = await asyncpg.connect(database_url)
    try:
        await connection.execute(
            """INSERT INTO tickgate_pending (job, scheduled_for, runner, expires_at, reserved_at)
            VALUES ($1, $2, $3, clock_timestamp() + interval '10 minutes', clock_timestamp())""",
            job,
            tick,
            runner,
        )
    finally:
        await connection.close()


async def _slot_of(database_url: str, job: str) -> tuple[datetime, str] | None:
    connection = await asyncpg.connect(database_url)
    try:
        row = await connection.fetchrow(
            "SELECT scheduled_for, runner FROM tickgate_pending WHERE job = $1", job
        )
    finally:
        await connection.close()
    return None if row is None else (row["scheduled_for"], row["runner"])


async def _rows(database_url: str, job: str) -> list[tuple[datetime, str]]:
    connection = await asyncpg.connect(database_url)
    try:
        rows = await connection.fetch(
            "SELECT scheduled_for, status FROM tickgate_runs WHERE job = $1", job
        )
    finally:
        await connection.close()
    return [(row["scheduled_for"], row["status"]) for row in rows]
