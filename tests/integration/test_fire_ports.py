"""The fire path's and the window's ports, held to one contract on two backends: real
PostgreSQL and the in-memory fake. Where they disagree, PostgreSQL is right and the fake is fixed.

The first part asks the ports directly, one gate answer at a time. The second drives
two Runners ("replicas") over one backend through races, each held at the exact step
where it matters (see tests/support/backends.py), so the interleaving is chosen, not
hoped for.
"""

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import uuid4

import pytest

from harness.waiting import eventually_async
from service.domain.cursors import OwedTick
from service.domain.errors import Conflict
from service.domain.jobs import Job, Overlap, complete_job, pause_job
from service.domain.ownership import BUCKETS, bucket_of
from service.domain.runs import AttemptEnd, CancelRequest, Run, RunStatus, RunTrigger, SkipReason
from service.domain.schedules import CronSchedule, IntervalSchedule, OnceSchedule
from service.metrics import Metrics
from service.scheduler import due as due_module
from service.scheduler import on_demand
from service.scheduler.running import LOCK_LOST
from service.store import Store
from service.store.errors import UNAVAILABLE
from service.store.fire_sql import ABANDONED_ERROR, LOST_ATTEMPT
from service.store.ports import (
    BackendId,
    ClaimOutcome,
    Ledger,
    Orphan,
    RunEnd,
    Skip,
    TickClaim,
    waits_for_a_tick,
)
from tests.support.backends import Backend, MemoryBackend, PostgresBackend, replicas
from tests.support.fire import Gates, lock_pool, running, skipped, tick_now

SUCCEEDED = RunEnd(RunStatus.SUCCEEDED, None, {"ok": True}, 1)
HOUR = timedelta(hours=1)


@pytest.fixture
async def postgres_backend(database_url: str, store: Store) -> AsyncIterator[PostgresBackend]:
    async with lock_pool(database_url, 8) as sessions:
        yield PostgresBackend(database_url, store, sessions)


@pytest.fixture
def memory_backend() -> MemoryBackend:
    return MemoryBackend()


@pytest.fixture(params=["postgres", "memory"])
def backend(request: pytest.FixtureRequest) -> Backend:
    chosen: Backend = request.getfixturevalue(f"{request.param}_backend")
    return chosen


def tick(
    job: Job,
    at: datetime,
    trigger: RunTrigger = RunTrigger.SCHEDULE,
    *,
    lock: bool = True,
) -> TickClaim:
    """A tick as a replica asks for it: manual runs and backfills take any version."""
    any_version = trigger in {RunTrigger.MANUAL, RunTrigger.BACKFILL}
    return TickClaim(job, at, trigger, "r", uuid4(), lock, any_version)


# --- the gate, one answer at a time -------------------------------------------------


async def test_two_sessions_claiming_the_same_ticks_let_each_through_once(
    backend: Backend,
) -> None:
    jobs = [await backend.add_job(f"same-{index}") for index in range(3)]
    at = tick_now()
    async with backend.sessions.session(5) as first, backend.sessions.session(5) as second:
        won = await first.claim([tick(job, at) for job in jobs])
        lost = await second.claim([tick(job, at) for job in jobs])
        assert [(c.outcome, c.holds_lock) for c in won] == [(ClaimOutcome.CLAIMED, True)] * 3
        # The lock is held, but the ledger already has the tick: it ran, or runs.
        assert [(c.outcome, c.holds_lock) for c in lost] == [(ClaimOutcome.ALREADY_RAN, False)] * 3
        assert [await backend.locks_on(job.lock_key) for job in jobs] == [1, 1, 1]
        ended = [
            await first.finish(claim.run.id, SUCCEEDED, job.lock_key)
            for claim, job in zip(won, jobs, strict=True)
            if claim.run
        ]
        assert [(run.status if run else None, released) for run, released in ended] == [
            (RunStatus.SUCCEEDED, True)
        ] * 3
        late = await second.claim([tick(job, at) for job in jobs])
        assert [(c.outcome, c.holds_lock) for c in late] == [(ClaimOutcome.ALREADY_RAN, False)] * 3
        # A run ends once: a second end records nothing and has no lock to release.
        assert await first.finish(won[0].run.id if won[0].run else uuid4(), SUCCEEDED, None) == (
            None,
            False,
        )
    for job, claim in zip(jobs, won, strict=True):
        assert await backend.locks_on(job.lock_key) == 0
        [run] = await backend.runs_of(job.name)
        assert claim.run is not None
        assert (run.id, run.status, run.result, run.attempts) == (
            claim.run.id,
            RunStatus.SUCCEEDED,
            {"ok": True},
            1,
        )
        assert run.finished_at is not None
        assert run.finished_at >= run.started_at
        assert run.duration_ms is not None


async def test_a_held_lock_is_locked_without_a_run_in_progress_and_busy_with_one(
    backend: Backend,
) -> None:
    job = await backend.add_job("contended")
    first, second, third = (tick_now() - timedelta(seconds=n) for n in (3, 2, 1))
    async with backend.sessions.session(5) as holder, backend.sessions.session(5) as other:
        async with backend.foreign_lock(job.lock_key):
            [locked] = await other.claim([tick(job, first)])
        assert (locked.outcome, locked.holds_lock, locked.run) == (ClaimOutcome.LOCKED, False, None)
        [running_one] = await holder.claim([tick(job, first)])
        assert running_one.outcome is ClaimOutcome.CLAIMED
        [busy] = await other.claim([tick(job, second)])
        assert (busy.outcome, busy.holds_lock) == (ClaimOutcome.BUSY, False)
        # The tick's own row answers before the lock does.
        [ran] = await other.claim([tick(job, first)])
        assert ran.outcome is ClaimOutcome.ALREADY_RAN
        assert running_one.run is not None
        await holder.finish(running_one.run.id, SUCCEEDED, job.lock_key)
        # A running backfill holds the lock but makes no scheduled tick wait on it.
        [backfill] = await holder.claim(
            [tick(job, second - timedelta(hours=1), RunTrigger.BACKFILL)]
        )
        assert (backfill.outcome, backfill.holds_lock) == (ClaimOutcome.CLAIMED, True)
        [waits] = await other.claim([tick(job, third)])
        assert waits.outcome is ClaimOutcome.LOCKED
        assert await holder.unlock(job.lock_key)
    assert [run.scheduled_for for run in await backend.runs_of("contended")] == [
        second - timedelta(hours=1),
        first,
    ]


async def test_a_tick_of_an_edited_or_recreated_job_is_stale(backend: Backend) -> None:
    original = await backend.add_job("changing")
    edited = await backend.edit_job("changing", description="edited")
    assert (original.version, edited.version) == (1, 2)
    at = tick_now()
    async with backend.sessions.session(5) as session:
        [stale] = await session.claim([tick(original, at)])
        assert (stale.outcome, stale.holds_lock) == (ClaimOutcome.STALE, False)
        assert await backend.locks_on(original.lock_key) == 0
        # A manual run takes the job as it stands, whichever version the caller saw.
        [manual] = await session.claim([tick(original, at, RunTrigger.MANUAL)])
        assert manual.outcome is ClaimOutcome.CLAIMED
        assert manual.run is not None
        await session.finish(manual.run.id, SUCCEEDED, original.lock_key)
        await backend.delete_job("changing")
        reborn = await backend.add_job("changing")
        assert reborn.version == original.version  # only the incarnation tells them apart
        [other_incarnation] = await session.claim([tick(original, at + timedelta(seconds=1))])
        assert (other_incarnation.outcome, other_incarnation.holds_lock) == (
            ClaimOutcome.STALE,
            False,
        )
    assert await backend.runs_of("changing") == []  # the delete took the old runs along
    assert await backend.locks_on(original.lock_key) == 0


