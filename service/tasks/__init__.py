"""Built-in tasks and the registry that names them."""

from service.tasks.base import TaskContext, TaskDefinition, TaskRegistry
from service.tasks.http import HTTP_TASK
from service.tasks.log import LOG_TASK

__all__ = ["TaskContext", "TaskDefinition", "TaskRegistry", "builtin_registry"]


def builtin_registry() -> TaskRegistry:
    return TaskRegistry([HTTP_TASK, LOG_TASK])
