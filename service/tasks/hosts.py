"""The http task's connections, host by host: what the metrics show of them.

A crowd of runs to one host shares at most a cap of connections from this replica
(aiohttp's per-host limit, `TICKGATE_HTTP_MAX_CONNECTIONS_PER_HOST`): runs above it wait
for a free one inside their own timeout, and kept-alive ones are reused first. Per host
(`host:port`, as the job's URL names it), `HostTally` counts the connections open, the
runs waiting for one and the connects that failed; the metrics read it at scrape time.
"""

import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from types import SimpleNamespace
from typing import Any

import aiohttp


@dataclass
class HostCounts:
    """One host's connections from this process now, and its failed connects so far."""

    open: int = 0
    waiting: int = 0
    connect_failures: int = 0


class HostTally:
    """Per host, what `HostCounts` holds. One per http task (its pool)."""

    def __init__(self) -> None:
        self._hosts: dict[str, HostCounts] = {}

    def of(self, host: str) -> HostCounts:
        return self._hosts.setdefault(host, HostCounts())

    def snapshot(self) -> Mapping[str, HostCounts]:
        """A copy, for a scrape."""
        return {host: replace(counts) for host, counts in self._hosts.items()}

    def waiting(self, host: str) -> "Waiting":
        """What one request passes aiohttp as its `trace_request_ctx`."""
        return Waiting(self.of(host))

    def trace_config(self) -> aiohttp.TraceConfig:
        """Counts the requests that wait for a free connection of their host."""
        config = aiohttp.TraceConfig()
        config.on_connection_queued_start.append(_queued)
        config.on_connection_queued_end.append(_dequeued)
        return config

    def opened(self, host: str, sock: socket.socket) -> socket.socket:
        """`sock`, a new connection to `host`, counted open until it is closed."""
        counts = self.of(host)
        counts.open += 1
        return _CountedSocket(sock, lambda: _closed(counts))


@dataclass
class Waiting:
    """One request's place in its host's count of runs waiting for a connection.
    aiohttp says when the wait begins and ends, but not that a wait ended by the run's
    timeout or cancel: `over` settles that, whatever happened."""

    counts: HostCounts
    queued: bool = False

    def start(self) -> None:
        self.queued = True
        self.counts.waiting += 1

    def over(self) -> None:
        if self.queued:
            self.queued = False
            self.counts.waiting -= 1


async def _queued(_session: Any, context: SimpleNamespace, _params: Any) -> None:
    if isinstance(context.trace_request_ctx, Waiting):
        context.trace_request_ctx.start()


async def _dequeued(_session: Any, context: SimpleNamespace, _params: Any) -> None:
    if isinstance(context.trace_request_ctx, Waiting):
        context.trace_request_ctx.over()


def _closed(counts: HostCounts) -> None:
    counts.open -= 1


class _CountedSocket(socket.socket):
    """The same file descriptor as the socket it replaces, telling `on_close` once
    when it is closed (asyncio closes a transport's socket when the connection ends;
    a failed connect closes it too)."""

    def __init__(self, sock: socket.socket, on_close: Callable[[], None]) -> None:
        super().__init__(sock.family, sock.type, sock.proto, fileno=sock.detach())
        self._on_close: Callable[[], None] | None = on_close

    def close(self) -> None:
        on_close, self._on_close = self._on_close, None
        if on_close is not None:
            on_close()
        super().close()
