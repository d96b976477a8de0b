"""APScheduler apps exactly once: four processes (three AsyncIOSchedulers, one
BackgroundScheduler) schedule the same jobs through `GatedExecutor` on one PostgreSQL,
beside a `tickgate serve` on the same database. Every tick of every job runs once across
them, as counted by the jobs themselves; killing one process mid-run doubles no tick;
the server lists the runs and fires none of them."""

import math
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import TypeVar

import httpx

from harness.replicas import REPO, free_port, start_replica, stop_all, wait_ready
from harness.waiting import eventually

SPAN_SECONDS = 20
PERIODS = {"every-second": 1, "every-two": 2, "fails": 2, "slow": 3}
T = TypeVar("T")


def start_app(database_url: str, log: Path, mode: str, out: Path) -> subprocess.Popen[bytes]:
    environment = os.environ | {"PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    with out.open("wb") as output:
        return subprocess.Popen(
            [sys.executable, "-m", "tests.acceptance.gated_app", database_url, str(log), mode],
            env=environment,
            stdout=output,
            stderr=subprocess.STDOUT,
            cwd=REPO,
        )


def starts(log: Path) -> list[tuple[str, int, int]]:
    """(job, tick, pid) of each run that began, as the jobs wrote it."""
    if not log.exists():
        return []
    lines = [line.split() for line in log.read_text().splitlines()]
    return [(job, int(tick), int(pid)) for job, tick, pid, event in lines if event == "start"]


def test_each_tick_runs_once_across_app_processes_and_a_kill_doubles_none(
    database_url: str, tmp_path: Path
) -> None:
    server = start_replica(tmp_path, database_url=database_url, runner_id="server")
    log = tmp_path / "runs.log"
    modes = ["asyncio", "asyncio", "asyncio", "background"]
    apps = [start_app(database_url, log, m, tmp_path / f"app{i}.out") for i, m in enumerate(modes)]
    try:
        wait_ready([server])
        eventually(lambda: {j for j, _, _ in starts(log)} >= set(PERIODS), 60, "every job to run")
        begin = math.ceil(time.time()) + 1
        # Kill -9 the process that is running a `slow` tick, mid-run (it takes 2 s).
        victim = eventually(lambda: _running_slow(log, begin), 30, "a slow run to begin")
        os.kill(victim[1], signal.SIGKILL)
        end = begin + SPAN_SECONDS
        eventually(lambda: time.time() > end + 4, SPAN_SECONDS + 10, "the span to pass")
        ran = Counter((job, tick) for job, tick, _ in starts(log) if begin <= tick < end)
        for job, period in PERIODS.items():
            expected = {(job, t) for t in range(begin, end) if t % period == 0}
            counts = {key: ran[key] for key in expected}
            assert set(counts.values()) == {1}, f"{job}: runs per tick {counts}"
            assert {key for key in ran if key[0] == job} == expected, f"{job}: off-schedule runs"
        assert [p for job, tick, p in starts(log) if (job, tick) == victim[0]] == [victim[1]]
        _check_api(server.url, victim[0][1])
    finally:
        for app in apps:
            if app.poll() is None:
                app.send_signal(signal.SIGTERM)
        for app in apps:
            app.wait(30)
        stop_all([server])


def _running_slow(log: Path, after: int) -> tuple[tuple[str, int], int] | None:
    """A `slow` run begun at or after `after` and not yet ended: ((job, tick), pid)."""
    lines = [line.split() for line in log.read_text().splitlines()]
    ended = {(job, tick) for job, tick, _, event in lines if event == "end"}
    for job, tick, pid, event in lines:
        if job == "slow" and event == "start" and int(tick) >= after and (job, tick) not in ended:
            return (job, int(tick)), int(pid)
    return None


def _check_api(url: str, killed_tick: int) -> None:
    """The server lists the app's jobs and runs; every run is an app process's; the run
    killed mid-way ends `abandoned` (once the next tick is claimed), never run again."""
    with httpx.Client(base_url=url, timeout=10) as client:
        jobs = {job["name"]: job for job in client.get("/v1/jobs").json()["items"]}
        assert {name: job["schedule"]["kind"] for name, job in jobs.items()} == dict.fromkeys(
            PERIODS, "app"
        )
        assert {job["state"] for job in jobs.values()} == {"active"}
        for name in PERIODS:
            runs = client.get(f"/v1/jobs/{name}/runs", params={"limit": 200}).json()["items"]
            assert runs, name
            assert all(run["runner"].startswith("app:test:") for run in runs), runs
        failed = client.get("/v1/jobs/fails/runs").json()["items"]
        assert {(r["status"], r["error"]) for r in failed if r["status"] != "running"} == {
            ("failed", "RuntimeError: this job always fails")
        }

        def killed_run() -> dict[str, object]:
            runs = client.get("/v1/jobs/slow/runs", params={"limit": 200}).json()["items"]
            [run] = [r for r in runs if _epoch(str(r["scheduled_for"])) == killed_tick]
            assert run["status"] == "abandoned", run
            return dict(run)

        eventually(killed_run, 30, "the killed run to be abandoned")


def _epoch(text: str) -> int:
    return int(datetime.fromisoformat(text).timestamp())


EXAMPLE = REPO / "examples" / "apscheduler-fastapi"


def test_the_fastapi_example_runs_each_tick_in_one_of_three_replicas(
    database_url: str, tmp_path: Path
) -> None:
    """examples/apscheduler-fastapi as three uvicorn replicas: every tick each one ran
    (its /runs) was run there only."""
    ports = [free_port() for _ in range(3)]
    environment = os.environ | {"PYTHONPATH": str(REPO), "DATABASE_URL": database_url}
    replicas = []
    for port in ports:
        with (tmp_path / f"uvicorn-{port}.log").open("wb") as output:
            command = [sys.executable, "-m", "uvicorn", "app:app", "--port", str(port)]
            replicas.append(
                subprocess.Popen(
                    command, cwd=EXAMPLE, env=environment, stdout=output, stderr=output
                )
            )
    try:
        with httpx.Client(timeout=5) as client:

            def made() -> list[tuple[str, str]]:
                runs = [client.get(f"http://127.0.0.1:{p}/runs").json() for p in ports]
                return [(run["job"], run["tick"]) for each in runs for run in each]

            def enough() -> list[tuple[str, str]]:
                runs = made()
                assert Counter(job for job, _ in runs) >= Counter({"report": 4, "refresh-cache": 3})
                return runs

            runs = eventually(lambda: _answering(enough), 90, "the example's jobs to run")
        assert [key for key, count in Counter(runs).items() if count > 1] == []
    finally:
        for replica in replicas:
            replica.send_signal(signal.SIGTERM)
        for replica in replicas:
            replica.wait(30)


def _answering(check: Callable[[], T]) -> T:
    """`check()`, a replica not answering yet counting as not yet."""
    try:
        return check()
    except httpx.TransportError as error:
        raise AssertionError(f"not answering yet: {error!r}") from error
