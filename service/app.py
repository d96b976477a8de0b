"""The app factory. Its lifespan opens what the app needs and closes it in reverse order."""

import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager

from fastapi import FastAPI

from service.api import install_routes
from service.api.deps import Services
from service.config import Settings
from service.store import Store
from service.tasks import TaskRegistry, builtin_registry

log = logging.getLogger(__name__)


def create_app(settings: Settings, registry: TaskRegistry | None = None) -> FastAPI:
    if settings.database_url is None:
        raise ValueError("create_app needs settings.database_url (the CLI fills it in)")
    tasks = registry or builtin_registry()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            store = await Store.open(str(settings.database_url), max_size=settings.api_pool_size)
            stack.push_async_callback(store.close)
            applied = await store.migrate()
            log.info("database ready (%d migrations applied now)", applied)
            app.state.services = Services(store=store, tasks=tasks, settings=settings)
            yield

    app = FastAPI(
        title="Tickgate",
        version=_version(),
        description="Cron, interval, daily and one-time jobs on PostgreSQL, "
        "each tick run exactly once across replicas.",
        lifespan=lifespan,
    )
    install_routes(app)
    return app


def _version() -> str:
    from importlib.metadata import version

    return version("tickgate")
