"""A delete is a cancel, and an edit or a pause reaches the next attempt of a run in
flight (#41), on real PostgreSQL with the fire path in process."""

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from uuid import uuid4

import asyncpg
import pytest
from pydantic import JsonValue

import service.scheduler.running as executing
from harness.receiver import Receiver
from harness.waiting import eventually_async
from service.config import Settings
from service.domain.jobs import Job, pause_job, replace_job
from service.domain.runs import CancelRequest, Run, RunStatus, RunTrigger
from service.metrics import Metrics
from service.scheduler import Runner
from service.store import Prune, Store
from service.store.link import Link
from service.store.ports import ClaimOutcome, RunEnd, TickClaim
from service.store.sessions import LockSessions
from service.tasks import TaskContext, TaskDefinition
from tests.integration.test_cancel import NEVER, running_run
from tests.support.db import advisory_locks_on
from tests.support.fire import (
    GateArgs,
    Gates,
    add_job,
    finished_runs,
    running,
    runs_of,
    tick_now,
)
from tests.support.inprocess import ended_run, served

# Each attempt says which it is and what args it ran, then fails when its gate opens.
Attempted = list[tuple[int, str]]


@pytest.fixture
def attempted() -> Attempted:
    return []


@pytest.fixture
async def retrying(
    store: Store, sessions: LockSessions, gates: Gates, metrics: Metrics, attempted: Attempted
) -> AsyncIterator[Runner]:
    task = _failing(gates, attempted)
    async with running(store, sessions, gates, metrics, tasks=[task]) as runner:
        yield runner


async def ended(store: Store, run: Run) -> Run:
    """The run as recorded once it has ended (it must not vanish meanwhile)."""
    found: list[Run] = []

    async def done() -> bool:
        found[:] = [r for r in [await store.get_run(run.id)] if r is not None]
        return bool(found) and found[0].status is not RunStatus.RUNNING

    await eventually_async(done, 30, f"run {run.id} ended and recorded")
    return found[0]


async def the_run(store: Store, job: str) -> Run:
    async def one() -> bool:
        return len(await runs_of(store, job)) == 1

    await eventually_async(one, 30, f"a run of {job}")
    [run] = await runs_of(store, job)
    return run


async def test_a_delete_cancels_the_run_in_flight_and_the_name_fires_again_at_once(
    runner: Runner, store: Store, gates: Gates, database_url: str
) -> None:
    job = await add_job(store, "doomed")
    runner.fire(job, tick_now(), RunTrigger.SCHEDULE)
    await eventually_async(lambda: gates.started == ["default"], 30, "the run to start")
    run = await the_run(store, "doomed")
    await store.mutate_job("doomed", lambda _: None, by="ops")
    reborn = await add_job(store, "doomed", args={"gate": "reborn"})  # the name is free
    cancelled = await ended(store, run)
    assert (cancelled.status, cancelled.error) == (
        RunStatus.CANCELLED,
        "cancelled by ops: the job was deleted",
    )
    assert not gates["default"].is_set()  # its task was stopped, not let through
    # Detached from the name: the job made again has none of the old one's rows.
    assert cancelled.job == f"doomed@deleted:{job.incarnation}"
    assert await runs_of(store, "doomed") == []
    assert await advisory_locks_on(database_url, job.lock_key) == 0
    tick = tick_now() + timedelta(seconds=1)
    runner.fire(reborn, tick, RunTrigger.SCHEDULE)
    await eventually_async(lambda: "reborn" in gates.started, 30, "the new job's run")
    gates["reborn"].set()
    [fired] = await finished_runs(store, "doomed", 1)
    assert (fired.scheduled_for, fired.status) == (tick, RunStatus.SUCCEEDED)
    manual = await runner.on_demand.trigger_now(reborn)  # no 409: the lock is free
    assert manual.job == "doomed"


async def test_delete_answers_with_its_run_cancelled_and_the_name_free_for_a_new_job(
    settings: Settings, receiver: Receiver
) -> None:
    """Through the API, with the scheduler running the job's ticks in its own process:
    the run in flight ends `cancelled`, naming who deleted the job, and a job made again
    under the name runs when triggered (no 409 from a lock the old run kept)."""
    job = {
        "name": "gone",
        "schedule": {"kind": "interval", "every_seconds": 1},
        "task": "http",
        "args": {"url": receiver.url_for("/gone", seconds=30)},
    }
    again = job | {"schedule": NEVER, "args": {"url": receiver.url_for("/again")}}
    async with served(settings.model_copy(update={"scheduler": True})) as client:
        assert (await client.post("/v1/jobs", json=job)).status_code == 201
        run = await running_run(client, "gone")
        deleted = await client.delete("/v1/jobs/gone")
        created = await client.post("/v1/jobs", json=again)
        cancelled = await ended_run(client, run["id"])
        triggered = await client.post("/v1/jobs/gone/trigger")
        listed = (await client.get("/v1/jobs/gone/runs")).json()["items"]
    assert (deleted.status_code, created.status_code) == (204, 201)
    assert cancelled["status"] == "cancelled", cancelled
    assert cancelled["error"] == "cancelled by 127.0.0.1: the job was deleted"
    assert triggered.status_code == 202, triggered.text
    assert [r["id"] for r in listed] == [triggered.json()["id"]]  # the new job's only


