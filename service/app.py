"""The app factory. Its lifespan opens what the app needs and closes it in reverse order."""

import asyncio
import logging
import os
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from functools import partial
from importlib.metadata import version
from typing import Any

import httpx
from fastapi import FastAPI
from fastapi.openapi.utils import get_openapi

from service.api import install_routes
from service.api.bulk import APPLY_ROUTE
from service.api.declarative import apply_job_file
from service.api.deps import Services
from service.api.docs import install_docs
from service.api.errors import declare_problem_media_type
from service.api.guards import READ_METHODS, BearerAuth, BodyLimits, LocalOnly, Tokens
from service.api.hook_rules import check_hooks
from service.api.ui import install_ui
from service.config import ConfigurationError, Settings, split_names, token_scopes
from service.domain.hooks import HookPlan
from service.domain.ownership import Heartbeat, Members
from service.faults import NONE, Faults
from service.metrics import Metrics
from service.scheduler import Runner, Window
from service.scheduler.chores import Chores
from service.scheduler.clock import ReplicaClock
from service.scheduler.departure import Departure
from service.scheduler.hooks import HookSender
from service.scheduler.membership import Membership
from service.scheduler.on_demand import SIDE_SESSIONS
from service.scheduler.remote import SchedulerProcess
from service.store import Store
from service.store.link import Link
from service.store.listener import JobListener
from service.store.members import MemberSession
from service.store.ports import Listener, OpenListener
from service.store.sessions import LockSessions
from service.store.targets import SqlTargetConnections
from service.tasks import TaskRegistry, builtin_registry
from service.tasks.hosts import HostLimits, HostTally
from service.tasks.netguard import Allowlist, GuardedTransport
from service.tasks.oauth import OAuthSecrets, OAuthSecretsError
from service.tasks.plugins import load_plugins
from service.tasks.signing import SigningKeys, SigningKeysError
from service.tasks.sql import sql_task
from service.tracing import tracing_from
from service.tzdb import tz_database

log = logging.getLogger(__name__)


def create_app(
    settings: Settings, registry: TaskRegistry | None = None, faults: Faults = NONE
) -> FastAPI:
    """The service's ASGI app; `faults` only as the harness injects them (service/faults.py)."""
    if settings.database_url is None:
        raise ValueError("create_app needs settings.database_url (the CLI fills it in)")
    hosts = HostTally()  # the http task's connections, for the metrics
    tasks = registry or build_registry(settings, hosts)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with AsyncExitStack() as stack:
            services = await _open(stack, settings, tasks, hosts, faults)
            app.state.services = services
            if settings.apply_jobs is not None:
                await apply_job_file(services, settings.apply_jobs)
            yield
            services.begin_shutdown()
            log.info("shutting down")

    app = FastAPI(
        title="Tickgate",
        version=version("tickgate"),
        description="Cron, interval, daily and one-time jobs on PostgreSQL, "
        "each tick run exactly once across replicas.",
        lifespan=lifespan,
        # Served from the package's own assets instead of a CDN (service/api/docs.py).
        docs_url=None,
        redoc_url=None,
        license_info={"name": "MIT", "identifier": "MIT"},
        # OpenAPI's default made explicit (generators warn without it): the API is on
        # the host that serves the document.
        servers=[{"url": "/", "description": "This server."}],
    )
    install_routes(app, api=settings.api)
    if settings.api:
        install_docs(app)
        install_ui(app)
    _install_guards(app, settings)
    app.openapi = lambda: _openapi_document(app)  # type: ignore[method-assign]
    return app


def _install_guards(app: FastAPI, settings: Settings) -> None:
    """Body limits always; bearer auth when tokens are configured, else requests meant
    for this server only (the CLI refuses to serve anonymously on a non-loopback address
    unless told to)."""
    bulk = {APPLY_ROUTE: settings.max_bulk_body_bytes}
    app.add_middleware(BodyLimits, max_bytes=settings.max_body_bytes, larger=bulk)
    scopes = token_scopes(settings)
    if scopes:
        open_paths = frozenset(split_names(settings.open_paths))
        app.add_middleware(BearerAuth, tokens=Tokens(scopes), open_paths=open_paths)
    else:
        app.add_middleware(LocalOnly, hosts=frozenset(split_names(settings.allowed_hosts)))


def sql_target_dsns(settings: Settings) -> dict[str, str]:
    """The operator's SQL targets, plus `self` (our own database, as a role of its own
    without rights on our tables) only if allowed."""
    targets = dict(settings.sql_targets)
    if settings.sql_allow_self:
        if not settings.sql_self_url:
            raise ConfigurationError(SELF_NEEDS_A_ROLE)
        targets["self"] = settings.sql_self_url
    return targets


SELF_NEEDS_A_ROLE = (
    "TICKGATE_SQL_ALLOW_SELF needs TICKGATE_SQL_SELF_URL, the DSN of a role that is not a "
    "superuser and has no rights on Tickgate's tables (CREATE ROLE tickgate_self LOGIN; "
    "grant it only what the maintenance needs): `self` statements never read the jobs' "
    "secrets. The embedded server makes one."
)


