"""`tickgate jobs export` against a real server: a file `apply` takes back unchanged."""

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from harness.cluster import serve
from harness.receiver import Receiver, receiving
from harness.waiting import eventually
from service.jobfile import parse_document
from tests.support.db import TemplateDatabases

SECRET = "Bearer hunter2"


@pytest.fixture(scope="module")
def hooks() -> Iterator[Receiver]:
    with receiving() as receiver:
        yield receiver


@pytest.fixture(scope="module")
def url(templates: TemplateDatabases, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A server of its own: `export` without filters sees only this module's jobs."""
    with (
        templates.cloned_url() as database_url,
        serve(tmp_path_factory.mktemp("export-server"), database_url=database_url) as replica,
    ):
        yield replica.url


def tickgate(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "service.client", "jobs", *args],
        capture_output=True,
        text=True,
        env=os.environ | {"TICKGATE_URL": url},
        timeout=60,
        check=False,
    )
    assert "Traceback" not in done.stderr, done.stderr
    return done


def ok(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    done = tickgate(url, *args)
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr}"
    return done


def outcomes(stdout: str) -> dict[str, str]:
    return dict(line.split(": ", 1) for line in stdout.splitlines() if ": " in line)


def every_kind(hook_url: str) -> list[dict[str, object]]:
    """A job of each schedule kind, and of every declared field set to a non-default."""
    return [
        {
            "name": "rt-cron",
            "description": "weekdays in Kyiv",
            "schedule": {"kind": "cron", "expression": "30  9 * * MON-FRI"},
            "timezone": "Europe/Kyiv",
            "task": "log",
            "args": {"message": "stand-up", "level": "warning"},
            "overlap": "allow",
            "timeout_seconds": 120,
            "misfire_grace_seconds": 5,
            "retry": {"max_attempts": 3, "min_backoff_seconds": 2.5, "max_doublings": 2},
            "jitter_seconds": 30,
            "catchup": "none",
        },
        {
            "name": "rt-interval",
            "schedule": {"kind": "interval", "every_seconds": 3600},
            "task": "log",
            "args": {"message": "hourly"},
            "overlap": "queue_one",
            "start_at": "2030-01-01T00:00:00+02:00",
            "end_at": "2031-01-01T00:00:00Z",
            "max_runs": 50,
        },
        {
            "name": "rt-daily",
            "schedule": {"kind": "daily", "at": ["15:30", "03:00:15"], "every_days": 2},
            "timezone": "America/New_York",
            "task": "log",
            "args": {"message": "twice"},
            "retry": {"max_attempts": 2, "max_retry_seconds": 600},
        },
        {
            "name": "rt-once",
            "schedule": {"kind": "once", "at": "2031-06-01T12:00:00"},
            "timezone": "Asia/Tokyo",
            "task": "log",
            "args": {"message": "once"},
        },
        {
            "name": "rt-hook",
            "schedule": {"kind": "cron", "expression": "0 0 1 1 *"},
            "task": "http",
            "args": {
                "url": hook_url,
                "method": "PUT",
                "headers": {"Authorization": SECRET, "X-Plain": "visible"},
                "secret_headers": ["authorization"],
                "body": {"nested": [1, 2.5, None, {"deep": True}]},
                "success_status": [200, 204],
            },
            "managed_by": "gitops",
        },
        {
            "name": "rt-done",
            "schedule": {"kind": "cron", "expression": "* * * * * *"},
            "task": "log",
            "args": {"message": "once only"},
            "max_runs": 1,
        },
    ]


