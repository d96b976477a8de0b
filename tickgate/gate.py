"""`locked_run`: the seed's pattern (gocron plus `pg_try_advisory_lock`), done right for
asyncio code with an asyncpg pool.

A session-level advisory lock belongs to the connection that took it, so one connection
is taken from the pool for the whole run: try the lock (never the blocking form: a job
someone else runs is not waited for), run, release the lock on that same connection, and
only then give the connection back. The release is shielded from cancellation; a
connection whose release is not confirmed (an error, a deadline passed, an answer of
false) is closed, never pooled, so no later borrower inherits the lock. Every database
call has a deadline.

The key is FNV-1a 64 of the name's UTF-8 bytes read as a signed 64-bit integer: Go's
`int64(fnv.New64a().Sum64())`, the key Tickgate's own jobs and a Go replica use.
"""

import asyncio
import logging
from collections.abc import Awaitable, Callable
from functools import partial
from typing import Any

import asyncpg

from service.domain.names import lock_key
from service.shielding import run_to_completion
from service.store import gate_sql
from service.store.connection import Connection, Pool
from service.store.gate import drop
from service.store.link import deadline

__all__ = ["lock_key", "locked_run"]

log = logging.getLogger("tickgate.gate")

STATEMENT_SECONDS = 10.0  # each lock call's deadline, the wait for a connection included
_TRY_LOCK = gate_sql.TRY_LOCK
_UNLOCK = gate_sql.UNLOCK
# What a lock call can fail with: the server's errors, a dropped or broken connection.
_CALL_FAILED = (asyncpg.PostgresError, asyncpg.InterfaceError, OSError, TimeoutError)


async def locked_run(
    pool: Pool,
    name: str,
    fn: Callable[[], Awaitable[Any]],
    *,
    timeout: float | None = None,  # noqa: ASYNC109 (the issue's signature: fn's limit)
) -> bool:
    """Run `fn()` while holding the advisory lock of `name`; False at once, without
    running it, when another holder has the lock. `fn` runs under `timeout` seconds
    (None: no limit; past it, TimeoutError); whatever `fn` raises is raised after the
    lock is released."""
    key = lock_key(name)
    connection = await asyncio.wait_for(pool.acquire(), STATEMENT_SECONDS)
    held = True  # until the try says otherwise: an answer lost may have taken the lock
    try:
        held = bool(await _call(connection, _TRY_LOCK, key))
        if not held:
            return False
        async with asyncio.timeout(timeout):
            await fn()
        return True
    finally:
        if held:
            held = not await run_to_completion(_unlock(connection, key))
        if held:
            drop(connection)
        await pool.release(connection)


async def _unlock(connection: Connection, key: int) -> bool:
    """Whether the release is confirmed."""
    try:
        return bool(await _call(connection, _UNLOCK, key))
    except _CALL_FAILED as error:
        log.warning("unlock of key %d not confirmed (%r): dropping the connection", key, error)
        return False


async def _call(connection: Connection, text: str, key: int) -> object:
    """One lock call within its deadline; past it the connection is dropped (a cancelled
    statement waits for the server's answer, which a silent link never gives)."""
    with deadline(STATEMENT_SECONDS, partial(drop, connection), "advisory lock"):
        return await connection.fetchval(text, key)
