"""Retries, queue_one, the window, max_runs, jitter, catch-up, pause notes, backfill."""

import asyncio
import itertools
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from harness.receiver import Receiver
from harness.waiting import eventually_async
from service.app import create_app
from service.config import Settings
from service.domain.jobs import JobSpec, create_job
from service.domain.schedules import IntervalSchedule, OnceSchedule
from service.store import Store

NEVER = {"kind": "cron", "expression": "0 0 1 1 *"}
EVERY_SECOND = {"kind": "cron", "expression": "* * * * * *"}


@asynccontextmanager
async def scheduling(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    """The app with its scheduler on, in-process."""
    app = create_app(settings.model_copy(update={"scheduler": True, "reconcile_seconds": 1}))
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://localhost") as http,
    ):
        yield http


def slow_queue_one(name: str, receiver: Receiver, every: int, anchor: datetime) -> dict[str, Any]:
    """A queue_one job whose run (an http call to /slow) outlasts its 1 s grace."""
    return {
        "name": name,
        "schedule": {"kind": "interval", "every_seconds": every, "anchor": anchor.isoformat()},
        "task": "http",
        "overlap": "queue_one",
        "misfire_grace_seconds": 1,
        "args": {"url": f"{receiver.url}/slow"},
    }


def log_job(name: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "schedule": NEVER, "task": "log", "args": {"message": name}} | fields


async def runs(client: httpx.AsyncClient, job: str) -> list[dict[str, Any]]:
    items: list[dict[str, Any]] = (await client.get(f"/v1/jobs/{job}/runs")).json()["items"]
    return items


async def finished_run(client: httpx.AsyncClient, run_id: str) -> dict[str, Any]:
    async def done() -> bool:
        return bool((await client.get(f"/v1/runs/{run_id}")).json()["status"] != "running")

    await eventually_async(done, 60, f"run {run_id} to finish")
    run: dict[str, Any] = (await client.get(f"/v1/runs/{run_id}")).json()
    return run


async def test_retries_back_off_and_keep_one_idempotency_key(
    client: httpx.AsyncClient, receiver: Receiver
) -> None:
    receiver.fail_first("/flaky", 2)
    retry = {
        "max_attempts": 5,
        "min_backoff_seconds": 0.2,
        "max_backoff_seconds": 2,
        "max_doublings": 3,
    }
    job = {
        "name": "flaky",
        "schedule": NEVER,
        "task": "http",
        "args": {"url": f"{receiver.url}/flaky"},
        "retry": retry,
    }
    assert (await client.post("/v1/jobs", json=job)).status_code == 201
    started = (await client.post("/v1/jobs/flaky/trigger")).json()
    run = await finished_run(client, started["id"])
    assert run["status"] == "succeeded"
    assert run["attempts"] == 3
    calls = receiver.receipts("flaky")
    assert [c.idempotency_key for c in calls] == [started["id"]] * 3
    gaps = [b.received_at - a.received_at for a, b in itertools.pairwise(calls)]
    assert gaps[0] >= 0.2
    assert gaps[1] >= 0.4  # the wait doubled


async def test_a_retry_is_counted_on_the_run_before_it_starts_and_each_attempt_has_its_times(
    client: httpx.AsyncClient, receiver: Receiver
) -> None:
    """While the second attempt is in flight, the run already says 2 attempts: a
    replica that takes the run over after a crash knows what the policy has left. Each
    attempt is listed with its times and how it ended, the last being the run itself."""
    receiver.respond("/counted", delay=1.5)
    receiver.fail_first("/counted", 1)
    retry = {"max_attempts": 3, "min_backoff_seconds": 0.1}
    job = log_job("counted", task="http", args={"url": f"{receiver.url}/counted"}, retry=retry)
    assert (await client.post("/v1/jobs", json=job)).status_code == 201
    started = (await client.post("/v1/jobs/counted/trigger")).json()
    await eventually_async(
        lambda: len(receiver.receipts("counted")) == 2, 30, "the second attempt to be sent"
    )
    during = (await client.get(f"/v1/runs/{started['id']}")).json()
    assert (during["status"], during["attempts"]) == ("running", 2)
    assert [(a["attempt"], a["status"]) for a in during["attempt_times"]] == [
        (1, "failed"),
        (2, "running"),
    ]
    assert during["attempt_times"][1]["ended_at"] is None
    await finished_run(client, started["id"])
    run = (await client.get(f"/v1/runs/{started['id']}")).json()
    assert (run["status"], run["attempts"]) == ("succeeded", 2)
    first, second = run["attempt_times"]
    assert (first["status"], second["status"], second["error"]) == ("failed", "succeeded", None)
    assert first["error"].endswith("answered HTTP 503")
    times = [first["started_at"], first["ended_at"], second["started_at"], second["ended_at"]]
    assert first["started_at"] == run["started_at"]
    assert second["ended_at"] == run["finished_at"]
    instants = [datetime.fromisoformat(t) for t in times]
    assert instants == sorted(instants), times


