"""The databases SQL tasks may run on: only those an operator named, by name."""

from collections.abc import Mapping

import asyncpg

from service.domain.runs import SqlOutcome

APPLICATION_NAME = "tickgate-sql"  # how a DBA tells these sessions apart in pg_stat_activity


class SqlTargetConnections:
    """Opens a connection of its own for each statement, so maintenance that refuses to
    run in a transaction (VACUUM, CREATE INDEX CONCURRENTLY) works, and the statement
    timeout is a session setting that dies with the connection."""

    def __init__(self, dsns: Mapping[str, str]) -> None:
        self._dsns = dict(dsns)

    def names(self) -> frozenset[str]:
        return frozenset(self._dsns)

    async def execute(self, target: str, statement: str, timeout_seconds: float) -> SqlOutcome:
        timeout_ms = str(max(1, round(timeout_seconds * 1000)))
        settings = {"statement_timeout": timeout_ms, "application_name": APPLICATION_NAME}
        connection = await asyncpg.connect(self._dsns[target], server_settings=settings)
        try:
            tag = await connection.execute(statement)
        finally:
            await connection.close()
        return SqlOutcome(command=tag, rows_affected=_rows_affected(tag))


def _rows_affected(tag: str) -> int:
    """`DELETE 5` -> 5, `INSERT 0 3` -> 3; tags without a count (`VACUUM`) -> 0."""
    last = tag.rsplit(" ", 1)[-1]
    return int(last) if last.isdigit() else 0
