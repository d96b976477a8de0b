"""Which failures mean "the database is away right now" rather than a bug."""

import asyncpg

# Connection refused or reset, the server shutting down or starting up, a pool or
# connection that broke mid-query, or a statement that ran past its deadline.
UNAVAILABLE: tuple[type[Exception], ...] = (
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
