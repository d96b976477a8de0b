"""Bounds on a link to PostgreSQL that goes silent: every one derived from one number.

A link can die without a word: a node loses power, a failover leaves a socket open to
nothing, a proxy or a NAT drops a flow. Neither end sees the connection close, so by
default PostgreSQL keeps the session, and every advisory lock it holds, until the
operating system's keepalive gives up (about 2 h 11 min), and the replica's lock-lost
fence never trips while its socket stays open. Three things bound it:

- TCP keepalives and TCP_USER_TIMEOUT, on both ends (the server's through `SET`, the
  client's on its socket): on a plain TCP path each end drops a peer that stopped
  answering;
- on the long-lived pinned sessions (lock sessions, the listener, the membership),
  `idle_session_timeout`: PostgreSQL ends a session that has been quiet that long, which
  works whatever the path (a Unix socket, a proxy, a pooler in session mode);
- so that a healthy pinned session is never quiet that long, it heartbeats (`SELECT 1`)
  whenever nothing else was said on it for a while, with a deadline: a heartbeat that
  fails or comes late drops the connection, which trips the fence of every run bound to
  it, and a new session takes its place.

Settings go in with `SET` once connected rather than as startup parameters, which
PgBouncer refuses. With the default of 30 s (TICKGATE_DB_LINK_TIMEOUT_SECONDS):

| bound | value |
|---|---|
| heartbeat of a quiet pinned session, and its deadline | L/6 (5 s) |
| client deadline of one statement on a pinned session | L/3 (10 s) |
| `statement_timeout` / `lock_timeout` of lock sessions | L/6 (5 s) / L/10 (3 s) |
| `idle_session_timeout` of pinned sessions | 2L/3 (20 s) |
| keepalives: idle, interval, count | L/3 (10 s), L/6 (5 s), 3 |
| `tcp_user_timeout` (both ends) | L (30 s) |

A replica whose link goes silent drops the session, and fences its runs, within L/2
(15 s: a quiet session's heartbeat comes within L/6 and answers within L/6; a busy
one's statement was sent within L/6 of the last answer and answers within L/3);
PostgreSQL ends the session 2L/3 after it last heard from it (`idle_session_timeout`:
the fence's bound and a heartbeat's more, for the fenced runs to stop), freeing its
locks. So the replica has stopped its runs before their locks are free for another
replica, except when the locks vanish at once (a failover to a standby, which never
had them). Until then the job's ticks find its lock held and are judged by the overlap
policy: the bound is 2L/3 rather than L (it was), a third less of that delay.
"""

import asyncio
import logging
import socket
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol

from service.store import session_sql
from service.store.connection import Connection

log = logging.getLogger(__name__)

DEFAULT_LINK_SECONDS = 30.0
KEEPALIVE_PROBES = 3
# Server settings that older PostgreSQL versions do not know, and the first that does.
_SINCE_VERSION = {"tcp_user_timeout": 12, "idle_session_timeout": 14}
# How long a deadline that ran out waits for an answer already in before it drops.
_LAST_LOOK_SECONDS = 0.1
# The client's socket options, each the same value as a server setting.
_SOCKET_OPTIONS = {
    "TCP_KEEPIDLE": "tcp_keepalives_idle",
    "TCP_KEEPINTVL": "tcp_keepalives_interval",
    "TCP_KEEPCNT": "tcp_keepalives_count",
    "TCP_USER_TIMEOUT": "tcp_user_timeout",
}


