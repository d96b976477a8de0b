"""`tickgate jobs ...` as a subprocess against a real `tickgate serve`, plus its pure parts."""

import asyncio
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
import yaml

from service.client.commands import job_list, load_document, schedule_summary
from service.client.http import JobFilter, Page, TickgateClient, collect
from tests.support.db import TemplateDatabases, with_database
from tests.support.processes import free_port, serve

pytestmark = pytest.mark.acceptance

NEVER = {"kind": "cron", "expression": "0 0 1 1 *"}  # midnight on New Year's Day
LOG = {"task": "log", "args": {"message": "hi"}}
UUID_PATTERN = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


@pytest.fixture(scope="module")
def url(templates: TemplateDatabases, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One server for the module, on a database of its own; tests use distinct job names."""
    database = asyncio.run(templates.clone())
    try:
        database_url = with_database(templates.server_url, database)
        with serve(tmp_path_factory.mktemp("cli-server"), database_url=database_url) as replica:
            yield replica.url
    finally:
        asyncio.run(templates.drop(database))


def tickgate(url: str, *args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    """`tickgate jobs ARGS` with TICKGATE_URL=url; never a traceback, whatever the outcome."""
    done = subprocess.run(
        [sys.executable, "-m", "service.client", "jobs", *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=os.environ | {"TICKGATE_URL": url},
        timeout=60,
        check=False,
    )
    assert "Traceback" not in done.stderr, done.stderr
    return done


def ok(url: str, *args: str, stdin: str | None = None) -> str:
    done = tickgate(url, *args, stdin=stdin)
    assert done.returncode == 0, f"exit {done.returncode}: {done.stderr}"
    return done.stdout


def as_json(url: str, *args: str) -> dict[str, object]:
    document = json.loads(ok(url, *args, "--json"))
    assert isinstance(document, dict)
    return document


def job(name: str, **fields: object) -> dict[str, object]:
    return {"name": name, "schedule": NEVER} | LOG | fields


def write_jobs(path: Path, *jobs: dict[str, object]) -> Path:
    path.write_text(yaml.safe_dump({"jobs": list(jobs)}, sort_keys=False))
    return path


def outcomes(stdout: str) -> dict[str, str]:
    return dict(line.split(": ", 1) for line in stdout.splitlines() if ": " in line)


def names_of(document: dict[str, object], key: str = "name") -> list[str]:
    items = document["items"]
    assert isinstance(items, list)
    return [item[key] for item in items]


def created(url: str, tmp_path: Path, *jobs: dict[str, object]) -> None:
    stdout = ok(url, "apply", "-f", str(write_jobs(tmp_path / "jobs.yaml", *jobs)))
    assert set(outcomes(stdout).values()) == {"created"}, stdout


# Against a running server


def test_apply_creates_then_is_unchanged_then_updates_one(url: str, tmp_path: Path) -> None:
    jobs = [job("apply-a"), job("apply-b", timezone="Europe/Kyiv"), job("apply-c")]
    path = write_jobs(tmp_path / "jobs.yaml", *jobs)
    assert outcomes(ok(url, "apply", "-f", str(path))) == dict.fromkeys(
        ["apply-a", "apply-b", "apply-c"], "created"
    )
    assert set(outcomes(ok(url, "apply", "-f", str(path))).values()) == {"unchanged"}

    jobs[1] = job("apply-b", timezone="Europe/Kyiv", description="now described")
    write_jobs(path, *jobs)
    assert outcomes(ok(url, "apply", "-f", str(path))) == {
        "apply-a": "unchanged",
        "apply-b": "updated",
        "apply-c": "unchanged",
    }
    assert as_json(url, "get", "apply-b")["version"] == 2
    assert as_json(url, "get", "apply-a")["version"] == 1


def test_apply_reads_a_json_list_from_stdin(url: str) -> None:
    stdin = json.dumps([job("stdin-a"), job("stdin-b")])
    assert outcomes(ok(url, "apply", "-f", "-", stdin=stdin)) == {
        "stdin-a": "created",
        "stdin-b": "created",
    }


def test_apply_with_bad_jobs_names_each_and_applies_none(url: str, tmp_path: Path) -> None:
    bad_cron = job("partial-bad", schedule={"kind": "cron", "expression": "nope"})
    bad_zone = job("partial-zone", timezone="Mars/Olympus")
    path = write_jobs(tmp_path / "jobs.yaml", job("partial-good"), bad_cron, bad_zone)
    done = tickgate(url, "apply", "-f", str(path))
    assert done.returncode == 1
    assert done.stdout == ""
    problems = [line for line in done.stderr.splitlines() if "body.jobs." in line]
    assert len(problems) == 2, done.stderr
    assert "body.jobs.1.schedule" in problems[0]
    assert "job 'partial-bad'" in problems[0]
    assert '"nope"' in problems[0]
    assert "body.jobs.2.timezone" in problems[1]
    assert "job 'partial-zone'" in problems[1]
    assert tickgate(url, "get", "partial-good").returncode == 1


def test_apply_prune_deletes_only_the_managers_jobs_the_file_omits(
    url: str, tmp_path: Path
) -> None:
    path = write_jobs(tmp_path / "jobs.yaml", job("gitops-a"), job("gitops-b"))
    ok(url, "apply", "-f", str(path), "--managed-by", "gitops")
    ok(url, "apply", "-f", str(write_jobs(tmp_path / "other.yaml", job("other-c"))))
    write_jobs(path, job("gitops-a"), job("gitops-new"))
    pruned = ok(url, "apply", "-f", str(path), "--managed-by", "gitops", "--prune")
    assert outcomes(pruned) == {
        "gitops-a": "unchanged",
        "gitops-new": "created",
        "gitops-b": "deleted",
    }
    assert "1 created, 0 updated, 1 unchanged, 1 deleted" in pruned
    assert tickgate(url, "get", "gitops-b").returncode == 1
    assert as_json(url, "get", "other-c")["managed_by"] is None
    assert as_json(url, "get", "gitops-new")["managed_by"] == "gitops"
    document = json.loads(
        ok(url, "apply", "-f", str(path), "--managed-by", "gitops", "--prune", "--json")
    )
    assert document["unchanged"] == 2
    assert document["deleted"] == 0


def test_apply_prune_without_a_manager_is_a_usage_error(url: str, tmp_path: Path) -> None:
    path = write_jobs(tmp_path / "jobs.yaml", job("unpruned"))
    done = tickgate(url, "apply", "-f", str(path), "--prune")
    assert done.returncode == 2
    assert "--managed-by" in done.stderr
    assert tickgate(url, "get", "unpruned").returncode == 1


def test_list_shows_a_table_and_json_has_the_items(url: str, tmp_path: Path) -> None:
    daily = {"kind": "daily", "at": ["03:00"]}
    interval = {"kind": "interval", "every_seconds": 86_400}
    created(
        url,
        tmp_path,
        job("list-a"),
        job("list-b", schedule=daily, timezone="Europe/Kyiv"),
        job("list-c", schedule=interval),
    )
    table = ok(url, "list", "--prefix", "list-")
    for text in ("list-a", "list-b", "list-c", "cron 0 0 1 1 *", "daily 03:00 every 1d"):
        assert text in table
    assert "every 86400s" in table
    assert "Europe/Kyiv" in table

    document = as_json(url, "list", "--prefix", "list-")
    assert names_of(document) == ["list-a", "list-b", "list-c"]
    assert document["next_cursor"] is None
    first = as_json(url, "list", "--prefix", "list-", "--limit", "2")
    assert names_of(first) == ["list-a", "list-b"]
    assert first["next_cursor"] is not None
    assert "raise --limit" in ok(url, "list", "--prefix", "list-", "--limit", "1")


def test_get_shows_the_fields_and_last_run(url: str, tmp_path: Path) -> None:
    created(url, tmp_path, job("get-me", timezone="Europe/Kyiv", description="about me"))
    shown = ok(url, "get", "get-me")
    for text in ("get-me", "cron 0 0 1 1 *", "Europe/Kyiv", "about me", '{"message":"hi"}'):
        assert text in shown
    assert "last run: none" in shown
    assert as_json(url, "get", "get-me")["timezone"] == "Europe/Kyiv"


def test_pause_and_resume_show_the_state(url: str, tmp_path: Path) -> None:
    created(url, tmp_path, job("pausable"))
    assert "state paused" in ok(url, "pause", "pausable")
    assert "paused" in ok(url, "list", "--state", "paused", "--prefix", "pausable")
    assert as_json(url, "get", "pausable")["next_run_at"] is None
    assert "state active" in ok(url, "resume", "pausable")
    assert as_json(url, "get", "pausable")["state"] == "active"


def test_trigger_prints_the_run_and_runs_lists_it(url: str, tmp_path: Path) -> None:
    created(url, tmp_path, job("triggered"))
    printed = ok(url, "trigger", "triggered")
    match = UUID_PATTERN.search(printed)
    assert match, printed
    run_id = match.group()
    runs = as_json(url, "runs", "triggered")
    assert names_of(runs, key="id") == [run_id]
    table = ok(url, "runs", "triggered")
    assert run_id in table
    assert "manual" in table


def test_runs_without_a_name_lists_every_jobs_runs_newest_first(url: str, tmp_path: Path) -> None:
    created(url, tmp_path, job("across-a"), job("across-b"))
    triggered = [ok(url, "trigger", name) for name in ("across-a", "across-b")]
    ids = [match.group() for match in map(UUID_PATTERN.search, triggered) if match]
    runs = as_json(url, "runs", "--limit", "2")
    assert names_of(runs, key="id") == ids[::-1]
    table = ok(url, "runs", "--limit", "2")
    assert [name for name in ("across-a", "across-b") if name in table] == ["across-a", "across-b"]
    failed = as_json(url, "runs", "--status", "failed")
    assert names_of(failed, key="id") == []


def test_delete_then_get_is_no_job_named(url: str, tmp_path: Path) -> None:
    created(url, tmp_path, job("doomed"))
    assert "deleted" in ok(url, "delete", "doomed")
    done = tickgate(url, "get", "doomed")
    assert done.returncode == 1
    assert "no job named 'doomed'" in done.stderr
    assert done.stdout == ""
    assert tickgate(url, "delete", "doomed").returncode == 1


def test_create_with_a_bad_cron_prints_the_problem(url: str, tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text(
        json.dumps(job("bad-cron", schedule={"kind": "cron", "expression": "0 0 99 * *"}))
    )
    done = tickgate(url, "create", "-f", str(path))
    assert done.returncode == 1
    assert "422" in done.stderr
    problem = next(line for line in done.stderr.splitlines() if "expression" in line)
    assert "schedule" in problem
    assert '"0 0 99 * *"' in problem
    assert tickgate(url, "get", "bad-cron").returncode == 1


def test_create_then_create_again_is_a_conflict(url: str, tmp_path: Path) -> None:
    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job("twice")))
    assert "created job 'twice'" in ok(url, "create", "-f", str(path))
    done = tickgate(url, "create", "-f", str(path))
    assert done.returncode == 1
    assert "already exists" in done.stderr


def test_a_bad_input_file_is_a_usage_error(url: str, tmp_path: Path) -> None:
    missing = tickgate(url, "apply", "-f", str(tmp_path / "missing.yaml"))
    assert missing.returncode == 2
    assert "missing.yaml" in missing.stderr
    nameless = tickgate(url, "apply", "-f", "-", stdin="- {task: log}\n")
    assert nameless.returncode == 2
    assert "name" in nameless.stderr
    assert tickgate(url, "runs", "x", "--status", "bogus").returncode == 2


# Without a server


def test_an_unreachable_server_is_exit_3_naming_the_url() -> None:
    nowhere = f"http://127.0.0.1:{free_port()}"
    done = tickgate(nowhere, "list")
    assert done.returncode == 3
    assert nowhere in done.stderr
    flag = tickgate("http://unused.invalid", "get", "x", "--url", nowhere)
    assert flag.returncode == 3
    assert nowhere in flag.stderr


def test_yaml_times_and_instants_stay_strings(tmp_path: Path) -> None:
    path = tmp_path / "jobs.yaml"
    path.write_text(
        "- name: a\n  schedule: {kind: daily, at: [15:30, 03:00]}\n"
        "- name: b\n  schedule: {kind: once, at: 2030-01-01T10:00:00Z}\n  timeout_seconds: 60\n"
    )
    first, second = job_list(load_document(str(path)), str(path))
    assert first["schedule"] == {"kind": "daily", "at": ["15:30", "03:00"]}
    assert second["schedule"] == {"kind": "once", "at": "2030-01-01T10:00:00Z"}
    assert second["timeout_seconds"] == 60


def test_schedule_summaries() -> None:
    assert schedule_summary({"kind": "cron", "expression": "0 3 * * *"}) == "cron 0 3 * * *"
    assert schedule_summary({"kind": "interval", "every_seconds": 300}) == "every 300s"
    daily = {"kind": "daily", "every_days": 2, "at": ["03:00:00", "15:30:15"]}
    assert schedule_summary(daily) == "daily 03:00,15:30:15 every 2d"
    once = {"kind": "once", "at": "2026-12-01T08:00:00Z"}
    assert schedule_summary(once) == "once 2026-12-01T08:00:00Z"


def test_collect_follows_cursors_up_to_the_limit() -> None:
    names = [f"job-{index:04d}" for index in range(2500)]
    asked: list[int] = []

    def fetch(size: int, cursor: str | None) -> Page:
        asked.append(size)
        start = int(cursor or 0)
        items: list[dict[str, object]] = [{"name": n} for n in names[start : start + size]]
        more = start + size < len(names)
        return Page(items, str(start + size) if more else None)

    every = collect(fetch, None)
    assert [item["name"] for item in every.items] == names
    assert every.next_cursor is None
    assert asked == [1000, 1000, 1000]
    asked.clear()
    some = collect(fetch, 1500)
    assert len(some.items) == 1500
    assert some.next_cursor == "1500"
    assert asked == [1000, 500]


def test_client_sends_filters_and_follows_next_cursor() -> None:
    seen: list[httpx.QueryParams] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.params)
        if "cursor" not in request.url.params:
            return httpx.Response(200, json={"items": [{"name": "a"}], "next_cursor": "c1"})
        return httpx.Response(200, json={"items": [{"name": "b"}], "next_cursor": None})

    with TickgateClient("http://tickgate", transport=httpx.MockTransport(answer)) as client:
        page = client.all_jobs(JobFilter(state="paused", prefix="a"))
    assert [item["name"] for item in page.items] == ["a", "b"]
    assert seen[0] == httpx.QueryParams({"limit": "1000", "state": "paused", "prefix": "a"})
    assert seen[1]["cursor"] == "c1"
