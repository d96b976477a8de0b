"""`tickgate jobs ...`: manage the jobs of a running Tickgate server through its REST API.

Tables go to stdout (rich; plain text when stdout is not a terminal), `--json` prints the
API's JSON instead. Errors go to stderr without a traceback. Exit codes: 0 done, 1 the API
refused (4xx/5xx), 2 bad usage or a bad input file, 3 the server could not be reached.
"""

import argparse
import getpass
import logging
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from functools import partial
from pathlib import Path
from typing import Any, Final, TypeAlias
from zoneinfo import ZoneInfo

from service.client.completion import complete_if_asked
from service.client.export import (
    as_applied,
    export_text,
    exported,
    job_diff,
    masked_secrets,
)
from service.client.http import (
    DEFAULT_URL,
    MAX_PAGE,
    ApiError,
    ClientError,
    JobFilter,
    JsonObject,
    Page,
    Problem,
    TickgateClient,
    Unreachable,
)
from service.client.inputs import (
    UsageError,
    inline_mapping,
    job_list,
    load_document,
    patch_document,
    single_job,
)
from service.client.render import (
    Output,
    cell_text,
    compact,
    job_table,
    jobs_table,
    name_of,
    new_table,
    run_table,
    runs_table,
    schedule_summary,
    when,
)

__all__ = ["UsageError", "job_list", "load_document", "schedule_summary", "single_job"]

URL_ENV: Final = "TICKGATE_URL"
# The bearer token comes from the environment only: a --token flag would leak it into
# shell history and `ps`.
TOKEN_ENV: Final = "TICKGATE_TOKEN"  # noqa: S105 - the name of a variable, not a secret
EXIT_API: Final = 1
EXIT_USAGE: Final = 2
EXIT_UNREACHABLE: Final = 3
EXIT_BROKEN_PIPE: Final = 141  # 128 + SIGPIPE, what a shell reports for `yes | head`
DEFAULT_TIMEOUT_SECONDS: Final = 10.0
# Completing a job name asks the server; a shell must not hang on a slow one.
COMPLETION_TIMEOUT_SECONDS: Final = 2.0
DEFAULT_RUNS: Final = 20
DEFAULT_PREVIEW: Final = 10
MAX_PREVIEW: Final = 100  # the API's largest `count`
# The API's enums (service.domain JobState / RunStatus), repeated so that the client stays
# a pure HTTP client that imports nothing of the server.
JOB_STATES: Final = ("active", "paused", "completed")
RUN_STATUSES: Final = ("running", "succeeded", "failed", "timed_out", "cancelled", "abandoned")
APPLY_OUTCOMES: Final = ("created", "updated", "unchanged", "deleted")
EXPORT_FORMATS: Final = ("yaml", "json")
_INPUT_PREVIEW: Final = 200
_GETS_BEFORE_LISTING: Final = 20  # `apply --diff`: past this many jobs, list them all
_ENUM_SHOWN: Final = 60  # longer lists of values read as `enum` in `tasks`

# A string: argparse._SubParsersAction is not subscriptable at run time before 3.12 or so.
SubParsers: TypeAlias = "argparse._SubParsersAction[argparse.ArgumentParser]"
Handler = Callable[[object, argparse.Namespace], None]
Render = Callable[[Output], None]


@dataclass(frozen=True)
class Context:
    """What every action gets: the client, the output and the parsed arguments."""

    client: TickgateClient
    out: Output
    args: argparse.Namespace

    def show(self, document: object, render: Render) -> None:
        """The one place where --json is decided: the API's document, or `render`."""
        if self.out.as_json:
            self.out.document(document)
        else:
            render(self.out)


Action = Callable[[Context], None]
Completer = Callable[..., list[str]]


@dataclass(frozen=True)
class Arg:
    """One `add_argument` of a command, with argcomplete's completer for its values."""

    flags: tuple[str, ...]
    options: Mapping[str, Any]
    completer: Completer | None = None


