"""The membership view: pure values."""

import pytest

from service.domain.ownership import Members


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