async def test_a_manual_or_backfill_claim_comes_back_with_the_job_as_stored(
    backend: Backend,
) -> None:
    """A manual run or a backfill tick runs the job as the claim read it, not as its
    caller read it before (#22, finding 6): an edit made meanwhile applies to it, and its
    row names that version. A scheduled tick runs the exact revision it was claimed for."""
    read_before = await backend.add_job("edited-meanwhile")
    stored = await backend.edit_job("edited-meanwhile", args={"message": "edited"})
    at = tick_now()
    async with backend.sessions.session(5) as session:
        for trigger, moment in ((RunTrigger.MANUAL, at), (RunTrigger.BACKFILL, at - HOUR)):
            [claim] = await session.claim([tick(read_before, moment, trigger)])
            assert claim.outcome is ClaimOutcome.CLAIMED
            assert claim.stored_job is not None
            assert (claim.stored_job.version, claim.stored_job.args) == (2, {"message": "edited"})
            assert claim.run is not None
            await session.finish(claim.run.id, SUCCEEDED, stored.lock_key)
        [scheduled] = await session.claim([tick(stored, at + timedelta(seconds=1))])
        assert (scheduled.outcome, scheduled.stored_job) == (ClaimOutcome.CLAIMED, None)
        assert await session.unlock(stored.lock_key)


async def test_two_claims_of_a_lockless_tick_in_flight_at_once_let_one_through(
    backend: Backend,
) -> None:
    """ "allow" jobs take no lock: the ledger's uniqueness and the job's cursor stand
    between two claims of one tick. Both held before deciding, both began with no
    row: one writes it; the other finds it (ALREADY_RAN), or finds the cursor held by
    the first (CONTENDED) and, asking again, finds the row."""
    job = await backend.add_job("allowed", overlap=Overlap.ALLOW)
    at = tick_now()
    async with (
        backend.sessions.session(5) as first,
        backend.sessions.session(5) as second,
        backend.hold_claims(job) as held,
    ):
        claims = [asyncio.create_task(first.claim([tick(job, at, lock=False)]))]
        await held.reached(1)
        claims.append(asyncio.create_task(second.claim([tick(job, at, lock=False)])))
        await held.reached(2)
        await held.resume()
        decided = [claim for [claim] in await asyncio.gather(*claims)]
        [again] = await second.claim([tick(job, at, lock=False)])
    assert sorted((c.outcome.value, c.holds_lock) for c in decided) in (
        [("already_ran", False), ("claimed", False)],
        [("claimed", False), ("contended", False)],
    )
    assert again.outcome is ClaimOutcome.ALREADY_RAN
    assert [run.id for run in await backend.runs_of("allowed")] == [
        claim.run.id for claim in decided if claim.run
    ]
    assert await backend.locks_on(job.lock_key) == 0


async def test_a_backfill_tick_of_a_recreated_job_is_stale(backend: Backend) -> None:
    original = await backend.add_job("reborn")
    await backend.delete_job("reborn")
    await backend.add_job("reborn")
    async with backend.sessions.session(5) as session:
        [claim] = await session.claim([tick(original, tick_now(), RunTrigger.BACKFILL)])
    assert await backend.runs_of("reborn") == []
    assert claim.outcome is ClaimOutcome.STALE


async def test_a_tick_of_a_deleted_job_is_gone_and_leaves_no_lock(backend: Backend) -> None:
    job = await backend.add_job("deleted")
    await backend.delete_job("deleted")
    async with backend.sessions.session(5) as session:
        [gone] = await session.claim([tick(job, tick_now())])
    assert (gone.outcome, gone.holds_lock, gone.run) == (ClaimOutcome.JOB_GONE, False, None)
    assert await backend.locks_on(job.lock_key) == 0


async def test_a_capped_job_claims_no_more_scheduled_ticks_but_manual_runs(
    backend: Backend,
) -> None:
    job = await backend.add_job("capped", max_runs=1)
    other = await backend.add_job("uncapped")
    first, second = tick_now() - timedelta(seconds=1), tick_now()
    async with backend.sessions.session(5) as session:
        with pytest.raises(ValueError, match="alone"):
            await session.claim([tick(job, first), tick(other, first)])
        with pytest.raises(ValueError, match="one tick per job"):
            await session.claim([tick(other, first), tick(other, second)])
        [counted] = await session.claim([tick(job, first)])
        assert counted.outcome is ClaimOutcome.CLAIMED
        assert counted.run is not None
        assert (current := await backend.job("capped")) is not None
        assert current.runs_started == 1
        await session.finish(counted.run.id, SUCCEEDED, job.lock_key)
        [capped] = await session.claim([tick(job, second)])
        assert (capped.outcome, capped.holds_lock) == (ClaimOutcome.CAPPED, False)
        [manual] = await session.claim([tick(job, second, RunTrigger.MANUAL)])
        assert manual.outcome is ClaimOutcome.CLAIMED
        assert await session.unlock(job.lock_key)
    assert (current := await backend.job("capped")) is not None
    assert current.runs_started == 1  # manual runs never count
    assert await backend.locks_on(job.lock_key) == 0


async def test_a_skipped_tick_is_claimed_by_a_backfill_but_not_by_a_schedule(
    backend: Backend,
) -> None:
    job = await backend.add_job("missed")
    at = tick_now() - timedelta(minutes=5)
    skip = Skip(job, at, RunTrigger.SCHEDULE, SkipReason.MISFIRE, "nobody had room")
    [skipped_run] = await backend.ledger.record_skips([skip], "r")
    async with backend.sessions.session(5) as session:
        [scheduled] = await session.claim([tick(job, at)])
        [manual] = await session.claim([tick(job, at, RunTrigger.MANUAL)])
        backfill = tick(job, at, RunTrigger.BACKFILL)
        [taken] = await session.claim([backfill])
        [again] = await session.claim([tick(job, at, RunTrigger.BACKFILL)])
        assert await session.unlock(job.lock_key)
    assert (scheduled.outcome, scheduled.holds_lock) == (ClaimOutcome.ALREADY_RAN, False)
    assert manual.outcome is ClaimOutcome.ALREADY_RAN
    assert (taken.outcome, again.outcome) == (ClaimOutcome.CLAIMED, ClaimOutcome.ALREADY_RAN)
    [row] = await backend.runs_of("missed")
    assert row == taken.run
    # The row keeps the skip's id (#41: its hook deliveries name it).
    assert (row.id, row.trigger, row.status) == (
        skipped_run.id,
        RunTrigger.BACKFILL,
        RunStatus.RUNNING,
    )
    assert (row.skip_reason, row.error, row.attempts, row.finished_at) == (None, None, 1, None)
    assert row.started_at > skipped_run.started_at
    # Nothing of the skip is left behind on the running row.
    assert (row.duration_ms, row.result, skipped_run.duration_ms) == (None, None, 0)


async def test_record_skips_records_each_tick_once_and_only_for_its_job(
    backend: Backend,
) -> None:
    job = await backend.add_job("skips")
    gone = await backend.add_job("gone")
    await backend.delete_job("gone")
    first, second, third = (tick_now() - timedelta(seconds=n) for n in (3, 2, 1))

    def skip(of: Job, at: datetime) -> Skip:
        return Skip(of, at, RunTrigger.SCHEDULE, SkipReason.OVERLAP, "still running")

    recorded = await backend.ledger.record_skips([skip(job, second), skip(job, first)], "r")
    assert [run.scheduled_for for run in recorded] == [first, second]
    for run in recorded:
        assert (run.status, run.skip_reason, run.error) == (
            RunStatus.SKIPPED,
            SkipReason.OVERLAP,
            "still running",
        )
        assert (run.attempts, run.duration_ms, run.runner) == (0, 0, "r")
        assert run.finished_at is not None
        assert run.started_at <= run.finished_at  # two readings of the clock, not one
    assert await backend.ledger.record_skips([skip(job, first), skip(job, second)], "r") == []
    async with backend.sessions.session(5) as session:
        [claim] = await session.claim([tick(job, third)])
        assert await session.unlock(job.lock_key)
    assert claim.outcome is ClaimOutcome.CLAIMED
    assert await backend.ledger.record_skips([skip(job, third), skip(gone, third)], "r") == []
    await backend.delete_job("skips")
    reborn = await backend.add_job("skips")
    assert await backend.ledger.record_skips([skip(job, third)], "r") == []  # old incarnation
    summed = Skip(reborn, third, RunTrigger.SCHEDULE, SkipReason.MISFIRE, "down", missed_ticks=4)
    [summary] = await backend.ledger.record_skips([summed], "r")
    assert (summary.skip_reason, summary.missed_ticks) == (SkipReason.MISFIRE, 4)


