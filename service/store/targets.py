"""The databases SQL tasks may run on: only those an operator named, by name."""

from collections.abc import Mapping
from typing import Any

import asyncpg
from pydantic import JsonValue
from pydantic_core import to_jsonable_python

from service.domain.runs import SqlOutcome
from service.store.targets_sql import PRIVILEGES

APPLICATION_NAME = "tickgate-sql"  # how a DBA tells these sessions apart in pg_stat_activity


class SqlTargetConnections:
    """Opens a connection of its own for each statement, so maintenance that refuses to
    run in a transaction (VACUUM, CREATE INDEX CONCURRENTLY) works, and the statement
    timeout is a session setting that dies with the connection."""

    def __init__(self, dsns: Mapping[str, str]) -> None:
        self._dsns = dict(dsns)

    def names(self) -> frozenset[str]:
        return frozenset(self._dsns)

    async def execute(
        self, target: str, statement: str, timeout_seconds: float, keep_rows: int = 0
    ) -> SqlOutcome:
        timeout_ms = str(max(1, round(timeout_seconds * 1000)))
        settings = {"statement_timeout": timeout_ms, "application_name": APPLICATION_NAME}
        connection = await asyncpg.connect(self._dsns[target], server_settings=settings)
        try:
            await _refuse_privileged(connection, target)
            if keep_rows:
                returned = await _returning_rows(connection, statement, keep_rows)
                if returned is not None:
                    return returned
            tag = await connection.execute(statement)
        finally:
            await connection.close()
        return SqlOutcome(command=tag, rows_affected=_rows_affected(tag))


class PrivilegedTarget(Exception):
    """The target's role may do more than the sql task ever runs with."""


async def _refuse_privileged(connection: "asyncpg.Connection[Any]", target: str) -> None:
    """Never run as a superuser (`COPY ... TO PROGRAM` would run commands on the host),
    and never as a role that may touch Tickgate's own tables (the jobs' secret headers
    are in them): whoever may write a job may run any statement on a target."""
    privileges = await connection.fetchrow(PRIVILEGES)
    assert privileges is not None  # one row, always
    if privileges["superuser"]:
        raise PrivilegedTarget(
            f"SQL target {target!r} connects as a superuser (or a member of one); the sql task "
            "never runs as one: give the target a role of its own"
        )
    if privileges["tickgate"]:
        raise PrivilegedTarget(
            f"SQL target {target!r} connects as a role with rights on Tickgate's tables "
            "(tickgate_*); the sql task never runs as one: give the target a role without them"
        )


async def _returning_rows(
    connection: "asyncpg.Connection[Any]", statement: str, keep: int
) -> SqlOutcome | None:
    """The first `keep` rows of a statement that returns rows, and how many it returned;
    None for any other (it then runs as one simple query, as VACUUM and a script of
    several statements need). Only one statement can be prepared, and one that returns
    rows reads through a portal, so the rest are counted on the server, never sent.
    CALL runs as a simple query: a procedure may commit, which a portal's transaction
    refuses."""
    verb = statement.lstrip().split(None, 1)[0].upper()
    if verb == "CALL":
        return None
    try:
        prepared = await connection.prepare(statement)
    except asyncpg.PostgresError:
        return None  # several statements, or an error the simple query reports alike
    columns = tuple(attribute.name for attribute in prepared.get_attributes())
    if not columns:
        return None
    async with connection.transaction():
        cursor = await prepared.cursor()
        rows = await cursor.fetch(keep)
        total = len(rows)
        skipped = _MOVE_MOST if total == keep else 0
        while skipped == _MOVE_MOST:
            skipped = await cursor.forward(_MOVE_MOST)
            total += skipped
    kept = tuple(tuple(_json(value) for value in row.values()) for row in rows)
    return SqlOutcome(_tag(verb, total), total, columns, kept)


_MOVE_MOST = 2**31 - 1  # MOVE FORWARD's largest count


def _tag(verb: str, rows: int) -> str:
    """The command tag PostgreSQL gives a statement returning `rows` rows (a portal read
    in part has none): INSERT, UPDATE, DELETE and MERGE with RETURNING by their verb,
    anything else (SELECT, WITH, VALUES, TABLE) as a SELECT."""
    if verb == "INSERT":
        return f"INSERT 0 {rows}"
    return f"{verb} {rows}" if verb in {"UPDATE", "DELETE", "MERGE"} else f"SELECT {rows}"


def _json(value: object) -> JsonValue:
    """A column's value as JSON: numbers and text as they are, timestamps in ISO 8601,
    numeric as its decimal text, bytea as base64, anything else as its text."""
    jsonable: JsonValue = to_jsonable_python(value, fallback=str, bytes_mode="base64")
    return jsonable


def _rows_affected(tag: str) -> int:
    """`DELETE 5` -> 5, `INSERT 0 3` -> 3; tags without a count (`VACUUM`) -> 0."""
    last = tag.rsplit(" ", 1)[-1]
    return int(last) if last.isdigit() else 0
