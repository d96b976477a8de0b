"""Admission: how much room this replica has for runs, how many claims it may have in
flight, and the due ticks that wait for both.

Room is counted in ticks: a tick takes one unit from when it is taken for a claim
(it may be claimed, and then runs at once) until its claim says it will not run here,
or until its run ends. A tick that turns out not to run holds its unit no longer than
its claim statement. Claims in flight are bounded apart: a batch taken for a claim
holds one of `claims` until its statement has answered (one per lock session, so no
claim waits for another's turn).

Ticks beyond the room or the claims wait, in arrival order, and no longer than their
deadline: `expired` hands back those past it, to be recorded as misfires. The queue is
bounded: past `limit` the oldest waiting ticks are handed back too, since waiting
longer could only make them misfires later (and other replicas, with room, are racing
for them meanwhile).
"""

from collections import deque
from collections.abc import Iterable
from datetime import datetime
from typing import Generic, Protocol, TypeVar


class Waiting(Protocol):
    @property
    def job_name(self) -> str: ...

    @property
    def deadline(self) -> datetime: ...

    @property
    def alone(self) -> bool:
        """Claimed on its own, never in a batch (a claim that counts runs)."""
        ...


T = TypeVar("T", bound=Waiting)


class Admission(Generic[T]):
    def __init__(self, room: int, claims: int, limit: int) -> None:
        self._room = room
        self._claims = claims
        self._limit = limit
        self._waiting: deque[T] = deque()
        # No waiting tick's deadline is earlier: most calls of `expired` cost nothing.
        self._earliest: datetime | None = None

    @property
    def room(self) -> int:
        return self._room

    def __len__(self) -> int:
        return len(self._waiting)

    @property
    def oldest(self) -> T | None:
        """The tick that has waited longest (None: none waits)."""
        return self._waiting[0] if self._waiting else None

    def offer(self, ticks: Iterable[T]) -> list[T]:
        """Queue `ticks`; return the oldest waiting ticks beyond the limit."""
        for tick in ticks:
            self._waiting.append(tick)
            if self._earliest is None or tick.deadline < self._earliest:
                self._earliest = tick.deadline
        overflow = []
        while len(self._waiting) > self._limit:
            overflow.append(self._waiting.popleft())
        return overflow

    def expired(self, now: datetime) -> list[T]:
        """Take every waiting tick past its deadline."""
        if self._earliest is None or now <= self._earliest:
            return []
        kept: deque[T] = deque()
        gone: list[T] = []
        for tick in self._waiting:
            (gone if tick.deadline < now else kept).append(tick)
        self._waiting = kept
        self._earliest = min((tick.deadline for tick in kept), default=None)
        return gone

    @property
    def claims(self) -> int:
        """Claims that may still go out now."""
        return self._claims

    def take(self, most: int) -> list[T]:
        """Up to `most` waiting ticks that fit the room, one per job, for a claim: a
        job's next tick waits for the next batch, and a tick that goes alone goes in a
        batch of one. None while `claims` are in flight already; a batch taken holds
        one until `claim_ended`."""
        if not self._claims:
            return []
        batch: list[T] = []
        names: set[str] = set()
        skipped: deque[T] = deque()
        while self._waiting and len(batch) < min(most, self._room):
            tick = self._waiting.popleft()
            if tick.job_name in names or (tick.alone and batch):
                skipped.append(tick)
                continue
            batch.append(tick)
            names.add(tick.job_name)
            if tick.alone:
                break
        self._waiting.extendleft(reversed(skipped))
        self._room -= len(batch)
        self._claims -= bool(batch)
        return batch

    def claim_ended(self) -> None:
        """A batch's claim statement answered (or failed)."""
        self._claims += 1

    def free(self, count: int = 1) -> None:
        self._room += count
