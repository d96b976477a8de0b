"""Leaving the cluster on SIGTERM without leaving a gap.

A replica that stopped firing at once would leave its jobs' ticks to their standbys,
which claim them only the takeover time late. Instead it leaves the membership at once
(its peers then promote their standbys) and goes on firing for LEAVE_SECONDS, longer
than a peer takes to see the change and take its jobs over; only then does it stop
producing ticks. Alone, there is nobody to hand over to: it stops at once.
"""

import asyncio

from service.scheduler.membership import MEMBERSHIP_POLL_SECONDS, Membership
from service.scheduler.mirror import Mirror
from service.scheduler.runner import Runner

LEAVE_SECONDS = 2 * MEMBERSHIP_POLL_SECONDS + 1.0


class Departure:
    def __init__(
        self, membership: Membership, mirror: Mirror, runner: Runner, *, hand_over: bool = True
    ) -> None:
        self._membership = membership
        self._mirror = mirror
        self._runner = runner
        self._hand_over = hand_over
        self._leaving: asyncio.Task[None] | None = None
        self._begun = False

    def begin(self) -> None:
        """SIGTERM arrived: leave, and stop producing ticks once peers have taken over.
        Safe to call more than once."""
        if self._begun:
            return
        self._begun = True
        if not self._hand_over or self._membership.members.alone:
            self._stop_ticks()
        else:
            self._leaving = asyncio.get_running_loop().create_task(self._leave())

    async def finished(self) -> None:
        """Wait until the departure begun has stopped this replica's ticks."""
        if self._leaving is not None:
            await self._leaving

    async def _leave(self) -> None:
        try:
            await self._membership.stop()
            await asyncio.sleep(LEAVE_SECONDS)
        finally:
            self._stop_ticks()

    def _stop_ticks(self) -> None:
        self._runner.accepting = False
        self._mirror.pause()
