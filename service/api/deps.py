"""What route handlers receive: the app's services, injected per request."""

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Annotated

from fastapi import Depends, Request

from service.config import Settings
from service.metrics import Metrics
from service.scheduler import Runner, Window
from service.scheduler.departure import Departure
from service.scheduler.remote import SchedulerProcess
from service.store import Store
from service.tasks import TaskRegistry
from service.tzdb import TzDatabase, tz_database


def utc_now() -> datetime:
    return datetime.now(UTC)


def proxy_prefix(request: Request) -> str:
    """The prefix a proxy serves the app under (uvicorn --root-path), if any: pages
    that link to the app's own paths (the dashboard, the API docs) put it first."""
    return str(request.scope.get("root_path", "")).rstrip("/")


@dataclass
class Lifecycle:
    """Flips once, when SIGTERM arrives: readiness fails and no new run starts."""

    shutting_down: bool = False


@dataclass(frozen=True)
class Services:
    store: Store
    tasks: TaskRegistry
    settings: Settings
    runner: Runner
    metrics: Metrics
    window: Window | None = None
    departure: Departure | None = None
    # The pod's scheduler in a process of its own, when `tickgate serve` split them.
    scheduler_process: SchedulerProcess | None = None
    lifecycle: Lifecycle = field(default_factory=Lifecycle)
    now: Callable[[], datetime] = field(default=utc_now)
    tzdata: TzDatabase = field(default_factory=tz_database)

    def begin_shutdown(self) -> None:
        """Readiness fails at once; the scheduler hands its jobs over, then starts no
        new run (at once without a scheduler: no manual run starts)."""
        self.lifecycle.shutting_down = True
        if self.departure is not None:
            self.departure.begin()
        else:
            self.runner.accepting = False


async def _services(request: Request) -> Services:
    # async on purpose: FastAPI runs a plain-def dependency in a worker thread, a
    # thread hop per request that cost a busy replica a sixth of its CPU.
    services: Services = request.app.state.services
    return services


ServicesDep = Annotated[Services, Depends(_services)]
