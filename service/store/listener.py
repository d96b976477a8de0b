"""LISTEN for job changes and cancels on a connection of its own, outside every pool."""

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any, Self

import asyncpg

from service.store import session_sql
from service.store.fire_sql import CANCELS_CHANNEL
from service.store.jobs_sql import JOBS_CHANNEL
from service.store.link import Link, deadline, heartbeat

log = logging.getLogger(__name__)

CONNECT_SECONDS = 10.0
CLOSE_SECONDS = 2.0


class JobListener:
    """Calls `on_change(name)` for every job write any replica commits, and `on_cancel()`
    for every cancel asked of a run (POST /v1/runs/{id}/cancel).

    Notifications sent while the connection is down are lost for good; the owner
    watches `alive` (and `on_lost`) and runs a full reconcile after reconnecting.
    A listener mostly waits, so it heartbeats (see `link`): a link gone silent is
    dropped within `Link.fence_seconds`, which calls `on_lost`, rather than leaving
    the window deaf until its next read.
    """

    def __init__(self, connection: "asyncpg.Connection[Any]", link: Link) -> None:
        self._connection = connection
        self._answered_at = time.monotonic()
        self._heartbeat = asyncio.create_task(heartbeat(link, self, "listener"))

    @classmethod
    async def open(
        cls,
        dsn: str,
        on_change: Callable[[str], None],
        on_lost: Callable[[], None],
        link: Link | None = None,
        on_cancel: Callable[[], None] | None = None,
    ) -> Self:
        link = link or Link()
        connection = await asyncpg.connect(dsn, timeout=CONNECT_SECONDS)

        def notified(_conn: object, _pid: int, _channel: str, payload: object) -> None:
            on_change(str(payload))

        def cancelled(_conn: object, _pid: int, _channel: str, _payload: object) -> None:
            if on_cancel is not None:
                on_cancel()

        try:
            with deadline(link.statement_seconds, connection.terminate, "listener"):
                await link.tune(connection, quiet_ends=True)
                await connection.add_listener(JOBS_CHANNEL, notified)
                await connection.add_listener(CANCELS_CHANNEL, cancelled)
        except BaseException:
            connection.terminate()
            raise
        connection.add_termination_listener(lambda _conn: on_lost())
        return cls(connection, link)

    @property
    def alive(self) -> bool:
        return not self._connection.is_closed()

    async def close(self) -> None:
        self._heartbeat.cancel()
        await asyncio.gather(self._heartbeat, return_exceptions=True)
        if self.alive:
            try:
                await self._connection.close(timeout=CLOSE_SECONDS)
            except Exception as error:  # noqa: BLE001 - logged; the connection is cut instead
                log.warning("listener did not close (%r); cutting it", error)
                self._connection.terminate()

    # --- the heartbeat (`link.Pulse`) ---

    @property
    def closed(self) -> bool:
        return not self.alive

    def quiet_seconds(self) -> float:
        return time.monotonic() - self._answered_at

    async def beat(self) -> None:
        await self._connection.fetchval(session_sql.PING)
        self._answered_at = time.monotonic()

    def drop(self) -> None:
        self._connection.terminate()