async def test_a_tick_of_a_job_made_again_finds_the_deleted_one_s_run_busy_not_locked(
    store: Store, sessions: LockSessions
) -> None:
    """Until the cancelled run of the deleted job has stopped, it holds the name's lock:
    the new job's ticks see a run in progress (the overlap policy records them), not a
    lock held by nobody they can see (polled, then a misfire)."""
    job = await add_job(store, "again")
    tick = tick_now()

    def claim_of(of: Job, at: datetime) -> TickClaim:
        return TickClaim(of, at, RunTrigger.SCHEDULE, "r", uuid4(), True)

    async with sessions.session(5) as old, sessions.session(5) as new:
        [claimed] = await old.claim([claim_of(job, tick)])
        assert claimed.run is not None
        await store.mutate_job("again", lambda _: None, by="ops")
        reborn = await add_job(store, "again")
        [answer] = await new.claim([claim_of(reborn, tick + timedelta(seconds=1))])
        detached = await store.get_run(claimed.run.id)
        assert await old.unlock(job.lock_key)
    assert answer.outcome is ClaimOutcome.BUSY
    assert detached is not None
    assert (detached.status, detached.job) == (
        RunStatus.RUNNING,
        f"again@deleted:{job.incarnation}",
    )


async def test_a_bulk_apply_that_prunes_a_job_cancels_its_run_in_flight(
    store: Store, sessions: LockSessions
) -> None:
    job = await add_job(store, "pruned-away", managed_by="argocd")
    async with sessions.session(5) as session:
        [claim] = await session.claim(
            [TickClaim(job, tick_now(), RunTrigger.SCHEDULE, "r", uuid4(), True)]
        )
        assert claim.run is not None
        applied = await store.apply_jobs([], lambda _: [], Prune("argocd"), by="gitops")
        asked = await store.cancels_asked("r")
        assert await session.unlock(job.lock_key)
    assert applied.deleted == ("pruned-away",)
    assert asked == [CancelRequest(claim.run.id, "gitops", "the job was deleted")]


async def test_retention_deletes_a_deleted_job_s_runs_once_they_ended(
    store: Store, sessions: LockSessions, database_url: str
) -> None:
    """The rows a delete left to runs in flight are history of a deleted job: kept while
    they run and a while after (GET /v1/runs/{id} shows how they ended), then pruned."""
    job = await add_job(store, "pruned")
    first, second = tick_now(), tick_now() + timedelta(seconds=1)
    claims = [
        TickClaim(job, at, RunTrigger.SCHEDULE, "r", uuid4(), False) for at in (first, second)
    ]
    async with sessions.session(5) as session:
        claimed = [claim for tick in claims for claim in await session.claim([tick])]
        await store.mutate_job("pruned", lambda _: None, by="ops")
        assert await store.prune_runs(keep=100) == 0  # both still running
        runs = [run for claim in claimed if (run := claim.run) is not None]
        for run, ended_ago in zip(runs, (600, 0), strict=True):
            await session.finish(run.id, RunEnd(RunStatus.CANCELLED, "x", None, 1), None)
            await _set(database_url, _ENDED_AGO, run.id, ended_ago)
    assert await store.prune_runs(keep=100) == 1
    assert [await store.get_run(run.id) is None for run in runs] == [True, False]


async def test_a_retry_runs_the_job_as_edited_before_it_started(
    retrying: Runner, store: Store, gates: Gates, attempted: Attempted, database_url: str
) -> None:
    job = await add_job(
        store,
        "edited",
        task="fail",
        args={"gate": "old"},
        retry={"max_attempts": 2, "min_backoff_seconds": 0.1},
    )
    retrying.fire(job, tick_now(), RunTrigger.SCHEDULE)
    await eventually_async(lambda: attempted == [(1, "old")], 30, "the first attempt")
    spec = job.spec().model_copy(update={"args": {"gate": "new"}})
    change = await store.mutate_job(
        "edited", lambda cur: replace_job(cur, spec, _now()) if cur else None
    )
    assert change.after is not None
    gates["attempt 1"].set()
    await eventually_async(lambda: len(attempted) == 2, 30, "the second attempt")
    gates["attempt 2"].set()
    [run] = await finished_runs(store, "edited", 1)
    assert attempted == [(1, "old"), (2, "new")]
    assert (run.status, run.attempts) == (RunStatus.FAILED, 2)
    assert await _job_version_of(database_url, run) == change.after.version  # as it ran


