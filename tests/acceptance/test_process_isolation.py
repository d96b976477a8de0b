"""`tickgate serve` runs the scheduler and the API in two processes, supervised as one pod.

API load does not hold the fire path back; the probes and the metrics cover both
processes; a child that dies takes the pod down; SIGTERM still gives runs their grace;
and the two roles also run alone, as separate Deployments would.
"""

import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from prometheus_client.parser import text_string_to_metric_families

from harness.accounting import await_accounting, rfc3339
from harness.cluster import serve
from harness.postgres import Sql
from harness.receiver import Receiver
from harness.replicas import START_DEADLINE_SECONDS, Replica, start_replica
from harness.waiting import eventually
from tests.support.cluster import (
    EVERY_SECOND_CRON,
    YEARLY_CRON,
    create,
    create_all,
    every_second_specs,
    http_job,
    next_whole_second,
    report,
    send_all,
    sleep_until,
    status_of,
    utc,
)

# The hammered replica's ticks must start within this of their due time: loose enough
# for a loaded CI box, far below the tens of seconds a fire path sharing the API's
# event loop fell behind under such load.
LOOSE_MISFIRE_GRACE_SECONDS = 10
HAMMER_CONCURRENCY = 32
HAMMER_BATCH = 256
HAMMER_MAX_BATCHES = 400
LIST_PAGE = "/v1/jobs?limit=100"


def hammer(replica: Replica, until: float) -> list[int]:
    """GET a page of 100 jobs from HAMMER_CONCURRENCY connections at once, batch after
    batch, until `until` (at most HAMMER_MAX_BATCHES); every answer's status."""
    statuses: list[int] = []
    requests = [("GET", f"{replica.url}{LIST_PAGE}", None)] * HAMMER_BATCH
    for _ in range(HAMMER_MAX_BATCHES):
        if time.time() > until:
            break
        statuses += [status for status, _ in send_all(requests, HAMMER_CONCURRENCY)]
    return statuses


def ready(replica: Replica) -> bool:
    return status_of(replica, "/readyz") == 200


def wait_ready(replica: Replica) -> None:
    eventually(lambda: ready(replica), START_DEADLINE_SECONDS, f"{replica.url} to be ready")


