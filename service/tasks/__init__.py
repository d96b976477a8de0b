"""Built-in tasks and the registry that names them."""

from service.domain.runs import SqlOutcome
from service.tasks.base import (
    SqlTargets,
    TaskContext,
    TaskDefinition,
    TaskRegistry,
    task,
)
from service.tasks.hosts import HostTally
from service.tasks.http import (
    CONNECT_TIMEOUT_SECONDS,
    MAX_CONNECTIONS_PER_HOST,
    NEW_CONNECTIONS_PER_HOST,
    http_task,
)
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
    max_per_host: int = MAX_CONNECTIONS_PER_HOST,
    max_new_per_host: int = NEW_CONNECTIONS_PER_HOST,
    connect_timeout_seconds: float = CONNECT_TIMEOUT_SECONDS,
    hosts: HostTally | None = None,
    signing: SigningKeys | None = None,
    oauth: OAuthSecrets | None = None,
) -> TaskRegistry:
    """`http` and `log`. `http_allow` is TICKGATE_HTTP_ALLOW: the loopback/private
    targets the http task may reach (none by default); ValueError if malformed. The
    http task's connections per host are capped at `max_per_host` (`max_new_per_host`
    of them new and not yet answered) and counted in
    `hosts`; it signs with the keys of `signing` and takes OAuth client secrets from
    `oauth`."""
    http = http_task(
        Allowlist.from_setting(http_allow),
        max_per_host=max_per_host,
        max_new_per_host=max_new_per_host,
        connect_timeout_seconds=connect_timeout_seconds,
        hosts=hosts,
        signing=signing,
        oauth=oauth,
    )
    return TaskRegistry([http, LOG_TASK])
