"""The startup check that DATABASE_URL gives each connection a PostgreSQL session of its own.

Every lock Tickgate relies on is a session advisory lock: a job's lock on a lock
session, a replica's membership. A pooler in transaction mode (PgBouncer's
`pool_mode = transaction`) lends a client a server session per transaction, so an
unlock can land on another session than its lock (which then stays held for good), or
a session holding a job's lock is lent to another replica, whose re-entrant
`pg_try_advisory_lock` succeeds: two runs of one tick. Nothing fails loudly (PgBouncer
1.21 and later even keep prepared statements working), so each process checks before
it starts, and refuses to.

The check, on connections opened as the lock pool opens its own: take a session lock on
a probe key in one statement, and look for it by `pg_backend_pid()` in the next, which
must run on the same backend. A quiet pooler may lend the same server session twice in
a row (PgBouncer lends the session released last, unless `server_round_robin`), so a
second connection then holds a transaction open: on a session of its own it shares
nothing with the first; behind transaction pooling it is lent the session the first
just let go, or the first's next statement must go to another one. Together these
catch a quiet PgBouncer whichever order it lends sessions in.

It also refuses a session handed on from another client without a reset (PgBouncer in
session mode with an empty `server_reset_query`): one that holds advisory locks as the
connection opens, or prepared statements asyncpg's new ones collide with. It would hold
its last client's locks, and re-enter them.

The probe lock is taken in shared mode: replicas starting together never wait for each
other, and a probe lock left on a pooled session by a refused start blocks nobody.
"""

import asyncio
from dataclasses import dataclass
from typing import Any

import asyncpg

from service.domain.names import lock_key
from service.store import session_sql
from service.store.errors import SharedSessionError
from service.store.sessions import CONNECT_SECONDS

# No job's key: job names cannot hold a colon (service/domain/names.py).
PROBE_LOCK_KEY = lock_key("tickgate:session-probe")
CHECK_SECONDS = 20.0


_FIX = (
    "Point DATABASE_URL at PostgreSQL directly, or use PgBouncer in session mode "
    "(pool_mode = session) with server_reset_query = DISCARD ALL, its default. The sql "
    "task's targets (TICKGATE_SQL_TARGETS) hold no locks and are not checked."
)


def transaction_pooling(seen: str) -> str:
    """The refusal when statements of one connection ran on different sessions."""
    return (
        f"DATABASE_URL does not keep a connection on one PostgreSQL session ({seen}): it "
        "goes through a pooler in transaction pooling mode (PgBouncer pool_mode = "
        "transaction, or alike). Tickgate's locks are session advisory locks, which "
        "transaction pooling strands or lends to other clients, so ticks could run twice "
        f"or never. {_FIX}"
    )


def not_reset(seen: str) -> str:
    """The refusal when a new connection's session carries another client's state."""
    return (
        f"DATABASE_URL gives a new connection a PostgreSQL session another client left as "
        f"it was ({seen}): a pooler hands sessions on without resetting them (PgBouncer in "
        "session mode with an empty server_reset_query), or lends them in transaction "
        "pooling mode. Such a session keeps its last client's advisory locks, so ticks "
        f"could run twice or never. {_FIX}"
    )


@dataclass(frozen=True)
class _Look:
    """What one statement saw: its backend, the advisory locks that backend held before
    the check took any, and whether it holds the probe lock."""

    pid: int
    inherited: int
    held: bool


async def refuse_shared_sessions(dsn: str) -> None:
    """Return if connections to `dsn` get PostgreSQL sessions of their own, kept from one
    statement to the next; else raise SharedSessionError saying what was seen and the
    fix. Connection failures propagate."""
    try:
        async with asyncio.timeout(CHECK_SECONDS):
            refusal = await _refusal(dsn)
    except asyncpg.InvalidSQLStatementNameError as error:
        refusal = transaction_pooling(f"a statement it prepared went missing: {error.message}")
    except asyncpg.DuplicatePreparedStatementError as error:
        refusal = not_reset(f"it held another client's prepared statement: {error.message}")
    if refusal is not None:
        raise SharedSessionError(refusal)


async def _refusal(dsn: str) -> str | None:
    """Why `dsn` must be refused, or None. The probe lock is released on the session that
    took it: a pooled session outlives the connection."""
    holder = await _connect(dsn)
    try:
        refusal = await _holder_refusal(dsn, holder)
        await holder.fetchval(session_sql.RELEASE_PROBE, PROBE_LOCK_KEY)
        await holder.close()
        return refusal
    finally:
        _drop(holder)


async def _holder_refusal(dsn: str, holder: "asyncpg.Connection[Any]") -> str | None:
    taken = await _look(holder, session_sql.TAKE_PROBE)
    if taken.inherited:
        return not_reset(f"backend {taken.pid} held {taken.inherited} advisory locks already")
    if refusal := _moved(taken, await _look(holder, session_sql.LOOK_PROBE)):
        return refusal
    other = await _connect(dsn)
    try:
        refusal = await _beside(other, holder, taken)
        await other.close()
        return refusal
    finally:
        _drop(other)


async def _beside(
    other: "asyncpg.Connection[Any]", holder: "asyncpg.Connection[Any]", taken: _Look
) -> str | None:
    """The holder's lock as its next statement sees it while `other` holds a
    transaction open, so that statement cannot be lent the other's session."""
    async with other.transaction():
        other_pid = await other.fetchval(session_sql.BACKEND_PID)
        if other_pid == taken.pid:
            return transaction_pooling(f"two connections were on backend {taken.pid} at once")
        return _moved(taken, await _look(holder, session_sql.LOOK_PROBE))


def _moved(taken: _Look, looked: _Look) -> str | None:
    """The refusal if a lock taken by one statement was not where the next one ran."""
    if looked.pid != taken.pid:
        return transaction_pooling(
            f"a session lock taken on backend {taken.pid} was looked for on backend "
            f"{looked.pid} by the next statement"
        )
    if not (taken.held and looked.held):
        return transaction_pooling(
            f"a session lock taken on backend {taken.pid} was gone by the next statement"
        )
    return None


async def _connect(dsn: str) -> "asyncpg.Connection[Any]":
    """A connection as the lock pool opens one (service/store/sessions.py)."""
    return await asyncpg.connect(dsn, timeout=CONNECT_SECONDS)


def _drop(connection: "asyncpg.Connection[Any]") -> None:
    """Cut a connection the check could not close politely (a failure, the deadline)."""
    if not connection.is_closed():
        connection.terminate()


async def _look(connection: "asyncpg.Connection[Any]", statement: str) -> _Look:
    row = await connection.fetchrow(statement, PROBE_LOCK_KEY)
    assert row is not None, "a SELECT without FROM returns one row"
    return _Look(pid=row["pid"], inherited=row["inherited"], held=row["held"])
