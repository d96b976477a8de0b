"""`jobs:` in the chart's values takes what the API takes: values.schema.json's job
definition is generated from the API's own model of a job body, and every job example in
the docs passes both the chart's schema (checked by Helm) and the API's model."""

import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml
from pydantic import ValidationError

from service.api.models import JobCreate, JobOut
from tests.deploy import ROOT
from tests.deploy.chart import DSN, NAMESPACE, RELEASE, Manifests, only
from tools import chartgen

DOCUMENTS = sorted(
    [ROOT / "README.md", *ROOT.glob("docs/**/*.md"), *ROOT.glob("examples/*/README.md")]
)
# A curl command up to its `-d '<body>'`, over `\` continuations and quoted words.
CURL = re.compile(r"curl\s(?P<head>(?:[^'\n]|'[^']*'|\\\n)*?)\s-d\s'(?P<body>[^']*)'")
FENCE = re.compile(r"^```(?P<language>\w*)\n(?P<body>.*?)^```", re.MULTILINE | re.DOTALL)
# What a shown job (GET /v1/jobs/{name}) has that a job body does not: computed by the server.
SHOWN_ONLY = frozenset(JobOut.model_fields) - frozenset(JobCreate.model_fields)

EVERY_FIELD: dict[str, Any] = {
    "name": "every-field",
    "description": "each field a POST /v1/jobs body may have",
    "schedule": {"kind": "daily", "every_days": 2, "at": ["03:00", "15:30:15"]},
    "timezone": "Europe/Kyiv",
    "task": "http",
    "args": {"url": "http://reports.internal/run", "method": "GET"},
    "overlap": "queue_one",
    "timeout_seconds": 120,
    "misfire_grace_seconds": 30,
    "retry": {
        "max_attempts": 5,
        "min_backoff_seconds": 1.5,
        "max_backoff_seconds": 60,
        "max_doublings": 3,
        "max_retry_seconds": 600,
    },
    "start_at": "2026-01-01T00:00:00Z",
    "end_at": "2027-01-01T00:00:00+02:00",
    "max_runs": 100,
    "jitter_seconds": 30,
    "catchup": "none",
    "managed_by": "helm:tickgate",
    "labels": {"team": "billing", "example.com/tier": "batch"},
    "capture": False,
    "hooks": [
        {
            "on": ["failure", "recovery"],
            "action": {"kind": "http", "args": {"url": "https://alerts.example.com/tg"}},
            "retry": {"max_attempts": 3},
        },
        {"on": ["success"], "action": {"kind": "trigger", "job": "next", "args": {"v": 2}}},
    ],
    "default_hooks": False,
}


def test_the_job_schema_is_generated_from_the_api_model() -> None:
    assert chartgen.SCHEMA.read_text() == chartgen.schema_text(), (
        "helm/tickgate/values.schema.json is stale: run `make docs`"
    )
    job = json.loads(chartgen.SCHEMA.read_text())["definitions"]["job"]
    assert set(job["properties"]) == set(JobCreate.model_fields)
    assert set(EVERY_FIELD) == set(JobCreate.model_fields)


def test_jobs_take_every_field_of_a_job_body(
    render: Callable[[dict[str, Any]], Manifests],
) -> None:
    """retry, start_at, end_at, max_runs, jitter_seconds and catchup were refused."""
    JobCreate.model_validate(EVERY_FIELD)
    manifests = render({"database": {"url": DSN}, "jobs": [EVERY_FIELD]})
    assert yaml.safe_load(only(manifests, "ConfigMap")["data"]["jobs.yaml"]) == [EVERY_FIELD]


@pytest.mark.parametrize(
    ("field", "bad", "where"),
    [
        ("retry", {"max_attempts": 21}, "/retry/max_attempts"),
        ("retry", {"attempts": 2}, "attempts"),
        ("max_runs", 0, "/max_runs"),
        ("jitter_seconds", 3601, "/jitter_seconds"),
        ("catchup", "all", "/catchup"),
        ("overlap", "queue", "/overlap"),
        ("schedule", {"kind": "daily", "at": ["3:00"]}, "/at/0"),
        ("labels", {"team": 7}, "/labels/team"),
    ],
)
def test_the_schema_refuses_what_the_api_refuses(
    helm: ModuleType, chart: Any, field: str, bad: object, where: str
) -> None:
    job = EVERY_FIELD | {field: bad}
    with pytest.raises(ValidationError):
        JobCreate.model_validate(job)
    with pytest.raises(helm.HelmValuesError, match=where):
        chart.validate_schema({"database": {"url": DSN}, "jobs": [job]})


