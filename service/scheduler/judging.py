"""The claim answers that decide nothing yet, judged: BUSY (another run of the job is in
progress) and STALE (the job changed since the tick was scheduled).

- BUSY: after a moment's patience the overlap policy decides. `skip` records the tick
  an `overlap` skip; `queue_one` lets it wait, in the job's one slot
  (`tickgate_pending`), for the run in progress, or skips it if another tick waits
  there already.
- STALE: a tick the job, as it stands now, still has goes round again with that
  definition; any other is no tick of the job.

Each ends by sending the tick round the runner's loop again or recording its skip,
through the `Loop` it is given: the loop stays the runner's.
"""

import asyncio
from collections.abc import Coroutine, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import replace
from typing import Any, Protocol

from service.domain.jobs import Overlap
from service.domain.runs import SkipReason
from service.scheduler.background import log_failure
from service.scheduler.clock import ReplicaClock
from service.scheduler.due import RETRY_AFTER_FAILURE_SECONDS, RETRY_SECONDS, DueTick
from service.shielding import run_to_completion
from service.store.ports import Following, Ledger

STILL_RUNNING = "an earlier run was still in progress"


class Loop(Protocol):
    """The runner's loop, as a judgement ends in it."""

    def again(self, ticks: Iterable[DueTick], after: float, why: str) -> None: ...

    def skip(self, ticks: Sequence[DueTick], reason: SkipReason, note: str) -> None: ...

    def spawn(self, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]: ...


class Judge:
    def __init__(self, loop: Loop, store: Ledger, clock: ReplicaClock, runner_id: str) -> None:
        self._loop = loop
        self._store = store
        self._clock = clock
        self._runner_id = runner_id

    def busy(self, tick: DueTick) -> None:
        """Another run of the job is in progress: after a moment's patience, the
        overlap policy decides. Whoever sees that records the skip, once."""
        if tick.queued or self._clock.now() < tick.patience_until:
            self._loop.again([tick], RETRY_SECONDS, STILL_RUNNING)
        elif tick.job.overlap is Overlap.QUEUE_ONE:
            self._loop.spawn(self._queue(tick))
        else:
            self._loop.skip([tick], SkipReason.OVERLAP, STILL_RUNNING)

    def stale(self, tick: DueTick) -> None:
        self._loop.spawn(self._judge_again(tick))

    def settled(self, tick: DueTick) -> None:
        """The tick has its outcome, or needs none: a tick that waited frees its slot."""
        if tick.queued:
            self._loop.spawn(self._release_slot(tick))

    async def _queue(self, tick: DueTick) -> None:
        """queue_one: this tick waits for the run in progress, unless another tick
        already does (then it is skipped). Waiting holds no connection."""
        job = tick.job
        longest = job.retry.worst_case_seconds(job.timeout_seconds) + job.misfire_grace_seconds
        with self._round_again_on_failure(tick, "queue_one slot"):
            held = await self._store.reserve_slot(
                job.name, tick.scheduled_for, self._runner_id, longest
            )
            if held is None or held == tick.scheduled_for:
                queued = tick.waiting(self._clock.now(), longest)
                self._loop.again(
                    [queued], RETRY_SECONDS, "the run it waited for outlasted its wait"
                )
            else:
                self._loop.skip(
                    [tick], SkipReason.OVERLAP, "another tick already waited for the run"
                )

    async def _judge_again(self, tick: DueTick) -> None:
        with self._round_again_on_failure(tick, "reading the changed job"):
            jobs = await self._store.get_jobs([tick.job_name])
            current = jobs[0] if jobs else None
            if current is not None and current.is_tick(tick.scheduled_for):
                claim = replace(tick.claim, job=current, following=Following.UNKNOWN)
                self._loop.again([replace(tick, claim=claim)], 0.0, "the job kept changing")
            else:
                self.settled(tick)

    async def _release_slot(self, tick: DueTick) -> None:
        await run_to_completion(self._store.release_slot(tick.job_name, tick.scheduled_for))

    @contextmanager
    def _round_again_on_failure(self, tick: DueTick, what: str) -> Iterator[None]:
        try:
            yield
        except Exception as error:  # noqa: BLE001 - logged; the tick goes round again
            log_failure(f"{what} for {tick.job_name}", error)
            self._loop.again([tick], RETRY_AFTER_FAILURE_SECONDS, f"{what} kept failing")
