"""`tickgate jobs ...`: manage the jobs of a running Tickgate server through its REST API.

Tables go to stdout (rich; plain text when stdout is not a terminal), `--json` prints the
API's JSON instead. Errors go to stderr without a traceback. Exit codes: 0 done, 1 the API
refused (4xx/5xx), 2 bad usage or a bad input file, 3 the server could not be reached.
"""

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Final, TextIO, TypeAlias

import yaml
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from service.client.http import (
    DEFAULT_URL,
    ApiError,
    JobFilter,
    JsonObject,
    Problem,
    TickgateClient,
    Unreachable,
)
from service.jobfile import parse_document

URL_ENV: Final = "TICKGATE_URL"
# The bearer token comes from the environment only: a --token flag would leak it into
# shell history and `ps`.
TOKEN_ENV: Final = "TICKGATE_TOKEN"  # noqa: S105 - the name of a variable, not a secret
EXIT_API: Final = 1
EXIT_USAGE: Final = 2
EXIT_UNREACHABLE: Final = 3
EXIT_BROKEN_PIPE: Final = 141  # 128 + SIGPIPE, what a shell reports for `yes | head`
DEFAULT_TIMEOUT_SECONDS: Final = 10.0
DEFAULT_RUNS: Final = 20
# The API's enums (service.domain JobState / RunStatus), repeated so that the client stays
# a pure HTTP client that imports nothing of the server.
JOB_STATES: Final = ("active", "paused", "completed")
RUN_STATUSES: Final = ("running", "succeeded", "failed", "timed_out", "cancelled", "abandoned")
APPLY_OUTCOMES: Final = ("created", "updated", "unchanged", "deleted")
NONE: Final = "-"
_INPUT_PREVIEW: Final = 200

# A string: argparse._SubParsersAction is not subscriptable at run time before 3.12 or so.
SubParsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
Handler = Callable[[object, argparse.Namespace], None]


class UsageError(Exception):
    """Bad input found before anything was sent (exit 2)."""


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


@dataclass(frozen=True)
class Context:
    """What every action gets: the client, the output and the parsed arguments."""

    client: TickgateClient
    out: Output
    args: argparse.Namespace


Action = Callable[[Context], None]


# Wiring


def add_jobs_command(commands: SubParsers) -> None:
    """Register `jobs` and its actions; each sets `command=handler(settings, args)`."""
    common = _common_options()
    jobs = commands.add_parser(
        "jobs",
        parents=[common],
        help="manage the jobs of a running Tickgate server",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    actions = jobs.add_subparsers(required=True, metavar="ACTION")
    for register in _REGISTRARS:
        register(actions, common)


def main(argv: list[str] | None = None) -> None:
    """`tickgate jobs ...` on its own (the main CLI registers the same command)."""
    parser = argparse.ArgumentParser(prog="tickgate")
    add_jobs_command(parser.add_subparsers(required=True, metavar="COMMAND"))
    args = parser.parse_args(argv)
    args.command(None, args)


def _common_options() -> argparse.ArgumentParser:
    """--url, --json and --timeout, accepted both before and after the action.

    SUPPRESS keeps an option given before the action from being reset by the action's
    own (absent) copy of it.
    """
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--url",
        default=argparse.SUPPRESS,
        help=f"the server's base URL (default: ${URL_ENV} or {DEFAULT_URL})",
    )
    common.add_argument(
        "--json",
        action="store_true",
        default=argparse.SUPPRESS,
        help="print the API's JSON instead of a table",
    )
    common.add_argument(
        "--timeout",
        type=_positive_float,
        default=argparse.SUPPRESS,
        metavar="SECONDS",
        help=f"per-request timeout (default: {DEFAULT_TIMEOUT_SECONDS:g})",
    )
    return common


def _action(
    actions: SubParsers, common: argparse.ArgumentParser, name: str, action: Action, summary: str
) -> argparse.ArgumentParser:
    parser = actions.add_parser(name, parents=[common], help=summary, description=summary)
    parser.set_defaults(command=_handler(action))
    return parser