async def test_a_skip_worked_out_from_an_older_threshold_leaves_the_new_ticks_alone(
    backend: Backend,
) -> None:
    """A 2 s job rescheduled to 1 s from an even second S: S is a tick of both, where the
    new cursor waits. A skip of S worked out from the old definition (its next tick:
    S + 2 s) is recorded, but does not move the cursor: the new tick S + 1 s is still
    claimed. At 1fbbe32 the skip moved the cursor to S + 2 s, and S + 1 s never ran."""
    anchor = tick_now() - timedelta(seconds=10)
    old = await backend.add_job("resched", schedule=_every(2, anchor))
    start = anchor + timedelta(seconds=20)  # even: a tick of both schedules
    new = await backend.edit_job("resched", schedule=_every(1, anchor), start_at=start)
    busy = Skip(old, start, RunTrigger.SCHEDULE, SkipReason.OVERLAP, "an earlier run")
    assert len(await backend.ledger.record_skips([busy], "r")) == 1
    async with backend.sessions.session(5) as session:
        [claimed] = await session.claim([tick(new, start + timedelta(seconds=1))])
        assert claimed.outcome is ClaimOutcome.CLAIMED
        assert claimed.run is not None
        await session.finish(claimed.run.id, SUCCEEDED, new.lock_key)


def _every(seconds: int, anchor: datetime) -> IntervalSchedule:
    return IntervalSchedule(kind="interval", every_seconds=seconds, anchor=anchor)


async def test_the_queue_one_slot_is_held_until_released_or_expired(backend: Backend) -> None:
    await backend.add_job("queue", overlap=Overlap.QUEUE_ONE)
    first, second, third = (tick_now() - timedelta(seconds=n) for n in (3, 2, 1))
    ledger = backend.ledger
    assert await ledger.reserve_slot("queue", first, "a", 60) == first
    assert await ledger.reserve_slot("queue", second, "b", 60) == first
    assert await ledger.reserve_slot("queue", first, "b", 60) == first
    await ledger.release_slot("queue", second)  # not the holder: nothing changes
    assert await ledger.reserve_slot("queue", second, "b", 60) == first
    await ledger.release_slot("queue", first)
    assert await ledger.reserve_slot("queue", second, "b", 0.2) == second
    assert await ledger.reserve_slot("queue", third, "a", 60) == second
    await backend.pass_time(0.4)
    assert await ledger.reserve_slot("queue", third, "a", 60) == third  # second expired
    assert await backend.slot_of("queue") == third
    await backend.delete_job("queue")  # the slot goes with its job
    with pytest.raises(backend.missing_job):
        await ledger.reserve_slot("queue", third, "a", 60)
    await backend.add_job("queue", overlap=Overlap.QUEUE_ONE)
    assert await ledger.reserve_slot("queue", first, "a", 60) == first


async def test_no_tick_passes_an_earlier_tick_waiting_in_the_queue_one_slot(
    backend: Backend,
) -> None:
    job = await backend.add_job("in-order", overlap=Overlap.QUEUE_ONE)
    waiting, later = tick_now() - timedelta(seconds=2), tick_now()
    assert await backend.ledger.reserve_slot("in-order", waiting, "a", 60) == waiting
    async with backend.sessions.session(5) as session:
        [passing] = await session.claim([tick(job, later)])
        assert (passing.outcome, passing.holds_lock) == (ClaimOutcome.BUSY, False)
        [first] = await session.claim([tick(job, waiting)])
        assert first.outcome is ClaimOutcome.CLAIMED
        assert await session.unlock(job.lock_key)
    assert [run.scheduled_for for run in await backend.runs_of("in-order")] == [waiting]


async def test_a_claim_of_the_waiting_tick_frees_its_slot_whoever_reserved_it(
    backend: Backend,
) -> None:
    """A replica reserved the slot for a tick and died waiting; another claims that tick
    (a replica taking over): the slot goes with the claim, so the ticks after it run
    instead of being skipped as overlaps until the dead replica's slot expires."""
    job = await backend.add_job("taken-over", overlap=Overlap.QUEUE_ONE)
    waiting, later = tick_now() - timedelta(seconds=2), tick_now()
    assert await backend.ledger.reserve_slot("taken-over", waiting, "dead", 600) == waiting
    async with backend.sessions.session(5) as session:
        [taken] = await session.claim([tick(job, waiting)])
        assert taken.outcome is ClaimOutcome.CLAIMED
        assert await backend.slot_of("taken-over") is None
        assert taken.run is not None
        await session.finish(taken.run.id, SUCCEEDED, job.lock_key)
        [next_one] = await session.claim([tick(job, later)])
        assert next_one.outcome is ClaimOutcome.CLAIMED
        assert await session.unlock(job.lock_key)
    ran = sorted(run.scheduled_for for run in await backend.runs_of("taken-over"))
    assert ran == [waiting, later]


async def test_a_slot_whose_tick_has_its_outcome_keeps_no_later_tick_out(
    backend: Backend,
) -> None:
    """The waiting tick got its row (dropped by a cancel of the queued tick) and its
    waiter died before freeing the slot: the slot holds nothing. The next tick runs, and
    the next to wait takes the slot, where before every later tick was BUSY (an
    `overlap` skip) until the slot expired."""
    job = await backend.add_job("decided", overlap=Overlap.QUEUE_ONE)
    waiting = tick_now() - timedelta(seconds=2)
    later, last = waiting + timedelta(seconds=1), waiting + timedelta(seconds=2)
    assert await backend.ledger.reserve_slot("decided", waiting, "dead", 600) == waiting
    dropped = Skip(job, waiting, RunTrigger.SCHEDULE, SkipReason.CANCELLED, "dropped")
    assert await backend.ledger.record_skips([dropped], "api")
    assert await backend.ledger.slot_tick("decided") is None
    async with backend.sessions.session(5) as session:
        [claimed] = await session.claim([tick(job, later)])
        assert claimed.outcome is ClaimOutcome.CLAIMED
        assert claimed.run is not None
        await session.finish(claimed.run.id, SUCCEEDED, job.lock_key)
    assert await backend.ledger.reserve_slot("decided", last, "b", 600) == last


async def test_a_session_claims_no_second_tick_of_a_job_whose_lock_it_holds(
    backend: Backend,
) -> None:
    """A session's advisory locks are re-entrant; its claims are not: while a run of
    the job holds the job's lock on this session, another tick of it is BUSY here, as
    on any other session, and the lock is not taken twice."""
    job = await backend.add_job("twice")
    first, second = tick_now() - timedelta(seconds=1), tick_now()
    async with backend.sessions.session(5) as session:
        [one] = await session.claim([tick(job, first)])
        [two] = await session.claim([tick(job, second)])
        [again] = await session.claim([tick(job, first)])
        [manual] = await session.claim([tick(job, second, RunTrigger.MANUAL)])
        assert (one.outcome, one.holds_lock) == (ClaimOutcome.CLAIMED, True)
        assert (two.outcome, two.holds_lock) == (ClaimOutcome.BUSY, False)
        assert (again.outcome, again.holds_lock) == (ClaimOutcome.ALREADY_RAN, False)
        assert (manual.outcome, manual.holds_lock) == (ClaimOutcome.BUSY, False)
        assert await backend.locks_on(job.lock_key) == 1
        assert one.run is not None
        assert await session.finish(one.run.id, SUCCEEDED, job.lock_key) != (None, False)
        assert await backend.locks_on(job.lock_key) == 0  # held once: released once
        [three] = await session.claim([tick(job, second)])
        assert (three.outcome, three.holds_lock) == (ClaimOutcome.CLAIMED, True)
        assert await session.unlock(job.lock_key)
        assert not await session.unlock(job.lock_key)
    assert await backend.locks_on(job.lock_key) == 0


