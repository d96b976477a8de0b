"""PUT /v1/jobs: a whole set of jobs applied in one transaction, for GitOps."""

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from functools import partial
from typing import Annotated, Any, TypeVar

from fastapi import APIRouter, Query, Request
from pydantic import ValidationError

from service.api.deps import Services, ServicesDep
from service.api.errors import CONFLICT, WRITE
from service.api.guards import caller
from service.api.hook_rules import check_chains
from service.api.jobs import declared_job
from service.api.models import (
    ApplyOutcome,
    ApplyQuery,
    ApplyResult,
    JobCreate,
    JobsApply,
    selected_labels,
)
from service.domain.errors import InvalidInput
from service.domain.jobs import Job
from service.domain.runs import DELETED_BY_TICKGATE
from service.store import JobsApplied, Prune

router = APIRouter(prefix="/v1/jobs", tags=["jobs"])
# Its bodies may be far larger than other requests' (TICKGATE_MAX_BULK_BODY_BYTES).
APPLY_ROUTE = ("PUT", "/v1/jobs")

Item = Mapping[str, Any]
R = TypeVar("R")


@router.put("", operation_id="apply_jobs", responses=WRITE | CONFLICT)
async def apply_set(
    body: JobsApply,
    query: Annotated[ApplyQuery, Query()],
    request: Request,
    services: ServicesDep,
) -> ApplyResult:
    """Create or replace every job of the set, and with `prune` delete the manager's jobs
    it does not name, in one transaction. Every job is checked first: a bad one is a 422
    naming each bad job by index and name, and nothing changes. An unchanged job keeps
    its version. With `dry_run`, the same answer, and nothing changes."""
    return await apply_jobs(services, body.jobs, query, by=caller(request, None))


async def apply_jobs(
    services: Services,
    items: Sequence[Item],
    scope: ApplyQuery,
    *,
    by: str = DELETED_BY_TICKGATE,
) -> ApplyResult:
    """Shared by PUT /v1/jobs and the jobs file applied at startup; `by`: who asks (the
    runs in flight of the jobs it prunes are cancelled in their name)."""
    prune = _prune(scope)
    twice = _repeated_names(items)
    parsed = [
        _attempt(index, _name_of(item), partial(_parsed, item, scope.managed_by, twice))
        for index, item in enumerate(items)
    ]
    declared = [job for job in parsed if isinstance(job, JobCreate)]
    await check_chains(services, {job.name: job.hooks for job in declared})
    now = await services.store.clock()

    def plan(stored: Mapping[str, Job]) -> list[Job]:
        """Every job as declared; the problems of the whole set, parsed or planned, as
        one InvalidInput (so some depend on what is stored, e.g. a past one-time job)."""
        return _all_or_problems(
            [
                _attempt(index, job.name, partial(_declared_job, services, job, stored, now))
                if isinstance(job, JobCreate)
                else job
                for index, job in enumerate(parsed)
            ]
        )

    names = [job.name for job in declared]
    applied = await services.store.apply_jobs(names, plan, prune, dry_run=scope.dry_run, by=by)
    return _result(applied, names)


def _result(applied: JobsApplied, names: Sequence[str]) -> ApplyResult:
    """Counts, and the outcomes in the set's order, then the deleted jobs."""
    kinds: dict[str, ApplyOutcome] = dict.fromkeys(applied.created, "created")
    kinds |= dict.fromkeys(applied.updated, "updated")
    kinds |= dict.fromkeys(applied.unchanged, "unchanged")
    outcomes = {name: kinds[name] for name in names} | dict.fromkeys(applied.deleted, "deleted")
    return ApplyResult(
        created=len(applied.created),
        updated=len(applied.updated),
        unchanged=len(applied.unchanged),
        deleted=len(applied.deleted),
        outcomes=outcomes,
    )


def _prune(scope: ApplyQuery) -> Prune | None:
    """Pruning with neither a manager nor a label would delete every job the set does
    not name, whoever made it: refused."""
    labels = selected_labels(scope.label)
    if not scope.prune:
        return None
    if scope.managed_by is None and not labels:
        raise InvalidInput.one(
            ("query", "prune"),
            "prune needs managed_by or a label: only the jobs in that scope may be deleted",
            True,
        )
    return Prune(scope.managed_by, labels)


def _declared_job(
    services: Services, job: JobCreate, stored: Mapping[str, Job], now: datetime
) -> Job:
    return declared_job(services, job.name, job.spec(), stored.get(job.name), now)


def _parsed(item: Item, managed_by: str | None, twice: set[str]) -> JobCreate:
    try:
        job = JobCreate.model_validate(item)
    except ValidationError as error:
        raise InvalidInput.from_validation(error, ("body",)) from error
    if job.name in twice:
        raise InvalidInput.one(
            ("body", "name"), "more than one job of the set has this name", job.name
        )
    if managed_by is None or job.managed_by == managed_by:
        return job
    if job.managed_by is not None:
        raise InvalidInput.one(
            ("body", "managed_by"),
            f"differs from the request's managed_by {managed_by!r}",
            job.managed_by,
        )
    return job.model_copy(update={"managed_by": managed_by})


def _repeated_names(items: Sequence[Item]) -> set[str]:
    seen: set[str] = set()
    twice: set[str] = set()
    for name in filter(None, map(_name_of, items)):
        (twice if name in seen else seen).add(name)
    return twice


def _name_of(item: Item) -> str | None:
    name = item.get("name")
    return name if isinstance(name, str) else None


def _attempt(index: int, name: str | None, make: Callable[[], R]) -> R | InvalidInput:
    """What `make` makes, or its problems, each at `body.jobs.<index>` and headed by the
    job's name."""
    try:
        return make()
    except InvalidInput as error:
        return error.within(("body", "jobs", index), f"job {name!r}" if name else None)


def _all_or_problems(results: Sequence[R | InvalidInput]) -> list[R]:
    problems = [result for result in results if isinstance(result, InvalidInput)]
    if problems:
        raise InvalidInput.joined(problems)
    return [result for result in results if not isinstance(result, InvalidInput)]
