"""A sweep resumes a crash's orphans in batches: each a statement of at most
RESUME_BATCH, never with one lock key twice (a session's locks are re-entrant, so the
second run of a job would get through), and every orphan in exactly one batch."""

from types import SimpleNamespace
from typing import cast

from service.scheduler.orphans import RESUME_BATCH, resume_batches
from service.store.ports import Orphan


def _orphan(n: int, key: int, locked: bool = True) -> Orphan:
    return cast(Orphan, SimpleNamespace(n=n, lock_key=key, locked=locked))


def test_a_crowd_of_orphans_goes_in_full_batches_each_key_once() -> None:
    orphans = [_orphan(n, key=n % 300) for n in range(450)]  # 150 keys twice
    orphans += [_orphan(450 + n, key=7, locked=False) for n in range(3)]  # lockless
    batches = list(resume_batches(orphans))
    assert sorted(o.n for b in batches for o in b) == list(range(453))  # type: ignore[attr-defined]
    assert all(len(batch) <= RESUME_BATCH for batch in batches)
    for batch in batches:
        keys = [orphan.lock_key for orphan in batch if orphan.locked]
        assert len(keys) == len(set(keys))
    assert len(batches) == 3  # 453 orphans, 300 keys: no batch left short for nothing


def test_no_orphans_no_batches() -> None:
    assert list(resume_batches([])) == []
