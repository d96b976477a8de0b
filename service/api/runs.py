"""Runs: trigger one now, list a job's runs, read one."""

from typing import Annotated
from uuid import UUID

from fastapi import APIRouter, Query, status

from service.api.deps import ServicesDep
from service.api.errors import COMMON, CONFLICT, NOT_FOUND
from service.api.jobs import NamePath, existing_job
from service.api.models import RunOut, RunPage, RunQuery, decode_run_cursor, encode_run_cursor
from service.domain.errors import NotFound

router = APIRouter(tags=["runs"], responses=COMMON | NOT_FOUND)


@router.post(
    "/v1/jobs/{name}/trigger",
    status_code=status.HTTP_202_ACCEPTED,
    operation_id="trigger_job",
    responses=CONFLICT,
)
async def trigger(name: NamePath, services: ServicesDep) -> RunOut:
    """Run the job now, through the same gates as a scheduled tick (trigger "manual").
    409 if an overlap "skip" job is running somewhere."""
    job = await existing_job(services, name)
    return RunOut.model_validate(await services.runner.trigger_now(job), from_attributes=True)


@router.get("/v1/jobs/{name}/runs", operation_id="list_runs")
async def list_runs(
    name: NamePath, query: Annotated[RunQuery, Query()], services: ServicesDep
) -> RunPage:
    """The job's runs, newest first."""
    await existing_job(services, name)
    before = decode_run_cursor(query.cursor) if query.cursor else None
    runs = await services.store.list_runs(name, query.limit + 1, before, query.status)
    page = runs[: query.limit]
    return RunPage(
        items=[RunOut.model_validate(run, from_attributes=True) for run in page],
        next_cursor=encode_run_cursor(page[-1]) if len(runs) > query.limit else None,
    )


@router.get("/v1/runs/{run_id}", operation_id="get_run")
async def get_run(run_id: UUID, services: ServicesDep) -> RunOut:
    """One run by id."""
    run = await services.store.get_run(run_id)
    if run is None:
        raise NotFound(f"no run with id {run_id}")
    return RunOut.model_validate(run, from_attributes=True)
