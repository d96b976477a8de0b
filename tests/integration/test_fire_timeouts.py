"""Deadlines on the fire path's statements, in process on real PostgreSQL (see
`service/store/link.py`): lock sessions set `statement_timeout` and `lock_timeout`.

A claim blocked by a row lock (a job being deleted in a long transaction, say) is ended
by the server's `lock_timeout`: it wrote nothing, gives back the advisory locks it took
and leaves the session, and every run on it, alone; the session's other statements go
on meanwhile, and the tick goes round again until it has its one outcome.
"""

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from uuid import uuid4

import asyncpg
import pytest

from harness.waiting import eventually_async
from service.domain.jobs import Job
from service.domain.runs import RunStatus, RunTrigger
from service.metrics import Metrics
from service.store import Store
from service.store.errors import TIMED_OUT
from service.store.link import Link, deadline
from service.store.ports import ClaimOutcome, RunEnd, TickClaim
from tests.support.db import advisory_lock_holders, advisory_locks_on
from tests.support.fire import (
    Gates,
    add_job,
    finished_runs,
    lock_pool,
    running,
    runs_of,
    tick_now,
)

# The shortest link timeout there is: lock_timeout 1 s, statement_timeout 1.7 s, the
# client's deadline 3.3 s.
LINK = Link(10)
SLACK_SECONDS = 10.0  # a loaded 2-core box
SUCCEEDED = RunEnd(RunStatus.SUCCEEDED, None, None, 1)


def scheduled(job: Job) -> TickClaim:
    return TickClaim(job, tick_now(), RunTrigger.SCHEDULE, "r", uuid4(), True)


@asynccontextmanager
async def row_locked(database_url: str, job: str) -> AsyncIterator[None]:
    """Another transaction holds the job's row FOR UPDATE (as a DELETE of it would)."""
    connection = await asyncpg.connect(database_url)
    try:
        async with connection.transaction():
            await connection.execute("SELECT 1 FROM tickgate_jobs WHERE name = $1 FOR UPDATE", job)
            yield
    finally:
        await connection.close()


async def test_a_claim_blocked_by_a_row_lock_times_out_and_gives_back_its_locks(
    database_url: str, store: Store
) -> None:
    ongoing, blocked = await add_job(store, "ongoing"), await add_job(store, "blocked")
    async with lock_pool(database_url, 1, LINK) as sessions, sessions.session(5) as session:
        [held] = await session.claim([scheduled(ongoing)])
        assert held.outcome is ClaimOutcome.CLAIMED
        lost = asyncio.Event()
        with session.fenced(lost.set):
            async with row_locked(database_url, blocked.name):
                started = time.monotonic()
                with pytest.raises(TIMED_OUT):
                    await asyncio.wait_for(
                        session.claim([scheduled(blocked)]), LINK.seconds + SLACK_SECONDS
                    )
                # The server ended it (lock_timeout), well inside the client's deadline.
                assert time.monotonic() - started < LINK.statement_seconds
                assert await advisory_locks_on(database_url, blocked.lock_key) == 0
                # The session, and the run it holds a lock for, go on.
                assert not session.closed
                assert not lost.is_set()
                assert await advisory_lock_holders(database_url, ongoing.lock_key) == [session.pid]
            [claim] = await session.claim([scheduled(blocked)])
            assert claim.outcome is ClaimOutcome.CLAIMED
            assert not lost.is_set()
            for job, run in ((ongoing, held.run), (blocked, claim.run)):
                assert run is not None
                await session.finish(run.id, SUCCEEDED, job.lock_key)
    assert await advisory_locks_on(database_url, blocked.lock_key) == 0


# A fault of the database's own: a trigger that refuses the ledger rows of one job.
REFUSE_ROWS_OF = """CREATE FUNCTION refuse_row() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN RAISE EXCEPTION 'refused for the test'; END $$;
    CREATE TRIGGER refuse_row BEFORE INSERT OR UPDATE ON tickgate_runs
    FOR EACH ROW WHEN (NEW.job = '{job}') EXECUTE FUNCTION refuse_row()"""


