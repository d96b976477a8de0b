"""Handover: a job owned here is fired at once; one owned elsewhere now only leaves the
mirror once its handover ends, so a change of members never leaves a job that nobody
fires."""

import asyncio

from service.scheduler.handover import Handover

HANDOVER = 0.05


def handover() -> tuple[Handover, list[str]]:
    dropped: list[str] = []
    return Handover(on_dropped=dropped.append, handover_seconds=HANDOVER), dropped


async def handover_ends() -> None:
    await asyncio.sleep(HANDOVER * 3)


async def test_a_job_owned_elsewhere_now_is_dropped_only_after_the_handover() -> None:
    table, dropped = handover()
    table.assign("kept", True)
    table.assign("leaving", False)
    assert "leaving" in table
    assert dropped == []
    await handover_ends()
    assert dropped == ["leaving"]
    assert "leaving" not in table
    assert "kept" not in table


async def test_a_job_owned_here_again_during_its_handover_is_kept() -> None:
    table, dropped = handover()
    table.assign("a", False)
    table.assign("a", True)
    await handover_ends()
    assert dropped == []


async def test_a_job_reported_leaving_twice_is_dropped_once_on_its_first_timer() -> None:
    table, dropped = handover()
    table.assign("a", False)
    await asyncio.sleep(HANDOVER / 2)
    table.assign("a", False)  # a second reconcile before the handover ended
    await handover_ends()
    assert dropped == ["a"]


async def test_a_forgotten_job_is_not_dropped_again_when_its_handover_ends() -> None:
    table, dropped = handover()
    table.assign("a", False)
    table.forget("a")  # deleted meanwhile: the mirror dropped it itself
    await handover_ends()
    assert dropped == []
