"""Built-in tasks and the registry that names them."""

from service.domain.runs import SqlOutcome
from service.tasks.base import (
    SqlTargets,
    TaskContext,
    TaskDefinition,
    TaskRegistry,
    task,
)
from service.tasks.http import HTTP_TASK
from service.tasks.log import LOG_TASK

__all__ = [
    "SqlOutcome",
    "SqlTargets",
    "TaskContext",
    "TaskDefinition",
    "TaskRegistry",
    "builtin_registry",
    "task",
]


def builtin_registry() -> TaskRegistry:
    return TaskRegistry([HTTP_TASK, LOG_TASK])