def signing_keys(settings: Settings) -> SigningKeys:
    try:
        return SigningKeys.load(settings.webhook_keys_file, settings.webhook_signing_key)
    except SigningKeysError as error:
        raise ConfigurationError(f"TICKGATE_WEBHOOK_KEYS_FILE: {error}") from None


def oauth_secrets(settings: Settings) -> OAuthSecrets:
    try:
        return OAuthSecrets.load(settings.oauth_secrets_file)
    except OAuthSecretsError as error:
        raise ConfigurationError(f"TICKGATE_OAUTH_SECRETS_FILE: {error}") from None


def check_configuration(settings: Settings) -> None:
    """What a replica would refuse at startup, said by the command before it spawns
    anything (ConfigurationError: one line, exit 2)."""
    signing_keys(settings)
    oauth_secrets(settings)
    sql_target_dsns(settings)


def build_registry(settings: Settings, hosts: HostTally | None = None) -> TaskRegistry:
    """Built-in tasks, the sql task for the configured targets, then plugins; the http
    task's connections are counted in `hosts`."""
    registry = builtin_registry(
        settings.http_allow,
        limits=HostLimits(
            settings.http_max_connections_per_host, settings.http_new_connections_per_host
        ),
        connect_timeout_seconds=settings.http_connect_timeout_seconds,
        hosts=hosts,
        signing=signing_keys(settings),
        oauth=oauth_secrets(settings),
    )
    registry.register(sql_task(frozenset(sql_target_dsns(settings))))
    loaded = load_plugins(registry, split_names(settings.task_modules))
    if loaded:
        log.info("plugin tasks registered: %s", ", ".join(loaded))
    return registry


def _openapi_document(app: FastAPI) -> dict[str, Any]:
    """FastAPI's document, cached, with descriptions for the schemas pydantic names
    itself (so every schema a client generator sees is described)."""
    if app.openapi_schema is None:
        document = get_openapi(
            title=app.title,
            version=app.version,
            description=app.description,
            routes=app.routes,
            license_info=app.license_info,
            servers=app.servers,
        )
        declare_problem_media_type(document)
        components = document.setdefault("components", {})
        for schema in components.get("schemas", {}).values():
            schema.setdefault("description", f"{schema.get('title', 'Any JSON value')}.")
        components["securitySchemes"] = {
            "bearer": {
                "type": "http",
                "scheme": "bearer",
                "description": "A token from TICKGATE_API_TOKENS; read scope for GET, "
                "write for the rest. Servers without tokens need none.",
            }
        }
        document["security"] = [{"bearer": []}, {}]
        _declare_scopes(document)
        app.openapi_schema = document
    return app.openapi_schema


def _declare_scopes(document: dict[str, Any]) -> None:
    """Each operation names the token scope it needs (OpenAPI 3.1 lets a bearer scheme
    list roles): `read` for GET, `write` for the rest, as BearerAuth decides. The empty
    alternative is a server without tokens."""
    for item in document["paths"].values():
        for method, operation in item.items():
            scope = "read" if method.upper() in READ_METHODS else "write"
            operation["security"] = [{"bearer": [scope]}, {}]


def begin_shutdown(app: FastAPI) -> None:
    """Called as SIGTERM arrives, before uvicorn stops serving: readiness fails at once
    and no new run starts. Safe to call before startup finished, and more than once."""
    services: Services | None = getattr(app.state, "services", None)
    if services is not None:
        services.begin_shutdown()


