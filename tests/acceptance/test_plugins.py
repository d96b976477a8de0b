"""A plugin task end to end: the example package, really built and installed, run by real
`tickgate serve` replicas sharing one database.

The example is built by pip from a copy of examples/tickgate-example-tasks and installed
with `--target` into a folder of its own; replicas get that folder on PYTHONPATH, so they
see its dist-info (and so its `tickgate.tasks` entry points) while the venv and this test
process never do. Nothing outside the repository is needed beyond what pip can build with.
"""

import asyncio
import os
import shutil
import subprocess
import sys
import textwrap
from collections import Counter
from importlib import metadata
from pathlib import Path
from typing import Any

import httpx
import pytest

from harness.cluster import serve_many
from harness.replicas import Replica, start_replica
from harness.waiting import eventually
from tests.support.db import role_url

EXAMPLE = Path(__file__).parents[2] / "examples" / "tickgate-example-tasks"
EXAMPLE_MODULES = "tickgate_example_tasks.greet,tickgate_example_tasks.maintenance"
GREET_JOB: dict[str, Any] = {
    "schedule": {"kind": "cron", "expression": "* * * * * *"},
    "task": "greet",
    "args": {"greeting": "hello from a plugin", "times": 2},
}


def _can_build_wheels_offline() -> bool:
    """setuptools >= 70.1 builds wheels by itself (older ones need `wheel` as well)."""
    try:
        release = metadata.version("setuptools").split(".")
    except metadata.PackageNotFoundError:
        return False
    numbers = tuple(int(part) for part in release[:2] if part.isdigit())
    return numbers >= (70, 1) or _installed("wheel")


def _installed(distribution: str) -> bool:
    try:
        metadata.version(distribution)
    except metadata.PackageNotFoundError:
        return False
    return True