# --- the examples in the docs --------------------------------------------------------------


def documented_jobs() -> Iterator[tuple[str, dict[str, Any]]]:
    """(where, job body) for every job example of the docs and of values.yaml's comments."""
    for document in DOCUMENTS:
        where = str(document.relative_to(ROOT))
        for number, fence in enumerate(FENCE.finditer(document.read_text())):
            for job in _jobs_in(fence["language"], fence["body"]):
                yield f"{where} block {number + 1} ({job.get('name')})", job
    for job in yaml.safe_load(_commented_example(chartgen.VALUES.read_text()))["jobs"]:
        yield f"values.yaml comment ({job['name']})", job


def _jobs_in(language: str, body: str) -> Iterator[dict[str, Any]]:
    if language == "yaml":
        for document in yaml.safe_load_all(body):
            if isinstance(document, dict) and isinstance(document.get("jobs"), list):
                yield from document["jobs"]
            elif isinstance(document, list):  # a jobs file, as `tickgate jobs apply` reads
                yield from (job for job in document if {"schedule", "task"} <= job.keys())
    elif language == "json":
        shown = json.loads(body)
        if {"schedule", "task"} <= shown.keys():
            yield {key: value for key, value in shown.items() if key not in SHOWN_ONLY}
    elif language in {"sh", "bash", "console"}:
        yield from _curl_bodies(body)


def _curl_bodies(script: str) -> Iterator[dict[str, Any]]:
    """The job bodies of the `curl ... /v1/jobs... -d '{...}'` commands of a shell block."""
    for command in CURL.finditer(script):
        url = re.search(r"/v1/jobs(?P<path>[^\s'?]*)", command["head"])
        if url is None:
            continue
        sent = json.loads(command["body"])
        path = url["path"]
        if path == "" and "jobs" in sent:
            yield from sent["jobs"]
        elif path == "":
            yield sent
        elif path.count("/") == 1:
            yield {"name": path.strip("/")} | sent


def _commented_example(values: str) -> str:
    """The example under `jobs:` in values.yaml's comments, uncommented."""
    block = values.split("\n#   jobs:\n", 1)[1].split("\njobs:", 1)[0]
    return "jobs:\n" + "\n".join(line.removeprefix("#   ") for line in block.splitlines())


def test_the_docs_have_job_examples() -> None:
    found = list(documented_jobs())
    assert len(found) >= 8, found
    assert any(where.startswith("docs/kubernetes.md") for where, _ in found)
    # The fields the chart used to refuse are shown in use somewhere.
    shown = set().union(*(job.keys() for _, job in found))
    assert {"retry", "start_at", "end_at", "max_runs", "jitter_seconds", "catchup"} <= shown


@pytest.mark.parametrize(("where", "job"), list(documented_jobs()))
def test_each_documented_job_passes_the_chart_schema_and_the_api_model(
    chart: Any, where: str, job: dict[str, Any]
) -> None:
    JobCreate.model_validate(job)
    chart.validate_schema({"database": {"url": DSN}, "jobs": [job]})


def test_helm_template_takes_every_documented_job(chart: Any, tmp_path: Path) -> None:
    """All of them at once in `jobs:` (renamed, since examples reuse names): rendered into
    the ConfigMap, read back by the service's loader as the same bodies."""
    from service.api.declarative import load_job_file

    jobs = [job | {"name": f"ex{n}"} for n, (_, job) in enumerate(documented_jobs())]
    files = chart.render(
        {"database": {"url": DSN}, "jobs": jobs}, name=RELEASE, namespace=NAMESPACE
    )
    config_map = yaml.safe_load(files["tickgate/templates/configmap-jobs.yaml"])
    rendered = tmp_path / "jobs.yaml"
    rendered.write_text(config_map["data"]["jobs.yaml"])
    assert load_job_file(rendered) == jobs
