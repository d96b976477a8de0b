"""/v1/jobs: thin handlers that pair a domain change with one store call."""

from collections.abc import Callable
from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Body, Path, Query, Request, Response, status
from pydantic import JsonValue, ValidationError

from service.api.deps import Services, ServicesDep
from service.api.errors import (
    CONFLICT,
    NOT_FOUND,
    PRECONDITION_FAILED,
    READ,
    WRITE,
    ResponseDoc,
)
from service.api.guards import caller
from service.api.hook_rules import check_chains, check_hooks, kept_secrets
from service.api.models import (
    PATCH_EXAMPLE,
    JobCreate,
    JobOut,
    JobPage,
    JobQuery,
    JobReplace,
    ListedJob,
    PauseRequest,
    decode_cursor,
    decode_tick_cursor,
    encode_cursor,
    encode_tick_cursor,
    selected_labels,
    shown_spec,
)
from service.api.preconditions import ETAG_DOC, IfMatch, etag, guarded
from service.domain.errors import Conflict, InvalidInput, NotFound
from service.domain.hooks import HOOKS, Hook
from service.domain.jobs import (
    Job,
    JobName,
    JobSpec,
    create_job,
    patched_spec,
    pause_job,
    refuse_if_fired_by_app,
    replace_job,
    resume_job,
)
from service.scheduler.overdue import overdue_jobs
from service.store import JobChange, JobFilter, ShownJob
from service.store.jobs import JobChangeFn
from service.tasks.http import merge_secret_headers

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])

CREATED: ResponseDoc = {
    201: {
        "model": JobOut,
        "description": "Created.",
        "headers": {
            "Location": {
                "description": "The new job's URL, /v1/jobs/{name}.",
                "schema": {"type": "string"},
            }
        }
        | ETAG_DOC,
    }
}
SHOWN: ResponseDoc = {200: {"description": "The job.", "headers": ETAG_DOC}}

MERGE_PATCH = "application/merge-patch+json"
PATCH_DOC: dict[str, Any] = {
    "description": "JSON merge patch (RFC 7396) of the declared fields: null resets one.",
    "examples": [PATCH_EXAMPLE],
}
MERGE_PATCH_SCHEMA = {
    "type": "object",
    "additionalProperties": {"$ref": "#/components/schemas/JsonValue"},
    **PATCH_DOC,
}
NamePath = Annotated[JobName, Path(description="The job's name, its identity.")]


@router.post(
    "",
    status_code=status.HTTP_201_CREATED,
    operation_id="create_job",
    responses=CREATED | WRITE | CONFLICT,
)
async def create(body: JobCreate, services: ServicesDep, response: Response) -> JobOut:
    """Create a job. 409 if the name (or its lock_key) is taken."""
    spec = _checked(services, body.spec())
    await check_chains(services, {body.name: spec.hooks})
    now = await services.store.clock()
    job = create_job(body.name, spec, now)
    if not await services.store.insert_job(job, job.next_run_at(now)):
        raise Conflict(f"job {body.name!r} already exists")
    response.headers["Location"] = f"/v1/jobs/{body.name}"
    response.headers["ETag"] = etag(job)
    return JobOut.of(job, now)  # a job just made has no runs yet


@router.put(
    "/{name}",
    operation_id="apply_job",
    status_code=status.HTTP_200_OK,
    responses=SHOWN | CREATED | WRITE | CONFLICT | PRECONDITION_FAILED,
)
async def apply(
    name: NamePath,
    body: JobReplace,
    services: ServicesDep,
    response: Response,
    if_match: IfMatch = None,
) -> JobOut:
    """Create (201) or replace (200) a job declaratively; an unchanged body changes nothing.
    With `If-Match`, only replace the job as it was when read (412 otherwise)."""
    if body.name is not None and body.name != name:
        raise InvalidInput.one(("body", "name"), "must equal the name in the path", body.name)
    await check_chains(services, {name: body.hooks})
    result = await upsert_job(services, name, body.spec(), if_match)
    if result.created:
        response.status_code = status.HTTP_201_CREATED
        response.headers["Location"] = f"/v1/jobs/{name}"
    now = services.now()
    if result.after != result.before:
        await file_next_tick(services, _after(result), now)
    return await _out(services, _after(result), now, response)


async def upsert_job(
    services: Services, name: str, spec: JobSpec, if_match: str | None = None
) -> JobChange:
    now = await services.store.clock()
    return await services.store.mutate_job(
        name,
        guarded(if_match, lambda current: declared_job(services, name, spec, current, now)),
    )


