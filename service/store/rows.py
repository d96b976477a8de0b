"""Rows become frozen domain objects the moment they leave the database."""

from collections.abc import Mapping
from typing import Any

from service.domain.jobs import Job


def job_from_row(row: Mapping[str, Any]) -> Job:
    return Job.model_validate(dict(row))
