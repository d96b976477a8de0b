"""Jobs declared in a file (a Helm values list, a GitOps repo), applied at startup."""

import logging
from pathlib import Path

import yaml
from pydantic import TypeAdapter, ValidationError

from service.api.deps import Services
from service.api.jobs import upsert_job
from service.api.models import JobCreate
from service.config import ConfigurationError
from service.domain.errors import DomainError
from service.jobfile import parse_document
from service.store import JobChange

log = logging.getLogger(__name__)
_JOB_LIST = TypeAdapter(list[JobCreate])


class JobFileError(ConfigurationError):
    """The jobs file cannot be applied; the message says which job and why."""


def load_job_file(path: Path) -> list[JobCreate]:
    """A YAML (or JSON) list of job objects, or a mapping with such a list under `jobs`."""
    try:
        document = parse_document(path.read_text())
    except (OSError, yaml.YAMLError) as error:
        raise JobFileError(f"cannot read jobs file {path}: {error}") from error
    if isinstance(document, dict):
        document = document.get("jobs")
    try:
        return _JOB_LIST.validate_python(document or [])
    except ValidationError as error:
        raise JobFileError(f"jobs file {path} is invalid:\n{error}") from error


async def apply_job_file(services: Services, path: Path) -> None:
    """Upsert every job in the file through the same code as PUT /v1/jobs/{name}.
    Jobs not in the file are left alone."""
    for job in load_job_file(path):
        try:
            change = await upsert_job(services, job.name, job.spec())
        except DomainError as error:
            raise JobFileError(f"job {job.name!r} in {path}: {error}") from error
        log.info("jobs file: %s %s", job.name, _outcome(change))


def _outcome(change: JobChange) -> str:
    if change.created:
        return "created"
    return "unchanged" if change.before == change.after else "updated"
