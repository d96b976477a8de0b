"""Runs: trigger one now, list a job's runs or every job's, read one."""

from datetime import datetime
from typing import Annotated
from uuid import UUID, uuid4

from fastapi import APIRouter, Body, Query, Request, status
from pydantic import JsonValue

from service.api.deps import Services, ServicesDep
from service.api.errors import CONFLICT, NOT_FOUND, READ, WRITE
from service.api.guards import caller
from service.api.jobs import NamePath, existing_job
from service.api.models import (
    MAX_BACKFILL_TICKS,
    AllRunsQuery,
    BackfillRequest,
    CancelBody,
    CancelOut,
    RunDetail,
    RunList,
    RunLogOut,
    RunOut,
    RunPage,
    RunQuery,
    TriggerRequest,
    decode_run_cursor,
    encode_run_cursor,
)
from service.domain.errors import Conflict, InvalidInput, NotFound
from service.domain.jobs import Job, fired_by_app, refuse_if_fired_by_app, ticks_between
from service.domain.runs import CancelRequest, Run, SkipReason
from service.store import KeptRun, RunFilter
from service.tasks.http import merge_secret_headers

router = APIRouter(tags=["runs"])
# A trigger without a body: the job's own args. (An optional body with a default, not
# `| None`: the schema stays a plain reference, which generated clients handle.)
NO_OVERRIDE = TriggerRequest()
NO_REASON = CancelBody()


@router.post(
    "/v1/jobs/{name}/trigger",
    status_code=status.HTTP_202_ACCEPTED,
    operation_id="trigger_job",
    responses=WRITE | NOT_FOUND | CONFLICT,
)
async def trigger(
    name: NamePath, services: ServicesDep, body: Annotated[TriggerRequest, Body()] = NO_OVERRIDE
) -> RunOut:
    """Run the job now, through the same gates as a scheduled tick (trigger "manual"),
    with the body's `args` instead of the job's if given (that run only; both kept on
    the run, with the `note`). 409 if an overlap "skip" job is running somewhere; 422
    naming the field if the args do not fit the task."""
    job = await existing_job(services, name)
    refuse_if_fired_by_app(job, "triggered")
    args = None
    if body.args is not None:
        args = merge_secret_headers(body.args, job.args)
        services.tasks.check_args(job.task, args)
    run = await services.runner.on_demand.trigger_now(job, args, body.note)
    return RunOut.model_validate(run, from_attributes=True)


@router.post(
    "/v1/jobs/{name}/backfill",
    operation_id="backfill_job",
    responses=WRITE | NOT_FOUND | CONFLICT,
)
async def backfill(name: NamePath, body: BackfillRequest, services: ServicesDep) -> RunList:
    """Run every nominal tick in [from, to] that has no run yet, once each and in order
    (trigger "backfill"), and return the runs this call made. At most 1000 ticks; `to`
    must not be in the future. 409 if `from` is at or before the newest tick whose run
    retention deleted: those ticks would read as never run. 409 too if the job, active
    when the backfill began, is paused or completed before its last tick: the ticks not
    yet claimed then do not run. Called on two replicas at once, each tick still runs
    exactly once."""
    job = await existing_job(services, name)
    refuse_if_fired_by_app(job, "backfilled")
    ticks = _backfill_ticks(job, body, await services.store.clock())
    unrun = await services.store.ticks_without_runs(
        [(name, tick) for tick in ticks], unrun=list(SkipReason)
    )
    # Read after the ledger: retention deletes rows and moves the watermark at once, so
    # a tick found missing above because it was pruned is found covered here.
    _refuse_pruned(body, await services.store.pruned_through(name))
    todo = [tick for tick in ticks if (name, tick) in unrun]
    runs = await services.runner.on_demand.backfill(job, todo)
    return RunList(items=[RunOut.model_validate(run, from_attributes=True) for run in runs])


def _backfill_ticks(job: Job, body: BackfillRequest, now: datetime) -> list[datetime]:
    if body.end < body.start:
        raise InvalidInput.one(("body", "to"), "must not be before `from`", body.end.isoformat())
    if body.end > now:
        # Backfill runs its ticks now: a future tick would run before it is due.
        raise InvalidInput.one(("body", "to"), "must not be in the future", body.end.isoformat())
    ticks = ticks_between(job, body.start, body.end, MAX_BACKFILL_TICKS + 1)
    if len(ticks) > MAX_BACKFILL_TICKS:
        raise InvalidInput.one(
            ("body", "to"),
            f"the range holds more than {MAX_BACKFILL_TICKS} ticks; backfill it in parts",
            body.end.isoformat(),
        )
    return ticks


def _refuse_pruned(body: BackfillRequest, pruned_through: datetime | None) -> None:
    if pruned_through is not None and body.start <= pruned_through:
        raise Conflict(
            f"runs up to {pruned_through.isoformat()} were pruned by retention; "
            "backfill from after it"
        )


