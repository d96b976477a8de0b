"""`tickgate jobs ...` as a subprocess against a real `tickgate serve`, plus its pure parts."""

import getpass
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

from harness.cluster import serve
from harness.receiver import Receiver
from harness.replicas import TICKGATE, free_port
from harness.waiting import eventually
from service.client.commands import (
    describe_api_error,
    describe_problem,
    job_list,
    load_document,
    schedule_summary,
)
from service.client.http import ApiError, JobFilter, Page, TickgateClient, collect
from tests.support.db import TemplateDatabases

NEVER = {"kind": "cron", "expression": "0 0 1 1 *"}  # midnight on New Year's Day
LOG = {"task": "log", "args": {"message": "hi"}}
UUID_PATTERN = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


@pytest.fixture(scope="module")
def url(templates: TemplateDatabases, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One server for the module, on a database of its own; tests use distinct job names."""
    with (
        templates.cloned_url() as database_url,
        serve(tmp_path_factory.mktemp("cli-server"), database_url=database_url) as replica,
    ):
        yield replica.url


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


def ok_main(*args: str) -> str:
    """`tickgate ARGS`, the installed command itself."""
    done = subprocess.run(
        [TICKGATE, *args], capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


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


def test_labels_filter_the_list_and_scope_a_prune(url: str, tmp_path: Path) -> None:
    billing = {"team": "billing"}
    path = write_jobs(
        tmp_path / "jobs.yaml",
        job("lab-keep", labels=billing),
        job("lab-drop", labels=billing),
        job("lab-other", labels={"team": "search"}),
    )
    ok(url, "apply", "-f", str(path))
    listed = json.loads(ok(url, "list", "--label", "team=billing", "--json"))
    assert [item["name"] for item in listed["items"]] == ["lab-drop", "lab-keep"]
    both = tickgate(url, "list", "--label", "team=billing", "--label", "team=search")
    assert both.returncode == 1
    assert "two values" in both.stderr

    write_jobs(path, job("lab-keep", labels=billing))
    pruned = ok(url, "apply", "-f", str(path), "--label", "team=billing", "--prune")
    assert outcomes(pruned) == {"lab-keep": "unchanged", "lab-drop": "deleted"}
    assert tickgate(url, "get", "lab-other").returncode == 0


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


def test_trigger_with_args_runs_with_them_and_bad_args_are_refused(
    url: str, tmp_path: Path
) -> None:
    created(url, tmp_path, job("with-args"))
    run = as_json(
        url, "trigger", "with-args", "--args", "{message: louder, level: warning}", "--note", "why"
    )
    assert (run["args"], run["note"]) == ({"message": "louder", "level": "warning"}, "why")
    refused = tickgate(url, "trigger", "with-args", "--args", '{"message": "x", "level": "loud"}')
    assert refused.returncode == 1, refused.stderr
    assert "args.level" in refused.stderr or "args/level" in refused.stderr, refused.stderr
    usage = tickgate(url, "trigger", "with-args", "--args", "[1, 2]")
    assert usage.returncode == 2, usage.stderr
    assert "--args: expected a mapping" in usage.stderr
    assert names_of(as_json(url, "runs", "with-args"), key="id") == [run["id"]]


def test_runs_cancel_stops_a_hung_run_saying_who_and_why(
    url: str, tmp_path: Path, receiver: Receiver
) -> None:
    hung = {"task": "http", "args": {"url": receiver.url_for("/cli-hung", seconds=30)}}
    created(url, tmp_path, job("cli-hung", **hung))
    run_id = str(as_json(url, "trigger", "cli-hung")["id"])
    assert "stopping it" in ok(url, "runs", "cancel", run_id, "--reason", "stuck")

    def ended() -> dict[str, object] | None:
        run = as_json(url, "runs", "get", run_id)
        return run if run["status"] != "running" else None

    run = eventually(ended, 30, "the cancelled run to end")
    assert run is not None
    assert run["status"] == "cancelled", run["error"]
    assert str(run["error"]).startswith(f"cancelled by {getpass.getuser()} (127.0.0.1")
    assert str(run["error"]).endswith(": stuck")
    again = tickgate(url, "runs", "cancel", run_id)
    assert again.returncode == 1
    assert "the run has ended already: cancelled" in again.stderr
    nothing = tickgate(url, "cancel-queued", "cli-hung")
    assert nothing.returncode == 1
    assert "no tick of 'cli-hung' is waiting" in nothing.stderr


def test_patch_hook_sets_the_jobs_hooks_and_a_bad_one_is_refused(
    url: str, tmp_path: Path, receiver: Receiver
) -> None:
    created(url, tmp_path, job("hooked"), job("hook-target"))
    alert = f"failure,recovery=http:{receiver.url_for('/cli-alerts')}"
    patched = as_json(
        url, "patch", "hooked", "--hook", alert, "--hook", "success=trigger:hook-target"
    )
    assert patched["hooks"] == [
        {
            "on": ["failure", "recovery"],
            "action": {"kind": "http", "args": {"url": receiver.url_for("/cli-alerts")}},
            "retry": patched["hooks"][0]["retry"],
        },
        {
            "on": ["success"],
            "action": {"kind": "trigger", "job": "hook-target", "args": None},
            "retry": patched["hooks"][1]["retry"],
        },
    ]
    run_id = str(as_json(url, "trigger", "hooked")["id"])

    def delivered() -> str | None:
        shown = ok(url, "runs", "hooks", run_id)
        return shown if "success hook 1: delivered after 1 attempts" in shown else None

    assert eventually(delivered, 30, "the chain hook's delivery")
    unknown = tickgate(url, "patch", "hooked", "--hook", "success=trigger:nobody")
    assert unknown.returncode == 1
    assert "no job of this name to trigger" in unknown.stderr
    malformed = tickgate(url, "patch", "hooked", "--hook", "success=mail:ops")
    assert malformed.returncode == 2
    assert "expected EVENTS=http:URL or EVENTS=trigger:JOB" in malformed.stderr


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


# The commands of issue #15


def versions(url: str, *names: str) -> dict[str, object]:
    return {name: as_json(url, "get", name)["version"] for name in names}


def test_apply_dry_run_changes_nothing_and_says_what_apply_then_does(
    url: str, tmp_path: Path
) -> None:
    path = write_jobs(tmp_path / "jobs.yaml", job("dry-a"), job("dry-b"), job("dry-c"))
    ok(url, "apply", "-f", str(path), "--managed-by", "dry")
    before = versions(url, "dry-a", "dry-b", "dry-c")
    write_jobs(path, job("dry-a"), job("dry-b", description="changed"), job("dry-new"))
    flags = ("-f", str(path), "--managed-by", "dry", "--prune")

    planned = ok(url, "apply", *flags, "--dry-run")
    assert "(a dry run; nothing changed)" in planned
    assert versions(url, "dry-a", "dry-b", "dry-c") == before
    assert tickgate(url, "get", "dry-new").returncode == 1
    planned_json = json.loads(ok(url, "apply", *flags, "--dry-run", "--json"))

    applied = ok(url, "apply", *flags)
    assert (
        outcomes(applied)
        == outcomes(planned)
        == {
            "dry-a": "unchanged",
            "dry-b": "updated",
            "dry-new": "created",
            "dry-c": "deleted",
        }
    )
    assert json.loads(ok(url, "apply", *flags, "--json")) != planned_json  # now unchanged
    assert versions(url, "dry-a", "dry-b") == {"dry-a": 1, "dry-b": 2}


def test_apply_dry_run_of_a_bad_set_fails_as_the_apply_would(url: str, tmp_path: Path) -> None:
    bad = job("dry-bad", schedule={"kind": "cron", "expression": "61 * * * *"})
    path = write_jobs(tmp_path / "jobs.yaml", job("dry-fine"), bad)
    done = tickgate(url, "apply", "-f", str(path), "--dry-run")
    assert done.returncode == 1
    assert "job 'dry-bad'" in done.stderr
    assert tickgate(url, "get", "dry-fine").returncode == 1


def test_apply_diff_shows_each_change_then_applies_only_with_yes(url: str, tmp_path: Path) -> None:
    daily = {"kind": "daily", "at": ["03:00"]}
    path = write_jobs(
        tmp_path / "jobs.yaml",
        job("diff-same", schedule=daily, retry={"max_attempts": 2}),
        job("diff-changed", timezone="Europe/Kyiv"),
        job("diff-gone"),
    )
    ok(url, "apply", "-f", str(path), "--managed-by", "diffs")
    write_jobs(
        path,
        job("diff-same", schedule={"kind": "daily", "at": ["03:00:00"], "every_days": 1})
        | {"retry": {"max_attempts": 2, "min_backoff_seconds": 5.0}},
        job(
            "diff-changed",
            timezone="Europe/Kyiv",
            args={"message": "changed"},
            schedule={"kind": "cron", "expression": "0  0 1 1  *"},
            retry={"min_backoff_seconds": 5.0},
            overlap="skip",
            description="",
        ),
        job("diff-new"),
    )
    flags = ("-f", str(path), "--managed-by", "diffs", "--prune")

    shown = ok(url, "apply", *flags, "--diff")
    assert "--- diff-changed (server)" in shown
    assert f"+++ diff-changed ({path})" in shown
    changed = shown[shown.index("--- diff-changed") : shown.index("--- diff-new")]
    edits = (line for line in changed.splitlines() if not line.startswith(("---", "+++")))
    lines = [line for line in edits if line.startswith(("-", "+"))]
    assert lines == ["-  message: hi", "+  message: changed"]  # defaults and spellings aside
    assert "+name: diff-new\n" in shown
    assert "-name: diff-gone\n" in shown
    assert "diff-same (server)" not in shown  # spelt otherwise, applied the same
    assert "1 created, 1 updated, 1 unchanged, 1 deleted (a dry run; nothing changed)" in shown
    assert as_json(url, "get", "diff-changed")["version"] == 1
    document = json.loads(ok(url, "apply", *flags, "--diff", "--json"))
    assert sorted(document["diffs"]) == ["diff-changed", "diff-gone", "diff-new"]
    assert document["updated"] == 1

    applied = ok(url, "apply", *flags, "--diff", "--yes")
    assert "+  message: changed" in applied
    assert "dry run" not in applied
    assert as_json(url, "get", "diff-changed")["version"] == 2
    assert tickgate(url, "get", "diff-gone").returncode == 1


def test_apply_diff_of_many_jobs_reads_them_by_listing(url: str, tmp_path: Path) -> None:
    names = [f"many-{index:02d}" for index in range(25)]
    path = write_jobs(tmp_path / "jobs.yaml", *(job(name) for name in names))
    ok(url, "apply", "-f", str(path))
    write_jobs(path, *(job(name, description=f"now {name}") for name in names))
    document = json.loads(ok(url, "apply", "-f", str(path), "--diff", "--json"))
    assert sorted(document["diffs"]) == names
    assert all(f"+description: now {n}" in diff for n, diff in document["diffs"].items())
    assert tickgate(url, "apply", "-f", str(path), "--yes").returncode == 2


def test_patch_merges_a_file_and_typed_sets(url: str, tmp_path: Path) -> None:
    created(url, tmp_path, job("patched", max_runs=5, retry={"max_attempts": 3}))
    patch = tmp_path / "patch.yaml"
    patch.write_text("description: from the file\nargs: {message: filed}\n")
    printed = ok(
        url,
        "patch",
        "patched",
        "-f",
        str(patch),
        "--set",
        "retry.min_backoff_seconds=7.5",
        "--set",
        "max_runs=null",
        "--set",
        "schedule={kind: daily, at: [15:30]}",
        "--set",
        "timeout_seconds=30",
    )
    assert "patched job 'patched': version 2" in printed
    shown = as_json(url, "get", "patched")
    assert shown["description"] == "from the file"
    assert shown["args"] == {"message": "filed"}
    assert shown["retry"]["max_attempts"] == 3  # merged, not replaced
    assert shown["retry"]["min_backoff_seconds"] == 7.5
    assert shown["max_runs"] is None
    assert shown["schedule"]["at"] == ["15:30:00"]
    assert shown["timeout_seconds"] == 30
    assert as_json(url, "patch", "patched", "--set", "description=")["description"] == ""
    nothing = tickgate(url, "patch", "patched")
    assert nothing.returncode == 2
    assert "--set" in nothing.stderr
    assert tickgate(url, "patch", "patched", "--set", "novalue").returncode == 2
    refused = tickgate(url, "patch", "patched", "--set", "timeout_seconds=-1")
    assert refused.returncode == 1
    assert "timeout_seconds" in refused.stderr


def test_backfill_runs_the_missed_ticks_once(url: str, tmp_path: Path) -> None:
    created(url, tmp_path, job("backfilled", schedule={"kind": "daily", "at": ["03:00"]}))
    window = ("--from", "2026-01-01T00:00:00Z", "--to", "2026-01-04T00:00:00Z")
    printed = ok(url, "backfill", "backfilled", *window)
    assert "backfilled job 'backfilled': 3 runs" in printed
    assert "2026-01-02T03:00:00Z" in printed
    assert "backfill" in printed
    assert as_json(url, "backfill", "backfilled", *window)["items"] == []
    runs = as_json(url, "runs", "backfilled")
    assert len(names_of(runs, key="id")) == 3
    future = tickgate(url, "backfill", "backfilled", "--from", "2026-01-01T00:00:00Z")
    assert future.returncode == 2  # --to is required


def test_runs_get_shows_one_run_and_each_attempt(
    url: str, tmp_path: Path, receiver: Receiver
) -> None:
    receiver.respond("/cli-flaky", status=503)
    retry = {"max_attempts": 2, "min_backoff_seconds": 0.1}
    flaky = {"task": "http", "args": {"url": receiver.url_for("/cli-flaky")}, "retry": retry}
    created(url, tmp_path, job("one-run", **flaky))
    match = UUID_PATTERN.search(ok(url, "trigger", "one-run"))
    assert match
    run_id = match.group()
    eventually(lambda: as_json(url, "runs", "get", run_id)["status"] == "failed", 30, "the end")
    shown = ok(url, "runs", "get", run_id)
    assert f"run {run_id}" in shown
    assert "one-run" in shown
    for attempt in ("attempt 1", "attempt 2"):
        [line] = [line for line in shown.splitlines() if attempt in line]
        assert "failed" in line, shown
    assert as_json(url, "runs", "get", run_id)["id"] == run_id
    assert tickgate(url, "runs", "one-run", run_id).returncode == 2
    missing = tickgate(url, "runs", "get", "00000000-0000-0000-0000-000000000000")
    assert missing.returncode == 1


def test_preview_by_flags_or_file(url: str, tmp_path: Path) -> None:
    after = ("--after", "2026-03-07T00:00:00Z")
    new_york = ("--timezone", "America/New_York")
    daily = ok(url, "preview", "--daily", "03:00", "15:30", *new_york, *after)
    assert "daily 03:00,15:30 every 1d in America/New_York" in daily
    assert "2026-03-07T08:00:00Z" in daily  # 03:00 EST
    assert "2026-03-07T03:00:00-05:00 EST" in daily
    assert "2026-03-09T03:00:00-04:00 EDT" in daily  # after the spring change
    cron = as_json(url, "preview", "--cron", "0 12 * * *", "--count", "2", *after)
    assert cron["fire_times"] == ["2026-03-07T12:00:00Z", "2026-03-08T12:00:00Z"]
    every = as_json(url, "preview", "--every", "90", "--count", "3", *after)
    assert len(every["fire_times"]) == 3
    once = as_json(url, "preview", "--once", "2030-01-01T09:00:00", "--timezone", "Asia/Tokyo")
    assert once["fire_times"] == ["2030-01-01T00:00:00Z"]

    path = tmp_path / "job.yaml"
    path.write_text(yaml.safe_dump(job("previewed", timezone="Europe/Kyiv")))
    from_file = as_json(url, "preview", "-f", str(path), "--count", "1", *after)
    assert from_file["fire_times"] == ["2026-12-31T22:00:00Z"]  # midnight in Kyiv
    assert tickgate(url, "preview", "--cron", "* * * * *", "--every", "5").returncode == 2
    assert tickgate(url, "preview").returncode == 2
    assert tickgate(url, "preview", "--cron", "@daily", "--every-days", "2").returncode == 2
    bad = tickgate(url, "preview", "--cron", "0 0 99 * *")
    assert bad.returncode == 1
    assert "expression" in bad.stderr


def test_tasks_lists_each_task_and_its_args(url: str) -> None:
    shown = ok(url, "tasks")
    assert "log: Write a message to the service log" in shown
    assert "message*: string" in shown
    assert "level: debug|info|warning|error" in shown
    assert "url*: string" in shown
    names = [task["name"] for task in as_json(url, "tasks")["items"]]
    assert {"http", "log", "sql"} <= set(names)


def complete(comp_line: str, **env: str) -> list[str]:
    """argcomplete's protocol, as its shell code speaks it: `_ARGCOMPLETE`, `COMP_LINE`
    and `COMP_POINT` set, the words read from fd 8, separated by a vertical tab."""
    done = subprocess.run(
        ["bash", "-c", '"$@" 8>&1 1>/dev/null 2>/dev/null', "-", TICKGATE],
        capture_output=True,
        text=True,
        env=os.environ
        | env
        | {"_ARGCOMPLETE": "1", "COMP_LINE": comp_line, "COMP_POINT": str(len(comp_line))},
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return [word.strip() for word in done.stdout.split("\v") if word.strip()]


def test_completion_offers_the_actions_of_jobs() -> None:
    offered = complete("tickgate jobs ")
    assert {"list", "get", "apply", "patch", "export", "preview", "backfill", "tasks"} <= set(
        offered
    )
    assert complete("tickgate jobs ex") == ["export"]
    assert complete("tickgate jobs export --fo") == ["--format"]
    assert set(complete("tickgate jobs export --format ")) == {"yaml", "json"}
    assert "completion" in complete("tickgate ")


def test_completion_of_a_job_name_asks_the_server(url: str, tmp_path: Path) -> None:
    created(url, tmp_path, job("complete-alpha"), job("complete-beta"))
    assert complete("tickgate jobs get complete-", TICKGATE_URL=url) == [
        "complete-alpha",
        "complete-beta",
    ]
    nowhere = f"http://127.0.0.1:{free_port()}"
    assert complete("tickgate jobs get complete-", TICKGATE_URL=nowhere) == []


def test_the_printed_bash_code_completes_in_bash(url: str, tmp_path: Path) -> None:
    created(url, tmp_path, job("bashed"))
    script = """source <(tickgate completion bash)
COMP_LINE="tickgate jobs pause bas"; COMP_POINT=${#COMP_LINE}
COMP_WORDS=(tickgate jobs pause bas); COMP_CWORD=3
_python_argcomplete tickgate
printf '%s\\n' "${COMPREPLY[@]}"
"""
    path = f"{Path(TICKGATE).parent}:{os.environ.get('PATH', '')}"
    done = subprocess.run(
        ["bash", "-c", script],
        capture_output=True,
        text=True,
        env=os.environ | {"PATH": path, "TICKGATE_URL": url},
        timeout=60,
        check=False,
    )
    assert done.stdout.split() == ["bashed"], done.stderr
    assert "compdef tickgate" in ok_main("completion", "zsh")


def test_field_problems_read_from_a_fastapi_422_or_a_problem_document() -> None:
    entry = {"loc": ["body", "jobs", 1, "schedule"], "msg": "bad cron", "input": "nope"}
    problem = {"type": "about:blank", "title": "Unprocessable", "status": 422}
    answers = iter(
        [
            httpx.Response(422, json={"detail": [entry]}),
            httpx.Response(422, json=problem | {"detail": "1 problem", "errors": [entry]}),
            httpx.Response(
                422,
                json=problem | {"errors": [{"pointer": "/jobs/1/schedule", "detail": "bad"}]},
            ),
            httpx.Response(409, json=problem | {"detail": "job 'a' has the lock_key of 'b'"}),
        ]
    )

    def answer(request: httpx.Request) -> httpx.Response:
        return next(answers)

    seen: list[ApiError] = []
    with TickgateClient("http://tickgate", transport=httpx.MockTransport(answer)) as client:
        for _ in range(4):
            with pytest.raises(ApiError) as raised:
                client.get_job("a")
            seen.append(raised.value)
    fastapi, problem_json, pointer, conflict = seen
    assert describe_problem(fastapi.problems[0]) == (
        'body.jobs.1.schedule: bad cron (input: "nope")'
    )
    assert problem_json.problems == fastapi.problems
    assert describe_problem(pointer.problems[0]) == "jobs.1.schedule: bad"
    assert describe_api_error(conflict) == ["conflict: job 'a' has the lock_key of 'b'"]
