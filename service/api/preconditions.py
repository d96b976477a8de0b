"""Optimistic concurrency on jobs (RFC 9110): every answer carrying a job has an `ETag`
made from its revision, and PUT, PATCH and DELETE honour `If-Match`, checked on the
row-locked job inside the change's own transaction, so no write slips in between."""

from collections.abc import Callable
from typing import Annotated, TypeVar

from fastapi import Header

from service.domain.errors import PreconditionFailed
from service.domain.jobs import Job

IfMatch = Annotated[
    str | None,
    Header(
        description="Change the job only if its current `ETag` is one of these "
        "(comma-separated), or with `*` only if it exists; else 412 and nothing changes.",
    ),
]
Current = TypeVar("Current", Job, Job | None)
ETAG_DOC = {
    "ETag": {
        "description": "The job's revision: send it back in `If-Match` to change the job "
        "only if nobody changed it since. Its `version` and its incarnation (a name "
        "deleted and made anew never repeats one).",
        "schema": {"type": "string"},
    }
}


def etag(job: Job) -> str:
    return f'"{job.version}-{job.incarnation.hex}"'


def guarded(
    if_match: str | None, change: Callable[[Current], Job | None]
) -> Callable[[Current], Job | None]:
    """`change`, run only if the job as locked now meets `if_match`: a change of any job
    (PUT) or of an existing one (PATCH and DELETE, whose 404 comes first)."""
    if if_match is None:
        return change

    def checked(current: Current) -> Job | None:
        if not _matches(if_match, current):
            shown = etag(current) if current is not None else "none: no such job"
            raise PreconditionFailed(f"If-Match {if_match} does not match the ETag {shown}")
        return change(current)

    return checked


def _matches(if_match: str, current: Job | None) -> bool:
    """Strong comparison, as If-Match demands: a weak tag (W/"...") never matches."""
    if current is None:
        return False
    tags = {tag.strip() for tag in if_match.split(",")}
    return "*" in tags or etag(current) in tags
