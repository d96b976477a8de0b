"""This replica's membership of the cluster, and its view of the live members.

A member is live while its own connection holds its advisory lock (see
`service/store/members_sql.py`); this module keeps that membership (a `MemberSession`
port), heartbeats on it and reads who else is live, every MEMBERSHIP_POLL_SECONDS. The
view only steers which buckets a replica reads into its window: correctness rests on the
gate alone.
"""

import asyncio
import logging
from collections.abc import Callable
from datetime import datetime

from service.domain.ownership import Heartbeat, Member, Members
from service.scheduler.backoff import Backoff
from service.store.errors import is_unavailable
from service.store.ports import JoinCluster, MemberSession

log = logging.getLogger(__name__)

# How often a member heartbeats and reads the live members: a member that dies is out
# of every other's view within about this long after PostgreSQL ends its session.
MEMBERSHIP_POLL_SECONDS = 1.0
# At startup, how long a replica waits at most for its view of the members to hold still.
STARTUP_SETTLE_SECONDS = 5.0


def _nothing_to_report() -> Heartbeat:
    return Heartbeat()


def _ignore(_members: Members) -> None:
    """The default `on_change`: nobody listens."""


class Membership:
    """
    Keeps this replica a live member of the cluster and its view of the members current.

    `start` joins (once, within the deadlines `join` keeps) and then polls in the background: each
    poll heartbeats and reads the live members. When the view changes, `on_change` gets
    the new one. If the membership connection dies, the replica joins again with
    backoff, under a new seed, and keeps its last view meanwhile. Before the first join
    the view is `Members.unknown()`: this replica owns every job.

    :param join: joins the cluster as a new member (in a replica, a connection of its
        own to PostgreSQL: `store.members.MemberSession.join`, with this replica's
        name, version and time-zone database; members on another tzdata than some
        peer's are logged as a warning)
    :param on_change: called with each new view, in the event loop; it must not block
        (set an event, say) and should not raise (an error is logged and dropped)
    :param heartbeat: what this replica reports at each poll (runs in flight, last sync)
    :param poll_seconds: the pause between polls
    """

    def __init__(
        self,
        *,
        join: JoinCluster,
        on_change: Callable[[Members], None] = _ignore,
        heartbeat: Callable[[], Heartbeat] = _nothing_to_report,
        poll_seconds: float = MEMBERSHIP_POLL_SECONDS,
    ) -> None:
        self._join = join
        self._on_change = on_change
        self._heartbeat = heartbeat
        self._poll_seconds = poll_seconds
        self._session: MemberSession | None = None
        # When this replica first joined, on the database's clock: each rejoin keeps it.
        self._up_since: datetime | None = None
        self._members = Members.unknown()
        self._peers: tuple[Member, ...] = ()
        self._loop: asyncio.Task[None] | None = None

    @property
    def members(self) -> Members:
        """The current view: the live members as last read, this replica included."""
        return self._members

    @property
    def peers(self) -> tuple[Member, ...]:
        """The live members' rows as last read (empty before the first read)."""
        return self._peers

    @property
    def cluster_since(self) -> datetime | None:
        """When the earliest live member came up, as last read (None: not known yet):
        the cluster has been up since, so a tick due before then was missed by every
        replica now live (`Takeover.since`). A member that rejoins (its membership's
        connection was lost, not its life) keeps the instant it first joined."""
        return min((peer.started_at for peer in self._peers), default=None)

    @property
    def joined(self) -> bool:
        """This replica holds a live membership, as far as it knows."""
        return self._session is not None and not self._session.closed

    async def start(self) -> None:
        """Join and read the members until the view holds still, so that the first sync
        already knows them, then keep polling in the background. A first poll that
        fails is retried there."""
        first_poll_ok = await self._poll_guarded()
        if first_poll_ok:
            await self._settle()
        self._loop = asyncio.create_task(self._poll_forever(first_poll_ok))

    async def _settle(self) -> None:
        """Replicas started together (a fresh deployment) join within moments of each
        other: polling until the view holds still for one poll keeps each from first
        loading every job, only to shed most of them once the others are seen."""
        loop = asyncio.get_running_loop()
        give_up_at = loop.time() + STARTUP_SETTLE_SECONDS
        seen = self._members
        while loop.time() < give_up_at:
            await asyncio.sleep(self._poll_seconds)
            if not await self._poll_guarded() or self._members == seen:
                return
            seen = self._members

    async def stop(self) -> None:
        """Stop polling and leave: the connection closes, and the lock with it."""
        if self._loop is not None:
            self._loop.cancel()
            await asyncio.gather(self._loop, return_exceptions=True)
        await self._leave()
        log.info("left the cluster")

    async def _poll_forever(self, last_ok: bool) -> None:
        backoff = Backoff()
        while True:
            if last_ok:
                backoff.reset()
                await asyncio.sleep(self._poll_seconds)
            else:
                await self._leave()
                await backoff.pause()
            last_ok = await self._poll_guarded()

    async def _poll_guarded(self) -> bool:
        """One poll; False if it failed, which is logged (the next one tries again)."""
        try:
            await self._poll()
        except Exception as error:
            # Whatever went wrong, membership must live on: the loop joins again.
            if is_unavailable(error):
                log.warning("membership poll failed, database unavailable (%r)", error)
            else:
                log.exception("membership poll failed")
            return False
        return True

    async def _poll(self) -> None:
        if self._session is None or self._session.closed:
            self._session = await self._join(since=self._up_since)
            self._up_since = self._session.started_at
            log.info("joined the cluster as member %d", self._session.seed)
        live = await self._session.heartbeat(self._heartbeat())
        self._see(self._session.seed, live)

    def _see(self, own: int, live: list[Member]) -> None:
        self._peers = tuple(live)
        members = Members.seen(own, (member.seed for member in live))
        if members == self._members:
            return
        log.info("live members: %s (this replica: %d)", list(members.seeds), own)
        self._members = members
        _warn_of_mixed_tzdata(live)
        try:
            self._on_change(members)
        except Exception:
            log.exception("the membership change callback failed")

    async def _leave(self) -> None:
        session, self._session = self._session, None
        if session is not None:
            await session.close()


def _warn_of_mixed_tzdata(live: list[Member]) -> None:
    """Members on different time-zone databases may each put a tick of a job in a zone
    whose rules changed at its own instant: the ledger still lets one run per tick it
    knows, but the two see different ticks."""
    releases = sorted({member.tzdata for member in live if member.tzdata})
    if len(releases) > 1:
        log.warning(
            "live members compute ticks with different time-zone databases: %s; "
            "run one image (PYTHONTZPATH empty, one tzdata release) on every replica",
            ", ".join(releases),
        )