def arg(*flags: str, completer: Completer | None = None, **options: Any) -> Arg:
    return Arg(flags, options, completer)


@dataclass(frozen=True)
class Command:
    """An action of `tickgate jobs`: its name, what runs, its help and its arguments;
    `one_of` are exclusive options of which exactly one must be given."""

    name: str
    action: Action
    summary: str
    arguments: tuple[Arg, ...] = ()
    one_of: tuple[Arg, ...] = ()


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
    for command in COMMANDS:
        _register(actions, common, command)


def main(argv: list[str] | None = None) -> None:
    """`tickgate jobs ...` on its own (the main CLI registers the same command)."""
    parser = argparse.ArgumentParser(prog="tickgate")
    add_jobs_command(parser.add_subparsers(required=True, metavar="COMMAND"))
    complete_if_asked(parser)
    args = parser.parse_args(argv)
    args.command(None, args)


def _register(actions: SubParsers, common: argparse.ArgumentParser, command: Command) -> None:
    parser = actions.add_parser(
        command.name, parents=[common], help=command.summary, description=command.summary
    )
    parser.set_defaults(command=_handler(command.action))
    for argument in command.arguments:
        _add(parser, argument)
    if command.one_of:
        group = parser.add_mutually_exclusive_group(required=True)
        for argument in command.one_of:
            _add(group, argument)


def _add(parser: argparse._ActionsContainer, argument: Arg) -> None:
    added = parser.add_argument(*argument.flags, **argument.options)
    if argument.completer is not None:
        added.completer = argument.completer  # type: ignore[attr-defined]  # argcomplete's


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


def _preview_count(text: str) -> int:
    value = _positive_int(text)
    if value > MAX_PREVIEW:
        raise argparse.ArgumentTypeError(f"at most {MAX_PREVIEW}: {value}")
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
    with _client(args, timeout) as client:
        action(Context(client, Output(bool(getattr(args, "json", False))), args))


def _client(args: argparse.Namespace, timeout: float) -> TickgateClient:
    token = os.environ.get(TOKEN_ENV) or None
    return TickgateClient(server_url(args), timeout=timeout, token=token)


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


def _note(text: str) -> None:
    """A remark on stderr, beside a result on stdout."""
    sys.stderr.write(f"note: {text}\n")


def describe_api_error(error: ApiError) -> list[str]:
    """Lines for stderr: the detail of a 404/409, each problem of a 422."""
    if error.problems:
        header = f"the server rejected the request (HTTP {error.status}):"
        return [header, *(f"  {describe_problem(problem)}" for problem in error.problems)]
    detail = error.detail if isinstance(error.detail, str) else compact(error.detail)
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
    value = compact(problem.input)
    if len(value) > _INPUT_PREVIEW:
        value = value[: _INPUT_PREVIEW - 3] + "..."
    return f"{loc}: {problem.msg} (input: {value})"


def complete_job_names(prefix: str, parsed_args: argparse.Namespace, **_: object) -> list[str]:
    """argcomplete's completer of NAME: the server's jobs whose names start so (none
    when the server cannot be asked: completion must never fail loudly)."""
    try:
        with _client(parsed_args, COMPLETION_TIMEOUT_SECONDS) as client:
            page = client.list_jobs(JobFilter(prefix=prefix or None), limit=MAX_PAGE)
    except (ClientError, UsageError):
        return []
    return [name_of(job) for job in page.items]


# Actions: jobs


def _job_filter(args: argparse.Namespace) -> JobFilter:
    """The --state, --task, --prefix and --label of list and export."""
    return JobFilter(args.state, args.task, args.prefix, tuple(args.label))


def _list(ctx: Context) -> None:
    args = ctx.args
    page = ctx.client.all_jobs(_job_filter(args), limit=args.limit)
    ctx.show(page.document(), partial(_show_jobs, page))