def samples(replica: Replica, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """Every sample called `name` in the replica's /metrics, by its labels."""
    text = httpx.get(f"{replica.url}/metrics", timeout=10).text
    return {
        tuple(sorted(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    }


def log_lines_of(replica: Replica, process: str) -> list[str]:
    return [line for line in replica.log().splitlines() if f'"process": "{process}"' in line]


# --- the fire path under API load -----------------------------------------------------------


def test_api_load_leaves_every_tick_one_row_in_time(
    database_url: str, tmp_path: Path, receiver: Receiver, sql: Sql
) -> None:
    """Six 1 s jobs with a 10 s misfire grace while 32 connections list 100 jobs at a
    time: every tick of the window is delivered once with one ledger row, none missed."""
    with serve(tmp_path, database_url=database_url) as replica:
        seeds = [http_job(f"seed-{i:03d}", receiver, YEARLY_CRON) for i in range(100)]
        specs, periods = every_second_specs(receiver, {"cron": 3, "interval": 3})
        graced = [spec | {"misfire_grace_seconds": LOOSE_MISFIRE_GRACE_SECONDS} for spec in specs]
        create_all([replica], seeds + graced)
        first = next_whole_second(time.time(), 2)
        last = first + 11
        statuses: list[int] = []
        load = threading.Thread(target=lambda: statuses.extend(hammer(replica, last + 1)))
        load.start()
        load.join(timeout=180)
        assert not load.is_alive(), "the load did not end"
        accounting = await_accounting(receiver, sql, periods, first, last)
        problems = accounting.problems()
        assert not problems, report(problems, [replica])
    assert len(statuses) >= HAMMER_BATCH, "the API was hardly loaded"
    assert set(statuses) == {200}, sorted(set(statuses))
    assert not receiver.duplicates()


# --- probes and metrics cover both processes --------------------------------------------------


def test_probes_fail_while_the_scheduler_process_does_not_answer(
    database_url: str, tmp_path: Path
) -> None:
    """SIGSTOP the scheduler process: the pod's liveness and readiness fail, naming it;
    SIGCONT: both pass again."""
    with serve(tmp_path, database_url=database_url) as replica:
        wait_ready(replica)
        children = replica.children()
        # The API yields the CPU to the fire path (TICKGATE_API_NICENESS, default 10).
        assert children["api"].nice() - children["scheduler"].nice() == 10
        scheduler = children["scheduler"]
        scheduler.send_signal(signal.SIGSTOP)
        try:
            eventually(lambda: status_of(replica, "/readyz") == 503, 30, "readiness to fail")
            body = httpx.get(f"{replica.url}/readyz", timeout=10).json()
            assert body["checks"]["scheduler"].startswith("scheduler process not answering")
            assert body["checks"]["database"] == "ok", body
            health = httpx.get(f"{replica.url}/healthz", timeout=10)
            assert health.status_code == 503, health.text
            assert health.json()["scheduler"].startswith("scheduler process not answering")
        finally:
            scheduler.send_signal(signal.SIGCONT)
        eventually(lambda: ready(replica), 30, "readiness to come back")
        assert status_of(replica, "/healthz") == 200


def test_liveness_says_alive_from_spawn_while_readiness_waits_for_the_scheduler(
    database_url: str, tmp_path: Path
) -> None:
    """Kubernetes restarts a pod whose liveness fails: a starting pod must not fail it.
    The scheduler process is held (SIGSTOP) the moment it names itself, long before it
    can be ready (it has still to check the database and build the app), so the pod's
    start is certain to be slow: every /healthz answer from spawn is 200, and /readyz
    says "not yet" (503) until the scheduler is let go and has synced."""
    replica = start_replica(tmp_path, database_url=database_url)
    answers: list[tuple[int, int]] = []

    def probed(readiness: int) -> Callable[[], bool]:
        def answered() -> bool:
            answers.append((status_of(replica, "/healthz"), status_of(replica, "/readyz")))
            return answers[-1][1] == readiness

        return answered

    try:
        scheduler = eventually(
            lambda: scheduler_process(replica), START_DEADLINE_SECONDS, "the scheduler", 0.005
        )
        scheduler.send_signal(signal.SIGSTOP)
        try:
            eventually(probed(503), START_DEADLINE_SECONDS, f"{replica.url} to say not ready")
        finally:
            scheduler.send_signal(signal.SIGCONT)
        eventually(probed(200), START_DEADLINE_SECONDS, f"{replica.url} to be ready")
    finally:
        replica.stop()
    answered = [(health, readiness) for health, readiness in answers if health]
    assert all(health == 200 for health, _ in answered), answers
    assert all(readiness in {200, 503} for _, readiness in answered), answers


def scheduler_process(replica: Replica) -> psutil.Process | None:
    """The replica's scheduler process once it runs `tickgate serve --uds`."""
    return role_process(replica, "scheduler")


def role_process(replica: Replica, role: str) -> psutil.Process | None:
    """The replica's process of `role` once it has named itself (a moment after the
    supervisor forked it)."""
    assert replica.alive, replica.log_tail()
    try:
        return replica.children().get(role)
    except psutil.Error:
        return None  # a child that has just exited


def handles_sigterm(process: psutil.Process) -> bool:
    """Whether `process` has installed a handler for SIGTERM (SigCgt in /proc)."""
    status = Path(f"/proc/{process.pid}/status").read_text()
    caught = next(line for line in status.splitlines() if line.startswith("SigCgt:"))
    return bool(int(caught.split()[1], 16) >> (signal.SIGTERM - 1) & 1)


def test_a_process_stopped_while_it_starts_stops_and_takes_the_pod_down(
    database_url: str, tmp_path: Path
) -> None:
    """The supervisor stops the API process when the scheduler fails at startup (or
    Kubernetes stops the pod early): a SIGTERM reaching the API process while it is
    still starting, after `tickgate serve` handles SIGTERM and before uvicorn does, is
    kept, not dropped. The API process stops without serving, and the pod exits for
    Kubernetes to restart it instead of serving on with no scheduler."""
    replica = start_replica(tmp_path, database_url=database_url)
    try:
        api = eventually(lambda: role_process(replica, "api"), START_DEADLINE_SECONDS, "the API")
        eventually(lambda: handles_sigterm(api), START_DEADLINE_SECONDS, "a SIGTERM handler", 0.002)
        api.send_signal(signal.SIGTERM)
        assert replica.wait_exit() != 0
    finally:
        replica.stop()
    assert "the api process exited unasked (0)" in replica.log(), replica.log_tail()
    api_lines = [line for line in replica.log().splitlines() if '"process": "api"' in line]
    assert not [line for line in api_lines if "Application startup complete" in line], api_lines


def test_a_pod_stopped_while_its_embedded_postgresql_starts_exits_without_serving(
    tmp_path: Path,
) -> None:
    """SIGTERM during the embedded PostgreSQL's start (seconds, on a new data directory):
    the pod releases the database, starts neither process and exits 0."""
    replica = start_replica(tmp_path, database_url=None)
    try:
        supervisor = psutil.Process(replica.pid)
        eventually(
            lambda: handles_sigterm(supervisor), START_DEADLINE_SECONDS, "a SIGTERM handler", 0.002
        )
        replica.process.send_signal(signal.SIGTERM)
        assert replica.wait_exit() == 0, replica.log_tail()
    finally:
        replica.stop()
    assert "stopped before serving" in replica.log(), replica.log_tail()
    assert "serving: scheduler pid" not in replica.log(), replica.log_tail()


def test_metrics_count_the_runs_of_both_processes(
    database_url: str, tmp_path: Path, sql: Sql
) -> None:
    """Scheduled runs (the scheduler process) and a manual run (the API process) add up
    in the pod's one /metrics, as in the ledger."""
    job = {"name": "beat", "schedule": EVERY_SECOND_CRON, "task": "log", "args": {"message": "b"}}
    succeeded = "SELECT count(*) FROM tickgate_runs WHERE job = 'beat' AND status = 'succeeded'"
    with serve(tmp_path, database_url=database_url) as replica:
        create(replica, job)
        eventually(lambda: sql.value(succeeded) >= 2, 30, "two scheduled runs")
        paused = httpx.post(f"{replica.url}/v1/jobs/beat/pause", timeout=10)
        assert paused.status_code == 200, paused.text
        triggered = httpx.post(f"{replica.url}/v1/jobs/beat/trigger", timeout=10)
        assert triggered.status_code == 202, triggered.text
        key = (("job", "beat"), ("status", "succeeded"))

        def counted_alike() -> bool:
            running = sql.value("SELECT count(*) FROM tickgate_runs WHERE status = 'running'")
            return not running and samples(replica, "tickgate_runs_total").get(key) == float(
                sql.value(succeeded)
            )

        eventually(counted_alike, 30, "/metrics to count every run in the ledger")
        manual = sql.value("SELECT count(*) FROM tickgate_runs WHERE trigger = 'manual'")
        assert manual == 1
        # Fire lag is observed by the scheduler process alone; job gauges by the API's.
        [fired] = samples(replica, "tickgate_fire_lag_seconds_count").values()
        assert fired == sql.value(succeeded) - 1
        assert samples(replica, "tickgate_jobs")[(("state", "paused"),)] == 1


# --- supervision -------------------------------------------------------------------------------


@pytest.mark.parametrize("role", ["scheduler", "api"])
def test_a_child_killed_takes_the_pod_down(database_url: str, tmp_path: Path, role: str) -> None:
    """kill -9 of either child: the pod is never ready again, the other child shuts down
    cleanly, and `tickgate serve` exits 137 (128 + SIGKILL) for Kubernetes to restart it."""
    replica = start_replica(tmp_path, database_url=database_url)
    try:
        wait_ready(replica)
        children = replica.children()
        [other] = [child for name, child in children.items() if name != role]
        victim = children[role]
        victim.kill()
        victim.wait(10)
        seen = {status_of(replica, "/readyz") for _ in range(5)}
        code = replica.wait_exit(60)
    finally:
        replica.stop()
    assert 200 not in seen, seen
    assert code == 128 + signal.SIGKILL, replica.log_tail()
    assert not other.is_running()
    log = replica.log()
    assert f"the {role} process exited unasked (137): stopping" in log, log
    other_role = "api" if role == "scheduler" else "scheduler"
    survivor = log_lines_of(replica, other_role)
    assert any("Application shutdown complete" in line for line in survivor), log


def test_sigterm_gives_a_scheduled_run_its_grace(
    database_url: str, tmp_path: Path, receiver: Receiver, sql: Sql
) -> None:
    """SIGTERM to the pod while a scheduled 4 s run is in flight in the scheduler
    process: the run completes and is recorded, the pod exits 0, no run stays running."""
    env = {"TICKGATE_SHUTDOWN_GRACE_SECONDS": "20"}
    with serve(tmp_path, database_url=database_url, **env) as replica:
        at = next_whole_second(time.time(), 3)
        once = {"kind": "once", "at": rfc3339(at)}
        create(replica, http_job("long", receiver, once, seconds=4))
        sleep_until(at)
        eventually(lambda: bool(receiver.receipts("long")), 30, "the scheduled call to start")
        signalled_at = time.time()
        replica.process.send_signal(signal.SIGTERM)
        code = replica.wait_exit(40)
    [run] = sql.fetch("SELECT status, trigger, finished_at FROM tickgate_runs WHERE job = 'long'")
    assert code == 0, replica.log_tail()
    assert (run["status"], run["trigger"]) == ("succeeded", "schedule"), replica.log_tail()
    [call] = receiver.receipts("long")
    assert call.answered_at is not None
    assert call.answered_at > signalled_at
    assert run["finished_at"] < utc(signalled_at + 20)
    assert not sql.value("SELECT count(*) FROM tickgate_runs WHERE status = 'running'")


# --- the roles alone (the chart's separate Deployments) --------------------------------------


def test_api_only_and_scheduler_only_replicas_share_the_work(
    database_url: str, tmp_path: Path, sql: Sql
) -> None:
    """An API-only replica takes the job; a scheduler-only replica (probes and metrics,
    no API) runs its ticks. Each is one process, not supervised."""
    scheduler = start_replica(tmp_path, database_url=database_url, TICKGATE_API="false")
    try:
        with serve(tmp_path, database_url=database_url, TICKGATE_SCHEDULER="false") as api:
            wait_ready(scheduler)
            wait_ready(api)
            assert status_of(scheduler, "/v1/jobs") == 404
            assert status_of(scheduler, "/healthz") == 200
            job: dict[str, Any] = {"name": "split", "schedule": EVERY_SECOND_CRON, "task": "log"}
            create(api, job | {"args": {"message": "s"}})
            runs_by = "SELECT count(*) FROM tickgate_runs WHERE job = 'split' AND runner = $1"
            eventually(lambda: sql.value(runs_by, scheduler.runner_id) >= 2, 30, "scheduled runs")
            assert samples(scheduler, "tickgate_runs_total")
            assert not samples(scheduler, "tickgate_jobs_overdue"), "job gauges are the API's"
            assert samples(api, "tickgate_jobs_overdue")
            assert scheduler.children() == {}
            assert api.children() == {}
    finally:
        scheduler.stop()
    assert scheduler.process.returncode == 0, scheduler.log_tail()


def test_neither_role_refuses_to_start(database_url: str, tmp_path: Path) -> None:
    replica = start_replica(
        tmp_path, database_url=database_url, TICKGATE_API="false", TICKGATE_SCHEDULER="false"
    )
    assert replica.wait_exit(30) == 2
    assert "TICKGATE_API and TICKGATE_SCHEDULER are both off" in replica.log()


def test_the_pods_runs_name_one_runner(database_url: str, tmp_path: Path, sql: Sql) -> None:
    """Scheduled runs (scheduler process) and manual runs (API process) name the same
    runner, the pod's, and so do their log records."""
    job = {"name": "named", "schedule": EVERY_SECOND_CRON, "task": "log", "args": {"message": "n"}}
    with serve(tmp_path, database_url=database_url) as replica:
        create(replica, job)
        triggered = httpx.post(f"{replica.url}/v1/jobs/named/trigger", timeout=10)
        assert triggered.status_code == 202, triggered.text
        eventually(
            lambda: sql.value("SELECT count(DISTINCT trigger) FROM tickgate_runs") == 2,
            30,
            "scheduled and manual runs",
        )
    runners = {row["runner"] for row in sql.fetch("SELECT runner FROM tickgate_runs")}
    assert runners == {replica.runner_id}
    for process in ("scheduler", "api"):
        run_lines = [line for line in log_lines_of(replica, process) if '"run_id"' in line]
        assert run_lines, f"no run logged by the {process} process"
        assert all(f'"runner": "{replica.runner_id}"' in line for line in run_lines)
