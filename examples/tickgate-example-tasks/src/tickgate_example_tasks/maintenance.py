"""`analyze`: refreshes the planner statistics of one table with `ANALYZE`.

`ANALYZE` only reads the table (it takes a SHARE UPDATE EXCLUSIVE lock, which blocks
neither reads nor writes), so it is a safe thing to schedule. The table name becomes
part of SQL text, so it is checked against a strict pattern when the job is created and
quoted as an identifier when the statement is built.
"""

import re

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from service.tasks import TaskContext, task

# One identifier, or schema.table: letters, digits and underscores, not starting with a
# digit, at most 63 characters each (PostgreSQL's NAMEDATALEN - 1).
IDENTIFIER = r"[A-Za-z_][A-Za-z0-9_]{0,62}"
TABLE_PATTERN = rf"^{IDENTIFIER}(\.{IDENTIFIER})?$"


class AnalyzeArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    table: str = Field(
        pattern=TABLE_PATTERN,
        description="Table to analyze, `name` or `schema.name`, matched case-sensitively "
        "(it is quoted).",
    )
    target: str = Field(
        "self",
        min_length=1,
        max_length=200,
        description="SQL target to run on (TICKGATE_SQL_TARGETS); `self` is Tickgate's own "
        "database when TICKGATE_SQL_ALLOW_SELF is on.",
    )


def quote_identifier(name: str) -> str:
    """`name` as a PostgreSQL quoted identifier: in double quotes, inner quotes doubled."""
    return '"' + name.replace('"', '""') + '"'


def analyze_statement(table: str) -> str:
    """`ANALYZE "schema"."table"` for a name that already matched TABLE_PATTERN."""
    if not re.fullmatch(TABLE_PATTERN, table):
        raise ValueError(f"not a table name: {table!r}")
    return "ANALYZE " + ".".join(quote_identifier(part) for part in table.split("."))


@task("analyze", args=AnalyzeArgs)
async def analyze(args: AnalyzeArgs, context: TaskContext) -> JsonValue:
    """Refresh the planner statistics of one table (ANALYZE) on a configured SQL target."""
    statement = analyze_statement(args.table)
    outcome = await context.sql.execute(args.target, statement, context.remaining_seconds())
    context.logger.info("%s on %s: %s", statement, args.target, outcome.command)
    return {"statement": statement, "target": args.target, "command": outcome.command}