async def test_an_orphaned_run_goes_on_once_elsewhere_while_its_policy_allows(
    backend: Backend,
) -> None:
    """A run whose session died mid-run (its replica crashed) is an orphan once its
    lock is free and it is 2 s old. With attempts left, one session takes it over: the
    same run, one more attempt counted, the lock taken again; any other session that
    tries is turned away by the lock. Its row counts each retry before it starts, so once the
    attempts are spent, a second crash leaves an orphan the sweep abandons."""
    job = await backend.add_job("orphan", retry={"max_attempts": 3})
    async with (
        backend.sessions.session(5) as doomed,
        backend.sessions.session(5) as taker,
        backend.sessions.session(5) as late,
    ):
        [claim] = await doomed.claim([tick(job, tick_now())])
        assert claim.run is not None
        doomed.terminate()  # the replica dies: its session and lock go with it
        await backend.pass_time(2.5)
        orphan = await _the_orphan(backend)
        assert (orphan.run.id, orphan.run.job, orphan.job.name) == (
            claim.run.id,
            "orphan",
            "orphan",
        )
        assert (orphan.run.attempts, orphan.locked) == (1, True)
        assert orphan.resumable(orphan.run.started_at + timedelta(seconds=3))
        async with backend.foreign_lock(job.lock_key):
            assert (await taker.resume([orphan], "b"))[0].outcome is ClaimOutcome.LOCKED
        [resumed] = await taker.resume([orphan], "b")
        assert (resumed.outcome, resumed.holds_lock) == (ClaimOutcome.CLAIMED, True)
        assert resumed.run is not None
        assert (resumed.run.id, resumed.run.attempts, resumed.run.runner) == (orphan.run.id, 2, "b")
        assert (await late.resume([orphan], "c"))[0].outcome is ClaimOutcome.LOCKED
        assert await backend.locks_on(job.lock_key) == 1
        assert await backend.ledger.orphans(10) == []  # its session is alive
        # The replica that lost it records its end no more: the run is the taker's now.
        assert await backend.ledger.finish_run(orphan.run.id, SUCCEEDED, orphan.backend) is None
        retried = AttemptEnd(2, RunStatus.FAILED, "boom", waited_seconds=0.5)
        noted = await backend.ledger.note_attempt(orphan.run, job, retried)  # the last retry
        assert noted.job is not None
        assert (noted.job.name, noted.job.version) == ("orphan", job.version)
        taker.terminate()
        await backend.pass_time(2.5)
        spent = await _the_orphan(backend)
        assert spent.run.attempts == 3
        assert not spent.resumable(spent.run.started_at + timedelta(seconds=3))
        [abandoned] = await backend.ledger.abandon([spent])
        assert (abandoned.status, abandoned.attempts) == (RunStatus.ABANDONED, 3)
        assert await backend.ledger.abandon([spent]) == []
        assert await backend.ledger.orphans(10) == []
    if isinstance(backend, PostgresBackend):  # the fake keeps no attempt times
        attempts = await backend.attempts_of(orphan.run.id)
        assert [(a.attempt, a.status, a.error) for a in attempts] == [
            (1, RunStatus.ABANDONED, LOST_ATTEMPT),
            (2, RunStatus.FAILED, "boom"),
            (3, RunStatus.ABANDONED, ABANDONED_ERROR),
        ]
        assert attempts[0].started_at == abandoned.started_at
        assert (attempts[0].ended_at, attempts[2].ended_at) == (None, abandoned.finished_at)
        assert attempts[1].ended_at is not None
        assert attempts[0].started_at < attempts[1].started_at < attempts[2].started_at


async def test_a_cancel_is_asked_of_its_runner_and_an_orphan_cancelled_is_never_resumed(
    backend: Backend,
) -> None:
    """A cancel asked of a running run stays asked of its runner until the run ends.
    Should that runner die first, the orphan gets no other attempt, whatever its policy
    allows: no session may resume it, and the sweep abandons it saying who cancelled."""
    job = await backend.add_job("cancelled", retry={"max_attempts": 3})
    async with backend.sessions.session(5) as doomed, backend.sessions.session(5) as taker:
        [claim] = await doomed.claim([tick(job, tick_now())])
        assert claim.run is not None
        asked = CancelRequest(claim.run.id, "ops", "hung")
        assert await backend.request_cancel(asked)
        assert await backend.ledger.cancels_asked("r") == [asked]
        assert await backend.ledger.cancels_asked("other") == []
        doomed.terminate()
        await backend.pass_time(2.5)
        orphan = await _the_orphan(backend)
        assert orphan.cancel_requested
        assert not orphan.resumable(orphan.run.started_at + timedelta(seconds=3))
        assert (await taker.resume([orphan], "b"))[0].outcome is ClaimOutcome.ALREADY_RAN
        assert await backend.advisory_locks() == (0, 0)
        [abandoned] = await backend.ledger.abandon([orphan])
    assert abandoned.status is RunStatus.ABANDONED
    assert abandoned.error == f"{ABANDONED_ERROR}; cancelled by ops: hung"
    assert await backend.ledger.cancels_asked("r") == []
    assert not await backend.request_cancel(asked)  # it has ended


async def test_the_tick_waiting_in_a_slot_is_read_until_its_wait_expires(
    backend: Backend,
) -> None:
    job = await backend.add_job("queued", overlap="queue_one")
    waiting = tick_now()
    assert await backend.ledger.slot_tick(job.name) is None
    assert await backend.ledger.reserve_slot(job.name, waiting, "r", 2) == waiting
    assert await backend.ledger.slot_tick(job.name) == waiting
    await backend.pass_time(2.5)
    assert await backend.ledger.slot_tick(job.name) is None


async def test_of_two_sessions_resuming_a_lockless_orphan_one_wins(backend: Backend) -> None:
    """An "allow" job's run holds no lock: the row's compare-and-set alone decides."""
    job = await backend.add_job("free-orphan", overlap="allow", retry={"max_attempts": 2})
    async with backend.sessions.session(5) as doomed, backend.sessions.session(5) as other:
        [claim] = await doomed.claim([tick(job, tick_now(), lock=False)])
        assert claim.run is not None
        doomed.terminate()
        await backend.pass_time(2.5)
        orphan = await _the_orphan(backend)
        async with backend.sessions.session(5) as racing:
            [won], [lost] = await asyncio.gather(
                other.resume([orphan], "b"), racing.resume([orphan], "c")
            )
        outcomes = sorted([won.outcome.value, lost.outcome.value])
        assert outcomes == [ClaimOutcome.ALREADY_RAN.value, ClaimOutcome.CLAIMED.value]
        assert (won.holds_lock, lost.holds_lock) == (False, False)
        assert await backend.advisory_locks() == (0, 0)


async def test_a_crowd_of_orphans_is_taken_over_in_one_resume(backend: Backend) -> None:
    """A crash mid-crowd leaves many orphans: one resume takes them all over, each as it
    would be alone (the lockless one without a lock); the same lock key twice in one
    resume is refused before anything is taken."""
    jobs = [await backend.add_job(f"crowd-{n}", retry={"max_attempts": 2}) for n in range(4)]
    free = await backend.add_job("crowd-free", overlap="allow", retry={"max_attempts": 2})
    async with backend.sessions.session(5) as doomed, backend.sessions.session(5) as taker:
        at = tick_now()
        ticks = [tick(job, at) for job in jobs] + [tick(free, at, lock=False)]
        assert all(claim.run for claim in await doomed.claim(ticks))
        doomed.terminate()
        await backend.pass_time(2.5)
        orphans = await _orphans(backend, 5)
        locked = next(orphan for orphan in orphans if orphan.locked)
        with pytest.raises(ValueError, match="one orphan per lock key"):
            await taker.resume([locked, locked], "b")
        resumed = await taker.resume(orphans, "b")
        assert [claim.outcome for claim in resumed] == [ClaimOutcome.CLAIMED] * 5
        assert [(c.run.id, c.run.attempts, c.run.runner) for c in resumed if c.run] == [
            (orphan.run.id, 2, "b") for orphan in orphans
        ]
        assert [claim.holds_lock for claim in resumed] == [orphan.locked for orphan in orphans]
        assert [await backend.locks_on(job.lock_key) for job in jobs] == [1, 1, 1, 1]
        assert await backend.ledger.orphans(10) == []


