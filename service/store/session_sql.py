"""The statements a connection runs on its own session: its settings, a ping, the clock,
its backend, and the probe that tells a session of its own from a pooler's
(`pooling`). One constant or builder per statement."""

from collections.abc import Mapping

# JIT off for every connection (`base.init_connection` says why).
NO_JIT = "SET jit = off"

# The heartbeat of a quiet connection: anything the server must answer.
PING = "SELECT 1"

# The database's clock: the one time every replica agrees on.
CLOCK = "SELECT clock_timestamp()"

# The backend this connection's next statement runs on.
BACKEND_PID = "SELECT pg_backend_pid()"


def settings(values: Mapping[str, int]) -> str:
    """The session settings given, in one statement (integers only, formatted here:
    nothing from outside goes into the statement)."""
    return "; ".join(f"SET {name} = {int(value)}" for name, value in values.items())


# The probe lock (its key the argument, in the one-bigint form) as pg_locks shows it.
_PROBE = """locktype = 'advisory' AND objsubid = 1
          AND classid = (($1::bigint >> 32) & 4294967295)::oid
          AND objid = ($1::bigint & 4294967295)::oid"""

# Take the probe lock, shared; with it, the backend, and how many other advisory locks
# the session held already (a session handed on without a reset).
TAKE_PROBE = f"""SELECT pg_backend_pid() AS pid, (
        SELECT count(*) FROM pg_locks
        WHERE locktype = 'advisory' AND pid = pg_backend_pid() AND NOT ({_PROBE})
    ) AS inherited, pg_try_advisory_lock_shared($1) AS held"""

# Whether this statement's backend holds the probe lock (its key the argument).
LOOK_PROBE = f"""SELECT pg_backend_pid() AS pid, 0 AS inherited, EXISTS (
        SELECT 1 FROM pg_locks
        WHERE {_PROBE} AND granted AND mode = 'ShareLock' AND pid = pg_backend_pid()
          AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
    ) AS held"""

RELEASE_PROBE = "SELECT pg_advisory_unlock_shared($1)"
