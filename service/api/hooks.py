"""A run's hook deliveries (GET /v1/runs/{id}/hooks) and a job's newest ones
(GET /v1/jobs/{name}/hooks)."""

from typing import Annotated
from uuid import UUID

from fastapi import APIRouter, Query

from service.api.deps import ServicesDep
from service.api.errors import NOT_FOUND, READ
from service.api.jobs import NamePath, existing_job
from service.api.models import HookDeliveryList, HookDeliveryOut
from service.domain.errors import NotFound

router = APIRouter(tags=["runs"])


@router.get("/v1/jobs/{name}/hooks", operation_id="list_job_hooks", responses=READ | NOT_FOUND)
async def job_hooks(
    name: NamePath, services: ServicesDep, limit: Annotated[int, Query(ge=1, le=100)] = 20
) -> HookDeliveryList:
    """The newest hook deliveries of the job's runs (at most `limit`), newest first."""
    await existing_job(services, name)
    deliveries = await services.store.job_deliveries(name, limit)
    return HookDeliveryList(items=[HookDeliveryOut.of(one) for one in deliveries])


@router.get("/v1/runs/{run_id}/hooks", operation_id="list_run_hooks", responses=READ | NOT_FOUND)
async def run_hooks(run_id: UUID, services: ServicesDep) -> HookDeliveryList:
    """The hook deliveries the run's end (or the tick's skip) wrote, oldest first, each
    with its status and attempts."""
    deliveries = await services.store.run_deliveries(run_id)
    if deliveries is None:
        raise NotFound(f"no run with id {run_id}")
    return HookDeliveryList(items=[HookDeliveryOut.of(one) for one in deliveries])