def declared_job(
    services: Services, name: str, spec: JobSpec, current: Job | None, now: datetime
) -> Job:
    """The job `spec` declares: created, or replacing `current` (unchanged if equal).
    The rule of every declarative apply, one job (PUT /v1/jobs/{name}) or a set. An
    app's job is refused first: whatever the body, it is changed in the app."""
    if current is not None:
        refuse_if_fired_by_app(current, "changed")
    checked = _checked(services, _with_kept_secrets(spec, current))
    return replace_job(current, checked, now) if current else create_job(name, checked, now)


@router.get("", operation_id="list_jobs", responses=READ)
async def list_jobs(query: Annotated[JobQuery, Query()], services: ServicesDep) -> JobPage:
    """Jobs in name order (or by next run: see `sort`), a page at a time."""
    where = JobFilter(query.state, query.task, query.prefix, selected_labels(query.label))
    if query.sort == "next_run":
        return await _by_next_run(services, query, where)
    after = decode_cursor(query.cursor) if query.cursor else None
    if query.overdue:
        shown = await _overdue(services, where, after, query.limit + 1)
    else:
        shown = await services.store.list_jobs(query.limit + 1, after, where)
    page, more = shown[: query.limit], len(shown) > query.limit
    return _page(services, page, encode_cursor(page[-1].job.name) if more else None)


async def _by_next_run(services: Services, query: JobQuery, where: JobFilter) -> JobPage:
    after = decode_tick_cursor(query.cursor) if query.cursor else None
    placed = await services.store.list_jobs_by_next_tick(query.limit + 1, after, where)
    page, more = placed[: query.limit], len(placed) > query.limit
    cursor = encode_tick_cursor(page[-1][1]) if more else None
    return _page(services, [shown for shown, _ in page], cursor)


def _page(services: Services, shown: list[ShownJob], cursor: str | None) -> JobPage:
    now = services.now()
    items = [ListedJob.of(one.job, now, one.last_run) for one in shown]
    return JobPage(items=items, next_cursor=cursor)


@router.get("/{name}", operation_id="get_job", responses=SHOWN | READ | NOT_FOUND)
async def get(name: NamePath, services: ServicesDep, response: Response) -> JobOut:
    """One job, with its next tick and latest run."""
    shown = await services.store.show_job(name)
    if shown is None:
        raise NotFound(f"no job named {name!r}")
    response.headers["ETag"] = etag(shown.job)
    return JobOut.of(shown.job, services.now(), shown.last_run)


@router.patch(
    "/{name}",
    operation_id="patch_job",
    responses=SHOWN | WRITE | NOT_FOUND | PRECONDITION_FAILED,
    # RFC 7396's own media type, beside application/json (FastAPI parses any +json).
    openapi_extra={"requestBody": {"content": {MERGE_PATCH: {"schema": MERGE_PATCH_SCHEMA}}}},
)
async def patch(
    name: NamePath,
    services: ServicesDep,
    body: Annotated[dict[str, JsonValue], Body(**PATCH_DOC)],
    response: Response,
    if_match: IfMatch = None,
) -> JobOut:
    """Change some declared fields; null resets a field to its default. With `If-Match`,
    only if the job is as it was when read (412 otherwise)."""
    now = await services.store.clock()
    if "hooks" in body:
        await check_chains(services, {name: _hooks_or_none(body["hooks"])})

    def change(current: Job) -> Job:
        refuse_if_fired_by_app(current, "changed")
        spec = _with_kept_secrets(patched_spec(name, shown_spec(current), body), current)
        return _checked_job(services, replace_job(current, spec, now))

    job = await _apply(services, name, _existing(name, guarded(if_match, change)), now)
    return await _out(services, job, now, response)


@router.delete(
    "/{name}",
    status_code=status.HTTP_204_NO_CONTENT,
    operation_id="delete_job",
    responses=WRITE | NOT_FOUND | PRECONDITION_FAILED,
)
async def delete(
    name: NamePath, request: Request, services: ServicesDep, if_match: IfMatch = None
) -> None:
    """Delete the job and its run history; replicas stop firing it within moments. A
    run of it in flight is cancelled, as POST /v1/runs/{id}/cancel does, and its row
    kept until it has ended. The name is free for a new job at once. With `If-Match`,
    only if the job is as it was when read (412 otherwise)."""
    deleting = _existing(name, guarded(if_match, _deleted))
    await services.store.mutate_job(name, deleting, by=caller(request, None))
    services.runner.job_deleted(name)  # the scheduler's replicas hear of it by NOTIFY


