"""The http task's connections, host by host: how a crowd takes turns on them, and what
the metrics show of them.

A crowd of runs to one host shares at most a cap of connections from this replica
(aiohttp's per-host limit, `TICKGATE_HTTP_MAX_CONNECTIONS_PER_HOST`): runs above it wait
for a free one inside their own timeout, and kept-alive ones are reused first.

Connections are opened a few at a time (`Turns`): a host gets as many requests in flight
as it has open connections that have answered, plus `HostLimits.new`
(`TICKGATE_HTTP_NEW_CONNECTIONS_PER_HOST`, 2), up to the cap. A new connection that has
not answered yet may be one the host has not accepted (its listen backlog is full: a
small webhook's is 5), and a connect the kernel dropped is retried only after TCP's SYN
timeout (1 s, then 3 s, 7 s): a crowd opening its cap's worth at once (or doubling them
each round trip, as TCP's slow start would) overflowed a small webhook's backlog in
every trial, and made runs late by seconds. So the pool grows by `new` connections per
round trip: a fast host is at the cap within milliseconds, one that answers in 0.5 s
after 16 s at the default, and kept-alive connections are reused from then on. A target
that closes each connection after one answer (HTTP/1.0) never has an answered
connection open: it gets `new` requests at a time from each replica. A connect that
took `SLOW_CONNECT_SECONDS` (a SYN dropped by a full backlog, most likely) is logged.

Per host (`host:port`, as the job's URL names it), `HostTally` counts the connections
open, the runs waiting for one and the connects that failed; the metrics read it at
scrape time.
"""

import asyncio
import contextlib
import logging
import socket
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from typing import Any

import aiohttp

log = logging.getLogger(__name__)

# A connect this slow was most likely dropped once by a full listen backlog (a SYN is
# sent again after 1 s): logged, once per host.
SLOW_CONNECT_SECONDS = 0.5


@dataclass(frozen=True)
class HostLimits:
    """Per host and replica: connections open at most (`connections`), and new ones
    not yet answered at once (`new`)."""

    connections: int = 64
    new: int = 2


class Turns:
    """Requests to one host in flight: at most `answered + new`, and the cap. The others
    wait their turn, first come first served."""

    def __init__(self) -> None:
        self.in_flight = 0
        self._queue: deque[asyncio.Future[None]] = deque()

    def room(self, counts: "HostCounts", limits: HostLimits) -> bool:
        return self.in_flight < min(limits.connections, counts.answered + limits.new)

    async def take(self, counts: "HostCounts", limits: HostLimits) -> None:
        if not self._queue and self.room(counts, limits):
            self.in_flight += 1
            return
        turn = asyncio.get_running_loop().create_future()
        self._queue.append(turn)
        counts.waiting += 1
        try:
            await turn  # `admit` counted it in flight
        except asyncio.CancelledError:
            if turn.cancelled():  # the run ended (timed out) while it waited
                with contextlib.suppress(ValueError):  # `admit` may have dropped it
                    self._queue.remove(turn)
            else:
                self.give_back(counts, limits)  # granted just as the run was cancelled
            raise
        finally:
            counts.waiting -= 1

    def give_back(self, counts: "HostCounts", limits: HostLimits) -> None:
        self.in_flight -= 1
        self.admit(counts, limits)

    def admit(self, counts: "HostCounts", limits: HostLimits) -> None:
        """Grant the turns there is room for now (after a request ended or a new
        connection answered)."""
        while self._queue and self.room(counts, limits):
            turn = self._queue.popleft()
            if turn.cancelled():
                continue  # its run ended while it waited; it is gone from the queue
            self.in_flight += 1
            turn.set_result(None)


@dataclass
class HostCounts:
    """One host's connections from this process now, and its failed connects so far;
    `answered`: open connections that have answered a request; `slow_connects`: connects
    that took SLOW_CONNECT_SECONDS or more."""

    open: int = 0
    waiting: int = 0
    connect_failures: int = 0
    answered: int = 0
    slow_connects: int = 0
    turns: Turns = field(default_factory=Turns, repr=False, compare=False)

    def idle(self) -> bool:
        """Nothing open, waiting or in flight: forgetting it loses no request's count."""
        return not (self.open or self.waiting or self.turns.in_flight)

    def connected_slowly(self, host: str, seconds: float) -> None:
        """A connect took SLOW_CONNECT_SECONDS or more: said once per host."""
        self.slow_connects += 1
        if self.slow_connects == 1:
            log.warning(
                "a connect to %s took %.1fs: its listen backlog may be full (a SYN was"
                " dropped); fewer new connections at once (TICKGATE_HTTP_NEW_CONNECTIONS"
                "_PER_HOST) or a deeper backlog there avoid it",
                host,
                seconds,
            )


# The hosts a tally keeps (each a few series of /metrics): a job author can aim runs at
# any number of host:port pairs, and /metrics must not grow with them for ever.
MAX_TALLIED_HOSTS = 512


