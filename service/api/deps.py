"""What route handlers receive: the app's services, injected per request."""

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Annotated

from fastapi import Depends, Request

from service.config import Settings
from service.scheduler import Mirror, Runner
from service.store import Store
from service.tasks import TaskRegistry


def utc_now() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class Services:
    store: Store
    tasks: TaskRegistry
    settings: Settings
    runner: Runner
    mirror: Mirror | None = None
    now: Callable[[], datetime] = field(default=utc_now)


def _services(request: Request) -> Services:
    services: Services = request.app.state.services
    return services


ServicesDep = Annotated[Services, Depends(_services)]