@router.get("/v1/jobs/{name}/runs", operation_id="list_runs", responses=READ | NOT_FOUND)
async def list_runs(
    name: NamePath, query: Annotated[RunQuery, Query()], services: ServicesDep
) -> RunPage:
    """The job's runs, newest first."""
    await existing_job(services, name)
    before = decode_run_cursor(query.cursor) if query.cursor else None
    where = RunFilter(frozenset({query.status}) if query.status else frozenset())
    runs = await services.store.list_runs(name, query.limit + 1, before, where)
    return _page(runs, query.limit)


@router.get("/v1/runs", operation_id="list_all_runs", responses=READ)
async def list_all_runs(query: Annotated[AllRunsQuery, Query()], services: ServicesDep) -> RunPage:
    """Every job's runs, newest first (by `started_at`, then id), a page at a time; runs
    recorded while you page show up on no later page and push nothing into it twice.
    Filters: status, job, and `since` <= `started_at` < `until`."""
    before = decode_run_cursor(query.cursor) if query.cursor else None
    runs = await services.store.list_runs(query.job, query.limit + 1, before, query.where())
    return _page(runs, query.limit)


def _page(runs: list[Run], limit: int) -> RunPage:
    """The first `limit` of `runs` (fetched one over to learn whether more follow)."""
    page = runs[:limit]
    return RunPage(
        items=[RunOut.model_validate(run, from_attributes=True) for run in page],
        next_cursor=encode_run_cursor(page[-1]) if len(runs) > limit else None,
    )


@router.get("/v1/runs/{run_id}", operation_id="get_run", responses=READ | NOT_FOUND)
async def get_run(run_id: UUID, services: ServicesDep) -> RunDetail:
    """One run by id, with what its last attempt answered (`output`) and every
    attempt's times (`attempt_times`)."""
    kept = await _kept(services, run_id)
    shown = {"output": kept.output, "attempt_times": kept.attempts()}
    return RunDetail.model_validate(kept.run.model_dump() | shown)


@router.get("/v1/runs/{run_id}/log", operation_id="get_run_log", responses=READ | NOT_FOUND)
async def get_run_log(run_id: UUID, services: ServicesDep) -> RunLogOut:
    """What the run logged, once it has ended (a run still going shows nothing yet)."""
    log = (await _kept(services, run_id)).log
    return RunLogOut.model_validate({"run_id": run_id, "lines": [], **_mapping(log)})


@router.post(
    "/v1/runs/{run_id}/cancel",
    status_code=status.HTTP_202_ACCEPTED,
    operation_id="cancel_run",
    responses=WRITE | NOT_FOUND | CONFLICT,
)
async def cancel_run(
    run_id: UUID,
    request: Request,
    services: ServicesDep,
    body: Annotated[CancelBody, Body()] = NO_REASON,
) -> CancelOut:
    """Cancel a running run: the replica running it hears of it (whichever replica
    answers this) and stops it the way a timeout does; it ends `cancelled` with who asked
    and why. If that replica is gone, the run ends `abandoned` once its lock is free, and
    is never resumed. 409 with its status if it has ended."""
    await _refuse_app_run(services, run_id)
    asked = CancelRequest(run_id, caller(request, body.by), body.reason)
    answer = await services.store.request_cancel(asked)
    if answer is None:
        raise NotFound(f"no run with id {run_id}")
    if not answer.asked:
        raise Conflict(f"the run has ended already: {answer.run.status.value}")
    run = RunOut.model_validate(answer.run, from_attributes=True)
    if answer.gone:
        detail = "the replica running it is gone: the orphan sweep ends it abandoned"
        return CancelOut(run=run, state="abandoning", detail=detail)
    return CancelOut(run=run, state="cancelling", detail="its replica is stopping it")


@router.post(
    "/v1/jobs/{name}/queued/cancel",
    operation_id="cancel_queued_tick",
    responses=WRITE | NOT_FOUND,
)
async def cancel_queued(
    name: NamePath,
    request: Request,
    services: ServicesDep,
    body: Annotated[CancelBody, Body()] = NO_REASON,
) -> RunOut:
    """Drop the tick of an overlap "queue_one" job that waits for the run in progress:
    it is recorded `skipped` with reason `cancelled` (who asked and why as its error),
    and never runs. 404 if no tick waits (or it has started: cancel its run)."""
    job = await existing_job(services, name)
    asked = CancelRequest(uuid4(), caller(request, body.by), body.reason)
    skipped = await services.runner.on_demand.cancel_queued(job, asked)
    if skipped is None:
        raise NotFound(f"no tick of {name!r} is waiting")
    return RunOut.model_validate(skipped, from_attributes=True)


async def _refuse_app_run(services: Services, run_id: UUID) -> None:
    """A run of a job an app fires runs in the app, which no replica can stop."""
    run = await services.store.get_run(run_id)
    job = await services.store.get_job(run.job) if run is not None else None
    if job is not None and fired_by_app(job):
        refuse_if_fired_by_app(job, "cancelled (its runs run in the app)")


async def _kept(services: Services, run_id: UUID) -> KeptRun:
    kept = await services.store.get_run_kept(run_id)
    if kept is None:
        raise NotFound(f"no run with id {run_id}")
    return kept


def _mapping(value: JsonValue) -> dict[str, JsonValue]:
    return value if isinstance(value, dict) else {}
