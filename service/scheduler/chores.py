"""The chores beside each replica's window: the loops that keep the ledger and the
cursors in order, while the window (`service/scheduler/window.py`) fires ticks.

- the audit, twice per takeover period: lagging cursors move on, their owed ticks
  go to the runner (`service/scheduler/audit.py`);
- the orphan sweep, twice per takeover period and at once when a peer left: runs
  whose replica is gone are resumed or abandoned (`service/scheduler/orphans.py`);
- every reconcile period (and completing jobs at startup too): jobs with nothing left
  to fire are completed, run history is pruned, the overdue book is filed
  (`service/scheduler/overdue.py`), and the metric series of jobs no longer read
  here are forgotten.

Each loop's round is guarded: a failure is logged and the next round tries again.
"""

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import replace
from datetime import datetime, timedelta

from service.domain.cursors import Takeover
from service.domain.jobs import Job, complete_if_ended
from service.domain.ownership import Members
from service.domain.runs import RunTrigger, SkipReason
from service.domain.schedules import OnceSchedule
from service.scheduler.audit import audit_cursors
from service.scheduler.background import guarded
from service.scheduler.overdue import check_overdue
from service.scheduler.runner import Runner
from service.store.ports import ChoreStore, Skip

log = logging.getLogger(__name__)

# A sweep meant for the moment an orphan's grace ends comes this much after it.
ORPHAN_SLACK_SECONDS = 0.1


class Chores:
    def __init__(
        self,
        *,
        store: ChoreStore,
        runner: Runner,
        reconcile_seconds: float,
        run_history: int,
        output_bytes_per_job: int | None = None,
        members: Callable[[], Members] = Members.unknown,
        cluster_since: Callable[[], datetime | None] = lambda: None,
        buckets_read: Callable[[], frozenset[int] | None] = lambda: None,
    ) -> None:
        """`members`: the view whose peers leaving makes orphans; `cluster_since`: when
        the earliest live member joined (None: unknown), which the audit takes over
        after (`Takeover`); `buckets_read`: the buckets the window reads (None: all),
        whose jobs' metric series stay."""
        self._store = store
        self._runner = runner
        self._reconcile_seconds = reconcile_seconds
        self._run_history = run_history
        self._output_bytes_per_job = output_bytes_per_job
        self._members = members
        self._view = Members.unknown()
        self._cluster_since = cluster_since
        self._buckets_read = buckets_read
        self._peer_left = asyncio.Event()
        self._next_orphan_sweep = runner.orphans.sweep_seconds
        self._loops: list[asyncio.Task[None]] = []

    def start(self) -> None:
        """The chores (completing jobs first) go in the background: the first tick
        never waits for them, however slow a chore is."""
        self._view = self._members()
        self._loops = [
            asyncio.create_task(self._maintain_forever()),
            asyncio.create_task(self._sweep_orphans_forever()),
            asyncio.create_task(self._audit_forever()),
        ]

    async def stop(self) -> None:
        for loop in self._loops:
            loop.cancel()
        await asyncio.gather(*self._loops, return_exceptions=True)

    def members_changed(self) -> None:
        """The live members changed: a peer gone while this replica stayed leaves its
        runs orphans now. (After a restart of PostgreSQL this replica rejoined too: no
        hurry.)"""
        view, before = self._members(), self._view
        self._view = view
        if view.own == before.own and set(before.seeds) - set(view.seeds):
            self._peer_left.set()

    # --- the loops ----------------------------------------------------------------

    async def _maintain_forever(self) -> None:
        await self._guarded(self._complete_ended(), "completing ended jobs")  # at startup too
        while True:
            await asyncio.sleep(self._reconcile_seconds)
            await self._guarded(self._complete_ended(), "completing ended jobs")
            await self._guarded(self._prune(), "pruning run history")
            await self._guarded(self._check_overdue(), "checking for overdue jobs")
            # The metric series of jobs in buckets no longer read here go, after a while.
            self._runner.metrics.forget_unowned(self._buckets_read())

    async def _sweep_orphans_forever(self) -> None:
        # Twice per takeover period, at once when a peer left the cluster, and again as
        # soon as an orphan left to its replica may be taken: a run its replica lost
        # mid-crowd goes on elsewhere (or is recorded abandoned) within seconds.
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._next_orphan_sweep):
                    await self._peer_left.wait()
            self._peer_left.clear()
            await self._guarded(self._sweep_orphans(), "sweeping orphaned runs")

    async def _sweep_orphans(self) -> None:
        period = self._runner.orphans.sweep_seconds
        self._next_orphan_sweep = period  # unless the sweep says sooner
        grace_left = await self._runner.orphans.sweep()
        if grace_left is not None:
            self._next_orphan_sweep = min(period, max(grace_left, 0.0) + ORPHAN_SLACK_SECONDS)

    async def _audit_forever(self) -> None:
        # Twice per takeover period, on every replica: a tick its owner left is claimed
        # within one and a half takeover periods of its due time, and one nobody can
        # start any more is recorded a moment after its reach, not a reconcile later.
        while True:
            await asyncio.sleep(self._runner.takeover_seconds / 2)
            await self._guarded(self._audit(), "auditing tick cursors")

    async def _audit(self) -> None:
        runner = self._runner
        after, since = timedelta(seconds=runner.takeover_seconds), self._cluster_since()
        takeover = Takeover(after, since) if since else Takeover.anytime(after)
        # A replica behind with its own ticks only accounts (`Takeover.taking`).
        takeover = replace(takeover, taking=not runner.behind)
        await audit_cursors(
            self._store, takeover, runner.runner_id, runner.metrics, runner.take_over
        )

    async def _guarded(self, work: Awaitable[None], what: str) -> bool:
        return await guarded(work, what, log)

    # --- the rounds -----------------------------------------------------------------

    async def _complete_ended(self) -> None:
        """Jobs with nothing left to fire become completed (a one-time tick nobody ran
        is recorded as a misfire first), judged on the database's clock, all in one
        transaction; each statement within its deadline."""
        ended = await self._store.ended_jobs()
        if ended:
            await self._store.record_skips(_missed_once_ticks(ended), self._runner.runner_id)
            await self._store.update_jobs({job.name: complete_if_ended for job in ended})

    async def _prune(self) -> None:
        pruned = await self._store.prune_runs(
            self._run_history, self._round_seconds, self._output_bytes_per_job
        )
        if pruned:
            log.info("deleted %d runs beyond the newest %d per job", pruned, self._run_history)

    async def _check_overdue(self) -> None:
        await check_overdue(self._store, self._round_seconds)

    @property
    def _round_seconds(self) -> float:
        """How often one replica of the cluster does each chore (retention, the overdue
        check): a little under the reconcile period, so that replicas' rounds drifting
        apart do not each find the last one too recent."""
        return self._reconcile_seconds * 0.9


def _missed_once_ticks(jobs: Iterable[Job]) -> list[Skip]:
    """The one-time ticks of these ended jobs, as misfires: recorded only where the
    ledger has no row for them (no replica was up in time)."""
    note = "not started within its misfire grace: no replica ran it"
    return [
        Skip(job, job.schedule.at, RunTrigger.SCHEDULE, SkipReason.MISFIRE, note)
        for job in jobs
        if isinstance(job.schedule, OnceSchedule)
    ]