@dataclass(frozen=True)
class Link:
    """How long a silent link to PostgreSQL may last (`seconds`), and the bounds that
    follow from it (see the module docstring)."""

    seconds: float = DEFAULT_LINK_SECONDS

    @property
    def heartbeat_seconds(self) -> float:
        """A quiet pinned session heartbeats this often, and the answer is due within
        this long."""
        return self.seconds / 6

    @property
    def statement_seconds(self) -> float:
        """The client's deadline for one statement of the fire path: past it the
        connection is dropped (what the statement did is unknown)."""
        return self.seconds / 3

    @property
    def fence_seconds(self) -> float:
        """A replica whose link went silent has fenced its runs within this long."""
        return self.seconds / 2

    @property
    def free_seconds(self) -> float:
        """PostgreSQL ends a pinned session quiet this long, freeing its locks: the
        fence's bound, and a heartbeat's time more for the runs fenced to stop."""
        return self.fence_seconds + self.heartbeat_seconds

    def server_settings(self, *, quiet_ends: bool, fire_path: bool) -> dict[str, int]:
        """What a session sets on the server: keepalives and the user timeout always;
        `quiet_ends`, for a session that heartbeats: the server ends it once quiet
        for `free_seconds`; `fire_path`, for a lock session: its statements, and their
        waits for row locks, are bounded too (the server ends them first, cleanly,
        well inside the client's deadline)."""
        whole = _ms(self.seconds)
        settings = {
            "tcp_keepalives_idle": round(self.seconds / 3),
            "tcp_keepalives_interval": round(self.seconds / 6),
            "tcp_keepalives_count": KEEPALIVE_PROBES,
            "tcp_user_timeout": whole,
        }
        if quiet_ends:
            settings |= {
                "idle_session_timeout": _ms(self.free_seconds),
                "idle_in_transaction_session_timeout": _ms(self.free_seconds),
            }
        if fire_path:
            settings |= {
                "statement_timeout": _ms(self.seconds / 6),
                "lock_timeout": _ms(self.seconds / 10),
            }
        return settings

    async def tune(
        self, connection: Connection, *, quiet_ends: bool = False, fire_path: bool = False
    ) -> None:
        """Set the socket's keepalives and the session's bounds (`server_settings`) on
        a new connection, in one round trip."""
        self.tune_socket(connection)
        major = connection.get_server_version().major
        settings = self.server_settings(quiet_ends=quiet_ends, fire_path=fire_path)
        known = {k: v for k, v in settings.items() if major >= _SINCE_VERSION.get(k, 0)}
        await connection.execute(session_sql.settings(known))

    def tune_socket(self, connection: Connection) -> None:
        """Keepalives and TCP_USER_TIMEOUT on the client's socket, when it is TCP: a
        peer that stops answering is dropped within about `seconds`, even by a
        connection that sends nothing (an idle pool connection)."""
        # asyncpg offers no socket options; its transport is the way to the socket.
        transport = getattr(connection, "_transport", None)
        sock = transport.get_extra_info("socket") if transport is not None else None
        if sock is None or sock.family not in (socket.AF_INET, socket.AF_INET6):
            return  # a Unix socket: no network in between
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
        same = self.server_settings(quiet_ends=False, fire_path=False)  # as the server's
        for option, setting in _SOCKET_OPTIONS.items():
            # Not every platform has every option.
            if (number := getattr(socket, option, None)) is not None:
                sock.setsockopt(socket.IPPROTO_TCP, number, same[setting])


def _ms(seconds: float) -> int:
    return max(1, round(seconds * 1000))


@contextmanager
def deadline(seconds: float, drop: Callable[[], None], what: str) -> Iterator[None]:
    """Bound the database calls of the block: at `seconds`, `drop` the connection
    (terminate it), which fails whatever waits on it at once, and the block's error
    becomes a TimeoutError.

    Dropping rather than cancelling: a cancelled asyncpg statement asks the server to
    cancel it over a new connection and waits for the answer, which a silent link never
    gives; and a statement that ran past its deadline leaves the session in a state
    nobody knows."""
    loop = asyncio.get_running_loop()
    expired = finished = False

    def expire() -> None:
        # After a stall of the event loop (CPU throttling, a long pause) the answer and
        # the timer come due together, and the timer may run first: a last look lets
        # an answer that is in be read before the connection is dropped for silence.
        loop.call_later(_LAST_LOOK_SECONDS, drop_unless_answered)

    def drop_unless_answered() -> None:
        nonlocal expired
        if not finished:
            expired = True
            drop()

    timer = loop.call_later(seconds, expire)
    try:
        yield
    except Exception as error:
        if expired:
            raise TimeoutError(f"{what}: no answer within {seconds:g}s") from error
        raise
    finally:
        finished = True
        timer.cancel()


class Pulse(Protocol):
    """A pinned connection, as its heartbeat sees it."""

    @property
    def closed(self) -> bool: ...

    def quiet_seconds(self) -> float:
        """How long since the connection last answered a statement."""
        ...

    async def beat(self) -> None:
        """Say something cheap on the connection (or nothing, if a statement is in
        flight: it has a deadline of its own)."""
        ...

    def drop(self) -> None:
        """Terminate the connection: the link is taken for dead."""
        ...


async def heartbeat(link: Link, pulse: Pulse, what: str) -> None:
    """While `pulse` is open: whenever it has been quiet for `link.heartbeat_seconds`,
    beat, with the same again as the deadline. A beat that fails or comes late drops
    the connection, and the heartbeat ends."""
    interval = link.heartbeat_seconds
    tried = time.monotonic()
    while not pulse.closed:
        quiet = min(pulse.quiet_seconds(), time.monotonic() - tried)
        if quiet < interval:
            await asyncio.sleep(interval - quiet)
            continue
        tried = time.monotonic()
        try:
            with deadline(interval, pulse.drop, f"{what} heartbeat"):
                await pulse.beat()
        except Exception as error:  # noqa: BLE001 - logged; the connection is dropped
            if pulse.closed and not isinstance(error, TimeoutError):
                return  # closed meanwhile by its owner or the server, not for silence
            pulse.drop()
            log.warning("%s: link lost, heartbeat failed (%r); connection dropped", what, error)
            return
