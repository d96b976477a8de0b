"""What a task is, what it receives when it runs, and the registry that names them."""

import logging
from collections.abc import Awaitable, Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, TypeVar
from uuid import UUID

import httpx
from pydantic import BaseModel, JsonValue, ValidationError

from service.domain.errors import InvalidInput

ArgsT = TypeVar("ArgsT", bound=BaseModel)


@dataclass(frozen=True)
class TaskContext:
    """Everything a running task may know about the run it serves."""

    job: str
    run_id: UUID
    scheduled_for: datetime
    attempt: int
    logger: logging.LoggerAdapter[logging.Logger]
    http: httpx.AsyncClient


@dataclass(frozen=True)
class TaskDefinition(Generic[ArgsT]):
    """A named async callable with the pydantic model its args must fit.

    `run` returns a JSON-able result stored on the run, or raises to fail it.
    """

    name: str
    description: str
    args_model: type[ArgsT]
    run: Callable[[ArgsT, TaskContext], Awaitable[JsonValue]]

    def parse_args(self, args: Mapping[str, JsonValue]) -> ArgsT:
        return self.args_model.model_validate(args)


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

    def check_args(self, task: str, args: Mapping[str, JsonValue]) -> None:
        """Raise InvalidInput (a 422) unless `task` exists and `args` fit its model."""
        definition = self._tasks.get(task)
        if definition is None:
            known = ", ".join(sorted(self._tasks))
            raise InvalidInput.one(("body", "task"), f"unknown task; known tasks: {known}", task)
        try:
            definition.parse_args(args)
        except ValidationError as error:
            raise InvalidInput.from_validation(error, ("body", "args")) from error
