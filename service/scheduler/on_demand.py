"""Runs asked for rather than scheduled: manual runs, a hook's chain runs, and backfills;
and the cancel of a tick waiting under queue_one.

They pass the same gate (lock and ledger) as scheduled ticks, but outside the fire
path's room, on side sessions of their own: the schedule never delays them and they
never take a scheduled claim's turn. They run in the process that asked (the API's for
the REST calls, the scheduler's for a chain run)."""

import asyncio
import time
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import replace
from datetime import datetime
from typing import Any

from pydantic import JsonValue

from service.domain.errors import Conflict, NotFound
from service.domain.jobs import Job, JobState
from service.domain.runs import CancelRequest, Run, RunTrigger, SkipReason
from service.scheduler.background import Background
from service.scheduler.clock import ReplicaClock
from service.scheduler.running import RunExecutor
from service.scheduler.skips import Skips
from service.store.ports import (
    Claim,
    ClaimOutcome,
    Ledger,
    LockPool,
    PinnedSession,
    Skip,
    TickClaim,
)
from service.tracing import GateTimes, now_ns

# Side sessions per replica; waiting for one (only while sessions are being replaced:
# the database went away) ends in a TimeoutError (503) after SIDE_WAIT_SECONDS.
SIDE_SESSIONS = 1
SIDE_WAIT_SECONDS = 10.0
# A backfill tick waits this long for the job's lock, then the backfill stops.
BACKFILL_WAIT_SECONDS = 30.0
# How often a backfill reads the runs of missed ticks it splits again, when another
# backfill changed them meanwhile, before it gives up (409).
SPLIT_ATTEMPTS = 3
# How soon a manual run or backfill asks the gate again for a lock or rows held elsewhere.
ASK_AGAIN_SECONDS = 0.1
# The claims a backfill tick asks again for; any other answer is its outcome.
_ASK_AGAIN = {ClaimOutcome.LOCKED, ClaimOutcome.CONTENDED, ClaimOutcome.BUSY}
CONTENDED = "the job's rows stayed held by other statements (edits, skips, the audit)"


