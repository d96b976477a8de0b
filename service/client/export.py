"""Jobs in the shape `apply` takes (`export`), and diffs of them (`apply --diff`).

The client imports nothing of the server, so the declared fields and their defaults are
repeated here; a test holds them equal to the API's (service.domain JobSpec).
"""

import difflib
import json
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime, time
from typing import Final
from zoneinfo import ZoneInfo

import yaml

from service.client.http import JsonObject

# The fields a job declares (a POST /v1/jobs body), in the order a file shows them.
DECLARED_FIELDS: Final = (
    "name",
    "description",
    "schedule",
    "timezone",
    "task",
    "args",
    "overlap",
    "timeout_seconds",
    "misfire_grace_seconds",
    "retry",
    "start_at",
    "end_at",
    "max_runs",
    "jitter_seconds",
    "catchup",
    "managed_by",
    "labels",
    "capture",
    "hooks",
    "default_hooks",
)
# What a declared field is when a body leaves it out.
DEFAULTS: Final[Mapping[str, object]] = {
    "description": "",
    "timezone": "UTC",
    "args": {},
    "overlap": "skip",
    "timeout_seconds": 600,
    "misfire_grace_seconds": 60,
    "retry": {},
    "start_at": None,
    "end_at": None,
    "max_runs": None,
    "jitter_seconds": 0,
    "catchup": "latest",
    "managed_by": None,
    "labels": {},
    "capture": True,
    "hooks": [],
    "default_hooks": True,
}
RETRY_DEFAULTS: Final[Mapping[str, object]] = {
    "max_attempts": 1,
    "min_backoff_seconds": 5,
    "max_backoff_seconds": 3600,
    "max_doublings": 5,
    "max_retry_seconds": 0,
}
DAILY_EVERY_DAYS: Final = 1
# How the API shows a secret header's value; sent back so, it keeps the stored value.
SECRET_MASK: Final = "***"  # noqa: S105 - the mask, not a secret
_INSTANT_FIELDS: Final = frozenset({"start_at", "end_at"})
_ANCHORS: Final = ("anchor", "anchor_date")
_FREE_FORM: Final = ("args", "labels")


def exported(job: JsonObject) -> JsonObject:
    """A job as the API shows it, in the shape `apply` takes: its declared fields in
    order, nulls left out (null is what each such field defaults to), instants in UTC."""
    return {field: _canonical(field, job[field]) for field in DECLARED_FIELDS if _given(job, field)}


def essential(job: JsonObject) -> JsonObject:
    """A job, shown or declared, reduced to what differs from the defaults: two jobs
    that apply the same way look the same (what `apply --diff` compares)."""
    shown = exported(job)
    retry = shown.get("retry")
    if isinstance(retry, dict):
        shown["retry"] = {k: v for k, v in retry.items() if RETRY_DEFAULTS.get(k) != v}
    return {
        field: value
        for field, value in shown.items()
        if field not in DEFAULTS or DEFAULTS[field] != value
    }


def as_applied(
    declared: JsonObject, current: JsonObject | None, managed_by: str | None
) -> JsonObject:
    """A job of a file as the server would store it, as far as a client can tell: with
    the request's manager, a one-time `at` without offset read in the job's zone, and
    the anchor of a schedule that leaves it out taken from the stored schedule of its
    kind (the server keeps it, so the grid stays)."""
    job = dict(declared)
    if managed_by is not None and job.get("managed_by") is None:
        job["managed_by"] = managed_by
    schedule = job.get("schedule")
    if isinstance(schedule, dict):
        stored = (current or {}).get("schedule")
        job["schedule"] = _kept_anchors(_zoned_once(schedule, job.get("timezone")), stored)
    return job


def _zoned_once(schedule: JsonObject, zone: object) -> JsonObject:
    if schedule.get("kind") != "once":
        return schedule
    return schedule | {"at": _in_zone(schedule.get("at"), zone)}


def _kept_anchors(schedule: JsonObject, stored: object) -> JsonObject:
    if not isinstance(stored, dict) or stored.get("kind") != schedule.get("kind"):
        return schedule
    return schedule | {k: stored[k] for k in _ANCHORS if k in stored and schedule.get(k) is None}


def masked(job: JsonObject) -> JsonObject:
    """`job` with the values of its secret headers replaced by the API's mask."""
    secret = {name.lower() for name in _secret_names(job)}
    args = job.get("args")
    headers = args.get("headers") if isinstance(args, dict) else None
    if not secret or not isinstance(args, dict) or not isinstance(headers, dict):
        return job
    shown = {n: SECRET_MASK if n.lower() in secret else v for n, v in headers.items()}
    return job | {"args": args | {"headers": shown}}