def _show_jobs(page: Page, out: Output) -> None:
    if not page.items:
        out.line("no jobs")
        return
    out.table(jobs_table(page.items))
    if page.next_cursor is not None:
        out.line(f"(first {len(page.items)} jobs shown; raise --limit for more)")


def _get(ctx: Context) -> None:
    job = ctx.client.get_job(ctx.args.name)
    ctx.show(job, partial(_show_job, job))


def _show_job(job: JsonObject, out: Output) -> None:
    out.table(job_table(job))
    last = job.get("last_run")
    if isinstance(last, dict):
        out.table(run_table(last, title="last run"))
    else:
        out.line("last run: none")


def _create(ctx: Context) -> None:
    job = ctx.client.create_job(single_job(load_document(ctx.args.file), ctx.args.file))
    next_run = when(job.get("next_run_at"))
    ctx.show(job, lambda out: out.line(f"created job {name_of(job)!r} (next run {next_run})"))


def _patch(ctx: Context) -> None:
    patch = patch_document(ctx.args.file, ctx.args.set, ctx.args.hook)
    job = ctx.client.patch_job(ctx.args.name, patch)
    summary = f"version {cell_text(job.get('version'))}, next run {when(job.get('next_run_at'))}"
    ctx.show(job, lambda out: out.line(f"patched job {name_of(job)!r}: {summary}"))


def _delete(ctx: Context) -> None:
    name = ctx.args.name
    ctx.client.delete_job(name)
    ctx.show({"name": name, "deleted": True}, lambda out: out.line(f"deleted job {name!r}"))


def _pause(ctx: Context) -> None:
    _show_state(ctx, ctx.client.pause_job(ctx.args.name))


def _resume(ctx: Context) -> None:
    _show_state(ctx, ctx.client.resume_job(ctx.args.name))


def _show_state(ctx: Context, job: JsonObject) -> None:
    state, next_run = cell_text(job.get("state")), when(job.get("next_run_at"))
    ctx.show(job, lambda out: out.line(f"job {name_of(job)!r}: state {state}, next run {next_run}"))


# Actions: apply and export


def _apply(ctx: Context) -> None:
    """Apply, or with --dry-run only ask what the apply would do; with --diff, first ask
    (a dry run) and show the diffs, then apply only when --yes says so."""
    args = ctx.args
    _refuse_unpaired(args)
    jobs = job_list(load_document(args.file), args.file)
    dry_run = args.dry_run or (args.diff and not args.yes)
    result = _apply_set(ctx, jobs, dry_run=args.diff or dry_run)
    diffs = _diffs(ctx, jobs, result) if args.diff else None
    if args.diff and not dry_run:
        result = _apply_set(ctx, jobs, dry_run=False)
    document = result if diffs is None else result | {"diffs": diffs}
    ctx.show(document, partial(_show_applied, result, diffs or {}, dry_run))


def _refuse_unpaired(args: argparse.Namespace) -> None:
    if args.prune and not (args.managed_by or args.label):
        raise UsageError(
            "--prune needs --managed-by or --label: only the jobs in that scope are deleted"
        )
    if args.yes and not args.diff:
        raise UsageError("--yes goes with --diff (an apply without --diff needs no --yes)")


def _apply_set(ctx: Context, jobs: Sequence[JsonObject], *, dry_run: bool) -> JsonObject:
    args = ctx.args
    return ctx.client.apply_jobs(
        jobs, managed_by=args.managed_by, prune=args.prune, dry_run=dry_run, labels=args.label
    )


def _diffs(ctx: Context, jobs: Sequence[JsonObject], result: JsonObject) -> dict[str, str]:
    """By name, the diff of each job the (dry-run) `result` creates, updates or deletes."""
    declared = {name_of(job): job for job in jobs}
    changed = {name: kind for name, kind in _outcomes(result).items() if kind != "unchanged"}
    stored = _stored(ctx.client, [name for name, kind in changed.items() if kind != "created"])
    diffs: dict[str, str] = {}
    for name in changed:
        current = exported(stored[name]) if name in stored else None
        wanted = declared.get(name)
        applied = as_applied(wanted, current, ctx.args.managed_by) if wanted else None
        diff = job_diff(name, current, applied, _source_label(ctx.args.file))
        diffs[name] = diff or f"{name}: only secret header values differ (not shown)\n"
    return diffs