@pytest.fixture(scope="module")
def example_site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example plugin installed, non-editable and without dependencies, into a
    folder of its own. Built from a copy, so the checkout gets no build/ or egg-info.

    With setuptools able to build wheels in the venv the build is offline; otherwise pip
    builds in an isolated environment, fetching setuptools from the configured index."""
    workdir = tmp_path_factory.mktemp("example-plugin")
    source, site = workdir / "source", workdir / "site"
    shutil.copytree(
        EXAMPLE, source, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__")
    )
    offline = ["--no-build-isolation", "--no-index"] if _can_build_wheels_offline() else []
    command = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps"]
    command += ["--disable-pip-version-check", *offline, "--target", str(site), str(source)]
    built = subprocess.run(command, capture_output=True, text=True, timeout=180, check=False)
    assert built.returncode == 0, f"installing the example failed:\n{built.stdout}{built.stderr}"
    assert list(site.glob("tickgate_example_tasks-*.dist-info/entry_points.txt"))
    return site


def python_path(*folders: Path) -> str:
    inherited = [os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []
    return os.pathsep.join([*map(str, folders), *inherited])


def tasks_of(replica: Replica) -> dict[str, Any]:
    answer = httpx.get(f"{replica.url}/v1/tasks", timeout=10)
    assert answer.status_code == 200, answer.text
    return {item["name"]: item for item in answer.json()["items"]}


def runs_of(replica: Replica, job: str) -> list[dict[str, Any]]:
    answer = httpx.get(f"{replica.url}/v1/jobs/{job}/runs", params={"limit": 1000}, timeout=10)
    assert answer.status_code == 200, answer.text
    runs: list[dict[str, Any]] = answer.json()["items"]
    return runs


def test_a_plugin_task_runs_end_to_end_across_two_replicas(
    database_url: str, tmp_path: Path, example_site: Path
) -> None:
    # Replica 0 finds the plugin by module name (sources on the path, no dist-info, so no
    # entry points); replica 1 through the installed package's entry points.
    by_module = {
        "PYTHONPATH": python_path(EXAMPLE / "src"),
        "TICKGATE_TASK_MODULES": EXAMPLE_MODULES,
    }
    by_entry_point = {"PYTHONPATH": python_path(example_site)}
    with serve_many(
        tmp_path,
        2,
        database_url=database_url,
        # For `analyze` on Tickgate's own database, as a role without rights on its
        # tables (#42): ANALYZE then skips them, and still answers its command.
        env={
            "TICKGATE_SQL_ALLOW_SELF": "1",
            "TICKGATE_SQL_SELF_URL": asyncio.run(role_url(database_url, "plugin_self")),
        },
        each=[by_module, by_entry_point],
    ) as replicas:
        a, b = replicas
        tasks = tasks_of(a)
        assert tasks == tasks_of(b), "replicas must run the same task set"
        assert {"analyze", "greet", "http", "log"} <= set(tasks)
        greet = tasks["greet"]
        assert greet["description"].startswith("Log a greeting")
        schema = greet["args_schema"]
        times = schema["properties"]["times"]
        assert (times["minimum"], times["maximum"]) == (1, 10)
        assert schema["required"] == ["greeting"]
        assert "pattern" in tasks["analyze"]["args_schema"]["properties"]["table"]

        # Args are checked when the job is written, on either replica, never at fire time.
        for replica, bad, field in [
            (a, {"greeting": "hi", "times": 11}, "times"),
            (b, {"greeting": "hi", "volume": 3}, "volume"),
        ]:
            refused = httpx.post(
                f"{replica.url}/v1/jobs",
                json=GREET_JOB | {"name": "loud", "args": bad},
                timeout=10,
            )
            assert refused.status_code == 422, refused.text
            assert [e["loc"] for e in refused.json()["errors"]] == [["body", "args", field]]
        assert httpx.get(f"{b.url}/v1/jobs/loud", timeout=10).status_code == 404

        created = httpx.post(f"{a.url}/v1/jobs", json=GREET_JOB | {"name": "hello"}, timeout=10)
        assert created.status_code == 201, created.text

        def succeeded_runs() -> int:
            return sum(run["status"] == "succeeded" for run in runs_of(b, "hello"))

        eventually(lambda: succeeded_runs() >= 4, 30, "4 successful runs of the plugin task")
        paused = httpx.post(f"{b.url}/v1/jobs/hello/pause", timeout=10)
        assert paused.status_code == 200, paused.text
        runs: list[dict[str, Any]] = []

        def all_finished() -> bool:
            runs[:] = runs_of(a, "hello")
            return all(run["status"] != "running" for run in runs)

        eventually(all_finished, 30, "the last run to finish")
        analyzed = run_analyze_once(b, "public.tickgate_jobs")
        logs = "\n".join(replica.log() for replica in replicas)

    ticks = Counter(run["scheduled_for"] for run in runs)
    assert [tick for tick, count in ticks.items() if count > 1] == [], "a tick ran twice"
    for run in runs:
        assert run["status"] == "succeeded", run
        assert run["result"] == {"said": "hello from a plugin", "times": 2, "attempt": 1}, run
        assert run["runner"] in {a.runner_id, b.runner_id}, run
    assert "hello from a plugin" in logs, "the task logs through context.logger"
    assert analyzed["status"] == "succeeded", analyzed
    assert analyzed["result"] == {
        "statement": 'ANALYZE "public"."tickgate_jobs"',
        "target": "self",
        "command": "ANALYZE",
    }


def run_analyze_once(replica: Replica, table: str) -> dict[str, Any]:
    """The example's SQL task, triggered by hand on a job that would not fire for a year."""
    job = {"schedule": {"kind": "cron", "expression": "0 0 1 1 *"}, "task": "analyze"}
    created = httpx.put(
        f"{replica.url}/v1/jobs/stats", json=job | {"args": {"table": table}}, timeout=10
    )
    assert created.status_code == 201, created.text
    triggered = httpx.post(f"{replica.url}/v1/jobs/stats/trigger", timeout=10)
    assert triggered.status_code == 202, triggered.text
    url = f"{replica.url}/v1/runs/{triggered.json()['id']}"
    eventually(
        lambda: httpx.get(url, timeout=10).json()["status"] != "running", 30, "the analyze run"
    )
    run: dict[str, Any] = httpx.get(url, timeout=10).json()
    return run


CLASHING_MODULE = """
    from pydantic import BaseModel, JsonValue

    from service.tasks import TaskContext, task


    class Args(BaseModel):
        pass


    @task("greet", args=Args)
    async def another_greet(args: Args, context: TaskContext) -> JsonValue:
        return None
"""


@pytest.mark.parametrize(
    ("modules", "expected"),
    [
        (
            "tickgate_example_tasks.no_such_module",
            ["cannot import task module 'tickgate_example_tasks.no_such_module'"],
        ),
        (
            "clashing_tasks",
            ["task 'greet' is defined twice", "'clashing_tasks'", "entry point 'greetings'"],
        ),
    ],
)
def test_a_replica_with_a_broken_task_set_refuses_to_start(
    database_url: str, tmp_path: Path, example_site: Path, modules: str, expected: list[str]
) -> None:
    """Fail fast: a replica must never run with a different task set than its peers."""
    extra = tmp_path / "extra"
    extra.mkdir()
    (extra / "clashing_tasks.py").write_text(textwrap.dedent(CLASHING_MODULE))
    replica = start_replica(
        tmp_path,
        database_url=database_url,
        PYTHONPATH=python_path(example_site, extra),
        TICKGATE_TASK_MODULES=modules,
    )
    try:
        code = replica.wait_exit(60)
    finally:
        replica.stop()
    log = replica.log()
    assert code != 0, log
    for text in expected:
        assert text in log, log