@router.post(
    "/{name}/pause", operation_id="pause_job", responses=SHOWN | WRITE | NOT_FOUND | CONFLICT
)
async def pause(
    name: NamePath, services: ServicesDep, response: Response, body: PauseRequest | None = None
) -> JobOut:
    """Stop firing; `next_run_at` becomes null. An optional `note` is kept on the job."""
    now = await services.store.clock()
    note = body.note if body else None
    job = await _apply(services, name, _existing(name, lambda j: pause_job(j, now, note)), now)
    return await _out(services, job, now, response)


@router.post(
    "/{name}/resume", operation_id="resume_job", responses=SHOWN | WRITE | NOT_FOUND | CONFLICT
)
async def resume(name: NamePath, services: ServicesDep, response: Response) -> JobOut:
    """Fire again from the next tick after now; ticks missed while paused are not replayed."""
    now = await services.store.clock()
    job = await _apply(services, name, _existing(name, lambda j: resume_job(j, now)), now)
    return await _out(services, job, now, response)


async def _overdue(
    services: Services, where: JobFilter, after: str | None, limit: int
) -> list[ShownJob]:
    overdue = await overdue_jobs(services.store)
    jobs = [j for j in overdue if where.admits(j) and (after is None or j.name > after)][:limit]
    last_runs = await services.store.last_runs([job.name for job in jobs])
    return [ShownJob(job, last_runs.get(job.name)) for job in jobs]


def _with_kept_secrets(spec: JobSpec, current: Job | None) -> JobSpec:
    """Secret headers are answered as "***"; sent back so, they keep the stored value, so
    a body copied from a GET changes nothing (the args', and each http hook's)."""
    hooks = kept_secrets(spec.hooks, current.hooks if current is not None else [])
    if spec.task != "http":
        return spec if hooks == spec.hooks else spec.model_copy(update={"hooks": hooks})
    stored = current.args if current is not None and current.task == "http" else None
    kept = merge_secret_headers(spec.args, stored)
    if kept == spec.args and hooks == spec.hooks:
        return spec
    return spec.model_copy(update={"args": kept, "hooks": hooks})


def _hooks_or_none(value: JsonValue) -> list[Hook]:
    """A PATCH's hooks, parsed to look for cycles first (a bad one: none; the patch
    itself then says what is wrong)."""
    try:
        return HOOKS.validate_python(value if value is not None else [])
    except ValidationError:
        return []


def _checked(services: Services, spec: JobSpec) -> JobSpec:
    services.tasks.check_args(spec.task, spec.args)
    check_hooks(services.tasks, spec.hooks, ("body", "hooks"))
    return spec


def _checked_job(services: Services, job: Job) -> Job:
    _checked(services, job)
    return job


def _existing(name: str, change: Callable[[Job], Job | None]) -> JobChangeFn:
    """Wrap `change` so a missing job is a 404 instead of a create."""

    def guarded(current: Job | None) -> Job | None:
        if current is None:
            raise NotFound(f"no job named {name!r}")
        return change(current)

    return guarded


async def _apply(services: Services, name: str, change: JobChangeFn, now: datetime) -> Job:
    """Change the job; when it did change, file its new next tick."""
    result = await services.store.mutate_job(name, change)
    job = _after(result)
    if job != result.before:
        await file_next_tick(services, job, now)
    return job


async def file_next_tick(services: Services, job: Job, now: datetime) -> None:
    """Put a job created or changed here in its place of next-run order at once (the
    overdue check files every active job's tick only once per reconcile round)."""
    await services.store.file_next_ticks([(job, job.next_run_at(now))])


def _after(result: JobChange) -> Job:
    assert result.after is not None, "a change that keeps the job returned None"
    return result.after


async def existing_job(services: Services, name: str) -> Job:
    job = await services.store.get_job(name)
    if job is None:
        raise NotFound(f"no job named {name!r}")
    return job


def _deleted(_: Job) -> None:
    """The change that deletes a job."""


async def _out(services: Services, job: Job, now: datetime, response: Response) -> JobOut:
    """The job as answered, its ETag in `response`'s headers."""
    response.headers["ETag"] = etag(job)
    last_runs = await services.store.last_runs([job.name])
    return JobOut.of(job, now, last_runs.get(job.name))
