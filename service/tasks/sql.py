"""The `sql` task: one statement per run on a database the operator named (pg_cron style).

Args hold a target *name*, never a DSN: the names an app accepts are fixed when it builds
the task from its configuration, so an unknown target is refused when the job is written.
"""

import json
from collections.abc import Callable
from typing import Annotated, Any

from pydantic import (
    AfterValidator,
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    JsonValue,
    WithJsonSchema,
)
from pydantic import create_model as create_pydantic_model
from pydantic_core import PydanticCustomError

from service.domain.runs import SqlOutcome
from service.tasks.base import TaskContext, TaskDefinition

MAX_STATEMENT_BYTES = 64 * 1024
DEFAULT_OUTPUT_ROWS = 20
MAX_OUTPUT_ROWS = 1000
# The rows a run shows stop here, however many `output_rows` allows.
MAX_OUTPUT_ROWS_BYTES = 64 * 1024
MAX_TIMEOUT_SECONDS = 86_400
TARGET_DESCRIPTION = "Name of a database the operator configured (TICKGATE_SQL_TARGETS)."


def _check_statement(statement: str) -> str:
    if not statement.strip():
        raise ValueError("the statement is blank")
    if "\x00" in statement:
        raise ValueError("the statement contains a NUL character")
    if len(statement.encode()) > MAX_STATEMENT_BYTES:
        raise ValueError(f"the statement is over {MAX_STATEMENT_BYTES} bytes of UTF-8")
    return statement


Statement = Annotated[
    str,
    Field(
        min_length=1,
        max_length=MAX_STATEMENT_BYTES,
        description="SQL run as one simple query, outside a transaction.",
    ),
    AfterValidator(_check_statement),
]


class SqlArgs(BaseModel):
    """Args of the `sql` task. `sql_task` narrows `target` to the configured names."""

    model_config = ConfigDict(extra="forbid")

    target: str = Field(description=TARGET_DESCRIPTION)
    statement: Statement
    timeout_seconds: float | None = Field(
        None,
        gt=0,
        le=MAX_TIMEOUT_SECONDS,
        description="statement_timeout; default and upper bound: the attempt's time left.",
    )
    output_rows: int = Field(
        DEFAULT_OUTPUT_ROWS,
        ge=0,
        le=MAX_OUTPUT_ROWS,
        description="Rows of a statement that returns rows the run shows as its output "
        f"(the first ones, {MAX_OUTPUT_ROWS_BYTES // 1024} KiB of JSON at most); all are "
        "counted. 0 runs every statement as a simple query and keeps none.",
    )


class SqlTargetError(LookupError):
    """The run names a target this replica has no DSN for."""


def _known_target(names: frozenset[str]) -> Callable[[Any], Any]:
    """A before-validator refusing anything but a configured name, listing them."""
    listed = ", ".join(sorted(names))

    def check(value: Any) -> Any:
        if not names:
            raise PydanticCustomError(
                "sql_target", "no SQL targets are configured (TICKGATE_SQL_TARGETS)"
            )
        if not isinstance(value, str) or value not in names:
            raise PydanticCustomError(
                "sql_target",
                "unknown SQL target; configured targets: {targets}",
                {"targets": listed},
            )
        return value

    return check


def _target_type(names: frozenset[str]) -> Any:
    """A str accepting only `names`; its JSON schema lists them as an `enum` (always an
    enum, even for one name, where a Literal would give `const`; none when empty)."""
    schema: dict[str, Any] = {"type": "string"}
    if names:
        schema["enum"] = sorted(names)
    return Annotated[str, BeforeValidator(_known_target(names)), WithJsonSchema(schema)]


def sql_args_model(names: frozenset[str]) -> type[SqlArgs]:
    """SqlArgs whose `target` accepts exactly `names`."""
    described = TARGET_DESCRIPTION if names else "No SQL targets are configured."
    return create_pydantic_model(
        "SqlArgs",
        __base__=SqlArgs,
        target=(_target_type(names), Field(description=described)),
    )


def statement_timeout(args: SqlArgs, context: TaskContext) -> float:
    """The args' timeout, never beyond the attempt's time left (the default)."""
    remaining = context.remaining_seconds()
    if args.timeout_seconds is None:
        return remaining
    return min(args.timeout_seconds, remaining)


async def run_sql(args: SqlArgs, context: TaskContext) -> JsonValue:
    configured = context.sql.names()
    if args.target not in configured:
        listed = ", ".join(sorted(configured)) or "none"
        raise SqlTargetError(f"no SQL target {args.target!r} here; configured: {listed}")
    timeout = statement_timeout(args, context)
    outcome = await context.sql.execute(args.target, args.statement, timeout, args.output_rows)
    context.logger.info("sql on %s: %s", args.target, outcome.command)
    context.output.keep(sql_output(outcome))
    return {
        "target": args.target,
        "command": outcome.command,
        "rows_affected": outcome.rows_affected,
    }


def sql_output(outcome: SqlOutcome) -> JsonValue:
    """The run's output: the command tag, and the rows kept (of a statement that returns
    rows), as many as fit in MAX_OUTPUT_ROWS_BYTES; `truncated` when some were left out."""
    rows: list[JsonValue] = []
    size = 0
    for row in outcome.rows:
        size += len(json.dumps(row, separators=(",", ":")).encode()) + 1
        if size > MAX_OUTPUT_ROWS_BYTES:
            break
        rows.append(list(row))
    return {
        "command": outcome.command,
        "rows_affected": outcome.rows_affected,
        "columns": list(outcome.columns),
        "rows": rows,
        "truncated": len(rows) < outcome.rows_affected and bool(outcome.columns),
    }


def sql_task(targets: frozenset[str]) -> TaskDefinition[SqlArgs]:
    """The `sql` task accepting the operator's target names (and nothing else)."""
    return TaskDefinition(
        name="sql",
        description="Run one SQL statement on a configured database target; "
        "statement_timeout bounds it.",
        args_model=sql_args_model(targets),
        run=run_sql,
    )
