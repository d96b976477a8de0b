"""The CLI client repeats a few facts of the API (it imports nothing of the server):
held equal to the API's here, and its export form checked against the API's own models."""

import re
from datetime import UTC, datetime
from pathlib import Path

import pytest

from service.api.models import JobCreate, JobOut
from service.client.commands import COMMANDS, JOB_STATES, RUN_STATUSES
from service.client.export import (
    DECLARED_FIELDS,
    DEFAULTS,
    RETRY_DEFAULTS,
    SECRET_MASK,
    as_applied,
    essential,
    exported,
    job_diff,
)
from service.domain.jobs import JobSpec, JobState, create_job
from service.domain.retry import RetryPolicy
from service.domain.runs import RunStatus
from service.tasks.http import SECRET_MASK as API_SECRET_MASK

NOW = datetime(2026, 3, 1, 12, tzinfo=UTC)
# The labels of issue #15 may land before or after this client: tolerated either way.
NOT_YET = {"labels"}


def test_the_declared_fields_and_their_defaults_are_the_apis() -> None:
    declared = set(JobCreate.model_fields)
    assert declared <= set(DECLARED_FIELDS)
    assert set(DECLARED_FIELDS) - declared <= NOT_YET
    for name, field in JobSpec.model_fields.items():
        if field.is_required():
            assert name not in DEFAULTS
            continue
        default = field.get_default(call_default_factory=True)
        if isinstance(default, RetryPolicy):
            assert DEFAULTS[name] == {}
        else:
            assert DEFAULTS[name] == default, name
    assert RetryPolicy().model_dump() == RETRY_DEFAULTS
    assert SECRET_MASK == API_SECRET_MASK
    assert tuple(JobState) == JOB_STATES
    assert set(RUN_STATUSES) == set(RunStatus) - {RunStatus.SKIPPED}


DECLARED = [
    {"schedule": {"kind": "cron", "expression": "30  9 * * MON-FRI"}, "timezone": "Europe/Kyiv"},
    {"schedule": {"kind": "interval", "every_seconds": 90}, "retry": {"max_attempts": 3}},
    {
        "schedule": {"kind": "daily", "at": ["15:30", "03:00:15"]},
        "start_at": "2030-01-01T00:00:00+02:00",
        "max_runs": 3,
    },
    {"schedule": {"kind": "once", "at": "2031-01-01T09:00:00"}, "timezone": "Asia/Tokyo"},
]


@pytest.mark.parametrize("declared", DECLARED, ids=lambda d: d["schedule"]["kind"])
def test_the_export_of_a_shown_job_declares_it_again_and_diffs_as_declared(
    declared: dict[str, object],
) -> None:
    body = {"name": "j", "task": "log", "args": {"message": "m"}} | declared
    job = create_job("j", JobCreate.model_validate(body).spec(), NOW)
    shown = JobOut.of(job, NOW).model_dump(mode="json")

    again = JobCreate.model_validate(exported(shown))
    assert again.spec() == job.spec()
    assert essential(exported(shown)) == essential(as_applied(body, exported(shown), None))
    assert job_diff("j", exported(shown), as_applied(body, exported(shown), None), "f") == ""


def test_a_diff_masks_secret_values_on_both_sides() -> None:
    args = {"url": "https://example.com", "headers": {"Authorization": "Bearer s"}}
    declared = {"name": "h", "task": "http", "args": args | {"secret_headers": ["authorization"]}}
    diff = job_diff("h", None, declared, "file.yaml")
    assert "Bearer s" not in diff
    assert "Authorization: '***'" in diff


def test_docs_cli_shows_every_action_with_an_example() -> None:
    text = (Path(__file__).parents[2] / "docs" / "cli.md").read_text()
    examples = {m.group(1) for m in re.finditer(r"^(?:\$ )?tickgate jobs ([\w-]+)\b", text, re.M)}
    missing = [command.name for command in COMMANDS if command.name not in examples]
    assert missing == []
    assert "tickgate completion bash" in text