async def _orphans(backend: Backend, count: int) -> list[Orphan]:
    """The `count` orphans, once the database shows their session gone."""
    found: list[Orphan] = []

    async def all_of_them() -> bool:
        found[:] = await backend.ledger.orphans(10)
        return len(found) == count

    await eventually_async(all_of_them, 30, f"{count} runs to be orphaned")
    return found


async def _the_orphan(backend: Backend) -> Orphan:
    """The one orphan, once the database shows its session gone."""
    found: list[Orphan] = []

    async def one() -> bool:
        found[:] = await backend.ledger.orphans(10)
        return len(found) == 1

    await eventually_async(one, 30, "the run to be orphaned")
    return found[0]


async def test_terminate_drops_the_sessions_locks_and_trips_its_fence(backend: Backend) -> None:
    job = await backend.add_job("killed")
    first, second = tick_now() - timedelta(seconds=1), tick_now()
    lost = asyncio.Event()
    async with backend.sessions.session(5) as doomed, backend.sessions.session(5) as other:
        [claim] = await doomed.claim([tick(job, first)])
        assert claim.holds_lock
        with doomed.fenced(lost.set):
            doomed.terminate()
            await asyncio.wait_for(lost.wait(), 5)
        assert doomed.closed
        doomed.terminate()  # again: harmless
        await eventually_async(
            lambda: _none_hold(backend, job.lock_key), 30, "the lock to go with its session"
        )
        # The running row of the dead session stays; only the lock said "busy".
        [next_one] = await other.claim([tick(job, second)])
        assert (next_one.outcome, next_one.holds_lock) == (ClaimOutcome.CLAIMED, True)
        with pytest.raises(UNAVAILABLE):
            await doomed.claim([tick(job, second + timedelta(seconds=1))])
        fence_went_up_late = asyncio.Event()
        with doomed.fenced(fence_went_up_late.set):
            assert fence_went_up_late.is_set()  # a dead session trips a fence at once
        assert await other.unlock(job.lock_key)


async def _none_hold(backend: Backend, key: int) -> bool:
    return await backend.locks_on(key) == 0


async def test_a_run_ends_through_the_ledger_once(backend: Backend) -> None:
    job = await backend.add_job("elsewhere")
    async with backend.sessions.session(5) as session:
        [claim] = await session.claim([tick(job, tick_now())])
        assert claim.run is not None
        # Only as the session that holds the run: another one's end is not recorded, nor
        # that of an earlier backend that had its PID (PIDs are reused; #41, finding 6).
        own = session.backend
        assert own.started_at is not None
        earlier = replace(own, started_at=own.started_at - timedelta(minutes=1))
        for other in (BackendId(own.pid + 1), BackendId(own.pid + 1, own.started_at), earlier):
            assert await backend.ledger.finish_run(claim.run.id, SUCCEEDED, other) is None
        ended = await backend.ledger.finish_run(claim.run.id, SUCCEEDED, session.backend)
        assert ended is not None
        assert (ended.status, ended.result) == (RunStatus.SUCCEEDED, {"ok": True})
        assert await backend.ledger.finish_run(claim.run.id, SUCCEEDED, session.backend) is None
        assert await backend.ledger.finish_run(uuid4(), SUCCEEDED, session.backend) is None
        # The lock is the session's to give back: an end elsewhere leaves it held.
        assert await session.finish(claim.run.id, SUCCEEDED, job.lock_key) == (None, True)
    assert await backend.locks_on(job.lock_key) == 0


async def test_jobs_are_read_and_updated_by_name(backend: Backend) -> None:
    await backend.add_job("kept")
    seen: list[datetime] = []

    def finish(current: Job, now: datetime) -> Job:
        seen.append(now)
        return complete_job(current, now)

    assert [job.name for job in await backend.ledger.get_jobs(["kept", "missing", "kept"])] == [
        "kept"
    ]
    await backend.ledger.update_jobs({"kept": finish, "missing": finish})
    assert len(seen) == 1
    assert seen[0].tzinfo is not None
    [job] = await backend.ledger.get_jobs(["kept"])
    assert (job.state.value, job.version, job.updated_at) == ("completed", 2, seen[0])


async def test_blocks_share_a_session_and_one_left_holding_a_lock_is_closed(
    backend: Backend,
) -> None:
    job, other = await backend.add_job("pooled"), await backend.add_job("other")
    async with backend.lock_pool(1) as pool:
        async with pool.session(5) as holder:
            [kept] = await holder.claim([tick(other, tick_now())])
            async with pool.session(5) as passing:
                assert passing is holder  # one session, shared by both blocks
            # Still held by the outer block: neither closed nor stripped of its lock.
            assert not holder.closed
            assert await backend.locks_on(other.lock_key) == 1
            assert await holder.unlock(other.lock_key)
        assert kept.holds_lock
        async with pool.session(5) as session:
            [claim] = await session.claim([tick(job, tick_now())])
            assert claim.holds_lock
        # Left by its last block still holding the lock (a bug the pool survives):
        # closed, and the lock with it; the next block gets a new session.
        assert session.closed

        async def released() -> bool:
            return await backend.locks_on(job.lock_key) == 0

        # The server ends the backend (and drops its locks) a moment after the client's
        # goodbye, not before the close returns: under load it was seen still held.
        await eventually_async(released, 10, "the closed session's lock released")
        async with pool.session(5) as replacement:
            assert replacement is not session
            assert not replacement.closed


async def test_with_every_session_closed_a_pool_waits_for_a_new_one_within_its_deadline(
    backend: Backend,
) -> None:
    job = await backend.add_job("reopened")
    async with (
        backend.lock_pool(2) as pool,
        pool.session(5) as first,
        pool.session(5) as second,
    ):
        assert first is not second
        [claim] = await first.claim([tick(job, tick_now())])
        assert claim.holds_lock
        await backend.kill_lock_holder(job.lock_key)
        await eventually_async(lambda: first.closed, 30, "the killed session to close")
        async with backend.refusing_connections():
            async with pool.session(5) as left:
                assert left is second  # the open one, though another block holds it
            second.terminate()
            with pytest.raises(TimeoutError):
                async with pool.session(0.5):
                    pass
        async with pool.session(30) as renewed:
            assert not renewed.closed
            assert renewed not in (first, second)


# --- two replicas racing --------------------------------------------------------------


async def test_a_claim_held_after_taking_the_lock_makes_the_other_replica_ask_again(
    backend: Backend, gates: Gates
) -> None:
    """Replica A has taken the job's lock and not yet written the tick's row when B
    claims the same tick: B hears LOCKED and must ask again, not drop the tick; it
    then finds A's row. The tick ends with exactly one row."""
    job = await backend.add_job("contested")
    at = tick_now()
    async with replicas(backend, gates) as (a, b):
        async with backend.hold_claims(job) as held:
            a.fire(job, at)
            await held.reached(1)
            assert await backend.locks_on(job.lock_key) == 1  # A's, taken mid-claim
            b.fire(job, at)
            await eventually_async(  # B asked while A held the lock, before A's row
                lambda: b.outcomes("contested", at)[:1] == [ClaimOutcome.LOCKED],
                30,
                "B to hear LOCKED",
            )
            assert await backend.runs_of("contested") == []
            await held.resume()
        await eventually_async(
            lambda: b.outcomes("contested", at)[-1:] == [ClaimOutcome.ALREADY_RAN],
            30,
            "B to find A's row",
        )
        gates["default"].set()
        [run] = await _finished_runs(backend, "contested", 1)
    assert a.outcomes("contested", at) == [ClaimOutcome.CLAIMED]
    assert b.outcomes("contested", at)[0] is ClaimOutcome.LOCKED
    assert (run.runner, run.status) == ("a", RunStatus.SUCCEEDED)
    assert skipped(b.metrics, "misfire") == 0