def _stored(client: TickgateClient, names: Sequence[str]) -> dict[str, JsonObject]:
    """The named jobs as stored: one GET each, or for many, the listing page by page."""
    if len(names) <= _GETS_BEFORE_LISTING:
        return {name: client.get_job(name) for name in names}
    wanted = set(names)
    return {name_of(job): job for job in client.all_jobs().items if name_of(job) in wanted}


def _show_applied(result: JsonObject, diffs: Mapping[str, str], dry_run: bool, out: Output) -> None:
    for diff in diffs.values():
        out.text(diff)
    for name, outcome in _outcomes(result).items():
        out.line(f"{name}: {outcome}")
    counts = ", ".join(f"{result.get(kind)} {kind}" for kind in APPLY_OUTCOMES)
    out.line(f"{counts} (a dry run; nothing changed)" if dry_run else counts)


def _outcomes(result: JsonObject) -> dict[str, str]:
    outcomes = result.get("outcomes")
    return {str(k): str(v) for k, v in outcomes.items()} if isinstance(outcomes, dict) else {}


def _source_label(source: str) -> str:
    return "<stdin>" if source == "-" else source


def _export(ctx: Context) -> None:
    args = ctx.args
    page = ctx.client.all_jobs(_job_filter(args))
    chosen = [
        job for job in page.items if _managed_as(job, args.managed_by) and not _fired_by_app(job)
    ]
    jobs = [exported(job) for job in chosen]
    as_json = ctx.out.as_json or args.format == "json"
    text = export_text(jobs, as_json=as_json)
    _note_masked_secrets(jobs)
    if args.output in {None, "-"}:
        ctx.out.text(text)
        return
    _write(args.output, text)
    _note(f"exported {len(jobs)} job{'' if len(jobs) == 1 else 's'} to {args.output}")


def _fired_by_app(job: JsonObject) -> bool:
    """An app's job (the APScheduler gate) is declared in the app: applied here, it
    would be refused."""
    schedule = job.get("schedule")
    return isinstance(schedule, dict) and schedule.get("kind") == "app"


def _managed_as(job: JsonObject, manager: str | None) -> bool:
    return manager is None or job.get("managed_by") == manager


def _note_masked_secrets(jobs: Iterable[JsonObject]) -> None:
    """Secret header values never leave the server: they are exported as the mask,
    which keeps the stored value when applied back to this server, and is refused
    (naming the job) where nothing is stored."""
    for job in jobs:
        headers = masked_secrets(job)
        if headers:
            listed = ", ".join(repr(name) for name in headers)
            _note(
                f'job {name_of(job)!r}: secret header {listed} exported as "***": applied to '
                "this server it keeps the stored value; for another server, put the value in"
            )


def _write(path: str, text: str) -> None:
    try:
        Path(path).write_text(text, encoding="utf-8")
    except OSError as error:
        raise UsageError(f"cannot write {path}: {error.strerror or error}") from None


# Actions: runs


def _trigger(ctx: Context) -> None:
    args = inline_mapping(ctx.args.args, "--args") if ctx.args.args is not None else None
    run = ctx.client.trigger_job(ctx.args.name, args, ctx.args.note)
    ctx.show(run, partial(_show_triggered, ctx.args.name, run))


def _show_triggered(name: str, run: JsonObject, out: Output) -> None:
    out.line(f"triggered job {name!r}: run {cell_text(run.get('id'))}")
    out.table(run_table(run, title="run"))


def _backfill(ctx: Context) -> None:
    args = ctx.args
    runs = ctx.client.backfill_job(args.name, args.start, args.end)
    items = runs.get("items")
    made = [run for run in items if isinstance(run, dict)] if isinstance(items, list) else []
    ctx.show(runs, partial(_show_backfilled, args.name, made))


