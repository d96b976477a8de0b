"""A due tick: a scheduled tick on its way through the runner's loop, and its times.

Each tick carries when it becomes a misfire (`deadline`: due + misfire grace, by this
replica's clock) and how long a BUSY answer is given before the overlap policy judges it
(`patience_until`). A tick the audit takes over from a replica that left it (`taken_over`)
gets more patience, or, under queue_one, the time its waiter's slot has left.
"""

from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta

from service.domain.cursors import OwedTick
from service.domain.jobs import Job
from service.domain.runs import SkipReason
from service.store.ports import Skip, TickClaim
from service.tracing import now_ns

# A BUSY tick waits this long (within its grace) before the overlap policy judges it:
# an earlier run may have returned and be just recording its end.
OVERLAP_PATIENCE = timedelta(seconds=0.5)
# How soon a tick the gate could not settle asks again. It holds no connection
# meanwhile; a LOCKED tick usually finds its row on the first retry (another replica
# was claiming it).
RETRY_SECONDS = 0.1
# How soon a tick goes round again after a statement about it failed.
RETRY_AFTER_FAILURE_SECONDS = 0.5


@dataclass(frozen=True)
class DueTick:
    """A scheduled tick on its way through the loop. `deadline` (this replica's clock)
    is when it becomes a misfire; `queued` ticks hold their queue_one job's slot."""

    claim: TickClaim
    deadline: datetime
    patience_until: datetime
    queued: bool = False
    # When a claim last found another run of the job in progress (the database's clock).
    busy_at: datetime | None = None
    # When the window fired it (wall clock, ns): its trace starts there.
    fired: int = field(default_factory=now_ns)

    @classmethod
    def of(cls, claim: TickClaim) -> "DueTick":
        deadline = claim.job.deadline(claim.scheduled_for)
        patience = min(claim.job.due(claim.scheduled_for) + OVERLAP_PATIENCE, deadline)
        return cls(claim, deadline, patience)

    @property
    def job(self) -> Job:
        return self.claim.job

    @property
    def job_name(self) -> str:
        return self.claim.job.name

    @property
    def scheduled_for(self) -> datetime:
        return self.claim.scheduled_for

    @property
    def alone(self) -> bool:
        return self.claim.counted

    def taken_over(self, owed: OwedTick, now: datetime, takeover: timedelta) -> "DueTick":
        """The tick as the audit hands it over from a replica that left it. A run of the
        job in progress then most likely means its owner is alive, only late (a stall, a
        clock behind this replica's), and will claim the tick once that run ends: the
        overlap policy judges a BUSY answer only after the takeover time again. A
        queue_one tick whose waiter is gone (`owed.waits_seconds`) waits in its place,
        in its slot, for as long as the slot has left."""
        if owed.waits_seconds is not None:
            return replace(self, queued=True, deadline=now + timedelta(seconds=owed.waits_seconds))
        patience = now + max(OVERLAP_PATIENCE, takeover)
        return replace(self, patience_until=min(patience, self.deadline))

    def waiting(self, now: datetime, seconds: float) -> "DueTick":
        """The tick holding its queue_one slot, for `seconds` at most from `now`."""
        return replace(self, queued=True, deadline=now + timedelta(seconds=seconds))

    def skip(self, reason: SkipReason, note: str) -> Skip:
        """The tick's skip row. An overlap skip's row says when the claim saw the run it
        gave way to, not when the row is written: by then (a crowd, a slow database)
        that run may have ended."""
        at = self.busy_at if reason is SkipReason.OVERLAP else None
        claim = self.claim
        return Skip(
            claim.job,
            claim.scheduled_for,
            claim.trigger,
            reason,
            note,
            following=claim.following,
            at=at,
        )
