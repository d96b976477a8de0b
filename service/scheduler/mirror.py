"""Each replica's in-memory copy of the active jobs: a timetable of their next ticks,
woken by the replica's one APScheduler 3 job at the next instant a tick falls due.

Changes arrive by LISTEN/NOTIFY within moments; a periodic full reconcile, comparing
revisions, covers notifications lost while the listener was down. Loads and reconciles
run one at a time: each then applies a later state of the database than the one before.

A replica mirrors only the jobs it owns among the live members (see
`service/domain/ownership.py`); a change of members reconciles at once, and `Handover`
hands jobs over without a gap. A tick whose owner died or stalls is taken over from its
tick cursor by the audit (`service/scheduler/audit.py`), by any replica.
"""

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from datetime import UTC, datetime, timedelta
from uuid import UUID

from apscheduler.schedulers.asyncio import AsyncIOScheduler

from service.domain.jobs import Catchup, Job, JobState, close_window
from service.domain.ownership import Members
from service.domain.runs import RunTrigger, SkipReason
from service.domain.schedules import OnceSchedule
from service.scheduler.audit import audit_cursors
from service.scheduler.backoff import Backoff
from service.scheduler.clock import ReplicaClock
from service.scheduler.executor import WakeExecutor
from service.scheduler.handover import Handover
from service.scheduler.overdue import check_overdue
from service.scheduler.runner import Runner
from service.scheduler.timetable import Timetable
from service.scheduler.trigger import NextDue
from service.store import Store
from service.store.errors import is_unavailable
from service.store.fire_sql import Skip
from service.store.link import Link
from service.store.listener import JobListener

log = logging.getLogger(__name__)

# The id of the one APScheduler job: it wakes the mirror when a tick falls due.
_WAKE = "tickgate-wake"