def _add_list(actions: SubParsers, common: argparse.ArgumentParser) -> None:
    parser = _action(actions, common, "list", _list, "list jobs in name order")
    parser.add_argument("--state", choices=JOB_STATES)
    parser.add_argument("--task", help="only jobs running this task")
    parser.add_argument("--prefix", help="only jobs whose name starts so")
    parser.add_argument(
        "--limit", type=_positive_int, help="at most this many jobs (default: all, page by page)"
    )


def _add_get(actions: SubParsers, common: argparse.ArgumentParser) -> None:
    _named(_action(actions, common, "get", _get, "show one job and its last run"))


def _add_create(actions: SubParsers, common: argparse.ArgumentParser) -> None:
    parser = _action(actions, common, "create", _create, "create one job (409 if it exists)")
    _file_option(parser, "a YAML or JSON job object with its name")


def _add_apply(actions: SubParsers, common: argparse.ArgumentParser) -> None:
    parser = _action(
        actions,
        common,
        "apply",
        _apply,
        "create or replace jobs declaratively, as one set in one transaction (PUT /v1/jobs); "
        "with --prune, also delete the manager's jobs the set does not name",
    )
    _file_option(parser, 'YAML or JSON: a list of job objects, or {"jobs": [...]}')
    parser.add_argument(
        "--managed-by",
        metavar="MANAGER",
        help="the set's manager (e.g. argocd/billing), set on each of its jobs",
    )
    parser.add_argument(
        "--prune",
        action="store_true",
        help="delete the active and paused jobs of --managed-by that the file does not name",
    )


def _add_delete(actions: SubParsers, common: argparse.ArgumentParser) -> None:
    _named(_action(actions, common, "delete", _delete, "delete a job"))


def _add_pause(actions: SubParsers, common: argparse.ArgumentParser) -> None:
    _named(_action(actions, common, "pause", _pause, "stop a job firing"))


def _add_resume(actions: SubParsers, common: argparse.ArgumentParser) -> None:
    _named(_action(actions, common, "resume", _resume, "fire a paused job again"))


def _add_trigger(actions: SubParsers, common: argparse.ArgumentParser) -> None:
    _named(_action(actions, common, "trigger", _trigger, "run a job now; prints the run"))


def _add_runs(actions: SubParsers, common: argparse.ArgumentParser) -> None:
    summary = "a job's runs, newest first; without NAME, every job's"
    parser = _action(actions, common, "runs", _runs, summary)
    parser.add_argument("name", metavar="NAME", nargs="?", help="the job's name")
    parser.add_argument("--status", choices=RUN_STATUSES)
    parser.add_argument(
        "--limit",
        type=_positive_int,
        default=DEFAULT_RUNS,
        help=f"at most this many runs (default: {DEFAULT_RUNS})",
    )


_REGISTRARS: Final = (
    _add_list,
    _add_get,
    _add_create,
    _add_apply,
    _add_delete,
    _add_pause,
    _add_resume,
    _add_trigger,
    _add_runs,
)