def _show_backfilled(name: str, runs: list[JsonObject], out: Output) -> None:
    out.line(f"backfilled job {name!r}: {len(runs)} runs")
    if runs:
        out.table(runs_table(runs))


def _runs(ctx: Context) -> None:
    args = ctx.args
    if args.run_id is not None:
        _run_get(ctx)
        return
    page = ctx.client.recent_runs(args.name, status=args.status, limit=args.limit)
    ctx.show(page.document(), partial(_show_runs, args.name, page))


def _run_get(ctx: Context) -> None:
    if ctx.args.name == "log":
        _run_log(ctx)
        return
    if ctx.args.name == "cancel":
        _run_cancel(ctx)
        return
    if ctx.args.name == "hooks":
        _run_hooks(ctx)
        return
    if ctx.args.name != "get":
        raise UsageError(
            "runs takes one job NAME; `runs get RUN_ID` shows one run, `runs log RUN_ID` its"
            " log, `runs hooks RUN_ID` its hook deliveries, `runs cancel RUN_ID` cancels it"
        )
    run = ctx.client.get_run(ctx.args.run_id)
    ctx.show(run, lambda out: out.table(run_table(run, title=f"run {ctx.args.run_id}")))


def _run_cancel(ctx: Context) -> None:
    answer = ctx.client.cancel_run(ctx.args.run_id, ctx.args.reason, _who())
    ctx.show(answer, lambda out: out.line(f"run {ctx.args.run_id}: {answer.get('detail')}"))


def _run_hooks(ctx: Context) -> None:
    answer = ctx.client.get_run_hooks(ctx.args.run_id)
    ctx.show(answer, partial(_show_hooks, answer))


def _show_hooks(answer: JsonObject, out: Output) -> None:
    items = answer.get("items")
    deliveries = (
        [item for item in items if isinstance(item, dict)] if isinstance(items, list) else []
    )
    for one in deliveries:
        error = f" ({one.get('last_error')})" if one.get("last_error") else ""
        out.line(
            f"{one.get('event')} hook {one.get('hook')}: {one.get('status')} after "
            f"{one.get('attempts')} attempts{error}"
        )
    if not deliveries:
        out.line("no hook deliveries")


def _cancel_queued(ctx: Context) -> None:
    skipped = ctx.client.cancel_queued(ctx.args.name, ctx.args.reason, _who())
    ctx.show(skipped, lambda out: out.table(run_table(skipped, title="dropped tick")))


def _who() -> str | None:
    """The local user, for the record of who cancelled (the API adds what it saw)."""
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no such user in the passwd database, no login name
        return None


def _run_log(ctx: Context) -> None:
    log = ctx.client.get_run_log(ctx.args.run_id)
    ctx.show(log, partial(_show_run_log, log))


def _show_run_log(log: JsonObject, out: Output) -> None:
    lines = log.get("lines")
    for line in lines if isinstance(lines, list) else []:
        if isinstance(line, dict):
            out.line(f"{line.get('at')} {line.get('level')} {line.get('message')}")
    if log.get("dropped"):
        out.line(f"({log.get('dropped')} more lines were not kept)")
    if not lines:
        out.line("nothing logged")


def _show_runs(name: str | None, page: Page, out: Output) -> None:
    if not page.items:
        out.line("no runs" if name is None else f"no runs of job {name!r}")
        return
    out.table(runs_table(page.items, with_job=name is None))
    if page.next_cursor is not None:
        out.line(f"(newest {len(page.items)} runs shown; raise --limit for more)")


# Actions: schedules and tasks


def _preview(ctx: Context) -> None:
    args = ctx.args
    schedule, zone = _schedule_of(args)
    request: JsonObject = {"schedule": schedule, "timezone": zone, "count": args.count}
    if args.after is not None:
        request["after"] = args.after
    answer = ctx.client.preview_schedule(request)
    ctx.show(answer, partial(_show_fire_times, schedule, zone, answer))