class HostTally:
    """Per host, what `HostCounts` holds. One per http task (its pool). Past
    `max_hosts`, the host used least recently with nothing in flight is forgotten (its
    series leave /metrics; its counts start again if it is called again)."""

    def __init__(
        self, limits: HostLimits | None = None, max_hosts: int = MAX_TALLIED_HOSTS
    ) -> None:
        self._hosts: dict[str, HostCounts] = {}
        self._max_hosts = max_hosts
        # Set by the http task that owns the tally (its settings).
        self.limits = limits or HostLimits()

    def of(self, host: str) -> HostCounts:
        """`host`'s counts, now its most recently used (a dict keeps insertion order)."""
        counts = self._hosts.pop(host, None) or HostCounts()
        self._hosts[host] = counts
        if len(self._hosts) > self._max_hosts:
            self._forget_one_idle()
        return counts

    def _forget_one_idle(self) -> None:
        idle = next((h for h, c in self._hosts.items() if c.idle()), None)
        if idle is not None:
            del self._hosts[idle]

    def snapshot(self) -> Mapping[str, HostCounts]:
        """A copy, for a scrape."""
        return {host: replace(counts) for host, counts in self._hosts.items()}

    @asynccontextmanager
    async def turn(self, host: str) -> AsyncIterator["Turn"]:
        """A request's turn at `host` (see `Turns`), for as long as the block lasts: a
        connection opened meanwhile (in this task) is the turn's."""
        counts, limits = self.of(host), self.limits
        await counts.turns.take(counts, limits)
        turn = Turn(counts, limits)
        token = _TURN.set(turn)
        try:
            yield turn
        finally:
            _TURN.reset(token)
            counts.turns.give_back(counts, limits)

    def waiting(self, host: str) -> "Waiting":
        """What one request passes aiohttp as its `trace_request_ctx`."""
        return Waiting(self.of(host), host)

    def trace_config(self) -> aiohttp.TraceConfig:
        """Counts the requests that wait for a free connection of their host."""
        config = aiohttp.TraceConfig()
        config.on_connection_queued_start.append(_queued)
        config.on_connection_queued_end.append(_dequeued)
        config.on_connection_create_start.append(_connecting)
        config.on_connection_create_end.append(_connected)
        return config

    def opened(self, host: str, sock: socket.socket) -> socket.socket:
        """`sock`, a new connection to `host`, counted open until it is closed."""
        counts = self.of(host)
        counts.open += 1
        counted = _CountedSocket(sock, lambda: _closed(counts, counted))
        turn = _TURN.get(None)
        if turn is not None:
            turn.opened = counted
        return counted


@dataclass
class Turn:
    """A request's turn at a host, and the connection it opened, if it opened one."""

    counts: HostCounts
    limits: HostLimits
    opened: "_CountedSocket | None" = None

    def answered(self) -> None:
        """The request has its answer: the connection it opened, if still open, counts
        as answered (one more new one may open)."""
        sock, self.opened = self.opened, None
        if sock is not None and not sock.closed and not sock.answered:
            sock.answered = True
            self.counts.answered += 1
            self.counts.turns.admit(self.counts, self.limits)


# The turn of the request this task is making: the socket factory runs in its task.
_TURN: ContextVar[Turn | None] = ContextVar("tickgate_http_turn", default=None)


def _closed(counts: HostCounts, counted: "_CountedSocket") -> None:
    counts.open -= 1
    counted.closed = True
    if counted.answered:
        counts.answered -= 1


@dataclass
class Waiting:
    """One request's place in its host's count of runs waiting for a connection.
    aiohttp says when the wait begins and ends, but not that a wait ended by the run's
    timeout or cancel: `over` settles that, whatever happened."""

    counts: HostCounts
    host: str = ""
    queued: bool = False
    connecting_since: float | None = None

    def connected(self) -> None:
        if self.connecting_since is not None:
            seconds = time.monotonic() - self.connecting_since
            if seconds >= SLOW_CONNECT_SECONDS:
                self.counts.connected_slowly(self.host, seconds)
            self.connecting_since = None

    def start(self) -> None:
        self.queued = True
        self.counts.waiting += 1

    def over(self) -> None:
        if self.queued:
            self.queued = False
            self.counts.waiting -= 1


async def _connecting(_session: Any, context: SimpleNamespace, _params: Any) -> None:
    if isinstance(context.trace_request_ctx, Waiting):
        context.trace_request_ctx.connecting_since = time.monotonic()


async def _connected(_session: Any, context: SimpleNamespace, _params: Any) -> None:
    if isinstance(context.trace_request_ctx, Waiting):
        context.trace_request_ctx.connected()


async def _queued(_session: Any, context: SimpleNamespace, _params: Any) -> None:
    if isinstance(context.trace_request_ctx, Waiting):
        context.trace_request_ctx.start()


async def _dequeued(_session: Any, context: SimpleNamespace, _params: Any) -> None:
    if isinstance(context.trace_request_ctx, Waiting):
        context.trace_request_ctx.over()


class _CountedSocket(socket.socket):
    """The same file descriptor as the socket it replaces, telling `on_close` once
    when it is closed (asyncio closes a transport's socket when the connection ends;
    a failed connect closes it too)."""

    def __init__(self, sock: socket.socket, on_close: Callable[[], None]) -> None:
        super().__init__(sock.family, sock.type, sock.proto, fileno=sock.detach())
        self._on_close: Callable[[], None] | None = on_close
        self.answered = False
        self.closed = False

    def close(self) -> None:
        on_close, self._on_close = self._on_close, None
        if on_close is not None:
            on_close()
        super().close()
