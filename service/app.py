"""The app factory. Its lifespan opens what the app needs and closes it in reverse order."""

import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from datetime import timedelta
from importlib.metadata import version

import httpx
from fastapi import FastAPI

from service.api import install_routes
from service.api.deps import Services
from service.config import Settings
from service.scheduler import Mirror, Runner
from service.store import Store
from service.store.sessions import RunSessions
from service.tasks import TaskRegistry, builtin_registry

log = logging.getLogger(__name__)


def create_app(settings: Settings, registry: TaskRegistry | None = None) -> FastAPI:
    if settings.database_url is None:
        raise ValueError("create_app needs settings.database_url (the CLI fills it in)")
    tasks = registry or builtin_registry()

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            app.state.services = await _open(stack, settings, tasks)
            yield
            log.info("shutting down")

    app = FastAPI(
        title="Tickgate",
        version=version("tickgate"),
        description="Cron, interval, daily and one-time jobs on PostgreSQL, "
        "each tick run exactly once across replicas.",
        lifespan=lifespan,
    )
    install_routes(app)
    return app


async def _open(stack: AsyncExitStack, settings: Settings, tasks: TaskRegistry) -> Services:
    """Open everything; `stack` closes it in reverse: ticks stop, runs get their grace,
    then the listener, the HTTP client and the pools close."""
    dsn = str(settings.database_url)
    store = await Store.open(dsn, max_size=settings.api_pool_size)
    stack.push_async_callback(store.close)
    log.info("database ready (%d migrations applied now)", await store.migrate())
    sessions = await RunSessions.open(dsn, settings.max_concurrent_runs)
    stack.push_async_callback(sessions.close)
    http = await stack.enter_async_context(httpx.AsyncClient(follow_redirects=False))
    runner = Runner(
        sessions=sessions,
        store=store,
        tasks=tasks,
        http=http,
        runner_id=settings.runner_id,
        fire_delay=timedelta(milliseconds=settings.test_fire_delay_ms),
    )
    mirror = None
    if settings.scheduler:
        mirror = Mirror(
            store=store,
            runner=runner,
            dsn=dsn,
            reconcile_seconds=settings.reconcile_seconds,
            run_history=settings.run_history,
        )
        stack.push_async_callback(mirror.stop)
    stack.push_async_callback(runner.shutdown, settings.shutdown_grace_seconds)
    if mirror is not None:
        stack.callback(mirror.pause)
        await mirror.start()
    return Services(store=store, tasks=tasks, settings=settings, runner=runner, mirror=mirror)