def masked_secrets(job: JsonObject) -> list[str]:
    """The headers of `job` whose values the API masked (and so an export holds as
    the mask, which keeps the stored value only where it is stored)."""
    args = job.get("args")
    headers = args.get("headers") if isinstance(args, dict) else None
    if not isinstance(headers, dict):
        return []
    secret = {name.lower() for name in _secret_names(job)}
    return [n for n, v in headers.items() if n.lower() in secret and v == SECRET_MASK]


def export_text(jobs: Sequence[JsonObject], *, as_json: bool) -> str:
    """The file `apply -f` reads back: `{"jobs": [...]}` as YAML or JSON."""
    document = {"jobs": list(jobs)}
    if as_json:
        return json.dumps(document, indent=2, ensure_ascii=False) + "\n"
    return _yaml(document)


def job_diff(
    name: str, current: JsonObject | None, declared: JsonObject | None, source: str
) -> str:
    """A unified diff of the job as stored (None: none) against the job as declared
    (None: deleted), secrets masked on both sides; empty when they apply the same."""
    before = _lines(current)
    after = _lines(declared)
    return "".join(difflib.unified_diff(before, after, f"{name} (server)", f"{name} ({source})"))


def _lines(job: JsonObject | None) -> list[str]:
    if job is None:
        return []
    shown = essential(masked(job))
    # The API keeps args as JSONB, which orders keys its own way: sorted, they compare.
    shown |= {key: _sorted(shown[key]) for key in _FREE_FORM if key in shown}
    return _yaml(shown).splitlines(keepends=True)


def _sorted(value: object) -> object:
    if isinstance(value, dict):
        return {key: _sorted(value[key]) for key in sorted(value)}
    if isinstance(value, list):
        return [_sorted(item) for item in value]
    return value


def _yaml(document: object) -> str:
    return yaml.safe_dump(document, sort_keys=False, allow_unicode=True, width=1_000_000)


def _given(job: JsonObject, field: str) -> bool:
    return job.get(field) is not None


def _secret_names(job: JsonObject) -> list[str]:
    args = job.get("args")
    if job.get("task") != "http" or not isinstance(args, dict):
        return []
    names = args.get("secret_headers")
    return [name for name in names if isinstance(name, str)] if isinstance(names, list) else []


def _canonical(field: str, value: object) -> object:
    """One spelling per value, so that a diff shows no difference the API ignores:
    instants in UTC with `Z`, wall times as HH:MM[:SS], whole floats as integers.
    `args` stay as they are: they are the task's, verbatim."""
    if field in _INSTANT_FIELDS:
        return _instant(value)
    if field == "schedule" and isinstance(value, dict):
        return _schedule(value)
    if field == "retry" and isinstance(value, dict):
        return {**RETRY_DEFAULTS, **{k: _number(v) for k, v in value.items()}}
    return _number(value)


def _schedule(schedule: JsonObject) -> JsonObject:
    kind = schedule.get("kind")
    if kind == "once":
        return schedule | {"at": _instant(schedule.get("at"))}
    if kind == "cron" and isinstance(schedule.get("expression"), str):
        return schedule | {"expression": " ".join(str(schedule["expression"]).split())}
    if kind == "interval" and schedule.get("anchor") is not None:
        return schedule | {"anchor": _instant(schedule["anchor"])}
    if kind == "daily":
        at = schedule.get("at")
        times = [_wall_time(t) for t in at] if isinstance(at, list) else at
        if isinstance(times, list) and all(isinstance(t, str) for t in times):
            times = sorted(set(times))  # as the API keeps them; zero-padded, so in time order
        return {"kind": kind, "every_days": DAILY_EVERY_DAYS} | schedule | {"at": times}
    return {key: _number(value) for key, value in schedule.items()}


def _instant(value: object) -> object:
    if not isinstance(value, str):
        return value
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        return value  # the API will say what is wrong with it
    if moment.tzinfo is None:
        return value
    return moment.astimezone(UTC).isoformat().replace("+00:00", "Z")


def _in_zone(value: object, zone: object) -> object:
    """A wall-clock instant without offset, in `zone` (UTC when unset), with its offset."""
    if not isinstance(value, str):
        return value
    try:
        moment = datetime.fromisoformat(value)
        tz = ZoneInfo(zone if isinstance(zone, str) else "UTC")
    except (ValueError, KeyError):
        return value  # the API will say what is wrong with it
    return moment.isoformat() if moment.tzinfo else moment.replace(tzinfo=tz).isoformat()


def _wall_time(value: object) -> object:
    if not isinstance(value, str):
        return value
    try:
        parsed = time.fromisoformat(value)
    except ValueError:
        return value
    return parsed.isoformat("minutes" if parsed.second == parsed.microsecond == 0 else "auto")


def _number(value: object) -> object:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return value
