"""Roles: promotions apply at once, demotions only after the handover, so a change of
members never leaves a job that nobody fires."""

import asyncio

from service.domain.ownership import Role
from service.scheduler.roles import Roles

HANDOVER = 0.05


def roles() -> tuple[Roles, list[str]]:
    dropped: list[str] = []
    return Roles(on_dropped=dropped.append, handover_seconds=HANDOVER), dropped


async def handover_ends() -> None:
    await asyncio.sleep(HANDOVER * 3)


async def test_a_new_job_takes_its_role_at_once() -> None:
    table, _ = roles()
    table.assign("a", Role.STANDBY)
    table.assign("b", Role.OWNER)
    assert table.stands_by("a")
    assert not table.stands_by("b")


async def test_a_standby_promoted_to_owner_claims_at_once() -> None:
    table, _ = roles()
    table.assign("a", Role.STANDBY)
    table.assign("a", Role.OWNER)
    assert not table.stands_by("a")


async def test_an_owner_demoted_to_standby_fires_as_owner_until_the_handover_ends() -> None:
    table, dropped = roles()
    table.assign("a", Role.OWNER)
    table.assign("a", Role.STANDBY)
    assert not table.stands_by("a")
    await handover_ends()
    assert table.stands_by("a")
    assert dropped == []


async def test_a_job_leaving_the_rank_is_dropped_only_after_the_handover() -> None:
    table, dropped = roles()
    table.assign("owned", Role.OWNER)
    table.assign("stood-by", Role.STANDBY)
    table.assign("owned", None)
    table.assign("stood-by", None)
    assert dropped == []
    assert table.stands_by("stood-by")
    await handover_ends()
    assert sorted(dropped) == ["owned", "stood-by"]
    assert not table.stands_by("stood-by")


async def test_a_job_ranked_here_again_during_its_handover_is_kept() -> None:
    table, dropped = roles()
    table.assign("a", Role.OWNER)
    table.assign("a", None)
    table.assign("a", Role.STANDBY)  # back in the rank, as its standby this time
    table.assign("b", Role.OWNER)
    table.assign("b", None)
    table.assign("b", Role.OWNER)
    await handover_ends()
    assert dropped == []
    assert table.stands_by("a")
    assert not table.stands_by("b")


async def test_a_job_not_mirrored_and_not_ranked_is_left_alone() -> None:
    table, dropped = roles()
    table.assign("elsewhere", None)
    await handover_ends()
    assert dropped == []
    assert not table.stands_by("elsewhere")


async def test_a_forgotten_job_is_not_dropped_again_when_its_handover_ends() -> None:
    table, dropped = roles()
    table.assign("a", Role.OWNER)
    table.assign("a", None)
    table.forget("a")  # deleted meanwhile: the mirror dropped it itself
    await handover_ends()
    assert dropped == []
