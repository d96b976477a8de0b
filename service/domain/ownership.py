"""Which replica fires which job: the cluster's live members, as one replica sees them,
and the buckets each owns.

Each job falls in one of BUCKETS buckets by its lock key (`bucket_of`), and each bucket
has one owner among the live members, by rendezvous hashing: member `seed` scores
`_score(bucket, seed)` and the highest score owns the bucket. The score depends only on
the bucket and the seed, so every replica computes the same owners from the same
members, a member leaving moves only its own buckets (each to the member that scored
next), and one joining takes a fair share from every other. A replica's due ticks are
then an index range per bucket it owns (`tickgate_cursors (bucket, due_at)`), with no
ranking of jobs at all.

Ownership only saves work. Any replica may claim any tick, and the gate (the job's
advisory lock plus its ledger row) lets one claim through whoever makes it. A stale view,
or two replicas that disagree, costs duplicate claims the gate refuses, or a tick that
the audit of the tick cursors takes over late (`service/scheduler/audit.py`); never a
second run. Ownership itself is computed by PostgreSQL (see
`service/store/members_sql.py`), so every replica ranks members the same way.
"""

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from typing import Self

# Fixed for good: a job's bucket is stored with its cursor (migration 0016).
BUCKETS = 4096


def bucket_of(lock_key: int) -> int:
    """The job's bucket: the low bits of its lock key (as PostgreSQL's `lock_key & 4095`)."""
    return lock_key & (BUCKETS - 1)


@dataclass(frozen=True)
class Members:
    """
    The cluster's live members, as one replica last saw them.

    A member is identified by its `seed`, a number drawn once per membership (a replica
    that loses its connection joins again under a new seed). `own` is the seed of the
    replica holding this view, None until it has joined; `seeds` are every live member's
    seeds in ascending order, `own` included. Two views compare equal exactly when they
    hold the same members, so a change of view is `new != old`.

    A replica with no view yet, or alone in its view, owns every job: it then behaves as
    if ownership did not exist.

    :raises ValueError: if `seeds` is not strictly ascending, or leaves out `own`, or a
        view without `own` names members
    """

    own: int | None
    seeds: tuple[int, ...]

    def __post_init__(self) -> None:
        if list(self.seeds) != sorted(set(self.seeds)):
            raise ValueError(f"seeds must be strictly ascending: {self.seeds}")
        if self.own is None and self.seeds:
            raise ValueError("a view with members belongs to a replica that joined")
        if self.own is not None and self.own not in self.seeds:
            raise ValueError(f"own seed {self.own} missing from {self.seeds}")

    @classmethod
    def unknown(cls) -> Self:
        """The view of a replica that has not joined yet: it owns everything."""
        return cls(None, ())

    @classmethod
    def seen(cls, own: int, live: Iterable[int]) -> Self:
        """
        The view of the replica `own` that read `live` from the database.

        :param own: this replica's seed; counted live even if `live` misses it (it
            holds its own lock, so it is)
        :param live: seeds of the live members, in any order, repeats allowed
        """
        return cls(own, tuple(sorted({own, *live})))

    @property
    def others(self) -> tuple[int, ...]:
        """Seeds of the live members other than this replica, ascending."""
        return tuple(seed for seed in self.seeds if seed != self.own)

    @property
    def alone(self) -> bool:
        """No other live member is known: this replica owns every job."""
        return not self.others


@dataclass(frozen=True)
class Heartbeat:
    """What a member reports of itself at each heartbeat, for display."""

    runs_in_flight: int = 0
    last_sync: datetime | None = None


@dataclass(frozen=True)
class Member:
    """One live member as its row in `tickgate_members` describes it: who it is
    (`runner_id`, its Tickgate `version`, the time-zone database it computes ticks
    with), since when, and its latest heartbeat."""

    seed: int
    runner_id: str
    version: str
    tzdata: str
    started_at: datetime
    heartbeat_at: datetime
    runs_in_flight: int
    last_sync: datetime | None


def owned_buckets(members: Members) -> frozenset[int] | None:
    """The buckets the replica holding `members` owns; None: every one (alone, or no
    view yet, it behaves as if ownership did not exist)."""
    if members.own is None or members.alone:
        return None
    own = members.own
    return frozenset(
        bucket
        for bucket in range(BUCKETS)
        if max(members.seeds, key=lambda seed: (_score(bucket, seed), seed)) == own
    )


def _score(bucket: int, seed: int) -> int:
    """A member's rendezvous score for a bucket: the same in every process and release."""
    digest = hashlib.blake2b(f"{bucket}:{seed}".encode(), digest_size=8).digest()
    return int.from_bytes(digest)