def _schedule_of(args: argparse.Namespace) -> tuple[JsonObject, str]:
    """The schedule the flags (or the file) give, and the zone to read it in."""
    if args.every_days is not None and args.daily is None:
        raise UsageError("--every-days goes with --daily")
    if args.file is not None:
        return _schedule_file(args.file, args.timezone)
    zone = args.timezone or "UTC"
    if args.cron is not None:
        return {"kind": "cron", "expression": args.cron}, zone
    if args.every is not None:
        return {"kind": "interval", "every_seconds": args.every}, zone
    if args.once is not None:
        return {"kind": "once", "at": args.once}, zone
    times = [part for text in args.daily for part in text.split(",") if part]
    return {"kind": "daily", "at": times, "every_days": args.every_days or 1}, zone


def _schedule_file(source: str, zone: str | None) -> tuple[JsonObject, str]:
    """A schedule object, or a job object (its schedule, in its timezone)."""
    document = load_document(source)
    if not isinstance(document, dict):
        raise UsageError(f"{_source_label(source)}: expected a schedule or a job (a mapping)")
    schedule, file_zone = document.get("schedule"), document.get("timezone")
    if not isinstance(schedule, dict):
        schedule, file_zone = document, None
    file_zone = file_zone if isinstance(file_zone, str) else "UTC"
    return {str(key): value for key, value in schedule.items()}, zone or file_zone


def _show_fire_times(schedule: JsonObject, zone: str, answer: JsonObject, out: Output) -> None:
    times = answer.get("fire_times")
    fire_times = [str(t) for t in times] if isinstance(times, list) else []
    if not fire_times:
        out.line(f"{schedule_summary(schedule)} in {zone}: never fires")
        return
    columns = ("#", "UTC") if zone == "UTC" else ("#", "UTC", zone)
    table = new_table(*columns, title=f"{schedule_summary(schedule)} in {zone}")
    for index, fire_time in enumerate(fire_times, start=1):
        cells = [str(index), when(fire_time), _local(fire_time, zone)]
        table.add_row(*cells[: len(columns)])
    out.table(table)


def _local(instant: str, zone: str) -> str:
    """The instant on the zone's wall clock, with its offset and abbreviation."""
    try:
        moment = datetime.fromisoformat(instant).astimezone(ZoneInfo(zone))
    except (ValueError, KeyError):
        return instant
    return f"{moment.replace(microsecond=0).isoformat()} {moment.tzname()}"


def _tasks(ctx: Context) -> None:
    answer = ctx.client.list_tasks()
    items = answer.get("items")
    tasks = [task for task in items if isinstance(task, dict)] if isinstance(items, list) else []
    ctx.show(answer, partial(_show_tasks, tasks))


def _show_tasks(tasks: list[JsonObject], out: Output) -> None:
    """Each task on two lines: its name and first sentence, then its args (* required)."""
    if not tasks:
        out.line("no tasks")
    for task in tasks:
        description = cell_text(task.get("description")).strip()
        out.line(f"{name_of(task)}: {description.split('. ', 1)[0].rstrip('.')}")
        out.line(f"  args: {args_summary(task.get('args_schema'))}")


def args_summary(schema: object) -> str:
    """`url*: string, method: enum, headers: object, ...`: an args JSON schema in short."""
    if not isinstance(schema, dict) or not isinstance(schema.get("properties"), dict):
        return "-"
    required = schema.get("required")
    needed = set(required) if isinstance(required, list) else set()
    return ", ".join(
        f"{name}{'*' if name in needed else ''}: {_schema_type(prop)}"
        for name, prop in schema["properties"].items()
    )


