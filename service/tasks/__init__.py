"""Built-in tasks and the registry that names them."""

from service.domain.runs import SqlOutcome
from service.tasks.base import (
    SqlTargets,
    TaskContext,
    TaskDefinition,
    TaskRegistry,
    task,
)
from service.tasks.http import http_task
from service.tasks.log import LOG_TASK
from service.tasks.netguard import Allowlist

__all__ = [
    "SqlOutcome",
    "SqlTargets",
    "TaskContext",
    "TaskDefinition",
    "TaskRegistry",
    "builtin_registry",
    "task",
]


def builtin_registry(http_allow: str = "") -> TaskRegistry:
    """`http` and `log`. `http_allow` is TICKGATE_HTTP_ALLOW: the loopback/private
    targets the http task may reach (none by default); ValueError if malformed."""
    return TaskRegistry([http_task(Allowlist.from_setting(http_allow)), LOG_TASK])
