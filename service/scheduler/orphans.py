"""Runs whose replica died mid-run (orphans): each whose retry policy allows another
attempt gets it on a replica alive, the same run (id, Idempotency-Key) moved there;
the others end `abandoned`. The chores sweep every half takeover period."""

import asyncio
import logging
import random
from collections.abc import Iterator
from datetime import datetime
from uuid import UUID

from service.scheduler.background import Background, log_failure
from service.scheduler.clock import ReplicaClock
from service.scheduler.running import RECORD_ELSEWHERE_SECONDS, RunExecutor
from service.store.ports import Claim, Ledger, LockPool, Orphan, PinnedSession

log = logging.getLogger(__name__)

# Orphans one resume statement takes over at most.
RESUME_BATCH = 200
# How long a resume waits for an open lock session (only while sessions are being
# replaced: the database went away); the next sweep finds the orphans again.
RESUME_WAIT_SECONDS = 10.0
# A replica that lost a run's session (not its life) records the run's end itself, trying
# for RECORD_ELSEWHERE_SECONDS; the orphan sweep leaves the run to it this long.
ORPHAN_GRACE_SECONDS = RECORD_ELSEWHERE_SECONDS + 5.0
# How long an orphan whose runner is not a member now is given for it to come back as one
# (a PostgreSQL restart ends every member's session too); a dead replica never does.
REJOIN_GRACE_SECONDS = 5.0


class Orphans:
    def __init__(
        self,
        *,
        sessions: LockPool,
        store: Ledger,
        executor: RunExecutor,
        clock: ReplicaClock,
        runner_id: str,
        room: int,
        takeover_seconds: float,
        background: Background,
    ) -> None:
        # How often the chores sweep: twice per takeover period.
        self.sweep_seconds = takeover_seconds / 2
        self._sessions = sessions
        self._store = store
        self._executor = executor
        self._clock = clock
        self._runner_id = runner_id
        self._room = room
        self._background = background
        self._resuming: set[UUID] = set()  # ids of the runs being resumed here

    async def sweep(self) -> float | None:
        """Abandon the orphans no attempt is left for, and resume the others here. A run
        whose runner is alive (it lost only the run's session) is left to it for
        ORPHAN_GRACE_SECONDS, and one whose runner is not a member now for
        REJOIN_GRACE_SECONDS (see `Orphan.awaits_its_replica`). Replicas sweep at once
        and each takes a share, the row's compare-and-set deciding; at most the room's
        worth of resumed runs go at a time here, and the rest wait for the next sweep.
        Returns in how many seconds the first orphan left to its replica may be taken
        (None: none is), for the next sweep to come no later."""
        room = self._room - len(self._resuming)
        found = await self._store.orphans(max(room, 1) * 4)
        graces = (REJOIN_GRACE_SECONDS, ORPHAN_GRACE_SECONDS)
        left = [orphan.grace_left(*graces) for orphan in found]
        orphans = [orphan for orphan, grace in zip(found, left, strict=True) if grace < 0]
        waiting = [grace for grace in left if grace >= 0]
        now = self._clock.now()
        for run in await self._store.abandon([o for o in orphans if not o.resumable(now)]):
            log.warning("run %s of %s abandoned by runner %s", run.id, run.job, run.runner)
        resumable = [o for o in orphans if o.resumable(now) and o.run.id not in self._resuming]
        random.shuffle(resumable)  # racing replicas each win a share, not the same ones
        if self._background.accepting:
            for batch in resume_batches(resumable[: max(room, 0)]):
                self._resuming.update(orphan.run.id for orphan in batch)
                self._background.spawn(self._resume(batch, now))
        return min(waiting, default=None)

    async def _resume(self, batch: list[Orphan], now: datetime) -> None:
        """Take the orphans' runs over on a lock session, in one statement, and make their
        next attempts there; one another replica took first, or that ended meanwhile, is
        left alone. (A crash mid-crowd leaves a thousand orphans: a statement each kept
        the last of them waiting for seconds.)"""
        try:
            async with self._sessions.session(RESUME_WAIT_SECONDS) as session:
                claims = await session.resume(batch, self._runner_id)
                answers = list(zip(batch, claims, strict=True))
                resumed = [(orphan, claim) for orphan, claim in answers if claim.run is not None]
                # Those not taken here may be found again by the next sweep.
                self._resuming.difference_update(o.run.id for o, c in answers if c.run is None)
                await asyncio.gather(*(self._resumed(session, o, c, now) for o, c in resumed))
        except Exception as error:  # noqa: BLE001 - logged; the next sweep finds them again
            log_failure(f"taking over {len(batch)} orphaned runs", error)
        finally:
            self._resuming.difference_update(orphan.run.id for orphan in batch)

    async def _resumed(
        self, session: PinnedSession, orphan: Orphan, claim: Claim, now: datetime
    ) -> None:
        """Make the next attempts of an orphan's run this session took over."""
        assert claim.run is not None
        log.warning(
            "run %s resumed here at attempt %d: runner %s stopped mid-run",
            claim.run.id,
            claim.run.attempts,
            orphan.run.runner,
            extra={"job": orphan.run.job},
        )
        try:
            spent = (now - orphan.run.started_at).total_seconds()
            await self._executor.run(session, orphan.job, claim, spent)
        except Exception as error:  # noqa: BLE001 - logged; the batch's other runs go on
            log_failure(f"resumed run {orphan.run.id}", error)
        finally:
            self._resuming.discard(orphan.run.id)


def resume_batches(orphans: list[Orphan]) -> Iterator[list[Orphan]]:
    """The orphans in batches of at most RESUME_BATCH, one orphan per lock key each
    (a session's locks are re-entrant: a key taken twice in one statement would let
    two runs of a job through)."""
    while orphans:
        batch: list[Orphan] = []
        keys: set[int] = set()
        rest = []
        for orphan in orphans:
            if len(batch) == RESUME_BATCH or (orphan.locked and orphan.lock_key in keys):
                rest.append(orphan)
                continue
            batch.append(orphan)
            if orphan.locked:
                keys.add(orphan.lock_key)
        yield batch
        orphans = rest
