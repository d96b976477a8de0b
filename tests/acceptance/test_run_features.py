"""The life of a run as people follow it (#24), on real `tickgate serve` replicas and a
loopback receiver: a run triggered with other arguments delivers those, once; a hung run
is cancelled through another replica; a webhook's answer shows in the run."""

import json
import time
from datetime import datetime
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

from harness.cluster import serve_many
from harness.receiver import Receiver
from harness.threaded import serving
from harness.waiting import eventually
from tests.support.answers import BIG, Target

NEVER = {"kind": "cron", "expression": "0 0 1 1 *"}


def test_a_trigger_with_args_delivers_those_args_once(
    database_url: str, tmp_path: Path, receiver: Receiver
) -> None:
    """Triggered through one replica, read through the other: the receiver gets the
    override body once; the job keeps its own; bad args are a 422 naming the field."""
    job = {
        "name": "deliver",
        "schedule": NEVER,
        "task": "http",
        "args": {"url": f"{receiver.url}/deliver", "body": {"v": 1}},
    }
    with serve_many(tmp_path, 2, database_url=database_url) as (first, second):
        made = httpx.post(f"{first.url}/v1/jobs", json=job, timeout=10)
        assert made.status_code == 201, made.text
        override = {"args": job["args"] | {"body": {"v": 2}}, "note": "re-run with v2"}
        started = httpx.post(f"{second.url}/v1/jobs/deliver/trigger", json=override, timeout=10)
        assert started.status_code == 202, started.text
        run_url = f"{first.url}/v1/runs/{started.json()['id']}"

        def ended() -> dict[str, object] | None:
            run: dict[str, object] = httpx.get(run_url, timeout=10).json()
            return run if run["status"] != "running" else None

        run = eventually(ended, 30, "the run to end")
        bad = {"args": job["args"] | {"method": "FETCH"}}
        refused = httpx.post(f"{first.url}/v1/jobs/deliver/trigger", json=bad, timeout=10)
        time.sleep(1)  # a second delivery, were there one, would be in by now
        kept = httpx.get(f"{second.url}/v1/jobs/deliver", timeout=10).json()
    assert run is not None
    assert (run["status"], run["note"], run["args"]) == (
        "succeeded",
        "re-run with v2",
        override["args"],
    )
    [delivery] = receiver.receipts("deliver")
    assert json.loads(delivery.body) == {"v": 2}
    assert delivery.run_id == run["id"]
    assert kept["args"]["body"] == {"v": 1}
    assert refused.status_code == 422, refused.text
    assert ["body", "args", "method"] in [problem["loc"] for problem in refused.json()["errors"]]


