"""Each replica's window: the ticks due in the next few seconds of the jobs it owns, read
from the jobs' tick cursors in PostgreSQL, and fired to the runner as each falls due.

The loop is: gather (a refill every WINDOW_SECONDS / 2 reads, through the cursors' index,
the jobs of the buckets this replica owns whose cursor may fall due within
WINDOW_SECONDS, and files their ticks in a heap), wake at each tick's instant and hand
it to the runner (admit, claim, run, record: `service/scheduler/runner.py`). A job
created or changed reaches the window at once by LISTEN/NOTIFY if it is in a bucket
this replica owns, and costs every other replica nothing; a notification lost is made
good by the next refill. Memory is bounded by the window, never by the number of jobs:
a job with no tick in it is not filed at all.

Ownership only saves work (see `service/domain/ownership.py`): a bucket this replica no
longer owns is still read and fired for HANDOVER_SECONDS, while its new owner reads
it; a tick nobody claimed is taken over from its cursor by the audit
(`service/scheduler/audit.py`), by any replica. The chores beside the window (the
audit, completing jobs, retention, orphans) are `service/scheduler/chores.py`'s.

The window reads and hears through its ports (`WindowReads`, `OpenListener` in
`service/store/ports.py`): PostgreSQL in a replica, `harness/memory.py` in tests.
"""

import asyncio
import contextlib
import heapq
import itertools
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from uuid import UUID

from service.domain.jobs import Job, JobState
from service.domain.names import lock_key
from service.domain.ownership import BUCKETS, Members, bucket_of, owned_buckets
from service.domain.window import Filing, plan_ticks
from service.scheduler.background import guarded
from service.scheduler.backoff import Backoff
from service.scheduler.clock import ReplicaClock
from service.scheduler.runner import Runner
from service.store.ports import Listener, OpenListener, WindowRead, WindowReads, waits_for_a_tick

log = logging.getLogger(__name__)

# How far ahead a replica holds ticks; it reads the window again every half of it.
WINDOW_SECONDS = 10.0
# Longer than every member takes to see a change of members and read what it now owns.
HANDOVER_SECONDS = 10.0
# A job's ticks one plan files at most (a one-second job has ten in the window).
MOST_TICKS_PER_JOB = 600
# Jobs planned between two turns of the event loop.
PLANS_PER_SLICE = 1000
# How often a healthy listener's connection is looked at, should its loss go unannounced.
LISTENER_CHECK_SECONDS = 1.0
# With nothing filed, the loop still looks again this often.
IDLE_SECONDS = 1.0
# How soon a window whose runner was full (a crowd bigger than its room and waiting
# limit) fires again the due ticks it kept.
FULL_RUNNER_SECONDS = 0.05
_INSTANT = timedelta(microseconds=1)
_EVERY_BUCKET = frozenset(range(BUCKETS))


@dataclass
class _FiledJob:
    """A job with ticks in the window: the definition filed from, the last tick a plan
    looked at, the last tick fired to the runner, and its entries in the heap."""

    job: Job
    filed_through: datetime | None = None
    fired_through: datetime | None = None
    entries: int = 0


@dataclass(frozen=True, order=True)
class _Entry:
    at: datetime  # true time at which the tick is due here
    order: int  # ties at one instant go in the order they were filed
    filed: _FiledJob = field(compare=False)
    job: Job = field(compare=False)
    filing: Filing = field(compare=False)


class _Buckets:
    """The buckets this replica reads and fires: those it owns (None: all), and those
    it owned until a moment ago, each until its handover ends."""

    def __init__(self) -> None:
        self.mine: frozenset[int] | None = None
        self._leaving: dict[int, float] = {}  # bucket -> when its handover ends (monotonic)
        self._assigned = False  # before the first view, nothing was fired to give up

    def assign(self, mine: frozenset[int] | None, now: float) -> bool:
        """Own `mine` from now on; whether that gains a bucket (to read at once)."""
        fired, self._assigned = self._assigned, True
        before = _EVERY_BUCKET if self.mine is None else self.mine
        before = before if fired else frozenset()
        after = _EVERY_BUCKET if mine is None else mine
        for bucket in before - after:
            self._leaving.setdefault(bucket, now + HANDOVER_SECONDS)
        for bucket in after:
            self._leaving.pop(bucket, None)
        self.mine = mine
        return bool(after - before)

    def reading(self, now: float) -> frozenset[int] | None:
        """The buckets a window read covers (None: all)."""
        self._leaving = {bucket: ends for bucket, ends in self._leaving.items() if ends > now}
        return None if self.mine is None else self.mine | self._leaving.keys()

    def fires(self, bucket: int, now: float) -> bool:
        return self.mine is None or bucket in self.mine or self._leaving.get(bucket, 0) > now


