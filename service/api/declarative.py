"""Jobs declared in a file (a Helm values list, a GitOps repo), applied at startup."""

import logging
from pathlib import Path
from typing import Any

import yaml
from pydantic import TypeAdapter, ValidationError

from service.api.bulk import apply_jobs
from service.api.deps import Services
from service.api.models import ApplyQuery
from service.config import ConfigurationError
from service.domain.errors import DomainError, InvalidInput
from service.jobfile import parse_document

log = logging.getLogger(__name__)
_ITEMS = TypeAdapter(list[dict[str, Any]])


class JobFileError(ConfigurationError):
    """The jobs file cannot be applied; the message says which job and why."""


def load_job_file(path: Path) -> list[dict[str, Any]]:
    """A YAML (or JSON) list of job objects, or a mapping with such a list under `jobs`."""
    try:
        document = parse_document(path.read_text())
    except (OSError, yaml.YAMLError) as error:
        raise JobFileError(f"cannot read jobs file {path}: {error}") from error
    if isinstance(document, dict):
        document = document.get("jobs")
    try:
        return _ITEMS.validate_python(document or [])
    except ValidationError as error:
        raise JobFileError(f"jobs file {path} is not a list of job objects:\n{error}") from error


async def apply_job_file(services: Services, path: Path) -> None:
    """Apply the file's jobs as one set, as PUT /v1/jobs does (without prune): every job
    is checked first, and either all are applied or none. Jobs not in it are left alone."""
    try:
        result = await apply_jobs(services, load_job_file(path), ApplyQuery())
    except InvalidInput as error:
        raise JobFileError(f"jobs file {path} is invalid:\n{_problems(error)}") from error
    except DomainError as error:
        raise JobFileError(f"jobs file {path}: {error}") from error
    for name, outcome in result.outcomes.items():
        log.info("jobs file: %s %s", name, outcome)


def _problems(error: InvalidInput) -> str:
    """One line per problem: where in the file (`jobs.<index>...`), what, and the value."""
    return "\n".join(
        f"  {'.'.join(map(str, problem.loc[1:]))}: {problem.msg} (input: {problem.input!r})"
        for problem in error.problems
    )
