"""The Helm chart's generated parts (written by `make docs`, through tools/gendocs.py):

- `values.schema.json`'s `definitions`: the job of `jobs:` and what it refers to, from the
  API's own model of a job body (`service.api.models.JobCreate`), so the chart accepts
  exactly the fields `POST /v1/jobs` does (`retry`, `start_at`, `max_runs`, ...);
- the values table, from the comments above each key in `values.yaml`: the whole of
  `helm/tickgate/README.md` and the Values section of docs/kubernetes.md.

Each is a pure function of its sources (and of the hand-written rest of its file).
"""

import json
import re
import textwrap
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
CHART_DIR = ROOT / "helm" / "tickgate"
SCHEMA = CHART_DIR / "values.schema.json"
VALUES = CHART_DIR / "values.yaml"
CHART_README = CHART_DIR / "README.md"
KUBERNETES_PAGE = ROOT / "docs" / "kubernetes.md"
VALUES_BEGIN = "<!-- values:begin -->"
VALUES_END = "<!-- values:end -->"

# Helm asserts JSON Schema formats, and RFC 3339's are narrower than what the API reads: a
# `once` job's `at` may be naive ("2030-01-01 09:00", a wall time in the job's zone), a
# daily `at` is "HH:MM" without an offset. So `date-time` and `date` are left to the
# service (which checks every job at startup) and `time` becomes the wall-time pattern.
DATE_FORMATS = frozenset({"date-time", "date"})
WALL_TIME = r"^([01][0-9]|2[0-3]):[0-5][0-9](:[0-5][0-9](\.[0-9]{1,6})?)?$"
# Keywords only a code generator or a form reads; Helm's validator ignores them.
DROPPED = frozenset({"title", "discriminator"})


def job_definitions() -> dict[str, Any]:
    """`definitions` of the values schema: `job` (a JobCreate) and the models it uses."""
    from service.api.models import JobCreate

    schema = JobCreate.model_json_schema(ref_template="#/definitions/{model}")
    models = schema.pop("$defs")
    schema["$comment"] = (
        "Generated from service.api.models.JobCreate by `make docs`; do not edit by hand."
    )
    return {"job": _for_helm(schema)} | {name: _for_helm(model) for name, model in models.items()}


def _for_helm(node: Any) -> Any:
    """Pydantic's schema in terms every Helm release's validator reads the same way."""
    if isinstance(node, list):
        return [_for_helm(item) for item in node]
    if not isinstance(node, dict):
        return node
    converted = {key: _for_helm(value) for key, value in node.items() if key not in DROPPED}
    if converted.get("format") == "time":
        del converted["format"]
        converted["pattern"] = WALL_TIME
    if converted.get("format") in DATE_FORMATS:
        del converted["format"]
    return converted


def schema_text() -> str:
    """values.schema.json with its definitions regenerated and the rest as written."""
    schema = json.loads(SCHEMA.read_text())
    schema["definitions"] = job_definitions()
    return json.dumps(schema, indent=2) + "\n"


# --- the values table ----------------------------------------------------------------------


@dataclass(frozen=True)
class Value:
    """One row of the values table: a dotted key, its default, and the comment block
    right above it in values.yaml."""

    path: str
    default: str
    comment: str


KEY = re.compile(r"^(?P<indent> *)(?P<key>[A-Za-z][A-Za-z0-9_-]*):")


def documented_values(text: str) -> list[Value]:
    """The rows of the values table, in the file's order.

    A mapping whose keys have comments of their own is a section: its keys get rows of
    their own (and it gets one only if it has a comment). Any other key is one row, its
    default the value as compact JSON (`resources` and the probes, say, whose keys are
    Kubernetes' own)."""
    comments = _comments(text)
    return list(_rows(yaml.safe_load(text), "", comments))


def _rows(values: dict[str, Any], prefix: str, comments: dict[str, str]) -> Iterator[Value]:
    for key, value in values.items():
        path = f"{prefix}{key}"
        section = isinstance(value, dict) and any(
            child.startswith(f"{path}.") for child in comments
        )
        if not section:
            yield Value(path, json.dumps(value, separators=(", ", ": ")), comments.get(path, ""))
            continue
        if path in comments:
            yield Value(path, "", comments[path])
        yield from _rows(value, f"{path}.", comments)


def _comments(text: str) -> dict[str, str]:
    """{dotted key: the run of `#` lines right above it}; a blank line ends a run, so a
    comment followed by a blank line belongs to no key."""
    found: dict[str, str] = {}
    parents: list[tuple[int, str]] = []
    block: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            block.append(stripped.removeprefix("#").removeprefix(" "))
            continue
        match = KEY.match(line)
        if match:
            indent = len(match["indent"])
            parents = [(level, key) for level, key in parents if level < indent]
            parents.append((indent, match["key"]))
            if block:
                found[".".join(key for _, key in parents)] = _joined(block)
        block = []
    return found


def _joined(comment: list[str]) -> str:
    """A comment block as one table cell: prose lines joined with spaces; each run of
    example lines (indented in the comment) one code span."""
    parts: list[str] = []
    example: list[str] = []
    for line in [*comment, ""]:
        if line.startswith("  "):
            example.append(line)
            continue
        if example:
            parts.extend(f"`{code}`" for code in _one_line(example))
            example = []
        if line:
            parts.append(line.replace("<", "&lt;"))
    return " ".join(parts).replace("|", "\\|")


def _one_line(example: list[str]) -> list[str]:
    """A YAML example of several lines in flow style (`key: {a: 1, b: [x]}`), which fits a
    table cell; anything else (a shell command) line by line."""
    lines = [line.strip() for line in example]
    try:
        parsed = yaml.safe_load(textwrap.dedent("\n".join(example)))
    except yaml.YAMLError:
        return lines
    if len(lines) == 1 or not isinstance(parsed, dict) or len(parsed) != 1:
        return lines
    ((key, value),) = parsed.items()
    flow = yaml.safe_dump(value, default_flow_style=True, width=1 << 20, sort_keys=False)
    return [f"{key}: {flow.strip()}"]


README_HEAD = """# The Tickgate Helm chart

Tickgate, an HTTP job scheduler on PostgreSQL that runs each tick exactly once across its
replicas. How to install it, tokens and GitOps, ingress, network policy, alerts and
`helm test`: [docs/kubernetes.md](../../docs/kubernetes.md).

```sh
helm install tickgate ./helm/tickgate --namespace tickgate --create-namespace \\
  --set image.repository=registry.example.com/tickgate \\
  --set database.existingSecret=tickgate-database
```

## Values

"""

TABLE_NOTE = "Generated from the comments in `values.yaml` by `make docs`; do not edit by hand.\n"


def values_table() -> str:
    """The table of every documented value: key, default, description."""
    rows = [
        f"| `{value.path}` | {f'`{value.default}`' if value.default else ''} | {value.comment} |"
        for value in documented_values(VALUES.read_text())
    ]
    return "\n".join(["| key | default | description |", "|---|---|---|", *rows]) + "\n"


def readme_text() -> str:
    """helm/tickgate/README.md: a head, then the values table."""
    return README_HEAD + TABLE_NOTE + "\n" + values_table()


def kubernetes_page() -> str:
    """docs/kubernetes.md with the values table between its markers; the rest as written."""
    page = KUBERNETES_PAGE.read_text()
    head, rest = page.split(VALUES_BEGIN, 1)
    tail = rest.split(VALUES_END, 1)[1]
    table = f"{VALUES_BEGIN}\n<!-- {TABLE_NOTE.strip()} -->\n\n{values_table()}{VALUES_END}"
    return head + table + tail