async def test_a_claim_the_database_refuses_gives_back_its_locks_and_fences_nothing(
    database_url: str, store: Store
) -> None:
    """#41, finding 2: a claim statement refused with an error (a constraint, a bug)
    wrote nothing: it raises to its caller and gives back the locks it took, and the
    session's other runs go on (they used to be fenced, `cancelled: lock lost`)."""
    ongoing, refused = await add_job(store, "ongoing"), await add_job(store, "refused")
    connection = await asyncpg.connect(database_url)
    try:
        await connection.execute(REFUSE_ROWS_OF.format(job=refused.name))
    finally:
        await connection.close()
    async with lock_pool(database_url, 1, LINK) as sessions, sessions.session(5) as session:
        [held] = await session.claim([scheduled(ongoing)])
        assert held.run is not None
        lost = asyncio.Event()
        with session.fenced(lost.set):
            with pytest.raises(asyncpg.RaiseError, match="refused for the test"):
                await session.claim([scheduled(refused)])
            assert await advisory_locks_on(database_url, refused.lock_key) == 0
            assert not session.closed
            assert not lost.is_set()
            assert await advisory_lock_holders(database_url, ongoing.lock_key) == [session.pid]
            [ended, released] = await session.finish(held.run.id, SUCCEEDED, ongoing.lock_key)
    assert released
    assert ended is not None
    assert ended.status is RunStatus.SUCCEEDED


async def test_a_blocked_claim_holds_up_neither_the_session_nor_its_tick(
    database_url: str, store: Store
) -> None:
    gates = Gates()
    ongoing = await add_job(store, "ongoing", args={"gate": "ongoing"})
    blocked = await add_job(store, "blocked", args={"gate": "blocked"})
    gates["blocked"].set()
    async with (
        lock_pool(database_url, 1, LINK) as sessions,
        running(store, sessions, gates, Metrics()) as runner,
    ):
        runner.fire(ongoing, tick_now(), RunTrigger.SCHEDULE)
        await eventually_async(lambda: "ongoing" in gates.started, 10, "the ongoing run")
        at = tick_now()
        async with row_locked(database_url, blocked.name):
            runner.fire(blocked, at, RunTrigger.SCHEDULE)
            await asyncio.sleep(LINK.seconds / 10)  # the claim is sent, and waits
            # The run on the same session ends, and records its end, while the claim
            # is still blocked: its statement gave up and the session took turns again.
            gates["ongoing"].set()
            [ended] = await asyncio.wait_for(
                finished_runs(store, "ongoing", 1), LINK.statement_seconds + SLACK_SECONDS
            )
            assert (ended.status, ended.error) == (RunStatus.SUCCEEDED, None)
            assert not [r for r in await runs_of(store, "blocked") if r.scheduled_for == at]
        # Once the blocker is gone, the tick has exactly one outcome: its run.
        [run] = await finished_runs(store, "blocked", 1)
        assert (run.scheduled_for, run.status, run.attempts) == (at, RunStatus.SUCCEEDED, 1)
    assert await advisory_locks_on(database_url, blocked.lock_key) == 0


async def test_an_answer_that_came_in_while_the_event_loop_stalled_is_taken(
    database_url: str,
) -> None:
    """A stalled event loop (CPU throttling, a long pause) finds the answer and the
    deadline both due: the answer wins, and the connection is kept."""
    connection = await asyncpg.connect(database_url)
    try:
        with deadline(0.2, connection.terminate, "stalled"):
            answer = asyncio.ensure_future(connection.fetchval("SELECT 7 FROM pg_sleep(0.01)"))
            await asyncio.sleep(0.01)  # sent
            time.sleep(1.0)  # noqa: ASYNC251 - the loop stalls; the answer comes in meanwhile
            assert await answer == 7
        assert not connection.is_closed()
    finally:
        await connection.close()
