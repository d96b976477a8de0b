"""The life of a run as people follow it (#24), on real `tickgate serve` replicas and a
loopback receiver: a run triggered with other arguments delivers those, once."""

import json
import time
from pathlib import Path

import httpx

from harness.cluster import serve_many
from harness.receiver import Receiver
from harness.waiting import eventually

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