def _schema_type(schema: object) -> str:
    if not isinstance(schema, dict):
        return "any"
    if isinstance(schema.get("enum"), list):
        values = "|".join(map(str, schema["enum"]))
        return values if len(values) <= _ENUM_SHOWN else "enum"
    if isinstance(schema.get("$ref"), str):
        return str(schema["$ref"]).rsplit("/", 1)[-1]
    for key in ("anyOf", "oneOf"):
        branches = schema.get(key)
        if isinstance(branches, list):
            return "|".join(dict.fromkeys(_schema_type(branch) for branch in branches))
    kind = schema.get("type")
    if kind == "array":
        return f"list[{_schema_type(schema.get('items'))}]"
    return "|".join(map(str, kind)) if isinstance(kind, list) else str(kind or "any")


# The table of actions: `tickgate jobs <name>`, in the order help lists them.

WITH_OFFSET: Final = "ISO 8601, with offset (2026-11-01T00:00:00Z)"
NAME: Final = arg("name", metavar="NAME", help="the job's name", completer=complete_job_names)


def file_arg(what: str, *, required: bool = True) -> Arg:
    return arg("-f", "--file", required=required, metavar="FILE", help=f"{what}; - reads stdin")


def _filters(what: str) -> tuple[Arg, ...]:
    return (
        arg("--state", choices=JOB_STATES),
        arg("--task", help=f"only {what} running this task"),
        arg("--prefix", help=f"only {what} whose name starts so"),
        arg(
            "--label",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help=f"only {what} carrying this label (repeat: all must match)",
        ),
    )