@pytest.mark.parametrize("patient", [True, False], ids=["patient", "impatient"])
async def test_a_run_whose_end_is_recorded_late_leaves_the_next_tick_an_outcome(
    backend: Backend, gates: Gates, patient: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A's run has returned, but its end (and unlock) is not yet recorded when the next
    tick reaches B: B sees BUSY. Within its patience B asks again and runs the tick once
    the end is in; past it, the overlap policy records a skip. Never nothing."""
    patience = timedelta(seconds=60 if patient else 0)
    monkeypatch.setattr(due_module, "OVERLAP_PATIENCE", patience)
    job = await backend.add_job("late-end")
    first, second = tick_now() - timedelta(seconds=2), tick_now() - timedelta(seconds=1)
    async with replicas(backend, gates) as (a, b):
        a.fire(job, first)
        await eventually_async(lambda: gates.started == ["default"], 30, "A's run")
        [started] = await backend.runs_of("late-end")
        async with backend.hold_finish(started.id) as held:
            gates["default"].set()
            await held.reached(1)
            b.fire(job, second)
            await eventually_async(
                lambda: ClaimOutcome.BUSY in b.outcomes("late-end", second), 30, "B to see BUSY"
            )
            if not patient:
                await eventually_async(lambda: _has_run(backend, "late-end", second), 30, "a skip")
            await held.resume()
        runs = await _finished_runs(backend, "late-end", 2)
    late = (RunStatus.SUCCEEDED, None) if patient else (RunStatus.SKIPPED, SkipReason.OVERLAP)
    assert [(r.scheduled_for, r.status, r.skip_reason, r.runner) for r in runs] == [
        (first, RunStatus.SUCCEEDED, None, "a"),
        (second, *late, "b"),
    ]
    assert len(gates.started) == (2 if patient else 1)


async def test_queue_one_across_two_replicas_runs_one_waiting_tick_after_the_run(
    backend: Backend, gates: Gates, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Both replicas fire every tick. While the first runs, the second takes the job's
    one waiting slot (both replicas wait with it), the third finds the slot taken and is
    skipped, once. The second runs after the first has ended."""
    monkeypatch.setattr(due_module, "OVERLAP_PATIENCE", timedelta(0))
    job = await backend.add_job("queued", overlap=Overlap.QUEUE_ONE)
    first, second, third = (tick_now() - timedelta(seconds=n) for n in (3, 2, 1))
    async with replicas(backend, gates) as both:
        for replica in both:
            replica.fire(job, first)
        await eventually_async(lambda: gates.started == ["default"], 30, "the first run")
        for replica in both:
            replica.fire(job, second)
        await eventually_async(lambda: _slot_is(backend, "queued", second), 30, "the slot")
        for replica in both:
            replica.fire(job, third)
        await eventually_async(lambda: _has_run(backend, "queued", third), 30, "the third's skip")
        await eventually_async(
            lambda: all(ClaimOutcome.BUSY in r.outcomes("queued", second) for r in both),
            30,
            "both replicas to wait with the second tick",
        )
        assert gates.started == ["default"], "the second tick must wait, not overlap"
        gates["default"].set()
        runs = await _finished_runs(backend, "queued", 3)
        await eventually_async(lambda: _slot_is(backend, "queued", None), 30, "the slot's release")
    assert [(r.scheduled_for, r.status, r.skip_reason) for r in runs] == [
        (first, RunStatus.SUCCEEDED, None),
        (second, RunStatus.SUCCEEDED, None),
        (third, RunStatus.SKIPPED, SkipReason.OVERLAP),
    ]
    assert runs[0].finished_at is not None
    assert runs[0].finished_at <= runs[1].started_at
    assert sum(skipped(r.metrics, "overlap") for r in both) == 1
    assert sum(skipped(r.metrics, "misfire") for r in both) == 0


async def test_a_pause_during_a_backfill_stops_its_remaining_ticks(
    backend: Backend, gates: Gates
) -> None:
    """A backfill of three ticks; the job is paused while the first one runs. That run
    goes on to its end, and the gate claims no later tick: the backfill stops with a
    conflict naming where. Before, its claims took any version and state, and every
    remaining tick ran (#22)."""
    yearly = {"kind": "cron", "expression": "0 0 1 1 *"}  # no scheduled tick to give way to
    job = await backend.add_job("backfilled", schedule=yearly)
    ticks = [datetime(2025, 1, 1, tzinfo=UTC) + timedelta(days=366 * n) for n in range(3)]
    async with replicas(backend, gates, names="a") as [a]:
        backfill = asyncio.create_task(a.runner.on_demand.backfill(job, ticks))
        await eventually_async(lambda: gates.started == ["default"], 30, "the first run")
        await _pause(backend, "backfilled")
        gates["default"].set()
        with pytest.raises(Conflict, match="paused"):
            await backfill
        runs = await _finished_runs(backend, "backfilled", 1)
    assert [(r.scheduled_for, r.status) for r in runs] == [(ticks[0], RunStatus.SUCCEEDED)]
    assert a.outcomes("backfilled", ticks[1]) == [ClaimOutcome.INACTIVE]


async def test_a_backfill_of_a_job_paused_before_it_began_runs_its_ticks(
    backend: Backend, gates: Gates
) -> None:
    """A pause stops only a backfill that began on an active job: one asked for a
    paused job (filling a gap before resuming it) runs as asked."""
    yearly = {"kind": "cron", "expression": "0 0 1 1 *"}
    await backend.add_job("paused-first", schedule=yearly)
    job = await backend.put(
        "paused-first", lambda current, now: current and pause_job(current, now)
    )
    assert job is not None
    ticks = [datetime(2025, 1, 1, tzinfo=UTC), datetime(2026, 1, 1, tzinfo=UTC)]
    gates["default"].set()
    async with replicas(backend, gates, names="a") as [a]:
        made = await a.runner.on_demand.backfill(job, ticks)
    assert [r.scheduled_for for r in made] == ticks


async def _pause(backend: Backend, name: str) -> Job:
    paused = await backend.put(name, lambda current, now: current and pause_job(current, now))
    assert paused is not None
    return paused


async def test_a_tick_taken_over_runs_once_whoever_ran_it(backend: Backend, gates: Gates) -> None:
    """B takes over two ticks, as its audit hands them over: one its owner A ran in the
    meantime meets A's row at the gate and runs no second time; the one nobody ran
    runs on B."""
    job = await backend.add_job("taken-over")
    ran, left = tick_now() - timedelta(seconds=2), tick_now() - timedelta(seconds=1)
    gates["default"].set()
    async with replicas(backend, gates, takeover_seconds=0.2) as (a, b):
        a.fire(job, ran)
        await _finished_runs(backend, "taken-over", 1)
        b.runner.take_over(job, OwedTick(ran, left))
        b.runner.take_over(job, OwedTick(left, None))
        runs = await _finished_runs(backend, "taken-over", 2)
        await eventually_async(lambda: b.outcomes("taken-over", ran), 30, "B's claim of A's tick")
    assert [(r.scheduled_for, r.status, r.runner) for r in runs] == [
        (ran, RunStatus.SUCCEEDED, "a"),
        (left, RunStatus.SUCCEEDED, "b"),
    ]
    assert b.outcomes("taken-over", ran) == [ClaimOutcome.ALREADY_RAN]


async def test_a_tick_taken_over_waits_out_a_live_owners_run_before_judging_overlap(
    backend: Backend, gates: Gates
) -> None:
    """B takes over a tick while its owner A's run of the previous tick is still in
    progress (A is alive, only late): B does not skip it as an overlap after the usual
    half second, but waits up to the takeover time again, and runs it once A's run
    ends."""
    job = await backend.add_job("late-owner", overlap=Overlap.SKIP)
    first, second = tick_now() - timedelta(seconds=2), tick_now() - timedelta(seconds=1)
    async with replicas(backend, gates, takeover_seconds=4) as (a, b):
        a.fire(job, first)
        await eventually_async(lambda: gates.started == ["default"], 30, "A's run")
        b.runner.take_over(job, OwedTick(second, None))
        await eventually_async(
            lambda: ClaimOutcome.BUSY in b.outcomes("late-owner", second), 30, "B's busy claim"
        )
        await asyncio.sleep(1.0)  # past the usual patience of half a second
        gates["default"].set()
        runs = await _finished_runs(backend, "late-owner", 2)
    assert [(r.scheduled_for, r.status, r.runner) for r in runs] == [
        (first, RunStatus.SUCCEEDED, "a"),
        (second, RunStatus.SUCCEEDED, "b"),
    ]


async def test_a_run_whose_session_dies_stops_and_the_next_tick_runs_elsewhere(
    backend: Backend, gates: Gates
) -> None:
    """The session holding A's run and its lock is closed from outside: the run is
    cancelled at once (it could overlap the next one otherwise) and its end recorded
    through the ledger; B, free to take the lock, runs the next tick."""
    job = await backend.add_job("fenced")
    first, second = tick_now() - timedelta(seconds=2), tick_now() - timedelta(seconds=1)
    async with replicas(backend, gates) as (a, b):
        a.fire(job, first)
        await eventually_async(lambda: gates.started == ["default"], 30, "A's run")
        await backend.kill_lock_holder(job.lock_key)
        [cancelled] = await _finished_runs(backend, "fenced", 1)
        assert cancelled.error == LOCK_LOST
        assert a.runner.runs_in_flight == 0
        gates["default"].set()
        b.fire(job, second)
        runs = await _finished_runs(backend, "fenced", 2)
    assert [(r.scheduled_for, r.status, r.error, r.runner) for r in runs] == [
        (first, RunStatus.CANCELLED, LOCK_LOST, "a"),
        (second, RunStatus.SUCCEEDED, None, "b"),
    ]
    assert b.outcomes("fenced", second) == [ClaimOutcome.CLAIMED]


class RefusingSkips:
    """The backend's ledger, but the database is away for its first `refusals` skip
    records (what a restart answers); everything else goes through."""

    def __init__(self, inner: Ledger, refusals: int) -> None:
        self._inner = inner
        self.refusals = refusals

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def record_skips(self, skips: Sequence[Skip], runner: str) -> list[Run]:
        if self.refusals:
            self.refusals -= 1
            raise ConnectionRefusedError("the database is away")
        return await self._inner.record_skips(skips, runner)


async def test_a_misfire_the_database_refused_is_recorded_once_it_answers(
    backend: Backend, gates: Gates
) -> None:
    """A tick past its grace is settled as a misfire; if the database is away when its
    row is written, the write is tried again until it answers: the tick keeps its one
    recorded outcome (it used to be logged and lost)."""
    job = await backend.add_job("refused", misfire_grace_seconds=5)
    late = tick_now() - timedelta(minutes=2)
    ledger = RefusingSkips(backend.ledger, refusals=2)
    async with (
        backend.lock_pool() as pool,
        running(ledger, pool, gates, Metrics(), runner_id="a") as runner,
    ):
        runner.fire(job, late, RunTrigger.SCHEDULE)

        async def recorded() -> bool:
            return [(r.scheduled_for, r.skip_reason) for r in await backend.runs_of("refused")] == [
                (late, SkipReason.MISFIRE)
            ]

        await eventually_async(recorded, 30, "the misfire's row")
    assert ledger.refusals == 0


class HeldSkips:
    """The backend's ledger, but skip records wait until `release` is set (a crowd, a slow
    database): `reached` is set once one waits."""

    def __init__(self, inner: Ledger) -> None:
        self._inner = inner
        self.reached = asyncio.Event()
        self.release = asyncio.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def record_skips(self, skips: Sequence[Skip], runner: str) -> list[Run]:
        self.reached.set()
        await self.release.wait()
        return await self._inner.record_skips(skips, runner)


async def test_an_overlap_skip_written_after_the_run_ended_names_when_it_was_in_progress(
    backend: Backend, gates: Gates, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The second tick finds the first still running and is skipped; its row is written
    only after that run has ended. The row's time is when the claim saw the run in
    progress, not when it was written: a reader of the ledger finds a run in progress at
    the skip's moment (it used to find the skip after the run's end)."""
    monkeypatch.setattr(due_module, "OVERLAP_PATIENCE", timedelta(0))
    job = await backend.add_job("overlapped")
    first, second = tick_now() - timedelta(seconds=2), tick_now() - timedelta(seconds=1)
    ledger = HeldSkips(backend.ledger)
    async with (
        backend.lock_pool() as pool,
        running(ledger, pool, gates, Metrics(), runner_id="a") as runner,
    ):
        runner.fire(job, first, RunTrigger.SCHEDULE)
        await eventually_async(lambda: gates.started == ["default"], 30, "the first run")
        runner.fire(job, second, RunTrigger.SCHEDULE)
        await asyncio.wait_for(ledger.reached.wait(), 30)
        gates["default"].set()
        [ran] = await _finished_runs(backend, "overlapped", 1)
        ledger.release.set()
        ran, skip = await _finished_runs(backend, "overlapped", 2)
    assert (skip.scheduled_for, skip.skip_reason) == (second, SkipReason.OVERLAP)
    assert ran.finished_at is not None
    assert ran.started_at <= skip.started_at <= ran.finished_at
    assert skip.finished_at == skip.started_at


# --- many runs on a few long-lived sessions -------------------------------------------


async def test_five_hundred_runs_in_flight_on_two_sessions_all_end_and_unlock(
    backend: Backend, gates: Gates
) -> None:
    jobs = [await backend.add_job(f"many-{index:03d}") for index in range(500)]
    at = tick_now()
    async with (
        backend.lock_pool(2) as pool,
        running(backend.ledger, pool, gates, Metrics(), room=1000) as runner,
    ):
        for job in jobs:
            runner.fire(job, at, RunTrigger.SCHEDULE)
        await eventually_async(lambda: len(gates.started) == 500, 60, "500 runs in flight")
        assert runner.runs_in_flight == 500
        assert await backend.advisory_locks() == (500, 2)  # every run's lock, on 2 sessions
        gates["default"].set()
        await eventually_async(
            lambda: _no_locks(backend), 60, "every end recorded, every lock released"
        )
        for job in jobs:
            [run] = await backend.runs_of(job.name)
            assert (run.scheduled_for, run.status) == (at, RunStatus.SUCCEEDED)
        assert runner.runs_in_flight == 0


async def test_a_session_that_dies_fences_exactly_its_runs_and_a_new_one_takes_its_place(
    backend: Backend, gates: Gates
) -> None:
    """Two waves of runs on the two sessions of a pool; the first wave's session is
    killed from outside. Its runs, and only they, are cancelled (their locks died);
    the second wave's finish; the next claims go to a new session."""
    waves = {
        wave: [await backend.add_job(f"{wave}-{index}", args={"gate": wave}) for index in range(10)]
        for wave in ("doomed", "spared", "next")
    }
    at = tick_now()
    async with (
        backend.lock_pool(2) as pool,
        running(backend.ledger, pool, gates, Metrics(), room=100) as runner,
    ):
        owners = {}
        for wave in ("doomed", "spared"):
            for job in waves[wave]:
                runner.fire(job, at, RunTrigger.SCHEDULE)
            await eventually_async(lambda w=wave: gates.started.count(w) == 10, 30, f"{wave} runs")
            owners[wave] = await _owners(backend, waves[wave])
        assert len(owners["doomed"]) == len(owners["spared"]) == 1
        assert owners["doomed"] != owners["spared"]
        await backend.kill_lock_holder(waves["doomed"][0].lock_key)
        for job in waves["doomed"]:
            [fenced] = await _finished_runs(backend, job.name, 1)
            assert (fenced.status, fenced.error) == (RunStatus.CANCELLED, LOCK_LOST)
        assert runner.runs_in_flight == 10  # the spared wave runs on
        await pool.fill()  # the dead session's replacement, open before the next claims
        for job in waves["next"]:
            runner.fire(job, at, RunTrigger.SCHEDULE)
        await eventually_async(lambda: gates.started.count("next") == 10, 30, "the next runs")
        owners["next"] = await _owners(backend, waves["next"])
        assert len(owners["next"]) == 1
        assert owners["next"].isdisjoint(owners["doomed"] | owners["spared"])
        gates["spared"].set()
        gates["next"].set()
        for job in waves["spared"] + waves["next"]:
            [run] = await _finished_runs(backend, job.name, 1)
            assert (run.status, run.error) == (RunStatus.SUCCEEDED, None)
    assert await backend.advisory_locks() == (0, 0)
    assert gates.started.count("doomed") == 10  # started once each, never again


async def test_a_manual_trigger_gets_through_while_the_schedule_holds_every_session(
    backend: Backend, gates: Gates
) -> None:
    """Both scheduled sessions are busy with a claim that cannot finish (held on the
    crowd's row; the crowd takes no lock, so both claims go on to it); a manual run of
    another job still starts within its deadline, on the side session."""
    crowd = await backend.add_job("crowd", overlap=Overlap.ALLOW)
    manual = await backend.add_job("manual", args={"gate": "manual"})
    at = tick_now()
    async with (
        backend.lock_pool(2) as pool,
        backend.lock_pool(1) as side,
        running(backend.ledger, pool, gates, Metrics(), side_sessions=side) as runner,
    ):
        async with backend.hold_claims(crowd) as held:
            # One tick per job per claim: two ticks of the crowd take both sessions.
            runner.fire(crowd, at - timedelta(seconds=1), RunTrigger.SCHEDULE)
            runner.fire(crowd, at, RunTrigger.SCHEDULE)
            await held.reached(2)
            async with asyncio.timeout(on_demand.SIDE_WAIT_SECONDS):
                run = await runner.on_demand.trigger_now(manual)
            assert (run.job, run.status) == ("manual", RunStatus.RUNNING)
            await eventually_async(lambda: gates.started == ["manual"], 30, "the manual run")
            assert await backend.runs_of("crowd") == []  # the schedule's claims still wait
        gates["manual"].set()
        gates["default"].set()
        [ended] = await _finished_runs(backend, "manual", 1)
        assert ended.status is RunStatus.SUCCEEDED
        await _finished_runs(backend, "crowd", 2)


async def test_a_job_never_runs_twice_at_once_on_a_replica_with_one_session(
    backend: Backend, gates: Gates, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every claim of this replica goes to its one session, which holds the running
    job's lock: the job's next tick is an overlap skip and a manual run a conflict,
    exactly as if the run held the lock elsewhere."""
    monkeypatch.setattr(due_module, "OVERLAP_PATIENCE", timedelta(0))
    job = await backend.add_job("one-at-a-time")
    first, second = tick_now() - timedelta(seconds=2), tick_now() - timedelta(seconds=1)
    async with (
        backend.lock_pool(1) as pool,
        running(backend.ledger, pool, gates, Metrics()) as runner,
    ):
        runner.fire(job, first, RunTrigger.SCHEDULE)
        await eventually_async(lambda: gates.started == ["default"], 30, "the first run")
        runner.fire(job, second, RunTrigger.SCHEDULE)
        await eventually_async(
            lambda: _has_run(backend, "one-at-a-time", second), 30, "the next tick"
        )
        with pytest.raises(Conflict):
            await runner.on_demand.trigger_now(job)
        gates["default"].set()
        runs = await _finished_runs(backend, "one-at-a-time", 2)
    assert [(r.scheduled_for, r.status, r.skip_reason) for r in runs] == [
        (first, RunStatus.SUCCEEDED, None),
        (second, RunStatus.SKIPPED, SkipReason.OVERLAP),
    ]
    assert gates.started == ["default"]


async def _owners(backend: Backend, jobs: list[Job]) -> set[int | None]:
    return {await backend.lock_owner(job.lock_key) for job in jobs}


async def _no_locks(backend: Backend) -> bool:
    return await backend.advisory_locks() == (0, 0)


async def _slot_is(backend: Backend, job: str, at: datetime | None) -> bool:
    return await backend.slot_of(job) == at


async def _has_run(backend: Backend, job: str, at: datetime) -> bool:
    return any(run.scheduled_for == at for run in await backend.runs_of(job))


async def _finished_runs(backend: Backend, job: str, count: int) -> list[Run]:
    """The job's runs in tick order, once there are `count` and none is running."""

    async def done() -> bool:
        runs = await backend.runs_of(job)
        return len(runs) >= count and all(r.status is not RunStatus.RUNNING for r in runs)

    await eventually_async(done, 30, f"{count} finished runs of {job}")
    return sorted(await backend.runs_of(job), key=lambda run: run.scheduled_for)


async def test_a_delete_detaches_the_run_in_flight_and_asks_its_cancel(backend: Backend) -> None:
    """A delete is a cancel (#41): the run in flight keeps its row, detached from the
    name, with its cancel asked; until it ends it holds the name's lock, and a tick of a
    job made again under the name finds a run of it in progress (`busy`)."""
    job = await backend.add_job("doomed")
    async with backend.sessions.session(5) as old, backend.sessions.session(5) as new:
        [claim] = await old.claim([tick(job, tick_now())])
        assert claim.run is not None
        await backend.delete_job("doomed")
        reborn = await backend.add_job("doomed")
        [later] = await new.claim([tick(reborn, tick_now() + timedelta(seconds=1))])
        asked = await backend.ledger.cancels_asked("r")
        assert await old.unlock(job.lock_key)
    assert later.outcome is ClaimOutcome.BUSY
    assert asked == [CancelRequest(claim.run.id, "tickgate", "the job was deleted")]
    assert await backend.runs_of("doomed") == []  # the job made again has none of them


# --- the window's ports ---------------------------------------------------------------


async def test_a_window_read_finds_the_active_jobs_due_in_it_of_the_buckets_asked(
    backend: Backend,
) -> None:
    due = await backend.add_job("due")
    await backend.add_job("paused")
    await backend.put("paused", lambda current, now: current and pause_job(current, now))
    await backend.add_job("yearly", schedule=CronSchedule(kind="cron", expression="0 0 1 1 *"))
    read = await backend.window.read_window(None, 10)
    assert read.until - read.now == timedelta(seconds=10)
    assert [(job.name, job.revision) for job, _ in read.jobs] == [("due", due.revision)]
    [(_, cursor)] = read.jobs
    assert waits_for_a_tick(cursor)
    assert cursor < read.until
    own = bucket_of(due.lock_key)
    assert [
        job.name for job, _ in (await backend.window.read_window(frozenset({own}), 10)).jobs
    ] == ["due"]
    others = frozenset(range(BUCKETS)) - {own}
    assert (await backend.window.read_window(others, 10)).jobs == []
    named = await backend.window.read_window(None, 10, ["paused", "yearly", "gone"])
    assert sorted(job.name for job, _ in named.jobs) == ["paused", "yearly"]


async def test_a_job_past_its_last_tick_reads_with_a_cursor_waiting_for_none(
    backend: Backend,
) -> None:
    at = tick_now() - timedelta(seconds=5)
    job = await backend.add_job("once", schedule=OnceSchedule(kind="once", at=at))
    [(_, cursor)] = (await backend.window.read_window(None, 10)).jobs
    assert cursor == at
    async with backend.sessions.session(5) as session:
        [claim] = await session.claim([tick(job, at)])
        assert claim.run is not None
        await session.finish(claim.run.id, SUCCEEDED, job.lock_key)
    assert (await backend.window.read_window(None, 10)).jobs == []
    [(_, cursor)] = (await backend.window.read_window(None, 10, ["once"])).jobs
    assert not waits_for_a_tick(cursor)


async def test_a_listener_hears_jobs_written_and_cancels_asked_until_it_is_lost(
    backend: Backend,
) -> None:
    changed: list[str] = []
    cancels: list[None] = []
    lost = asyncio.Event()
    listener = await backend.listen(changed.append, lost.set, lambda: cancels.append(None))
    try:
        assert listener.alive
        job = await backend.add_job("heard")
        await eventually_async(lambda: "heard" in changed, 10, "the write heard")
        await backend.delete_job("heard")
        await eventually_async(lambda: changed.count("heard") >= 2, 10, "the delete heard")
        job = await backend.add_job("cancelled")
        async with backend.sessions.session(5) as session:
            [claim] = await session.claim([tick(job, tick_now())])
            assert claim.run is not None
            assert await backend.request_cancel(CancelRequest(claim.run.id, "ops", "hung"))
            await eventually_async(lambda: cancels != [], 10, "the cancel heard")
            await session.finish(claim.run.id, SUCCEEDED, job.lock_key)
        assert await backend.lose_listeners() == 1
        await asyncio.wait_for(lost.wait(), 10)
        assert not listener.alive
    finally:
        await listener.close()
