"""Which failures mean "the database is away right now" rather than a bug, and the
database an operator must not give Tickgate."""

import asyncpg

from service.config import ConfigurationError

# A statement the server ended at its `statement_timeout` or `lock_timeout` (or that
# an operator cancelled): it changed nothing, and the session lives on. Session-level
# advisory locks it took are the exception: they outlive it.
TIMED_OUT: tuple[type[Exception], ...] = (
    asyncpg.QueryCanceledError,
    asyncpg.LockNotAvailableError,
)

# Connection refused or reset, the server shutting down or starting up, a pool or
# connection that broke mid-query, or a statement that ran past its deadline (the
# client's, or the server's).
UNAVAILABLE: tuple[type[Exception], ...] = (
    *TIMED_OUT,
    OSError,
    TimeoutError,
    asyncpg.InterfaceError,
    # A connection caught mid-operation by a break is left in a state asyncpg calls
    # internal ("another operation is in progress"); it is a broken link, not a bug.
    asyncpg.InternalClientError,
    asyncpg.PostgresConnectionError,
    asyncpg.CannotConnectNowError,
    asyncpg.exceptions.OperatorInterventionError,
)


def is_unavailable(error: BaseException) -> bool:
    return isinstance(error, UNAVAILABLE)


def timed_out(error: BaseException) -> bool:
    return isinstance(error, TIMED_OUT)


class SharedSessionError(ConfigurationError):
    """DATABASE_URL gives Tickgate PostgreSQL sessions other clients use too: a pooler
    that lends them per transaction (PgBouncer in transaction mode), or hands them on
    without a reset. Tickgate's session advisory locks would be taken, held and
    released on sessions it does not own. Startup stops."""