COMMANDS: Final = (
    Command(
        "list",
        _list,
        "list jobs in name order",
        (
            *_filters("jobs"),
            arg(
                "--limit",
                type=_positive_int,
                help="at most this many jobs (default: all, page by page)",
            ),
        ),
    ),
    Command("get", _get, "show one job and its last run", (NAME,)),
    Command(
        "create",
        _create,
        "create one job (409 if it exists)",
        (file_arg("a YAML or JSON job object with its name"),),
    ),
    Command(
        "apply",
        _apply,
        "create or replace jobs declaratively, as one set in one transaction (PUT /v1/jobs); "
        "with --prune, also delete the manager's jobs the set does not name",
        (
            file_arg('YAML or JSON: a list of job objects, or {"jobs": [...]}'),
            arg(
                "--managed-by",
                metavar="MANAGER",
                help="the set's manager (e.g. argocd/billing), set on each of its jobs",
            ),
            arg(
                "--prune",
                action="store_true",
                help="delete the active and paused jobs of --managed-by (and --label) that "
                "the file does not name",
            ),
            arg(
                "--label",
                action="append",
                default=[],
                metavar="KEY=VALUE",
                help="with --prune: only jobs carrying this label are in its scope (repeat: "
                "all must match); the file's jobs should carry it too",
            ),
            arg(
                "--dry-run",
                action="store_true",
                help="have the server check and plan the whole set as the apply would, and "
                "change nothing; prints what the apply would do",
            ),
            arg(
                "--diff",
                action="store_true",
                help="print a diff of each job the apply would create, update or delete; a "
                "dry run unless --yes is given too",
            ),
            arg("--yes", action="store_true", help="with --diff: apply after showing the diff"),
        ),
    ),
    Command(
        "patch",
        _patch,
        "change some fields of a job (a JSON merge patch: null resets a field)",
        (
            NAME,
            file_arg("a YAML or JSON mapping of the fields to change", required=False),
            arg(
                "--set",
                action="append",
                default=[],
                metavar="KEY=VALUE",
                help="a field to change, repeatable; dots for nested keys (retry.max_attempts"
                "=3); the value is read as YAML (null, 30, [a, b], {kind: cron, ...})",
            ),
            arg(
                "--hook",
                action="append",
                default=[],
                metavar="EVENTS=ACTION",
                help="set the job's hooks (repeat for several; they replace its hooks): "
                "`failure,recovery=http:URL` posts the run to URL, `success=trigger:JOB` runs "
                "JOB; events: failure, success, recovery, misfire, skip",
            ),
        ),
    ),
    Command("delete", _delete, "delete a job", (NAME,)),
    Command("pause", _pause, "stop a job firing", (NAME,)),
    Command("resume", _resume, "fire a paused job again", (NAME,)),
    Command(
        "trigger",
        _trigger,
        "run a job now; prints the run",
        (
            NAME,
            arg(
                "--args",
                metavar="JSON",
                help="arguments for this run only, instead of the job's (JSON, or YAML flow"
                " style: '{message: hi}'); checked as the job's are",
            ),
            arg("--note", metavar="TEXT", help="why the run was triggered; kept on the run"),
        ),
    ),
    Command(
        "cancel-queued",
        _cancel_queued,
        "drop the tick of a queue_one job that waits for the run in progress (recorded "
        "skipped, reason cancelled)",
        (NAME, arg("--reason", metavar="TEXT", help="why (kept on the skipped tick)")),
    ),
    Command(
        "backfill",
        _backfill,
        "run each tick of a job in [--from, --to] that has no run yet, once, in order "
        "(at most 1000 ticks; --to not in the future)",
        (
            NAME,
            arg("--from", dest="start", required=True, metavar="INSTANT", help=WITH_OFFSET),
            arg("--to", dest="end", required=True, metavar="INSTANT", help=WITH_OFFSET),
        ),
    ),
    Command(
        "runs",
        _runs,
        "a job's runs, newest first; without NAME, every job's; `runs get RUN_ID`: one run;"
        " `runs log RUN_ID`: what it logged; `runs hooks RUN_ID`: its hook deliveries;"
        " `runs cancel RUN_ID [--reason TEXT]`: stop it",
        (
            arg(
                "name",
                metavar="NAME",
                nargs="?",
                help="the job's name (or `get`, `log`, `hooks` or `cancel`, then RUN_ID)",
                completer=complete_job_names,
            ),
            arg(
                "run_id",
                metavar="RUN_ID",
                nargs="?",
                help="after `get`: the run to show; after `log`: the run whose log to show;"
                " after `cancel`: the run to cancel",
            ),
            arg("--reason", metavar="TEXT", help="with `cancel`: why (kept on the run)"),
            arg("--status", choices=RUN_STATUSES),
            arg(
                "--limit",
                type=_positive_int,
                default=DEFAULT_RUNS,
                help=f"at most this many runs (default: {DEFAULT_RUNS})",
            ),
        ),
    ),
    Command(
        "preview",
        _preview,
        "the instants a schedule would fire at, before a job uses it",
        (
            arg("--every-days", type=_positive_int, metavar="N", help="with --daily"),
            arg("--timezone", metavar="ZONE", help="IANA zone (default: the file's, or UTC)"),
            arg("--after", metavar="INSTANT", help="from this instant (default: now)"),
            arg(
                "--count",
                type=_preview_count,
                default=DEFAULT_PREVIEW,
                help=f"how many (default: {DEFAULT_PREVIEW}, at most {MAX_PREVIEW})",
            ),
        ),
        one_of=(
            arg("--cron", metavar="EXPR", help="5 fields, 6 with seconds first, or @daily..."),
            arg("--every", type=_positive_int, metavar="SECONDS", help="an interval"),
            arg("--daily", nargs="+", metavar="HH:MM", help="wall times, every day"),
            arg("--once", metavar="INSTANT", help="one instant (no offset: in --timezone)"),
            file_arg("a schedule object, or a job (its schedule and timezone)", required=False),
        ),
    ),
    Command("tasks", _tasks, "the tasks jobs may run, and their args"),
    Command(
        "export",
        _export,
        "write jobs in the shape apply takes (apply of it reports each unchanged)",
        (
            *_filters("jobs"),
            arg("--managed-by", metavar="MANAGER", help="only the jobs of this manager"),
            arg("-o", "--output", metavar="FILE", help="write here (default: stdout)"),
            arg(
                "--format",
                choices=EXPORT_FORMATS,
                default="yaml",
                help="yaml (default) or json (--json too)",
            ),
        ),
    ),
)
