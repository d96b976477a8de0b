"""What a task is, what it receives when it runs, and the registry that names them."""

import inspect
import logging
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Generic, Protocol, TypeVar
from uuid import UUID

import httpx
from pydantic import BaseModel, JsonValue, ValidationError

from service.domain.errors import InvalidInput
from service.domain.runs import SqlOutcome

ArgsT = TypeVar("ArgsT", bound=BaseModel)


class SqlTargets(Protocol):
    """Databases an operator named for SQL tasks. Callers name a target, never a DSN."""

    def names(self) -> frozenset[str]:
        """The configured target names."""
        ...

    async def execute(
        self, target: str, statement: str, timeout_seconds: float, keep_rows: int = 0
    ) -> SqlOutcome:
        """Run `statement` on `target` with `statement_timeout` set to the timeout; of a
        single statement that returns rows, keep the first `keep_rows` (and count all).
        KeyError for an unknown target; the database's error if the statement fails."""
        ...


class Output:
    """What a run shows of its attempt's answer (the http task's response): a task keeps
    it here as it goes, even when the attempt then fails, and it is stored with the
    run's end, beside the run (GET /v1/runs/{id})."""

    def __init__(self) -> None:
        self.kept: JsonValue = None

    def keep(self, output: JsonValue) -> None:
        self.kept = output


@dataclass(frozen=True)
class TaskContext:
    """Everything a running task may know about the run it serves.

    `deadline` is when this attempt is cancelled (the job's `timeout_seconds` from the
    attempt's start, or the end of the retry budget if sooner): a task that can stop
    early should check `remaining_seconds()`; one that can't is cancelled there anyway.
    `trace_headers` carry the attempt's trace to what the task calls (W3C `traceparent`),
    empty while tracing is off. `output` keeps what the attempt's target answered.
    """

    job: str
    run_id: UUID
    scheduled_for: datetime
    attempt: int
    logger: logging.LoggerAdapter[logging.Logger]
    deadline: datetime
    http: httpx.AsyncClient
    sql: SqlTargets
    trace_headers: Mapping[str, str] = field(default_factory=dict)
    output: Output = field(default_factory=Output)

    def remaining_seconds(self) -> float:
        return max(0.0, (self.deadline - datetime.now(UTC)).total_seconds())


@dataclass(frozen=True)
class TaskDefinition(Generic[ArgsT]):
    """A named async callable with the pydantic model its args must fit.

    `run` returns a JSON-able result stored on the run, or raises to fail it.
    """

    name: str
    description: str
    args_model: type[ArgsT]
    run: Callable[[ArgsT, TaskContext], Awaitable[JsonValue]]
    # Releases what `run` keeps between runs (kept-alive connections, say).
    close: Callable[[], Awaitable[None]] | None = None
    # Sets up, before the replica reports ready, what `run` would set up on first use
    # (certificates, connection pools), so a replica's first runs are as quick as later ones.
    warm: Callable[[], None] | None = None
    # Checks, when a job is written, what the args model alone cannot (a name that
    # must be configured, say): raises InvalidInput.
    check: Callable[[ArgsT], None] | None = None
    # `check` and more, where a caller asks for it (`check_args(..., reach=True)`): what
    # the run would refuse anyway, refused when written (a hook's webhook target).
    check_reach: Callable[[ArgsT], None] | None = None

    def parse_args(self, args: Mapping[str, JsonValue]) -> ArgsT:
        return self.args_model.model_validate(args)


RunFn = Callable[[ArgsT, TaskContext], Awaitable[JsonValue]]


def task(
    name: str, *, args: type[ArgsT], description: str | None = None
) -> Callable[[RunFn[ArgsT]], TaskDefinition[ArgsT]]:
    """Declare an async function as a task: `@task("reindex", args=ReindexArgs)`.

    The decorated name becomes a TaskDefinition; nothing is registered globally. The
    service finds definitions in the modules named by TICKGATE_TASK_MODULES and in the
    `tickgate.tasks` entry-point group. The description defaults to the docstring.
    """

    def declare(run: RunFn[ArgsT]) -> TaskDefinition[ArgsT]:
        text = description or inspect.getdoc(run) or name
        return TaskDefinition(name=name, description=text, args_model=args, run=run)

    return declare


class TaskRegistry:
    """Task names to definitions. Built per app, never a module-level global."""

    def __init__(self, definitions: Iterable[TaskDefinition[Any]] = ()) -> None:
        self._tasks: dict[str, TaskDefinition[Any]] = {}
        for definition in definitions:
            self.register(definition)

    def register(self, definition: TaskDefinition[Any]) -> None:
        if definition.name in self._tasks:
            raise ValueError(f"task {definition.name!r} is registered twice")
        self._tasks[definition.name] = definition

    def __iter__(self) -> Iterator[TaskDefinition[Any]]:
        return iter(sorted(self._tasks.values(), key=lambda d: d.name))

    def get(self, name: str) -> TaskDefinition[Any] | None:
        return self._tasks.get(name)

    def warm(self) -> None:
        """Set up what the tasks would set up on their first run."""
        for definition in self._tasks.values():
            if definition.warm is not None:
                definition.warm()

    async def aclose(self) -> None:
        """Release what the tasks keep between runs; they reopen it if run again."""
        for definition in self._tasks.values():
            if definition.close is not None:
                await definition.close()

    def check_args(self, task: str, args: Mapping[str, JsonValue], *, reach: bool = False) -> None:
        """Raise InvalidInput (a 422) unless `task` exists and `args` fit its model;
        with `reach`, its `check_reach` too."""
        definition = self._tasks.get(task)
        if definition is None:
            known = ", ".join(sorted(self._tasks))
            raise InvalidInput.one(("body", "task"), f"unknown task; known tasks: {known}", task)
        try:
            parsed = definition.parse_args(args)
        except ValidationError as error:
            raise InvalidInput.from_validation(error, ("body", "args")) from error
        checks = definition.check_reach if reach else None
        checks = checks or definition.check
        if checks is not None:
            checks(parsed)
