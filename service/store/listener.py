"""LISTEN for job changes on a connection of its own, outside every pool."""

import logging
from collections.abc import Callable
from typing import Any, Self

import asyncpg

from service.store.store import JOBS_CHANNEL

log = logging.getLogger(__name__)


class JobListener:
    """Calls `on_change(name)` for every job write any replica commits.

    Notifications sent while the connection is down are lost for good; the owner
    watches `alive` (and `on_lost`) and runs a full reconcile after reconnecting.
    """

    def __init__(self, connection: "asyncpg.Connection[Any]") -> None:
        self._connection = connection

    @classmethod
    async def open(
        cls, dsn: str, on_change: Callable[[str], None], on_lost: Callable[[], None]
    ) -> Self:
        connection = await asyncpg.connect(dsn)

        def notified(_conn: object, _pid: int, _channel: str, payload: object) -> None:
            on_change(str(payload))

        await connection.add_listener(JOBS_CHANNEL, notified)
        connection.add_termination_listener(lambda _conn: on_lost())
        return cls(connection)

    @property
    def alive(self) -> bool:
        return not self._connection.is_closed()

    async def close(self) -> None:
        if self.alive:
            await self._connection.close()