def test_export_then_apply_reports_every_job_unchanged(
    url: str, hooks: Receiver, tmp_path: Path
) -> None:
    source = tmp_path / "jobs.yaml"
    source.write_text(yaml.safe_dump({"jobs": every_kind(hooks.url_for("/rt"))}))
    assert set(outcomes(ok(url, "apply", "-f", str(source)).stdout).values()) == {"created"}
    ok(url, "pause", "rt-daily")
    eventually(lambda: state_of(url, "rt-done") == "completed", 60, "rt-done to complete")
    versions = {job["name"]: job["version"] for job in listed(url)}

    exported = tmp_path / "exported.yaml"
    done = ok(url, "export", "-o", str(exported))
    assert done.stdout == ""
    document = parse_document(exported.read_text())
    assert isinstance(document, dict)
    assert [job["name"] for job in document["jobs"]] == sorted(versions)
    assert "version" not in document["jobs"][0]
    assert "lock_key" not in document["jobs"][0]
    applied = ok(url, "apply", "-f", str(exported)).stdout
    assert outcomes(applied) == dict.fromkeys(sorted(versions), "unchanged"), applied

    as_json = tmp_path / "exported.json"
    ok(url, "export", "--format", "json", "-o", str(as_json))
    assert json.loads(as_json.read_text()) == document
    assert json.loads(ok(url, "export", "--json").stdout) == document
    assert parse_document(ok(url, "export").stdout) == document
    assert set(outcomes(ok(url, "apply", "-f", str(as_json)).stdout).values()) == {"unchanged"}
    assert {job["name"]: job["version"] for job in listed(url)} == versions
    assert state_of(url, "rt-daily") == "paused"
    assert state_of(url, "rt-done") == "completed"


def test_export_filters_by_prefix_manager_and_state(url: str, tmp_path: Path) -> None:
    jobs = [
        {"name": f"flt-{n}", "schedule": {"kind": "interval", "every_seconds": 60}, "task": "log"}
        | {"args": {"message": n}}
        for n in ("a", "b", "c")
    ]
    source = tmp_path / "jobs.yaml"
    source.write_text(yaml.safe_dump(jobs[:2]))
    ok(url, "apply", "-f", str(source), "--managed-by", "team-x")
    source.write_text(yaml.safe_dump(jobs[2:]))
    ok(url, "apply", "-f", str(source))
    ok(url, "pause", "flt-b")

    def names(*filters: str) -> list[str]:
        document = parse_document(ok(url, "export", "--prefix", "flt-", *filters).stdout)
        assert isinstance(document, dict)
        return [job["name"] for job in document["jobs"]]

    assert names() == ["flt-a", "flt-b", "flt-c"]
    assert names("--managed-by", "team-x") == ["flt-a", "flt-b"]
    assert names("--state", "paused") == ["flt-b"]
    assert names("--managed-by", "nobody") == []


def test_secret_headers_are_exported_masked_said_so_and_kept_by_apply(
    url: str, hooks: Receiver, tmp_path: Path
) -> None:
    [hook] = [job for job in every_kind(hooks.url_for("/secret")) if job["task"] == "http"]
    job = hook | {"name": "sec-hook"}
    source = tmp_path / "jobs.yaml"
    source.write_text(yaml.safe_dump([job]))
    ok(url, "apply", "-f", str(source), "--managed-by", "gitops")

    exported = tmp_path / "exported.yaml"
    done = ok(url, "export", "--prefix", "sec-", "-o", str(exported))
    assert SECRET not in exported.read_text()
    [note] = [line for line in done.stderr.splitlines() if "secret header" in line]
    assert "'sec-hook'" in note
    assert "'Authorization'" in note
    assert "***" in note
    assert outcomes(ok(url, "apply", "-f", str(exported)).stdout) == {"sec-hook": "unchanged"}

    # Applied back, the mask kept the stored secret: the request still carries it.
    ok(url, "trigger", "sec-hook")
    eventually(lambda: bool(hooks.receipts("sec-hook")), 30, "the triggered request")
    assert hooks.receipts("sec-hook")[0].headers["authorization"] == SECRET

    # Where nothing is stored, the mask is refused, naming the job: no job without its secret.
    ok(url, "delete", "sec-hook")
    refused = tickgate(url, "apply", "-f", str(exported))
    assert refused.returncode == 1
    assert "sec-hook" in refused.stderr
    assert "***" in refused.stderr
    assert tickgate(url, "get", "sec-hook").returncode == 1


def listed(url: str) -> list[dict[str, object]]:
    document = json.loads(ok(url, "list", "--json").stdout)
    items: list[dict[str, object]] = document["items"]
    return items


def state_of(url: str, name: str) -> object:
    return next(job["state"] for job in listed(url) if job["name"] == name)