class Mirror:
    def __init__(
        self,
        *,
        store: Store,
        runner: Runner,
        dsn: str,
        reconcile_seconds: float,
        run_history: int,
        clock: ReplicaClock | None = None,
        members: Callable[[], Members] = Members.unknown,
        link: Link | None = None,
    ) -> None:
        self._store = store
        self._link = link
        self._clock = clock or ReplicaClock()
        self._runner = runner
        self._dsn = dsn
        self._reconcile_seconds = reconcile_seconds
        self._run_history = run_history
        self._timetable = Timetable(self._clock)
        self._members = members
        self._handover = Handover(on_dropped=self._timetable.drop)
        self._members_changed = asyncio.Event()
        self._armed_at: datetime | None = None  # when the wake-up job fires next
        self._changed: set[str] = set()
        self._wake = asyncio.Event()
        # Held by each load and reconcile from its read to its last change: applied out
        # of order, an older read would bring back an old definition or drop a new job.
        self._loading = asyncio.Lock()
        self._listener: JobListener | None = None
        self._loops: list[asyncio.Task[None]] = []
        self._scheduler = AsyncIOScheduler(
            timezone=UTC,
            executors={"default": WakeExecutor(self._wake_up)},
            # One wake-up takes every tick due by then, however late it comes.
            job_defaults={"coalesce": True, "max_instances": 1, "misfire_grace_time": None},
        )
        self.last_sync: datetime | None = None
        # The database's clock at the first sync: a tick found late at a load that fell
        # due since then is a scheduled tick, one before a catch-up (`_late_trigger`).
        self._up_since: datetime | None = None
        self._stopping = False
        self._lost = asyncio.Event()

    @property
    def synced(self) -> bool:
        return self.last_sync is not None

    def __len__(self) -> int:
        return len(self._timetable)

    def mirrored(self) -> dict[str, tuple[UUID, int]]:
        """Name to revision of every job this replica would fire."""
        return self._timetable.revisions()

    @property
    def healthy(self) -> bool:
        """Synced at least once and hearing about changes as they happen."""
        return self.synced and self._listener is not None and self._listener.alive

    async def start(self) -> None:
        logging.getLogger("apscheduler").setLevel(logging.WARNING)
        in_sync = await self._guarded(self._listen_and_sync(), "listening for job changes")
        # Filed now, the wake-up job first fires at the timetable's earliest tick.
        self._scheduler.add_job(
            _never_called, trigger=NextDue(lambda: self._timetable.earliest), id=_WAKE
        )
        self._scheduler.start()
        await self._guarded(self._sweep(), "sweeping runs")
        self._loops = [
            asyncio.create_task(self._relisten_forever(in_sync)),
            asyncio.create_task(self._apply_changes_forever()),
            asyncio.create_task(self._maintain_forever()),
            asyncio.create_task(self._follow_members_forever()),
            asyncio.create_task(self._sweep_orphans_forever()),
            asyncio.create_task(self._audit_forever()),
        ]

    def pause(self) -> None:
        """Stop producing ticks (shutdown begins); runs in flight go on."""
        if self._scheduler.running:
            self._scheduler.pause()

    async def stop(self) -> None:
        self._stopping = True
        for loop in self._loops:
            loop.cancel()
        await asyncio.gather(*self._loops, return_exceptions=True)
        if self._scheduler.running:
            self._scheduler.shutdown(wait=False)
        if self._listener:
            await self._listener.close()

    def members_changed(self) -> None:
        """The live members changed: reconcile soon, to mirror what is ranked here now."""
        self._members_changed.set()

    async def reconcile(self) -> None:
        """Make the mirror equal the active jobs owned here, by revision."""
        async with self._loading:
            owned = await self._store.owned_versions(self._members())
            for name in self._timetable.revisions():
                self._handover.assign(name, name in owned)
            stale = [name for name, revision in owned.items() if self._revision(name) != revision]
            if stale:
                await self._apply(stale)
            self.last_sync = datetime.now(UTC)

    def _revision(self, name: str) -> tuple[UUID, int] | None:
        job = self._timetable.get(name)
        return job.revision if job else None

    def _wake_up(self) -> None:
        """A tick fell due: hand over every tick due by now, then sleep until the next."""
        for due in self._timetable.due(datetime.now(UTC)):
            self._runner.fire(due.job, due.tick, RunTrigger.SCHEDULE, following=due.following)
        self._armed_at = self._timetable.earliest

    def _arm(self, at: datetime | None) -> None:
        """Make sure the wake-up job fires by `at` (a newly filed tick's due time)."""
        if at is None or not self._scheduler.running:
            return  # not started yet: the wake-up job is filed with the earliest tick
        if self._armed_at is None or at < self._armed_at:
            self._armed_at = at
            self._scheduler.modify_job(_WAKE, next_run_time=at)

    def _on_notify(self, name: str) -> None:
        self._changed.add(name)
        self._wake.set()

    def _on_listener_lost(self) -> None:
        if not self._stopping:
            log.warning("lost the LISTEN connection; reconnecting")
        self._lost.set()

    async def _listen_and_sync(self) -> None:
        """LISTEN first, then reconcile: a change committed in between is seen by both."""
        if self._listener is not None:
            await self._listener.close()
        self._lost.clear()
        self._listener = await JobListener.open(
            self._dsn, self._on_notify, self._on_listener_lost, self._link
        )
        await self.reconcile()
        if self._up_since is None:
            self._up_since = await self._store.clock()
        log.info("scheduler synced: %d active jobs mirrored", len(self._timetable))

    async def _relisten_forever(self, in_sync: bool) -> None:
        """Reconnect with backoff whenever the listener drops (a database restart, say),
        and resync in full: notifications sent meanwhile are lost. Until a resync
        succeeds, the mirror may miss those changes for good, so a failed one is tried
        again even when the new listener is up."""
        backoff = Backoff()
        while True:
            if in_sync and self.healthy:
                await self._lost.wait()
                backoff.reset()
            await backoff.pause()
            in_sync = await self._guarded(self._listen_and_sync(), "reconnecting the listener")

    async def _apply_changes_forever(self) -> None:
        backoff = Backoff()
        while True:
            await self._wake.wait()
            self._wake.clear()
            names, self._changed = self._changed, set()
            if names and not await self._guarded(self._load(sorted(names)), "applying job changes"):
                # No notification will come again for these: keep them for the next wake,
                # after a pause so that a database outage is not a hot loop.
                self._changed |= names
                self._wake.set()
                await backoff.pause()
            else:
                backoff.reset()

    async def _follow_members_forever(self) -> None:
        backoff = Backoff()
        while True:
            await self._members_changed.wait()
            self._members_changed.clear()
            if await self._guarded(self.reconcile(), "following a change of members"):
                backoff.reset()
            else:
                self._members_changed.set()
                await backoff.pause()

    async def _maintain_forever(self) -> None:
        while True:
            await asyncio.sleep(self._reconcile_seconds)
            await self._guarded(self.reconcile(), "reconciling jobs")
            await self._guarded(self._sweep(), "sweeping runs")
            # The cluster's chores walk every job, so they wait for the first round rather
            # than hold up this replica's start (readiness).
            await self._guarded(self._prune(), "pruning run history")
            await self._guarded(self._check_overdue(), "checking for overdue jobs")

    async def _sweep_orphans_forever(self) -> None:
        # Twice per takeover period: a run its replica lost mid-crowd goes on elsewhere
        # (or is recorded abandoned) within seconds, not a reconcile.
        while True:
            await asyncio.sleep(self._runner.orphan_sweep_seconds)
            await self._guarded(self._runner.sweep_orphans(), "sweeping orphaned runs")

    async def _audit_forever(self) -> None:
        # Twice per takeover period, on every replica: a tick its owner left is claimed
        # within one and a half takeover periods of its due time, and one nobody can
        # start any more is recorded a moment after its reach, not a reconcile later.
        while True:
            await asyncio.sleep(self._runner.takeover_seconds / 2)
            await self._guarded(self._audit(), "auditing tick cursors")

    async def _audit(self) -> None:
        runner = self._runner
        takeover = timedelta(seconds=runner.takeover_seconds)
        await audit_cursors(
            self._store, takeover, runner.runner_id, runner.metrics, runner.take_over
        )

    async def _guarded(self, work: Awaitable[None], what: str) -> bool:
        """Run `work`; False if it failed, which is logged."""
        try:
            await work
        except Exception as error:
            # Whatever went wrong, the loops must live on; the next round tries again.
            if is_unavailable(error):
                log.warning("failed %s, database unavailable (%r); will retry", what, error)
            else:
                log.exception("failed %s; will retry", what)
            return False
        return True

    async def _load(self, names: list[str]) -> None:
        async with self._loading:
            await self._apply(names)

    async def _apply(self, names: list[str]) -> None:
        """Mirror these jobs as they stand now. Only with `_loading` held."""
        ranked = await self._store.get_ranked_jobs(names, self._members())
        found = {job.name: (job, role) for job, role in ranked}
        loaded = []
        for name in names:
            job, owned = found.get(name, (None, False))
            if job is None:
                self._drop(name)
                self._runner.job_deleted(name)
            elif job.state is not JobState.ACTIVE:
                self._drop(name)
            elif owned or self._timetable.get(name) is not None:
                # A job owned elsewhere now is kept up to date while it is handed over.
                self._handover.assign(name, owned)
                if self._put(job):
                    loaded.append(job)
        await self._catch_up(loaded)

    def _put(self, job: Job) -> bool:
        """Mirror `job`; False if this revision, or a later one of the same incarnation,
        is already mirrored."""
        current = self._timetable.get(job.name)
        if current is not None and not _supersedes(job, current):
            return False
        self._arm(self._timetable.put(job, datetime.now(UTC)))
        return True

    def _drop(self, name: str) -> None:
        self._timetable.drop(name)
        self._handover.forget(name)

    async def _catch_up(self, jobs: Iterable[Job]) -> None:
        """Fire, once, the latest tick of each job just loaded that nobody ran and is
        still in grace: a scheduled tick if it fell due while this replica was up (the
        job was created, or handed over, a moment ago), a catch-up if it fell before,
        for the jobs whose policy asks for one.

        Every replica may try this at once at startup; the ledger lets one through.
        Which ticks are past is judged on the database's clock, so a replica whose own
        clock runs ahead never "catches up" a tick that is not due yet.
        """
        now = await self._store.clock()
        due = {}
        for job in jobs:
            tick = job.tick_in_grace(now)
            if tick is not None and (trigger := self._late_trigger(job, tick)) is not None:
                due[(job.name, tick)] = (job, trigger)
        if due:
            for name, tick in await self._store.ticks_without_runs(list(due)):
                job, trigger = due[(name, tick)]
                self._runner.fire(job, tick, trigger)

    def _late_trigger(self, job: Job, tick: datetime) -> RunTrigger | None:
        """How a tick found late at load runs, if it does: a tick this replica was up
        for is a scheduled one; one it was not is the catch-up policy's (the audit draws
        the same line for the whole cluster, see `Takeover`)."""
        if self._up_since is not None and job.due(tick) >= self._up_since:
            return RunTrigger.SCHEDULE
        return RunTrigger.CATCHUP if job.catchup is Catchup.LATEST else None

    async def _sweep(self) -> None:
        """Jobs with nothing left to fire become completed (a one-time tick nobody ran
        is recorded as a misfire first), judged on the database's clock."""
        ended = await self._store.ended_jobs()
        if ended:
            await self._store.record_skips(_missed_once_ticks(ended), self._runner.runner_id)
            now = await self._store.clock()
            for job in ended:
                await self._store.mutate_job(job.name, _closing_window(now))

    async def _prune(self) -> None:
        pruned = await self._store.prune_runs(self._run_history, self._round_seconds)
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


def _supersedes(job: Job, current: Job) -> bool:
    """A later revision: another incarnation (the name was deleted and created anew;
    versions start again at 1) or a higher version of the same one."""
    return job.incarnation != current.incarnation or job.version > current.version


def _missed_once_ticks(jobs: Iterable[Job]) -> list[Skip]:
    """The one-time ticks of these ended jobs, as misfires: recorded only where the
    ledger has no row for them (no replica was up in time)."""
    note = "not started within its misfire grace: no replica ran it"
    return [
        Skip(job, job.schedule.at, RunTrigger.SCHEDULE, SkipReason.MISFIRE, note)
        for job in jobs
        if isinstance(job.schedule, OnceSchedule)
    ]


def _closing_window(now: datetime) -> Callable[[Job | None], Job | None]:
    def change(current: Job | None) -> Job | None:
        return close_window(current, now) if current else None

    return change


def _never_called() -> None:
    """APScheduler wants a callable; WakeExecutor wakes the mirror instead."""