class OnDemand:
    def __init__(
        self,
        *,
        skips: Skips,
        side_sessions: LockPool,
        store: Ledger,
        executor: RunExecutor,
        clock: ReplicaClock,
        runner_id: str,
        background: Background,
    ) -> None:
        self._skips = skips
        self._side_sessions = side_sessions
        self._store = store
        self._executor = executor
        self._clock = clock
        self._runner_id = runner_id
        self._background = background

    async def trigger_now(
        self,
        job: Job,
        args: dict[str, JsonValue] | None = None,
        note: str | None = None,
        trigger: RunTrigger = RunTrigger.MANUAL,
    ) -> Run:
        """A manual run (or a hook's `chain` run) through the same gate, with `args`
        instead of the job's if given (checked already) and the caller's `note`, both kept
        on its row; returns once the row exists and leaves the run going. Conflict if a
        "skip" job is running anywhere."""
        assert trigger.on_demand, "a tick's run is claimed by the loop, not asked for"
        decided: asyncio.Future[Claim] = asyncio.get_running_loop().create_future()
        tick = TickClaim.of(job, self._clock.now(), trigger, self._runner_id, any_version=True)
        tick = replace(tick, args=args, note=note)
        task = self._background.spawn(self._discard(self._on_the_side(tick, decided.set_result)))
        either: set[asyncio.Future[Any]] = {decided, task}
        await asyncio.wait(either, return_when=asyncio.FIRST_COMPLETED)
        if not decided.done():
            task.result()  # the gate failed before deciding: raise its error
            raise Conflict(f"job {job.name!r} could not be started")
        return _claimed_run(job, decided.result())

    async def backfill(self, job: Job, ticks: Sequence[datetime]) -> list[Run]:
        """Run each tick that has no run yet, in order, one after another; return the
        runs this call made. Scheduled ticks of the job go first. A job active when it
        began that is paused or completed meanwhile stops it (Conflict): the gate claims
        no tick for it after that. Another replica backfilling the same range at once
        takes some ticks itself: the ledger lets each through exactly once."""
        made = []
        while_active = job.state is JobState.ACTIVE  # a pause meanwhile stops the rest
        await self._split_missed(job, ticks)
        for at in ticks:
            tick = TickClaim.of(job, at, RunTrigger.BACKFILL, self._runner_id, any_version=True)
            run = await self._backfill_one(replace(tick, while_active=while_active))
            if run is not None:
                made.append(run)
        return made

    async def _split_missed(self, job: Job, ticks: Sequence[datetime]) -> None:
        """Give each tick a misfire row counts among its run of missed ticks a row of its
        own first, so it keeps exactly one outcome whether or not the backfill gets to
        it. Another backfill splitting the same run at once makes this one read again."""
        for _ in range(SPLIT_ATTEMPTS):
            if await self._store.split_missed(job, ticks):
                return
        raise Conflict(f"backfill of {job.name!r}: its missed ticks kept changing; try again")

    async def _backfill_one(self, tick: TickClaim) -> Run | None:
        """Claim and run one backfill tick, giving way to the job's scheduled ticks and
        waiting a bounded time for its lock."""
        deadline = time.monotonic() + BACKFILL_WAIT_SECONDS
        while True:
            await self._give_way(tick.job, deadline)
            claims: list[Claim] = []
            run = await self._on_the_side(tick, claims.append)
            if claims[0].outcome is ClaimOutcome.JOB_GONE:
                raise NotFound(f"no job named {tick.job.name!r}")
            if claims[0].outcome is ClaimOutcome.INACTIVE:
                raise Conflict(
                    f"backfill of {tick.job.name!r} stopped at {tick.scheduled_for.isoformat()}:"
                    " the job was paused or completed meanwhile; the ticks before it ran"
                )
            if claims[0].outcome not in _ASK_AGAIN:
                return run
            if time.monotonic() > deadline or not self._background.accepting:
                raise Conflict(
                    f"backfill of {tick.job.name!r} stopped at {tick.scheduled_for.isoformat()}:"
                    f" the job's lock stayed held for {BACKFILL_WAIT_SECONDS:g}s"
                )
            await asyncio.sleep(ASK_AGAIN_SECONDS)

    async def _give_way(self, job: Job, deadline: float) -> None:
        """Wait, until `deadline`, while the job has a scheduled tick due now and still
        without a ledger row: the scheduler is claiming it, and goes first. The ledger
        says so wherever the scheduler runs (backfills run in the API's process, or on
        another replica), so it is polled, like the lock."""
        while time.monotonic() < deadline and await self._scheduled_tick_waits(job):  # noqa: ASYNC110
            await asyncio.sleep(ASK_AGAIN_SECONDS)

    async def _scheduled_tick_waits(self, job: Job) -> bool:
        now = self._clock.now()
        tick = job.tick_in_grace(now)
        if tick is None or not job.is_tick(tick) or job.due(tick) > now:
            return False
        return bool(await self._store.ticks_without_runs([(job.name, tick)]))

    async def _claimed_on_the_side(self, session: PinnedSession, tick: TickClaim) -> Claim:
        """The gate's answer, asked again while another statement holds the job's rows
        (a moment, as a claim would have waited for them), for up to SIDE_WAIT_SECONDS."""
        deadline = time.monotonic() + SIDE_WAIT_SECONDS
        [claim] = await session.claim([tick])
        while claim.outcome is ClaimOutcome.CONTENDED and time.monotonic() < deadline:
            await asyncio.sleep(ASK_AGAIN_SECONDS)
            [claim] = await session.claim([tick])
        return claim

    async def _on_the_side(self, tick: TickClaim, on_claim: Callable[[Claim], None]) -> Run | None:
        """Claim one tick on a side session, outside the room, and run it if claimed;
        `on_claim` hears the claim as soon as there is one."""
        if not self._background.accepting:
            on_claim(Claim(ClaimOutcome.LOCKED))
            return None
        async with self._side_sessions.session(SIDE_WAIT_SECONDS) as session:
            sent = now_ns()
            claim = await self._claimed_on_the_side(session, tick)
            claimed = GateTimes(sent, sent, now_ns(), 1)
            on_claim(claim)
            if claim.run is None:
                return None
            # The job as the claim read it: an edit since the caller read it applies.
            job = claim.stored_job or tick.job
            return await self._executor.run(session, job, claim, claimed=claimed)

    async def cancel_queued(self, job: Job, request: CancelRequest) -> Run | None:
        """Drop the tick waiting under queue_one: it is recorded skipped, `cancelled`,
        and its slot freed. None if no tick waits, or it was claimed meanwhile (its
        run is then the one to cancel). The replica that holds it finds its row."""
        tick = await self._store.slot_tick(job.name)
        if tick is None:
            return None
        note = request.error()
        skip = Skip(job, tick, RunTrigger.SCHEDULE, SkipReason.CANCELLED, note)
        recorded = await self._skips.record([skip])
        await self._store.release_slot(job.name, tick)
        return recorded[0] if recorded else None

    async def _discard(self, work: Coroutine[Any, Any, object]) -> None:
        await work


def _claimed_run(job: Job, claim: Claim) -> Run:
    if claim.run is not None:
        return claim.run
    if claim.outcome is ClaimOutcome.JOB_GONE:
        raise NotFound(f"no job named {job.name!r}")
    if claim.outcome is ClaimOutcome.CONTENDED:
        raise Conflict(f"job {job.name!r} could not be started: {CONTENDED}")
    raise Conflict(f"job {job.name!r} is running somewhere; overlap is '{job.overlap.value}'")
