"""The membership view and the buckets each member owns: pure values."""

import pytest

from service.domain.ownership import BUCKETS, Members, bucket_of, owned_buckets


def test_a_view_is_its_live_seeds_sorted_with_its_own() -> None:
    view = Members.seen(5, [9, 2, 9])
    assert view == Members(5, (2, 5, 9))
    assert view.others == (2, 9)
    assert not view.alone


def test_views_of_the_same_members_are_equal() -> None:
    assert Members.seen(2, [3, 1]) == Members.seen(2, [1, 2, 3])
    assert Members.seen(2, [3, 1]) != Members.seen(2, [1])
    assert Members.seen(2, [1]) != Members.seen(1, [2])


def test_with_no_view_or_alone_a_replica_owns_everything() -> None:
    assert Members.unknown().alone
    assert Members.unknown().others == ()
    assert Members.seen(4, []).alone
    assert Members.seen(4, [4]).others == ()


@pytest.mark.parametrize(
    ("own", "seeds", "why"),
    [
        (1, (2, 1), "ascending"),
        (1, (1, 1), "ascending"),
        (3, (1, 2), "missing"),
        (None, (1,), "joined"),
    ],
)
def test_an_inconsistent_view_is_refused(own: int | None, seeds: tuple[int, ...], why: str) -> None:
    with pytest.raises(ValueError, match=why):
        Members(own, seeds)


def test_every_bucket_has_exactly_one_owner_and_shares_are_fair() -> None:
    seeds = [3, 8, 21]
    owned = [owned_buckets(Members.seen(seed, seeds)) for seed in seeds]
    assert all(share is not None for share in owned)
    shares = [share for share in owned if share is not None]
    assert sorted(b for share in shares for b in share) == list(range(BUCKETS))
    assert all(BUCKETS / 3 * 0.9 < len(share) < BUCKETS / 3 * 1.1 for share in shares)


def test_a_leaver_moves_only_its_own_buckets_and_a_joiner_takes_from_all() -> None:
    before = {seed: owned_buckets(Members.seen(seed, [1, 2, 3])) for seed in (1, 2, 3)}
    after = {seed: owned_buckets(Members.seen(seed, [1, 2])) for seed in (1, 2)}
    for seed in (1, 2):
        kept, now = before[seed], after[seed]
        assert kept is not None
        assert now is not None
        assert kept <= now  # kept all it had
    joined = {seed: owned_buckets(Members.seen(seed, [1, 2, 3, 4])) for seed in (1, 2, 3, 4)}
    for seed in (1, 2, 3):
        gave, had = joined[seed], before[seed]
        assert gave is not None
        assert had is not None
        assert gave < had  # gave some to the joiner, took none


def test_alone_or_without_a_view_a_replica_owns_every_bucket() -> None:
    assert owned_buckets(Members.seen(5, [5])) is None
    assert owned_buckets(Members.unknown()) is None


def test_a_bucket_is_the_low_bits_of_the_lock_key_as_postgresql_computes_them() -> None:
    assert bucket_of(0) == 0
    assert bucket_of(4097) == 1
    assert bucket_of(-1) == BUCKETS - 1  # two's complement, as bigint & 4095
