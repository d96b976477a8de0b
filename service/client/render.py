"""What the CLI prints: rich tables on a terminal (plain text when piped), or JSON."""

import json
import sys
from collections.abc import Callable, Iterable
from datetime import UTC, datetime
from typing import Any, Final, TextIO

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from service.client.http import JsonObject

NONE: Final = "-"


class Output:
    """Where results go: a rich console on stdout, or one JSON document with --json."""

    def __init__(self, as_json: bool, stream: TextIO | None = None) -> None:
        self.as_json = as_json
        self.stream = stream or sys.stdout
        width = None if self.stream.isatty() else 200
        self.console = Console(file=self.stream, width=width, highlight=False)

    def document(self, document: object) -> None:
        json.dump(document, self.stream, indent=2)
        self.stream.write("\n")

    def line(self, text: str) -> None:
        self.console.print(Text(text))

    def table(self, table: Table) -> None:
        self.console.print(table)

    def text(self, text: str) -> None:
        """Verbatim (a diff, a YAML document): no markup, no wrapping."""
        self.stream.write(text)


def jobs_table(jobs: Iterable[JsonObject]) -> Table:
    table = new_table("name", "schedule", "timezone", "task", "state", "next_run_at", "last run")
    for job in jobs:
        last = job.get("last_run")
        table.add_row(
            cell(job.get("name")),
            Text(schedule_summary(job.get("schedule"))),
            cell(job.get("timezone")),
            cell(job.get("task")),
            cell(job.get("state")),
            Text(when(job.get("next_run_at"))),
            cell(last.get("status") if isinstance(last, dict) else None),
        )
    return table


def job_table(job: JsonObject) -> Table:
    table = new_table("field", "value", title=f"job {name_of(job)}", expand_last=True)
    rows: list[tuple[str, object]] = [
        ("name", job.get("name")),
        ("description", job.get("description") or None),
        ("schedule", schedule_summary(job.get("schedule"))),
        ("schedule (json)", job.get("schedule")),
        ("timezone", job.get("timezone")),
        ("task", job.get("task")),
        ("args", job.get("args")),
        ("state", job.get("state")),
        ("overlap", job.get("overlap")),
        ("timeout_seconds", job.get("timeout_seconds")),
        ("misfire_grace_seconds", job.get("misfire_grace_seconds")),
        ("lock_key", job.get("lock_key")),
        ("next_run_at", when(job.get("next_run_at"))),
        ("created_at", when(job.get("created_at"))),
        ("updated_at", when(job.get("updated_at"))),
        ("version", job.get("version")),
    ]
    for key, value in rows:
        table.add_row(Text(key), cell(value))
    return table


_RUN_FIELDS: Final = (
    "id",
    "job",
    "scheduled_for",
    "trigger",
    "status",
    "started_at",
    "finished_at",
    "duration_ms",
    "attempts",
    "runner",
    "error",
    "result",
)
_TIME_FIELDS: Final = frozenset({"scheduled_for", "started_at", "finished_at"})


def run_table(run: JsonObject, *, title: str) -> Table:
    table = new_table("field", "value", title=title, expand_last=True)
    for key in _RUN_FIELDS:
        value = run.get(key)
        table.add_row(Text(key), Text(when(value)) if key in _TIME_FIELDS else cell(value))
    attempts = run.get("attempt_times")
    if isinstance(attempts, list) and len(attempts) > 1:  # one attempt says nothing more
        for attempt in attempts:
            table.add_row(Text(f"attempt {attempt['attempt']}"), Text(attempt_line(attempt)))
    return table


def attempt_line(attempt: JsonObject) -> str:
    """`failed 2026-12-05T02:00:01Z → 2026-12-05T02:00:02Z: <error>`."""
    ended = when(attempt.get("ended_at")) if attempt.get("ended_at") else "?"
    error = f": {attempt['error']}" if attempt.get("error") else ""
    return f"{attempt['status']} {when(attempt.get('started_at'))} → {ended}{error}"


def runs_table(runs: Iterable[JsonObject], *, with_job: bool = False) -> Table:
    columns: tuple[str, ...] = (
        "id",
        "scheduled_for",
        "trigger",
        "status",
        "duration_ms",
        "runner",
        "error",
    )
    if with_job:
        columns = ("job", *columns)
    table = new_table(*columns)
    for run in runs:
        table.add_row(
            *(Text(when(run.get(c))) if c in _TIME_FIELDS else cell(run.get(c)) for c in columns)
        )
    return table


def schedule_summary(schedule: object) -> str:
    """`cron 0 3 * * *`, `every 300s`, `daily 03:00,15:30:15 every 1d`, `once <instant>`,
    `app <trigger>` (a job an app fires through the APScheduler gate)."""
    if not isinstance(schedule, dict):
        return cell_text(schedule)
    summary = _SUMMARIES.get(str(schedule.get("kind")))
    return summary(schedule) if summary else compact(schedule)


_SUMMARIES: dict[str, Callable[[dict[str, Any]], str]] = {
    "cron": lambda s: f"cron {s.get('expression')}",
    "interval": lambda s: f"every {s.get('every_seconds')}s",
    "daily": lambda s: f"daily {_wall_times(s.get('at'))} every {s.get('every_days', 1)}d",
    "once": lambda s: f"once {when(s.get('at'))}",
    "app": lambda s: f"app {s.get('trigger')}",
}


def _wall_times(times: object) -> str:
    if not isinstance(times, list):
        return cell_text(times)
    return ",".join(str(t).removesuffix(":00") if str(t).count(":") == 2 else str(t) for t in times)


def new_table(*columns: str, title: str | None = None, expand_last: bool = False) -> Table:
    table = Table(
        title=title, box=box.SIMPLE_HEAD, show_edge=False, title_justify="left", highlight=False
    )
    for index, column in enumerate(columns):
        last = expand_last and index == len(columns) - 1
        table.add_column(column, overflow="fold", no_wrap=not last)
    return table


def cell(value: object) -> Text:
    return Text(cell_text(value))


def cell_text(value: object) -> str:
    if value is None:
        return NONE
    if isinstance(value, str):
        return value
    return compact(value)


def when(value: object) -> str:
    """An ISO instant from the API, to the second, `Z` for UTC; anything else as is."""
    if not isinstance(value, str):
        return cell_text(value)
    try:
        instant = datetime.fromisoformat(value)
    except ValueError:
        return value
    if instant.tzinfo is not None and instant.utcoffset() == UTC.utcoffset(None):
        return instant.replace(microsecond=0, tzinfo=None).isoformat() + "Z"
    return instant.replace(microsecond=0).isoformat()


def compact(value: object) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def name_of(job: JsonObject) -> str:
    return str(job.get("name"))