async def test_retries_stop_at_max_attempts_and_at_the_budget(
    client: httpx.AsyncClient, receiver: Receiver
) -> None:
    receiver.respond("/down", status=500)
    base = {"schedule": NEVER, "task": "http", "args": {"url": f"{receiver.url}/down"}}
    capped = base | {"name": "capped", "retry": {"max_attempts": 2, "min_backoff_seconds": 0.1}}
    budget = base | {
        "name": "budget",
        "retry": {"max_attempts": 5, "min_backoff_seconds": 1, "max_retry_seconds": 0.5},
    }
    for job in (capped, budget):
        assert (await client.post("/v1/jobs", json=job)).status_code == 201
    first = await finished_run(client, (await client.post("/v1/jobs/capped/trigger")).json()["id"])
    second = await finished_run(client, (await client.post("/v1/jobs/budget/trigger")).json()["id"])
    assert (first["status"], first["attempts"]) == ("failed", 2)
    assert "500" in first["error"]
    assert (second["status"], second["attempts"]) == ("failed", 1)


async def test_max_runs_completes_the_job(settings: Settings) -> None:
    async with scheduling(settings) as client:
        job = log_job("thrice", schedule=EVERY_SECOND, max_runs=3)
        assert (await client.post("/v1/jobs", json=job)).status_code == 201

        async def completed() -> bool:
            state = (await client.get("/v1/jobs/thrice")).json()["state"]
            return bool(state == "completed")

        await eventually_async(completed, 60, "the job to complete after 3 runs")
        done = await runs(client, "thrice")
        assert len(done) == 3
        assert (await client.get("/v1/jobs/thrice")).json()["runs_started"] == 3


async def test_window_end_completes_the_job(settings: Settings) -> None:
    end = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=3)
    async with scheduling(settings) as client:
        job = log_job("windowed", schedule=EVERY_SECOND, end_at=end.isoformat())
        assert (await client.post("/v1/jobs", json=job)).status_code == 201

        async def completed() -> bool:
            return bool((await client.get("/v1/jobs/windowed")).json()["state"] == "completed")

        await eventually_async(completed, 60, "the job to complete after its window")
        made = await runs(client, "windowed")
        assert made
        assert all(datetime.fromisoformat(r["scheduled_for"]) <= end for r in made)


async def test_a_tick_waiting_under_queue_one_at_the_window_s_end_still_runs(
    settings: Settings, receiver: Receiver
) -> None:
    """The window ends while a tick due inside it waits for the run before it: the job
    completes once that tick has run, not before (the completion chore used to complete it at its
    end_at, and the waiting tick never ran)."""
    receiver.respond("/slow", delay=2.5)
    first = datetime.now(UTC).replace(microsecond=0) + timedelta(seconds=2)
    end = first + timedelta(seconds=1.5)  # ticks at first and first + 1
    async with scheduling(settings) as client:
        job = slow_queue_one("windowed", receiver, 1, first) | {"end_at": end.isoformat()}
        assert (await client.post("/v1/jobs", json=job)).status_code == 201

        async def completed() -> bool:
            return bool((await client.get("/v1/jobs/windowed")).json()["state"] == "completed")

        await eventually_async(completed, 60, "the job to complete after its window")
        made = {r["scheduled_for"]: r for r in await runs(client, "windowed")}
        waited = made[(first + timedelta(seconds=1)).isoformat().replace("+00:00", "Z")]
        waited = await finished_run(client, waited["id"])
    assert (waited["status"], waited["skip_reason"]) == ("succeeded", None), waited


async def test_window_start_defers_the_first_tick(client: httpx.AsyncClient) -> None:
    start = datetime(2099, 1, 1, tzinfo=UTC)
    created = (
        await client.post(
            "/v1/jobs", json=log_job("later", schedule=EVERY_SECOND, start_at=start.isoformat())
        )
    ).json()
    assert datetime.fromisoformat(created["next_run_at"]) == start
    assert len(created["next_runs"]) == 10