def _named(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    parser.add_argument("name", metavar="NAME", help="the job's name")
    return parser


def _file_option(parser: argparse.ArgumentParser, what: str) -> None:
    parser.add_argument(
        "-f", "--file", required=True, metavar="FILE", help=f"{what}; - reads stdin"
    )


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a whole number: {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1: {value}")
    return value


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be more than 0: {text}")
    return value


# Running an action: client, output, errors and exit codes


def _handler(action: Action) -> Handler:
    def handle(_settings: object, args: argparse.Namespace) -> None:
        try:
            _run(action, args)
        except UsageError as error:
            _fail(EXIT_USAGE, [str(error)])
        except Unreachable as error:
            _fail(EXIT_UNREACHABLE, [f"{error} (is it running? set --url or ${URL_ENV})"])
        except ApiError as error:
            _fail(EXIT_API, describe_api_error(error))
        except KeyboardInterrupt:
            _fail(130, ["interrupted"])
        except BrokenPipeError:
            _quiet_broken_pipe()

    return handle


def _run(action: Action, args: argparse.Namespace) -> None:
    _quiet_request_logs()
    timeout = float(getattr(args, "timeout", DEFAULT_TIMEOUT_SECONDS))
    token = os.environ.get(TOKEN_ENV) or None
    with TickgateClient(server_url(args), timeout=timeout, token=token) as client:
        action(Context(client, Output(bool(getattr(args, "json", False))), args))


def _quiet_request_logs() -> None:
    """httpx logs every request at INFO; the main CLI's logging setup would print them."""
    for name in ("httpx", "httpcore"):
        logger = logging.getLogger(name)
        if logger.level == logging.NOTSET:
            logger.setLevel(logging.WARNING)


def server_url(args: argparse.Namespace) -> str:
    """--url, else $TICKGATE_URL, else the default; an http(s) URL or a UsageError."""
    url = str(getattr(args, "url", None) or os.environ.get(URL_ENV) or DEFAULT_URL).strip()
    if not url.startswith(("http://", "https://")) or url in {"http://", "https://"}:
        raise UsageError(f"not an http(s) URL: {url!r} (from --url or ${URL_ENV})")
    return url.rstrip("/")


def _quiet_broken_pipe() -> None:
    """stdout's reader left (`| head`): stop quietly, as a process killed by SIGPIPE would."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())  # the interpreter's final flush must not fail again
    raise SystemExit(EXIT_BROKEN_PIPE)


def _fail(code: int, lines: Sequence[str]) -> None:
    first, *rest = lines
    sys.stderr.write("".join(f"{line}\n" for line in (f"error: {first}", *rest)))
    raise SystemExit(code)


def describe_api_error(error: ApiError) -> list[str]:
    """Lines for stderr: the detail of a 404/409, each problem of a 422."""
    if error.problems:
        header = f"the server rejected the request (HTTP {error.status}):"
        return [header, *(f"  {describe_problem(problem)}" for problem in error.problems)]
    detail = error.detail if isinstance(error.detail, str) else _compact(error.detail)
    if error.status == 404 and detail.startswith("no "):
        return [detail]
    if error.status == 409:
        return [f"conflict: {detail}"]
    return [f"HTTP {error.status} from {error.method} {error.url}: {detail}"]


def describe_problem(problem: Problem) -> str:
    """`loc: msg (input: value)`, the value as JSON, shortened."""
    loc = ".".join(problem.loc) or "request"
    if not problem.has_input:
        return f"{loc}: {problem.msg}"
    value = _compact(problem.input)
    if len(value) > _INPUT_PREVIEW:
        value = value[: _INPUT_PREVIEW - 3] + "..."
    return f"{loc}: {problem.msg} (input: {value})"


# Actions


def _list(ctx: Context) -> None:
    args = ctx.args
    where = JobFilter(args.state, args.task, args.prefix)
    page = ctx.client.all_jobs(where, limit=args.limit)
    if ctx.out.as_json:
        ctx.out.document(page.document())
        return
    if not page.items:
        ctx.out.line("no jobs")
        return
    ctx.out.table(jobs_table(page.items))
    if page.next_cursor is not None:
        ctx.out.line(f"(first {len(page.items)} jobs shown; raise --limit for more)")


def _get(ctx: Context) -> None:
    job = ctx.client.get_job(ctx.args.name)
    if ctx.out.as_json:
        ctx.out.document(job)
        return
    ctx.out.table(job_table(job))
    last = job.get("last_run")
    if isinstance(last, dict):
        ctx.out.table(run_table(last, title="last run"))
    else:
        ctx.out.line("last run: none")


def _create(ctx: Context) -> None:
    body = single_job(load_document(ctx.args.file), ctx.args.file)
    job = ctx.client.create_job(body)
    if ctx.out.as_json:
        ctx.out.document(job)
        return
    ctx.out.line(f"created job {_name(job)!r} (next run {_when(job.get('next_run_at'))})")


def _apply(ctx: Context) -> None:
    args = ctx.args
    if args.prune and not args.managed_by:
        raise UsageError("--prune needs --managed-by: only that manager's jobs are deleted")
    jobs = job_list(load_document(args.file), args.file)
    result = ctx.client.apply_jobs(jobs, managed_by=args.managed_by, prune=args.prune)
    if ctx.out.as_json:
        ctx.out.document(result)
        return
    outcomes = result.get("outcomes")
    if isinstance(outcomes, dict):
        for name, outcome in outcomes.items():
            ctx.out.line(f"{name}: {outcome}")
    ctx.out.line(", ".join(f"{result.get(kind)} {kind}" for kind in APPLY_OUTCOMES))


def _delete(ctx: Context) -> None:
    ctx.client.delete_job(ctx.args.name)
    if ctx.out.as_json:
        ctx.out.document({"name": ctx.args.name, "deleted": True})
    else:
        ctx.out.line(f"deleted job {ctx.args.name!r}")


def _pause(ctx: Context) -> None:
    _show_state(ctx, ctx.client.pause_job(ctx.args.name))


def _resume(ctx: Context) -> None:
    _show_state(ctx, ctx.client.resume_job(ctx.args.name))


def _show_state(ctx: Context, job: JsonObject) -> None:
    if ctx.out.as_json:
        ctx.out.document(job)
        return
    state, when = _cell_text(job.get("state")), _when(job.get("next_run_at"))
    ctx.out.line(f"job {_name(job)!r}: state {state}, next run {when}")


def _trigger(ctx: Context) -> None:
    run = ctx.client.trigger_job(ctx.args.name)
    if ctx.out.as_json:
        ctx.out.document(run)
        return
    ctx.out.line(f"triggered job {ctx.args.name!r}: run {_cell_text(run.get('id'))}")
    ctx.out.table(run_table(run, title="run"))


def _runs(ctx: Context) -> None:
    page = ctx.client.recent_runs(ctx.args.name, status=ctx.args.status, limit=ctx.args.limit)
    if ctx.out.as_json:
        ctx.out.document(page.document())
        return
    every_job = ctx.args.name is None
    if not page.items:
        ctx.out.line("no runs" if every_job else f"no runs of job {ctx.args.name!r}")
        return
    ctx.out.table(runs_table(page.items, with_job=every_job))
    if page.next_cursor is not None:
        ctx.out.line(f"(newest {len(page.items)} runs shown; raise --limit for more)")


# Input files


def load_document(source: str) -> object:
    """The JSON or YAML document in the file `source` (`-`: stdin); UsageError if bad."""
    text = _read(source)
    try:
        document: object = json.loads(text)
    except ValueError:
        document = _yaml(text, source)
    try:
        json.dumps(document, allow_nan=False)
    except (TypeError, ValueError) as error:
        raise UsageError(f"{_label(source)}: not representable as JSON: {error}") from None
    return document


def _read(source: str) -> str:
    if source == "-":
        return sys.stdin.read()
    try:
        return Path(source).read_text(encoding="utf-8")
    except OSError as error:
        raise UsageError(f"cannot read {source}: {error.strerror or error}") from None
    except UnicodeDecodeError as error:
        raise UsageError(f"cannot read {source}: not UTF-8 ({error.reason})") from None


def _yaml(text: str, source: str) -> object:
    try:
        document = parse_document(text)
    except yaml.YAMLError as error:
        raise UsageError(f"{_label(source)}: not valid YAML or JSON: {error}") from None
    return document


def single_job(document: object, source: str) -> JsonObject:
    """The one job object `create` takes."""
    if not isinstance(document, dict):
        raise UsageError(f"{_label(source)}: expected one job object (a mapping)")
    return _job_object(document, _label(source))


def job_list(document: object, source: str) -> list[JsonObject]:
    """The jobs `apply` takes: a list, `{"jobs": [...]}`, or a single job object."""
    label = _label(source)
    if isinstance(document, dict) and "jobs" in document and "name" not in document:
        document = document["jobs"]
    elif isinstance(document, dict):
        document = [document]
    if not isinstance(document, list):
        raise UsageError(f'{label}: expected a list of job objects or {{"jobs": [...]}}')
    jobs = [_job_object(item, f"{label}: job #{index + 1}") for index, item in enumerate(document)]
    _no_duplicates([_name(job) for job in jobs], label)
    return jobs


def _job_object(item: object, where: str) -> JsonObject:
    if not isinstance(item, dict):
        raise UsageError(f"{where}: a job must be a mapping, not {_json_kind(item)}")
    name = item.get("name")
    if not isinstance(name, str) or not name:
        raise UsageError(f"{where}: a job needs a `name` string")
    return {str(key): value for key, value in item.items()}


def _no_duplicates(names: Iterable[str], label: str) -> None:
    seen: set[str] = set()
    for name in names:
        if name in seen:
            raise UsageError(f"{label}: job {name!r} appears more than once")
        seen.add(name)


def _label(source: str) -> str:
    return "<stdin>" if source == "-" else source


def _json_kind(value: object) -> str:
    kinds = {list: "a list", str: "a string", bool: "a boolean", int: "a number"}
    return next((kind for cls, kind in kinds.items() if isinstance(value, cls)), "a value")


# Rendering


def jobs_table(jobs: Iterable[JsonObject]) -> Table:
    table = _table("name", "schedule", "timezone", "task", "state", "next_run_at", "last run")
    for job in jobs:
        last = job.get("last_run")
        table.add_row(
            _cell(job.get("name")),
            Text(schedule_summary(job.get("schedule"))),
            _cell(job.get("timezone")),
            _cell(job.get("task")),
            _cell(job.get("state")),
            Text(_when(job.get("next_run_at"))),
            _cell(last.get("status") if isinstance(last, dict) else None),
        )
    return table


def job_table(job: JsonObject) -> Table:
    table = _table("field", "value", title=f"job {_name(job)}", expand_last=True)
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
        ("next_run_at", _when(job.get("next_run_at"))),
        ("created_at", _when(job.get("created_at"))),
        ("updated_at", _when(job.get("updated_at"))),
        ("version", job.get("version")),
    ]
    for key, value in rows:
        table.add_row(Text(key), _cell(value))
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
    table = _table("field", "value", title=title, expand_last=True)
    for key in _RUN_FIELDS:
        value = run.get(key)
        table.add_row(Text(key), Text(_when(value)) if key in _TIME_FIELDS else _cell(value))
    return table


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
    table = _table(*columns)
    for run in runs:
        table.add_row(
            *(Text(_when(run.get(c))) if c in _TIME_FIELDS else _cell(run.get(c)) for c in columns)
        )
    return table


def schedule_summary(schedule: object) -> str:
    """`cron 0 3 * * *`, `every 300s`, `daily 03:00,15:30:15 every 1d`, `once <instant>`."""
    if not isinstance(schedule, dict):
        return _cell_text(schedule)
    kind = schedule.get("kind")
    if kind == "cron":
        return f"cron {schedule.get('expression')}"
    if kind == "interval":
        return f"every {schedule.get('every_seconds')}s"
    if kind == "daily":
        return f"daily {_wall_times(schedule.get('at'))} every {schedule.get('every_days', 1)}d"
    if kind == "once":
        return f"once {_when(schedule.get('at'))}"
    return _compact(schedule)


def _wall_times(times: object) -> str:
    if not isinstance(times, list):
        return _cell_text(times)
    return ",".join(str(t).removesuffix(":00") if str(t).count(":") == 2 else str(t) for t in times)


def _table(*columns: str, title: str | None = None, expand_last: bool = False) -> Table:
    table = Table(
        title=title, box=box.SIMPLE_HEAD, show_edge=False, title_justify="left", highlight=False
    )
    for index, column in enumerate(columns):
        last = expand_last and index == len(columns) - 1
        table.add_column(column, overflow="fold", no_wrap=not last)
    return table


def _cell(value: object) -> Text:
    return Text(_cell_text(value))


def _cell_text(value: object) -> str:
    if value is None:
        return NONE
    if isinstance(value, str):
        return value
    return _compact(value)


def _when(value: object) -> str:
    """An ISO instant from the API, to the second, `Z` for UTC; anything else as is."""
    if not isinstance(value, str):
        return _cell_text(value)
    try:
        instant = datetime.fromisoformat(value)
    except ValueError:
        return value
    if instant.tzinfo is not None and instant.utcoffset() == UTC.utcoffset(None):
        return instant.replace(microsecond=0, tzinfo=None).isoformat() + "Z"
    return instant.replace(microsecond=0).isoformat()


def _compact(value: object) -> str:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False)


def _name(job: JsonObject) -> str:
    return str(job.get("name"))
