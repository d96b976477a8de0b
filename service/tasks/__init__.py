"""Built-in tasks and the registry that names them."""

from service.domain.runs import SqlOutcome
from service.tasks.base import (
    SqlTargets,
    TaskContext,
    TaskDefinition,
    TaskRegistry,
    task,
)
from service.tasks.hosts import HostLimits, HostTally
from service.tasks.http import CONNECT_TIMEOUT_SECONDS, http_task
from service.tasks.log import LOG_TASK
from service.tasks.netguard import Allowlist
from service.tasks.oauth import OAuthSecrets
from service.tasks.signing import SigningKeys

__all__ = [
    "SqlOutcome",
    "SqlTargets",
    "TaskContext",
    "TaskDefinition",
    "TaskRegistry",
    "builtin_registry",
    "task",
]


def builtin_registry(
    http_allow: str = "",
    *,
    limits: HostLimits | None = None,
    connect_timeout_seconds: float = CONNECT_TIMEOUT_SECONDS,
    hosts: HostTally | None = None,
    signing: SigningKeys | None = None,
    oauth: OAuthSecrets | None = None,
) -> TaskRegistry:
    """`http` and `log`. `http_allow` is TICKGATE_HTTP_ALLOW: the loopback/private
    targets the http task may reach (none by default); ValueError if malformed. The
    http task's connections per host are bounded by `limits` and counted in
    `hosts`; it signs with the keys of `signing` and takes OAuth client secrets from
    `oauth`."""
    http = http_task(
        Allowlist.from_setting(http_allow),
        limits=limits,
        connect_timeout_seconds=connect_timeout_seconds,
        hosts=hosts,
        signing=signing,
        oauth=oauth,
    )
    return TaskRegistry([http, LOG_TASK])