async def test_jitter_delays_the_start_not_the_tick(settings: Settings) -> None:
    async with scheduling(settings) as client:
        job = log_job(
            "jittery", schedule={"kind": "cron", "expression": "*/2 * * * * *"}, jitter_seconds=1
        )
        assert (await client.post("/v1/jobs", json=job)).status_code == 201
        await eventually_async(lambda: _has_runs(client, "jittery", 2), 60, "two jittered runs")
        for run in (await runs(client, "jittery"))[:2]:
            tick = datetime.fromisoformat(run["scheduled_for"])
            assert tick.microsecond == 0
            assert tick.second % 2 == 0  # nominal, never shifted


async def _has_runs(client: httpx.AsyncClient, job: str, count: int) -> bool:
    return len(_ran(await runs(client, job))) >= count


async def _has_rows(client: httpx.AsyncClient, job: str, count: int) -> bool:
    return len(await runs(client, job)) >= count


def _ran(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows that are runs, not recorded skips."""
    return [row for row in rows if row["status"] != "skipped"]


async def plant(store: Store, name: str, catchup: str) -> datetime:
    """A job whose hourly tick fell 5 s ago, while no scheduler was running; that tick."""
    tick = datetime.now(UTC).replace(microsecond=0) - timedelta(seconds=5)
    spec = JobSpec(
        schedule=IntervalSchedule(kind="interval", every_seconds=3600, anchor=tick),
        task="log",
        args={"message": name},
        catchup=catchup,  # type: ignore[arg-type]
    )
    made = tick - timedelta(hours=2)
    await store.mutate_job(name, lambda _: create_job(name, spec, made))
    return tick


async def test_catchup_none_skips_the_missed_tick(settings: Settings, store: Store) -> None:
    """Ticks that fell while no replica was up are the catch-up policy's: `latest` runs
    one, `none` none, and the audit, which takes over the ticks an owner leaves, takes
    over neither (it would run every missed tick within the grace)."""
    await plant(store, "caught", "latest")
    await plant(store, "skipped", "none")
    takeover = 0.5
    app_settings = settings.model_copy(update={"takeover_seconds": takeover})
    async with scheduling(app_settings) as client:
        await eventually_async(lambda: _has_runs(client, "caught", 1), 60, "the catch-up run")
        # Several audit rounds (two per takeover period) find both ticks lagging.
        await asyncio.sleep(6 * takeover)
        assert [run["trigger"] for run in _ran(await runs(client, "caught"))] == ["catchup"]
        assert _ran(await runs(client, "skipped")) == []


async def test_ticks_missed_while_no_replica_was_up_are_summed_up(
    settings: Settings, store: Store
) -> None:
    """An hourly job made two hours ago, with no replica up since: the tick an hour ago
    is summed up in a misfire row (one row for however many ticks fell); the tick 5 s
    ago, still in its grace, is caught up."""
    tick = await plant(store, "gap", "latest")
    async with scheduling(settings) as client:
        await eventually_async(lambda: _has_rows(client, "gap", 2), 60, "the catch-up and the gap")
        rows = await runs(client, "gap")
    skipped = [row for row in rows if row["status"] == "skipped"]
    assert [(row["skip_reason"], row["missed_ticks"]) for row in skipped] == [("misfire", 1)]
    assert datetime.fromisoformat(skipped[0]["scheduled_for"]) == tick - timedelta(hours=1)
    [ran] = _ran(rows)
    assert (ran["trigger"], datetime.fromisoformat(ran["scheduled_for"])) == ("catchup", tick)


async def test_pause_note_is_kept_until_resume(client: httpx.AsyncClient) -> None:
    await client.post("/v1/jobs", json=log_job("noted"))
    paused = (await client.post("/v1/jobs/noted/pause", json={"note": "db upgrade"})).json()
    assert (paused["state"], paused["pause_note"]) == ("paused", "db upgrade")
    assert (await client.get("/v1/jobs/noted")).json()["pause_note"] == "db upgrade"
    resumed = (await client.post("/v1/jobs/noted/resume")).json()
    assert resumed["pause_note"] is None
    bare = (await client.post("/v1/jobs/noted/pause")).json()
    assert (bare["state"], bare["pause_note"]) == ("paused", None)
    bad = await client.post("/v1/jobs/noted/pause", json={"note": "x" * 1025})
    assert bad.status_code == 422


async def test_backfill_runs_each_missing_tick_once_in_order(client: httpx.AsyncClient) -> None:
    anchor = "2026-01-01T00:00:00Z"
    job = log_job("filled", schedule={"kind": "interval", "every_seconds": 60, "anchor": anchor})
    await client.post("/v1/jobs", json=job)
    window = {"from": "2026-01-01T00:00:00Z", "to": "2026-01-01T00:04:30Z"}
    first = await client.post("/v1/jobs/filled/backfill", json=window)
    assert first.status_code == 200, first.text
    made = first.json()["items"]
    assert [r["scheduled_for"] for r in made] == [f"2026-01-01T00:0{m}:00Z" for m in range(5)]
    assert {r["trigger"] for r in made} == {"backfill"}
    assert {r["status"] for r in made} == {"succeeded"}
    again = await client.post("/v1/jobs/filled/backfill", json=window)
    assert again.json()["items"] == []


@pytest.mark.parametrize(
    "body",
    [
        {"from": "2026-01-01T00:00:00Z", "to": "2026-01-02T00:00:00Z"},  # 1441 ticks
        {"from": "2026-01-01T01:00:00Z", "to": "2026-01-01T00:00:00Z"},
        {"from": "2026-01-01T00:00:00", "to": "2026-01-01T00:10:00Z"},
        {"from": "2026-01-01T00:00:00Z"},
        {"from": "2026-01-01T00:00:00Z", "to": "2026-01-01T00:10:00Z", "extra": 1},
    ],
)
async def test_bad_backfills_are_422(client: httpx.AsyncClient, body: dict[str, Any]) -> None:
    job = log_job(
        "filled",
        schedule={"kind": "interval", "every_seconds": 60, "anchor": "2026-01-01T00:00:00Z"},
    )
    await client.post("/v1/jobs", json=job)
    response = await client.post("/v1/jobs/filled/backfill", json=body)
    assert response.status_code == 422, response.text
    assert await runs(client, "filled") == []


async def test_unknown_job_backfill_is_404(client: httpx.AsyncClient) -> None:
    body = {"from": "2026-01-01T00:00:00Z", "to": "2026-01-01T00:10:00Z"}
    assert (await client.post("/v1/jobs/ghost/backfill", json=body)).status_code == 404


@pytest.mark.parametrize(
    ("fields", "loc"),
    [
        ({"retry": {"max_attempts": 0}}, "max_attempts"),
        ({"retry": {"max_attempts": 21}}, "max_attempts"),
        ({"retry": {"min_backoff_seconds": 9, "max_backoff_seconds": 1}}, "retry"),
        ({"retry": {"max_doublings": 17}}, "max_doublings"),
        ({"retry": {"max_retry_seconds": -1}}, "max_retry_seconds"),
        ({"retry": {"tries": 3}}, "tries"),
        ({"start_at": "2026-12-01T10:00:00"}, "start_at"),
        ({"start_at": "2026-12-02T00:00:00Z", "end_at": "2026-12-01T00:00:00Z"}, "body"),
        ({"max_runs": 0}, "max_runs"),
        ({"jitter_seconds": -1}, "jitter_seconds"),
        ({"jitter_seconds": 3601}, "jitter_seconds"),
        ({"catchup": "all"}, "catchup"),
        ({"overlap": "queue_two"}, "overlap"),
    ],
)
async def test_bad_policy_values_are_422(
    client: httpx.AsyncClient, fields: dict[str, Any], loc: str
) -> None:
    response = await client.post("/v1/jobs", json=log_job("policy") | fields)
    assert response.status_code == 422, response.text
    assert any(loc in problem["loc"] for problem in response.json()["errors"]), response.text
    assert (await client.get("/v1/jobs/policy")).status_code == 404


async def test_job_shows_next_runs(client: httpx.AsyncClient) -> None:
    created = (await client.post("/v1/jobs", json=log_job("nexts", schedule=EVERY_SECOND))).json()
    ticks = [datetime.fromisoformat(t) for t in created["next_runs"]]
    assert len(ticks) == 10
    assert all((b - a) == timedelta(seconds=1) for a, b in itertools.pairwise(ticks))
    assert created["next_run_at"] == created["next_runs"][0]


async def test_a_listing_shows_the_next_tick_and_the_last_run_but_not_the_next_ten(
    client: httpx.AsyncClient,
) -> None:
    hourly = {"kind": "cron", "expression": "0 * * * *"}
    await client.post("/v1/jobs", json=log_job("listed", schedule=hourly))
    run = await finished_run(client, (await client.post("/v1/jobs/listed/trigger")).json()["id"])
    single = (await client.get("/v1/jobs/listed")).json()
    [listed] = (await client.get("/v1/jobs")).json()["items"]
    assert "next_runs" not in listed
    assert listed == {key: value for key, value in single.items() if key != "next_runs"}
    assert listed["next_run_at"] == single["next_runs"][0]
    assert listed["last_run"]["id"] == run["id"]


async def test_queue_one_runs_one_waiting_tick_after_the_run(
    settings: Settings, receiver: Receiver
) -> None:
    receiver.respond("/slow", delay=2.5)
    async with scheduling(settings) as client:
        job = {
            "name": "queued",
            "schedule": EVERY_SECOND,
            "task": "http",
            "overlap": "queue_one",
            "args": {"url": f"{receiver.url}/slow"},
        }
        assert (await client.post("/v1/jobs", json=job)).status_code == 201
        await eventually_async(lambda: _has_runs(client, "queued", 2), 60, "a queued run")
        await client.post("/v1/jobs/queued/pause")
        await asyncio.sleep(0)  # let the pause reach the mirror before counting
        rows = await runs(client, "queued")
        made = sorted(_ran(rows), key=lambda r: r["started_at"])
    # Ticks that came while one already waited are recorded as overlap skips; the one
    # waiting (or still undecided) when the pause came is recorded superseded (#41).
    assert {row["skip_reason"] for row in rows if row not in made} <= {"overlap", "superseded"}
    # Runs never overlap, and each next one starts right after the previous ended
    # (it waited), though ticks came every second.
    for earlier, later in itertools.pairwise(made):
        if earlier["finished_at"] is None:
            continue
        assert _when(later["started_at"]) >= _when(earlier["finished_at"])
    ticks = [datetime.fromisoformat(r["scheduled_for"]) for r in made]
    assert len(ticks) == len(set(ticks))
    # The second run is the tick that queued: due while the first still ran, it
    # started only once the first had finished.
    first, second = made[0], made[1]
    queued_tick, queued_start = _when(second["scheduled_for"]), _when(second["started_at"])
    assert queued_tick < _when(first["finished_at"]) <= queued_start


async def test_a_queue_one_tick_due_during_a_backfill_run_waits_for_it(
    settings: Settings, receiver: Receiver
) -> None:
    """A scheduled tick gives a backfill run no room, and the backfill gives way to it
    before its next tick. A queue_one tick due during a backfill run longer than its
    grace waits for that run, as it would for any run: it used to be recorded a misfire
    (its claim saw the lock held by no run it counted, and asked again until its grace
    ran out)."""
    receiver.respond("/slow", delay=2.5)
    now = datetime.now(UTC).replace(microsecond=0)
    due = now + timedelta(seconds=3)  # the scheduled tick, 1 s into the first backfill run
    async with scheduling(settings) as client:
        job = slow_queue_one("queued", receiver, 60, due)
        assert (await client.post("/v1/jobs", json=job)).status_code == 201
        await asyncio.sleep((due - timedelta(seconds=1) - datetime.now(UTC)).total_seconds())
        span = {
            "from": (due - timedelta(seconds=120)).isoformat(),
            "to": (due - timedelta(seconds=60)).isoformat(),
        }
        backfill = await client.post("/v1/jobs/queued/backfill", json=span)
        assert backfill.status_code == 200, backfill.text
        backfilled = backfill.json()["items"]
        assert len(backfilled) == 2

        async def scheduled() -> dict[str, Any] | None:
            rows = await runs(client, "queued")
            return next((r for r in rows if r["trigger"] == "schedule"), None)

        ran = await eventually_async(scheduled, 30, "the scheduled tick's row")
        ran = await finished_run(client, ran["id"])
    assert (ran["status"], ran["skip_reason"]) == ("succeeded", None), ran
    first = min(backfilled, key=lambda r: r["scheduled_for"])
    assert _when(first["started_at"]) < _when(ran["scheduled_for"]) < _when(first["finished_at"])
    assert _when(ran["started_at"]) >= _when(first["finished_at"])


def _when(text: str | None) -> datetime:
    assert text is not None
    return datetime.fromisoformat(text)


async def test_a_one_time_job_nobody_ran_is_recorded_and_completed_by_the_completion_chore(
    settings: Settings, store: Store
) -> None:
    """Its tick fell while no replica was up: the completion chore records the misfire, once, and
    completes the job, which would otherwise stay active forever."""
    at = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=10)
    spec = JobSpec(
        schedule=OnceSchedule(kind="once", at=at),
        task="log",
        args={"message": "missed"},
        misfire_grace_seconds=5,
    )
    await store.mutate_job("missed", lambda _: create_job("missed", spec, at - timedelta(hours=1)))
    async with scheduling(settings) as client:

        async def completed() -> bool:
            job = (await client.get("/v1/jobs/missed")).json()
            return bool(job["state"] == "completed")

        await eventually_async(completed, 60, "the completion chore to complete the job")
        [skip] = await runs(client, "missed")
    assert (skip["status"], skip["skip_reason"], skip["attempts"]) == ("skipped", "misfire", 0)
    assert datetime.fromisoformat(skip["scheduled_for"]) == at
