"""SharedParts keeps one copy of equal job parts; every schedule kind must pass through it
(a daily schedule holds a list, which cannot be hashed)."""

from datetime import UTC, datetime

from service.domain.jobs import JobSpec, create_job
from service.store.rows import SharedParts

NOW = datetime(2026, 1, 1, tzinfo=UTC)


def row_of(name: str, schedule: dict[str, object]) -> dict[str, str]:
    spec = JobSpec.model_validate({"schedule": schedule, "task": "log", "args": {"message": "m"}})
    return {"job": create_job(name, spec, NOW).model_dump_json()}


def test_every_schedule_kind_is_shared_and_equal_ones_once() -> None:
    shared = SharedParts()
    daily = {"kind": "daily", "at": ["03:00", "04:00"]}
    first, second = (shared.job_from_row(row_of(n, daily)) for n in ("a", "b"))
    assert first.schedule is second.schedule
    for schedule in (
        {"kind": "cron", "expression": "* * * * *"},
        {"kind": "interval", "every_seconds": 5},
        {"kind": "once", "at": "2030-01-01T00:00:00Z"},
    ):
        assert shared.job_from_row(row_of("c", schedule)).schedule.kind == schedule["kind"]