class Window:
    def __init__(
        self,
        *,
        store: WindowReads,
        listen: OpenListener,
        runner: Runner,
        clock: ReplicaClock | None = None,
        members: Callable[[], Members] = Members.unknown,
        cluster_since: Callable[[], datetime | None] = lambda: None,
        window_seconds: float = WINDOW_SECONDS,
    ) -> None:
        """`listen`: opens the listener of job changes; `members`: the view ownership
        follows; `cluster_since`: when the earliest live member joined, on the
        database's clock (None: unknown), which the audit takes over after
        (`Takeover`); `window_seconds`: how far ahead ticks are filed; the window is read
        again every half of it."""
        self._store = store
        self._listen = listen
        self._clock = clock or ReplicaClock()
        self._runner = runner
        self._members = members
        self._cluster_since = cluster_since
        self._buckets = _Buckets()
        # A replica whose clock runs ahead fires a tick before the database's clock
        # reads it: it reads that much further ahead.
        self._seconds = window_seconds + max(0.0, self._clock.offset.total_seconds())
        self._refill_seconds = window_seconds / 2
        self._jobs: dict[str, _FiledJob] = {}
        self._heap: list[_Entry] = []
        self._order = itertools.count()
        self._dead = 0  # entries in the heap that will fire nothing
        self._filed = asyncio.Event()  # an entry went in: the next instant may be earlier
        self._refill_now = asyncio.Event()
        self._members_changed = asyncio.Event()
        self._changed: set[str] = set()
        self._wake = asyncio.Event()
        # Kept by each read from the database to its last change of the window: applied
        # out of order, an older read would bring back an old definition.
        self._loading = asyncio.Lock()
        self._listener: Listener | None = None
        self._loops: list[asyncio.Task[None]] = []
        self._paused = False
        self._stopping = False
        self._lost = asyncio.Event()
        self.last_sync: datetime | None = None
        # The database's clock at the first read: while no member is known, a tick due
        # by then that nobody ran was missed while this replica was down, a catch-up
        # matter (`plan_ticks`). Once members are known, the earliest one's start is:
        # the audit judges by that (`Takeover.since`), and the window must agree with it
        # on which tick is the catch-up, or the one the audit waits for never runs.
        self._up_since: datetime | None = None

    @property
    def synced(self) -> bool:
        return self.last_sync is not None

    def __len__(self) -> int:
        return len(self._jobs)

    @property
    def runner(self) -> Runner:
        """The runner this window hands its ticks to (and the audit its takeovers)."""
        return self._runner

    def filed(self) -> dict[str, tuple[UUID, int]]:
        """Name to revision of every job with ticks in the window."""
        return {name: filed.job.revision for name, filed in self._jobs.items()}

    @property
    def healthy(self) -> bool:
        """Read at least once and hearing about changes as they happen."""
        return self.synced and self._listener is not None and self._listener.alive

    async def start(self) -> None:
        self._buckets.assign(owned_buckets(self._members()), _monotonic())
        in_sync = await self._guarded(self._listen_and_refill(), "listening for job changes")
        self._loops = [
            asyncio.create_task(self._fire_forever()),
            asyncio.create_task(self._refill_forever()),
            asyncio.create_task(self._relisten_forever(in_sync)),
            asyncio.create_task(self._apply_changes_forever()),
            asyncio.create_task(self._follow_members_forever()),
        ]

    def pause(self) -> None:
        """Stop firing ticks (shutdown begins); runs in flight go on."""
        self._paused = True

    async def stop(self) -> None:
        self._stopping = True
        for loop in self._loops:
            loop.cancel()
        await asyncio.gather(*self._loops, return_exceptions=True)
        if self._listener:
            await self._listener.close()

    def members_changed(self) -> None:
        """The live members changed: own the buckets ranked here now."""
        self._members_changed.set()

    def buckets_read(self) -> frozenset[int] | None:
        """The buckets a read of the window covers now (None: all): those owned, and
        those still handed over."""
        return self._buckets.reading(_monotonic())

    # --- gather -------------------------------------------------------------------

    async def refill(self) -> None:
        """Read the window again: every job of the buckets read whose cursor may fall
        due in it, each planned from past what is filed already."""
        async with self._loading:
            buckets = self._buckets.reading(_monotonic())
            read = await self._store.read_window(buckets, self._seconds, filed=self._filed_job)
            self._up_since = self._up_since or read.now
            for index, (job, cursor) in enumerate(read.jobs, 1):
                self._plan(job, cursor, read)
                if not index % PLANS_PER_SLICE:
                    await asyncio.sleep(0)  # a crowd's ticks: the due ones still go out
            self._forget_all_but({job.name for job, _ in read.jobs})
            self.last_sync = datetime.now(UTC)

    def _filed_job(self, name: str) -> Job | None:
        filed = self._jobs.get(name)
        return filed.job if filed is not None else None

    async def _load(self, names: list[str]) -> None:
        """Bring these jobs, notified as changed, up to date in the window, if they are
        filed here or fall in a bucket read here. A job this replica keeps metric series of
        (it ran one of its ticks, taken over) is read too, only to learn if it was
        deleted: its deletion must take them away."""
        now = _monotonic()
        ours = {n for n in names if n in self._jobs or self._buckets.fires(_bucket(n), now)}
        names = [n for n in names if n in ours or self._runner.metrics.counts(n)]
        if not names:
            return
        async with self._loading:
            read = await self._store.read_window(None, self._seconds, names)
            found = {job.name: (job, cursor) for job, cursor in read.jobs}
            for name in names:
                job, cursor = found.get(name, (None, None))
                if job is None:
                    self._drop(name)
                    self._runner.job_deleted(name)
                elif name not in ours:
                    continue
                elif job.state is not JobState.ACTIVE or not waits_for_a_tick(cursor):
                    self._drop(name)
                else:
                    self._plan(job, cursor, read)

    def _plan(self, job: Job, cursor: datetime, read: WindowRead) -> None:
        """File the job's ticks in the window that are not filed already. A new
        definition replaces the old one's entries, from past the last tick fired."""
        filed = self._jobs.get(job.name)
        after = cursor - _INSTANT
        if filed is not None and filed.job.revision != job.revision:
            self._dead += filed.entries
            filed.job, filed.filed_through = job, None
        if filed is not None:
            after = max(after, filed.filed_through or filed.fired_through or after)
        since = self._cluster_since() or self._up_since or read.now
        plan = plan_ticks(
            job, after, now=read.now, until=read.until, since=since, most=MOST_TICKS_PER_JOB
        )
        if filed is None and not plan.filings:
            return
        filed = filed or self._jobs.setdefault(job.name, _FiledJob(job))
        filed.filed_through = plan.through or filed.filed_through
        for filing in plan.filings:
            self._file(filed, filing)

    def _file(self, filed: _FiledJob, filing: Filing) -> None:
        at = self._clock.true(filing.tick)
        entry = _Entry(at, next(self._order), filed, filed.job, filing)
        heapq.heappush(self._heap, entry)
        filed.entries += 1
        if self._heap[0] is entry:
            self._filed.set()

    def _drop(self, name: str) -> None:
        filed = self._jobs.pop(name, None)
        if filed is not None:
            self._dead += filed.entries

    def _forget_all_but(self, read: set[str]) -> None:
        """Jobs the last read did not find and with nothing left in the heap are filed no
        longer: memory follows the window, not the jobs."""
        for name in [n for n, filed in self._jobs.items() if n not in read and not filed.entries]:
            del self._jobs[name]
        if self._dead > len(self._heap) // 2 + 1024:
            self._heap = [entry for entry in self._heap if self._live(entry)]
            heapq.heapify(self._heap)
            self._dead = 0

    def _live(self, entry: _Entry) -> bool:
        return self._jobs.get(entry.job.name) is entry.filed and entry.filed.job is entry.job

    # --- fire ---------------------------------------------------------------------

    async def _fire_forever(self) -> None:
        """Hand every tick due by now to the runner, then sleep until the next one is due
        (or one is filed ahead of it)."""
        while True:
            self._filed.clear()
            now = datetime.now(UTC)
            if not self._paused:
                self._fire_due(now)
            wait = IDLE_SECONDS
            if self._heap and not self._paused:
                wait = min(wait, max(0.0, (self._heap[0].at - now).total_seconds()))
                wait = max(wait, FULL_RUNNER_SECONDS if self._runner.full else 0.0)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):
                    await self._filed.wait()

    def _fire_due(self, now: datetime) -> None:
        """Hand the due ticks over while the runner takes them; a full runner leaves the
        rest filed here (a crowd: they go as room frees, or as misfires past due)."""
        clock = _monotonic()
        while self._heap and self._heap[0].at <= now and not self._runner.full:
            entry = heapq.heappop(self._heap)
            entry.filed.entries -= 1
            if not self._live(entry):
                self._dead = max(0, self._dead - 1)
                continue
            if not self._buckets.fires(_bucket(entry.job.name), clock):
                continue
            filing = entry.filing
            entry.filed.fired_through = max(entry.filed.fired_through or filing.tick, filing.tick)
            self._runner.fire(entry.job, filing.tick, filing.trigger, following=filing.following)

    # --- the loops ----------------------------------------------------------------

    async def _refill_forever(self) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._refill_seconds):
                    await self._refill_now.wait()
            self._refill_now.clear()
            await self._guarded(self.refill(), "reading the window")

    def _on_notify(self, name: str) -> None:
        self._changed.add(name)
        self._wake.set()

    def _on_cancel(self) -> None:
        self._runner.cancel_asked()

    def _on_listener_lost(self) -> None:
        if not self._stopping:
            log.warning("lost the LISTEN connection; reconnecting")
        self._lost.set()

    async def _listen_and_refill(self) -> None:
        """LISTEN first, then read: a change committed in between is seen by both."""
        if self._listener is not None:
            await self._listener.close()
        self._lost.clear()
        listen = self._listen
        self._listener = await listen(self._on_notify, self._on_listener_lost, self._on_cancel)
        self._runner.cancel_asked()  # any asked while it was not listening
        await self.refill()
        log.info("scheduler synced: %d jobs with ticks in the window", len(self._jobs))

    async def _relisten_forever(self, in_sync: bool) -> None:
        """Reconnect with backoff whenever the listener drops (a database restart, say),
        and read the window again: notifications sent meanwhile are lost. Until a read
        succeeds the window may miss those changes, so a failed one is tried again even
        when the new listener is up."""
        backoff = Backoff()
        while True:
            if in_sync and self.healthy:
                await self._until_listener_lost()
                backoff.reset()
            await backoff.pause()
            in_sync = await self._guarded(self._listen_and_refill(), "reconnecting the listener")

    async def _until_listener_lost(self) -> None:
        """Until the listener is lost: its termination callback says so, or its
        connection is found closed at a check every LISTENER_CHECK_SECONDS. asyncpg
        skips the callback for a connection lost while it was already closing, which
        once left a replica deaf (and not ready) after a database restart."""
        while self.healthy:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(LISTENER_CHECK_SECONDS):
                    await self._lost.wait()
                    return
        log.warning("the LISTEN connection is closed; reconnecting")

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
        while True:
            await self._members_changed.wait()
            self._members_changed.clear()
            if self._buckets.assign(owned_buckets(self._members()), _monotonic()):
                self._refill_now.set()  # the gained buckets' ticks are due now

    async def _guarded(self, work: Awaitable[None], what: str) -> bool:
        return await guarded(work, what, log)


def _bucket(name: str) -> int:
    return bucket_of(lock_key(name))


def _monotonic() -> float:
    return asyncio.get_running_loop().time()
