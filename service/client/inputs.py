"""What the CLI reads: job files (YAML or JSON, `-` for stdin) and `--set key=value`."""

import json
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path

import yaml

from service.client.http import JsonObject
from service.client.render import name_of
from service.jobfile import parse_document


class UsageError(Exception):
    """Bad input found before anything was sent (exit 2)."""


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


def inline_mapping(text: str, option: str) -> JsonObject:
    """A mapping given on the command line (`--args '{"a": 1}'`: JSON, or YAML's flow
    style); UsageError if it is not one."""
    try:
        document = parse_document(text)
    except yaml.YAMLError as error:
        raise UsageError(f"{option}: not valid YAML or JSON: {error}") from None
    if not isinstance(document, dict):
        raise UsageError(f'{option}: expected a mapping, like \'{{"key": "value"}}\'')
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
    _no_duplicates([name_of(job) for job in jobs], label)
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


HOOK_FORM = "EVENTS=http:URL or EVENTS=trigger:JOB (EVENTS: failure,recovery,...)"


def hook_option(text: str) -> JsonObject:
    """`--hook failure,recovery=http:https://alerts.example/tg` as a hook: a webhook to
    the URL (POST, the run as its body), or `success=trigger:report` to run another job."""
    events, _, action = text.partition("=")
    kind, _, target = action.partition(":")
    on = [event.strip() for event in events.split(",") if event.strip()]
    if not on or kind not in {"http", "trigger"} or not target:
        raise UsageError(f"--hook {text!r}: expected {HOOK_FORM}")
    if kind == "http":
        return {"on": on, "action": {"kind": "http", "args": {"url": target}}}
    return {"on": on, "action": {"kind": "trigger", "job": target}}


def patch_document(
    source: str | None, settings: Sequence[str], hooks: Sequence[str] = ()
) -> JsonObject:
    """A JSON merge patch: the mapping in the file `source` (if any), then each
    `key=value` of `settings` merged into it (`a.b=1` is `{"a": {"b": 1}}`), then the
    `--hook`s, if any, as the job's hooks (all of them: a merge patch replaces a list)."""
    patch: JsonObject = {}
    if source is not None:
        document = load_document(source)
        if not isinstance(document, dict):
            raise UsageError(f"{_label(source)}: expected a mapping of the fields to change")
        patch = {str(key): value for key, value in document.items()}
    for setting in settings:
        path, value = _setting(setting)
        _merge_at(patch, path, value)
    if hooks:
        patch["hooks"] = [hook_option(text) for text in hooks]
    if not patch:
        raise UsageError("nothing to change: give -f FILE, --set key=value or --hook")
    return patch


def _setting(text: str) -> tuple[list[str], object]:
    """`retry.max_attempts=3` as (["retry", "max_attempts"], 3): the value read as YAML
    (so `null`, numbers, `[a, b]` and `{kind: interval, every_seconds: 60}` are typed;
    `15:30` and instants stay strings; an empty value is the empty string)."""
    key, equals, value = text.partition("=")
    path = key.split(".")
    if not equals or not all(path):
        raise UsageError(f"--set takes key=value (dots for nested keys), not {text!r}")
    if not value:
        return path, ""
    try:
        return path, parse_document(value)
    except yaml.YAMLError as error:
        raise UsageError(f"--set {key}: not a YAML value: {error}") from None


def _merge_at(patch: JsonObject, path: list[str], value: object) -> None:
    *parents, last = path
    here = patch
    for key in parents:
        child = here.get(key)
        if not isinstance(child, dict):
            child = here[key] = {}
        here = child
    here[last] = value
