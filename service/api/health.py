"""Probes and metrics: /healthz (alive), /readyz (able to serve), /metrics."""

import asyncio
import logging
from datetime import UTC, datetime
from typing import Literal

from fastapi import APIRouter, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from service.api.deps import Services, ServicesDep
from service.api.errors import GUARDED, documented
from service.metrics import merge_expositions
from service.store.errors import UNAVAILABLE
from service.store.migrate import head_version

log = logging.getLogger(__name__)
router = APIRouter(tags=["health"])
READY_DB_TIMEOUT_SECONDS = 1.0
OK = "ok"


class Health(BaseModel):
    """The process and its event loop are alive."""

    status: Literal["ok"] = "ok"


class Unhealthy(BaseModel):
    """The pod's scheduler process, which runs beside this one, does not answer."""

    status: Literal["unhealthy"] = "unhealthy"
    scheduler: str = Field(description="Why the scheduler process does not count as alive.")


class Readiness(BaseModel):
    """Whether this replica should receive traffic, and each check's verdict."""

    status: Literal["ready", "not_ready"]
    checks: dict[str, str] = Field(
        description="database, migrations, scheduler and shutdown: 'ok' or what is wrong."
    )
    tzdata: str = Field(
        description="The time-zone database release ticks are computed with, and its "
        "source, e.g. `2025b (tzdata package)`: every replica should report the same."
    )


@router.get(
    "/healthz",
    operation_id="get_health",
    response_model=Health,
    responses=documented(503, Unhealthy, "The scheduler process is not alive.") | GUARDED,
)
async def healthz(services: ServicesDep) -> JSONResponse:
    """Liveness: never touches the database, so an outage restarts no pod. Where the
    scheduler runs in a process of its own, it must answer too."""
    scheduler = services.scheduler_process
    verdict = OK if scheduler is None else await scheduler.liveness()
    if verdict == OK:
        return JSONResponse(Health().model_dump())
    return JSONResponse(Unhealthy(scheduler=verdict).model_dump(), status_code=503)


@router.get(
    "/readyz",
    operation_id="get_readiness",
    response_model=Readiness,
    responses=documented(503, Readiness, "Not ready; `checks` says why.") | GUARDED,
)
async def readyz(services: ServicesDep) -> JSONResponse:
    """Readiness: the database answers within 1 s, migrations are at head, the
    scheduler (if on) has synced and hears changes, and shutdown has not begun."""
    checks = {"shutdown": "shutting down" if services.lifecycle.shutting_down else OK}
    database, scheduler = await asyncio.gather(
        _database_checks(services), _scheduler_check(services)
    )
    checks |= database | {"scheduler": scheduler}
    ready = all(verdict in {OK, "off"} for verdict in checks.values())
    body = Readiness(
        status="ready" if ready else "not_ready", checks=checks, tzdata=str(services.tzdata)
    )
    return JSONResponse(body.model_dump(), status_code=200 if ready else 503)


@router.get("/metrics", include_in_schema=False)
async def metrics(services: ServicesDep) -> Response:
    """Prometheus text exposition: this process's metrics, merged with those of the
    scheduler process beside it, if any."""
    _refresh_sync_age(services)
    if services.metrics.database_gauges:
        await _refresh_database_gauges(services)
    exposition = services.metrics.exposition()
    if services.scheduler_process is not None:
        scheduler = await services.scheduler_process.exposition()
        exposition = exposition if scheduler is None else merge_expositions(exposition, scheduler)
    return Response(exposition, media_type="text/plain; version=0.0.4")


async def _database_checks(services: Services) -> dict[str, str]:
    try:
        version = await services.store.schema_version(within=READY_DB_TIMEOUT_SECONDS)
    except UNAVAILABLE as error:
        # The kind of failure only: its text can name the database's address.
        return {"database": f"unreachable: {type(error).__name__}", "migrations": "unknown"}
    head = head_version()
    migrations = OK if version == head else f"at version {version}, head is {head}"
    return {"database": OK, "migrations": migrations}


async def _scheduler_check(services: Services) -> str:
    if services.scheduler_process is not None:
        return await services.scheduler_process.readiness()
    window = services.window
    if window is None:
        return "off"
    if not window.synced:
        return "first sync not finished"
    return OK if window.healthy else "not listening for job changes"


def _refresh_sync_age(services: Services) -> None:
    if services.window is not None and services.window.last_sync is not None:
        age = datetime.now(UTC) - services.window.last_sync
        services.metrics.sync_age.set(age.total_seconds())


async def _refresh_database_gauges(services: Services) -> None:
    gauges = services.metrics
    try:
        for state, count in (await services.store.job_counts()).items():
            gauges.jobs.labels(state.value).set(count)
        overdue = await services.store.overdue_summary()
        gauges.jobs_overdue.set(overdue.count)
        if overdue.checked_at is not None:
            gauges.overdue_checked.set(overdue.checked_at.timestamp())
        gauges.set_app_successes(await services.store.app_last_successes())
    except UNAVAILABLE as error:
        # Keep the last values; readiness reports the outage.
        log.debug("job gauges not refreshed: %r", error)