async def _open(
    stack: AsyncExitStack,
    settings: Settings,
    tasks: TaskRegistry,
    hosts: HostTally,
    faults: Faults,
) -> Services:
    """Open everything; `stack` closes it in reverse: ticks stop, runs get their grace,
    then the listener, the HTTP client and the pools close."""
    dsn = str(settings.database_url)
    link = Link(settings.db_link_timeout_seconds)
    hooks = HookPlan(tuple(settings.default_hooks))
    check_hooks(tasks, hooks.defaults, ("TICKGATE_DEFAULT_HOOKS",))  # a bad one stops startup
    store = await Store.open(dsn, max_size=settings.api_pool_size, link=link, hooks=hooks)
    stack.push_async_callback(store.close)
    log.info("database ready (%d migrations applied now)", await store.migrate())
    sessions = LockSessions(dsn, settings.lock_sessions, link)
    stack.push_async_callback(sessions.close)
    if settings.scheduler:
        await sessions.fill()  # an API-only replica claims no scheduled tick
    side_sessions = LockSessions(dsn, SIDE_SESSIONS, link)
    stack.push_async_callback(side_sessions.close)
    # A plugin's client: guarded as the http task is (the same allowlist), no env proxies.
    guarded = GuardedTransport(Allowlist.from_setting(settings.http_allow))
    http = await stack.enter_async_context(
        httpx.AsyncClient(follow_redirects=False, transport=guarded, trust_env=False)
    )
    stack.push_async_callback(tasks.aclose)
    if settings.scheduler:
        tasks.warm()  # before readiness: a replica's first runs are as quick as later ones
    metrics = Metrics(database_gauges=settings.api, hosts=hosts)
    metrics.set_tzdata(tz_database())
    # Closed after the runner (pushed before it): the last runs' spans are exported.
    tracing = await stack.enter_async_context(tracing_from(os.environ, settings.runner_id))
    if faults != NONE:
        log.warning("faults injected on purpose (a test's replica): %s", faults)
    clock = ReplicaClock(faults.clock_offset)
    runner_sql = SqlTargetConnections(sql_target_dsns(settings))
    runner = Runner(
        sessions=sessions,
        side_sessions=side_sessions,
        store=store,
        tasks=tasks,
        http=http,
        sql=runner_sql,
        runner_id=settings.runner_id,
        metrics=metrics,
        fire_delay=faults.fire_delay,
        record_delay=faults.record_delay,
        clock=clock,
        room=settings.max_concurrent_runs,
        takeover_seconds=settings.takeover_seconds,
        tracing=tracing,
        hooks=hooks,
    )
    sender = HookSender(
        store=store,
        runner=runner,
        tasks=tasks,
        http=http,
        sql=runner_sql,
        metrics=metrics,
        sender=settings.runner_id,
        public_url=settings.public_url,
        start_delay=faults.hook_delay,
    )
    window = departure = None
    if settings.scheduler:
        window, departure = await _open_scheduler(
            stack, settings, store=store, runner=runner, clock=clock, sender=sender
        )
    else:
        stack.push_async_callback(runner.shutdown, settings.shutdown_grace_seconds)
    return Services(
        store=store,
        tasks=tasks,
        settings=settings,
        runner=runner,
        metrics=metrics,
        window=window,
        departure=departure,
        scheduler_process=_scheduler_process(stack, settings),
        now=clock.now,
        tzdata=tz_database(),
    )


async def _open_scheduler(
    stack: AsyncExitStack,
    settings: Settings,
    *,
    store: Store,
    runner: Runner,
    clock: ReplicaClock,
    sender: HookSender,
) -> tuple[Window, Departure]:
    """Join the cluster, then hold the window of what is owned here with its chores
    beside it, and send hook deliveries. At shutdown the replica leaves first and hands
    its jobs over (`Departure`), stops producing ticks, gives runs in flight their grace,
    then stops the chores, the window and the sender."""
    dsn = str(settings.database_url)

    def heartbeat() -> Heartbeat:
        return Heartbeat(runs_in_flight=runner.runs_in_flight, last_sync=window.last_sync)

    def members_changed(_members: Members) -> None:
        window.members_changed()
        chores.members_changed()

    join = partial(
        MemberSession.join,
        dsn,
        settings.runner_id,
        version("tickgate"),
        str(tz_database()),
        Link(settings.db_link_timeout_seconds),
    )
    membership = Membership(join=join, on_change=members_changed, heartbeat=heartbeat)
    members = (lambda: membership.members) if settings.ownership else Members.unknown
    window = Window(
        store=store,
        listen=_listener_of(dsn, Link(settings.db_link_timeout_seconds)),
        runner=runner,
        clock=clock,
        members=members,
        cluster_since=lambda: membership.cluster_since,
    )
    chores = Chores(
        store=store,
        runner=runner,
        reconcile_seconds=settings.reconcile_seconds,
        run_history=settings.run_history,
        output_bytes_per_job=settings.output_bytes_per_job,
        members=members,
        cluster_since=lambda: membership.cluster_since,
        buckets_read=window.buckets_read,
    )
    stack.push_async_callback(window.stop)
    stack.push_async_callback(chores.stop)
    stack.push_async_callback(runner.shutdown, settings.shutdown_grace_seconds)
    stack.callback(window.pause)
    stack.push_async_callback(membership.stop)
    departure = Departure(
        membership, _ticks_stopper(window, runner), store.live_members, hand_over=settings.ownership
    )
    stack.push_async_callback(departure.finished)
    await membership.start()
    await window.start()
    chores.start()
    sending = asyncio.create_task(sender.send_forever())
    stack.push_async_callback(_stopped, sending)
    return window, departure


def _listener_of(dsn: str, link: Link) -> OpenListener:
    """The window's listener: a connection of its own that LISTENs for job changes."""

    async def listen(
        on_change: Callable[[str], None], on_lost: Callable[[], None], on_cancel: Callable[[], None]
    ) -> Listener:
        return await JobListener.open(dsn, on_change, on_lost, link, on_cancel)

    return listen


async def _stopped(task: "asyncio.Task[None]") -> None:
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)


def _ticks_stopper(window: Window, runner: Runner) -> Callable[[], None]:
    """Stop producing ticks and admitting any: runs in flight go on."""

    def stop_ticks() -> None:
        runner.accepting = False
        window.pause()

    return stop_ticks


def _scheduler_process(stack: AsyncExitStack, settings: Settings) -> SchedulerProcess | None:
    """The pod's scheduler process beside this API process, if `tickgate serve` split them."""
    if settings.scheduler_socket is None:
        return None
    scheduler = SchedulerProcess(settings.scheduler_socket)
    stack.push_async_callback(scheduler.aclose)
    return scheduler
