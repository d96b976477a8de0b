"""A replica's membership of the cluster, held on a connection of its own."""

import asyncio
from collections.abc import Awaitable
from contextlib import suppress
from datetime import datetime
from typing import Any, Self, TypeVar

import asyncpg

from service.domain.ownership import Heartbeat, Member
from service.store import members_sql
from service.store.base import init_connection
from service.store.errors import UNAVAILABLE
from service.store.link import Link
from service.store.rows import member_from_row

# Deadlines: opening the connection (a TLS handshake, a busy server), each statement,
# and a polite close before the connection is simply dropped.
CONNECT_SECONDS = 10.0
STATEMENT_SECONDS = 5.0
CLOSE_SECONDS = 2.0

T = TypeVar("T")


class SeedTakenError(RuntimeError):
    """Something else holds the advisory lock of the seed this replica drew (another
    application using the two-int lock form with the same class): the replica did not
    become a member. Joining again draws another seed."""


class MemberSession:
    """
    One membership: this replica's row in `tickgate_members` and the advisory lock that
    makes it live, held by a connection of its own.

    Not pooled: the membership must end exactly when the connection does, and a pool
    would keep or hand on a connection at will. A statement that fails or runs past its
    deadline ends the session (its connection is closed at once, its lock with it):
    what happened to the session is unknown, and a new membership is cheap.
    """

    def __init__(
        self, connection: "asyncpg.Connection[Any]", seed: int, started_at: datetime
    ) -> None:
        self._connection = connection
        self._seed = seed
        self.started_at = started_at

    @classmethod
    async def join(
        cls,
        dsn: str,
        runner_id: str,
        version: str,
        tzdata: str = "",
        link: Link | None = None,
        *,
        since: datetime | None = None,
    ) -> Self:
        """
        Become a live member: insert a row under a new seed and take its lock.

        :param dsn: the database, connected to directly (no pool)
        :param runner_id: this replica's name, shown with its membership
        :param version: the Tickgate version this replica runs, shown likewise
        :param tzdata: the time-zone database it computes ticks with (service/tzdb.py)
        :param link: the bounds on a silent link: keepalives, and the server ends the
            session once quiet that long (the membership polls every second)
        :param since: when this replica first joined (the `started_at` of its first
            membership), for a rejoin: it has been up since; None: now, a first join
        :return: the session, live until `close` or until its connection dies
        :raises SeedTakenError: if the new seed's lock is held by something else
        """
        async with asyncio.timeout(CONNECT_SECONDS):
            connection = await asyncpg.connect(dsn)
        await _within_deadline(connection, init_connection(connection))
        link = link or Link()
        await _within_deadline(connection, link.tune(connection, quiet_ends=True))
        joined = await _within_deadline(
            connection, connection.fetchrow(members_sql.JOIN, runner_id, version, tzdata, since)
        )
        if joined is None:
            connection.terminate()
            raise SeedTakenError(
                f"the lock of the seed drawn (class {members_sql.MEMBER_LOCK_CLASS})"
            )
        return cls(connection, joined["seed"], joined["started_at"])

    @property
    def seed(self) -> int:
        return self._seed

    @property
    def closed(self) -> bool:
        """The membership is over: this replica closed it, or its connection died."""
        return self._connection.is_closed()

    async def heartbeat(self, beat: Heartbeat) -> list[Member]:
        """
        Record that this member is alive and what it reports, delete the rows of members
        dead for an hour (a bounded batch), and read the live members.

        :param beat: what this replica reports of itself
        :return: the live members in seed order; this one among them (its row shows its
            previous heartbeat)
        """
        statement = self._connection.fetch(
            members_sql.HEARTBEAT, self._seed, beat.runs_in_flight, beat.last_sync
        )
        rows = await _within_deadline(self._connection, statement)
        return [member_from_row(row) for row in rows]

    async def live_members(self) -> list[Member]:
        """The live members in seed order, this one among them."""
        statement = self._connection.fetch(members_sql.LIVE_MEMBERS)
        rows = await _within_deadline(self._connection, statement)
        return [member_from_row(row) for row in rows]

    async def close(self) -> None:
        """Leave the cluster: close the connection, which releases the lock. The row
        stays until it is swept. Safe on a session that is already over."""
        if self.closed:
            return
        try:
            # The lock goes with the session either way; a close that fails or hangs
            # only means the connection is dropped rather than said goodbye to.
            with suppress(*UNAVAILABLE):
                async with asyncio.timeout(CLOSE_SECONDS):
                    await self._connection.close()
        finally:
            self.terminate()

    def terminate(self) -> None:
        """Drop the connection at once, and with it the membership."""
        if not self.closed:
            self._connection.terminate()


async def _within_deadline(connection: "asyncpg.Connection[Any]", statement: Awaitable[T]) -> T:
    """Await one statement of `connection` within STATEMENT_SECONDS. On any failure,
    the deadline included, drop the connection: what the statement did to the session
    is unknown, and the membership ends with it."""
    try:
        async with asyncio.timeout(STATEMENT_SECONDS):
            return await statement
    except BaseException:
        connection.terminate()
        raise