def test_a_hung_run_is_cancelled_through_another_replica_and_the_next_tick_runs_on_time(
    database_url: str, tmp_path: Path, receiver: Receiver
) -> None:
    """A run whose target answers after 60 s is cancelled through the replica that is
    not running it: it ends `cancelled` within 5 s with who asked and why, a second
    cancel is a 409 naming its status, and the job's next tick runs on time."""
    job = {
        "name": "hung",
        "schedule": {"kind": "interval", "every_seconds": 5},
        "task": "http",
        "args": {"url": receiver.url_for("/hung", seconds=60)},
        "timeout_seconds": 120,
    }
    with serve_many(tmp_path, 2, database_url=database_url, runner_prefix="cancel-") as replicas:
        made = httpx.post(f"{replicas[0].url}/v1/jobs", json=job, timeout=10)
        assert made.status_code == 201, made.text
        runs_url = f"{replicas[0].url}/v1/jobs/hung/runs"

        def running() -> dict[str, Any] | None:
            items = httpx.get(runs_url, timeout=10).json()["items"]
            return next((run for run in items if run["status"] == "running"), None)

        run = eventually(running, 30, "a run of the hung job")
        assert run is not None
        eventually(lambda: receiver.receipts("hung"), 10, "the hung request to arrive")
        other = next(r for r in replicas if r.runner_id != run["runner"])
        asked_at = time.monotonic()
        cancel = {"reason": "target hung", "by": "ops"}
        answer = httpx.post(f"{other.url}/v1/runs/{run['id']}/cancel", json=cancel, timeout=10)
        assert answer.status_code == 202, answer.text
        assert answer.json()["state"] == "cancelling"

        def ended() -> dict[str, Any] | None:
            shown: dict[str, Any] = httpx.get(f"{other.url}/v1/runs/{run['id']}", timeout=10).json()
            return shown if shown["status"] != "running" else None

        cancelled = eventually(ended, 30, "the cancelled run to end")
        took = time.monotonic() - asked_at
        again = httpx.post(f"{other.url}/v1/runs/{run['id']}/cancel", timeout=10)

        def next_tick() -> dict[str, Any] | None:
            items = httpx.get(runs_url, timeout=10).json()["items"]
            later = [r for r in items if r["scheduled_for"] > run["scheduled_for"]]
            return later[-1] if later else None

        following = eventually(next_tick, 30, "the job's next tick")
        assert following is not None
        # Not left hanging on the way out (shutdown would wait for it).
        httpx.post(f"{other.url}/v1/runs/{following['id']}/cancel", timeout=10)
        httpx.delete(f"{other.url}/v1/jobs/hung", timeout=10)
    assert cancelled is not None
    assert cancelled["status"] == "cancelled", cancelled
    assert took < 5, took
    assert cancelled["error"].startswith("cancelled by ops (127.0.0.1"), cancelled
    assert cancelled["error"].endswith(": target hung"), cancelled
    assert again.status_code == 409, again.text
    assert "cancelled" in again.json()["detail"]
    assert following["status"] in {"running", "succeeded"}, following
    assert following["trigger"] == "schedule"
    lag = datetime.fromisoformat(following["started_at"]) - datetime.fromisoformat(
        following["scheduled_for"]
    )
    assert lag.total_seconds() < 2, following


def test_a_webhook_s_500_body_and_a_2_mib_body_show_in_the_run(
    database_url: str, tmp_path: Path
) -> None:
    """The target's JSON error body shows in GET /v1/runs/{id}, the job's secret header
    value redacted where the target echoes it; a 2 MiB body is kept up to the cap and
    marked truncated."""
    secret = "tok-real-5ecret"
    with (
        serving(ThreadingHTTPServer(("127.0.0.1", 0), Target), "answers") as target,
        serve_many(tmp_path, 2, database_url=database_url) as (one, other),
    ):
        failing = {
            "name": "fails",
            "schedule": NEVER,
            "task": "http",
            "args": {
                "url": f"{target}/fail",
                "headers": {"X-Token": secret},
                "secret_headers": ["X-Token"],
            },
        }
        big = {"name": "big", "schedule": NEVER, "task": "http", "args": {"url": f"{target}/big"}}
        runs = []
        for job in (failing, big):
            made = httpx.post(f"{one.url}/v1/jobs", json=job, timeout=10)
            assert made.status_code == 201, made.text
            started = httpx.post(f"{one.url}/v1/jobs/{job['name']}/trigger", timeout=10)
            run_url = f"{other.url}/v1/runs/{started.json()['id']}"

            def ended(url: str = run_url) -> dict[str, Any] | None:
                run: dict[str, Any] = httpx.get(url, timeout=10).json()
                return run if run["status"] != "running" else None

            runs.append(eventually(ended, 30, f"the run of {job['name']}"))
    failed, kept = runs
    assert failed is not None
    assert kept is not None
    assert (failed["status"], failed["output"]["status"]) == ("failed", 500)
    assert json.loads(failed["output"]["body"]) == {"error": "token rejected", "token": "***"}
    assert secret not in json.dumps(failed)
    assert kept["status"] == "succeeded"
    assert kept["output"]["body"] == "x" * 16 * 1024
    assert kept["output"]["truncated"] is True
    assert kept["output"]["headers"]["content-length"] == str(BIG)