async def test_a_retry_of_a_job_paused_meanwhile_does_not_start_and_is_recorded(
    retrying: Runner, store: Store, gates: Gates, attempted: Attempted
) -> None:
    job = await add_job(
        store, "paused", task="fail", retry={"max_attempts": 3, "min_backoff_seconds": 0.1}
    )
    retrying.fire(job, tick_now(), RunTrigger.SCHEDULE)
    await eventually_async(lambda: attempted == [(1, "default")], 30, "the first attempt")
    await store.mutate_job("paused", lambda cur: pause_job(cur, _now()) if cur else None)
    for attempt in (1, 2, 3):  # were the others to start, they would end at once
        gates[f"attempt {attempt}"].set()
    # A pause records the ticks it leaves undecided as superseded skips: the run alone.
    [run] = [
        r for r in await finished_runs(store, "paused", 1) if r.status is not RunStatus.SKIPPED
    ]
    assert (run.status, run.attempts) == (RunStatus.CANCELLED, 1)
    assert run.error == "cancelled: the job was paused before attempt 2"
    assert attempted == [(1, "default")]


async def test_a_manual_run_of_a_job_paused_before_it_makes_its_retries(
    retrying: Runner, store: Store, gates: Gates, attempted: Attempted
) -> None:
    """Only a pause since the run began stops its retries: a paused job may be triggered."""
    retry = {"max_attempts": 2, "min_backoff_seconds": 0.1}
    await add_job(store, "asleep", task="fail", retry=retry)
    change = await store.mutate_job("asleep", lambda cur: pause_job(cur, _now()) if cur else None)
    assert change.after is not None
    gates["attempt 1"].set()
    gates["attempt 2"].set()
    await retrying.on_demand.trigger_now(change.after)
    # A pause records the ticks it leaves undecided as superseded skips: the run alone.
    [run] = [
        r for r in await finished_runs(store, "asleep", 1) if r.status is not RunStatus.SKIPPED
    ]
    assert (run.status, run.attempts) == (RunStatus.FAILED, 2)
    assert attempted == [(1, "default"), (2, "default")]


async def test_an_attempt_that_cannot_be_counted_is_not_made(
    database_url: str,
    sessions: LockSessions,
    gates: Gates,
    metrics: Metrics,
    attempted: Attempted,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A retry is counted on the run's row before it starts, or not made at all: one made
    uncounted, its replica dying then, would be made again by the replica resuming the
    run, one more than `max_attempts`. The count fails here as in an outage: its
    statement waits on the run's row, held by another transaction, past its deadline."""
    monkeypatch.setattr(executing, "NOTE_ATTEMPT_SECONDS", 0.0, raising=False)  # one ask
    store = await Store.open(database_url, max_size=4, link=Link(seconds=3))
    holder = await asyncpg.connect(database_url)
    try:
        task = _failing(gates, attempted)
        async with running(store, sessions, gates, metrics, tasks=[task]) as runner:
            retry = {"max_attempts": 2, "min_backoff_seconds": 0.1}
            job = await add_job(store, "uncounted", task="fail", retry=retry)
            runner.fire(job, tick_now(), RunTrigger.SCHEDULE)
            run = await the_run(store, "uncounted")
            async with holder.transaction():
                await holder.execute(_HOLD_THE_ROW, run.id)
                gates["attempt 1"].set()
                gates["attempt 2"].set()  # were it to start, it would end at once

                def refused() -> bool:
                    return any("not counted" in r.getMessage() for r in caplog.records)

                await eventually_async(refused, 30, "the count of attempt 2 to fail")
            recorded = await ended(store, run)
    finally:
        await holder.close()
        await store.close()
    assert attempted == [(1, "default")]
    assert (recorded.status, recorded.attempts) == (RunStatus.FAILED, 1)
    assert "attempt 2 was not started: it could not be counted" in (recorded.error or "")


async def _job_version_of(database_url: str, run: Run) -> int:
    connection = await asyncpg.connect(database_url)
    try:
        version: int = await connection.fetchval(_JOB_VERSION, run.id)
    finally:
        await connection.close()
    return version


async def _set(database_url: str, statement: str, *args: object) -> None:
    connection = await asyncpg.connect(database_url)
    try:
        await connection.execute(statement, *args)
    finally:
        await connection.close()


_ENDED_AGO = """UPDATE tickgate_runs
    SET finished_at = clock_timestamp() - make_interval(secs => $2) WHERE id = $1"""
_JOB_VERSION = "SELECT job_version FROM tickgate_runs WHERE id = $1"
_HOLD_THE_ROW = "SELECT 1 FROM tickgate_runs WHERE id = $1 FOR UPDATE"


def _failing(gates: Gates, attempted: Attempted) -> TaskDefinition[GateArgs]:
    async def fail(args: GateArgs, context: TaskContext) -> JsonValue:
        attempted.append((context.attempt, args.gate))
        await gates[f"attempt {context.attempt}"].wait()
        raise RuntimeError(f"attempt {context.attempt} failed")

    return TaskDefinition("fail", "fails once its attempt's gate opens", GateArgs, fail)


def _now() -> datetime:
    return datetime.now(UTC)
