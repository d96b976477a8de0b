"""Leaving the cluster on SIGTERM without leaving a gap.

A replica that stopped firing at once would leave its jobs' ticks to the audit, which
takes them over only the takeover time late. Instead it leaves the membership at once
(its peers then load the jobs they own now) and goes on firing for LEAVE_SECONDS, longer
than a peer takes to see the change and take its jobs over; only then does it stop
producing ticks. With nobody to hand over to it stops at once: alone when SIGTERM
came, or once no other member is live (the whole cluster is stopping, as on a
scale-down to zero or an uninstall). That check only saves waiting: a peer missed by it
still takes the ticks over from their cursors, through the gate.
"""

import asyncio
import logging
from collections.abc import Awaitable, Callable

from service.domain.ownership import Member
from service.scheduler.membership import MEMBERSHIP_POLL_SECONDS, Membership
from service.store.errors import is_unavailable

log = logging.getLogger(__name__)

LEAVE_SECONDS = 2 * MEMBERSHIP_POLL_SECONDS + 1.0
# While leaving, how often it looks whether any other member is still live.
PEERS_POLL_SECONDS = 0.25


class Departure:
    """
    Hands this replica's jobs over on SIGTERM, then stops its ticks.

    :param membership: this replica's membership, left first
    :param stop_ticks: stops producing ticks (runs in flight go on)
    :param live_members: the cluster's live members as the database sees them; once
        this replica has left, any member there is a peer that may take over
    :param hand_over: whether peers take jobs over at all (ownership on); if not, the
        ticks stop at once
    """

    def __init__(
        self,
        membership: Membership,
        stop_ticks: Callable[[], None],
        live_members: Callable[[], Awaitable[list[Member]]],
        *,
        hand_over: bool = True,
    ) -> None:
        self._membership = membership
        self._stop_ticks = stop_ticks
        self._live_members = live_members
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
            await self._give_peers_time()
        finally:
            self._stop_ticks()

    async def _give_peers_time(self) -> None:
        """LEAVE_SECONDS, or less once no peer is left to take the jobs over."""
        loop = asyncio.get_running_loop()
        until = loop.time() + LEAVE_SECONDS
        while (left := until - loop.time()) > 0:
            await asyncio.sleep(min(PEERS_POLL_SECONDS, left))
            if not await self._peers_live(max(until - loop.time(), PEERS_POLL_SECONDS)):
                log.info("no other member is live: nobody to hand the jobs over to")
                return

    async def _peers_live(self, within: float) -> bool:
        """Whether another member is live; True when that cannot be read in time."""
        try:
            async with asyncio.timeout(within):
                return bool(await self._live_members())
        except TimeoutError:
            return True  # the database is slow or away: the wait ends on time anyway
        except Exception as error:
            # Unknown, so assume peers: waiting out LEAVE_SECONDS is the safe side.
            if not is_unavailable(error):
                log.exception("reading the live members while leaving failed")
            return True
