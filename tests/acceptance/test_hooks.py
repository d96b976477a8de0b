"""Outcome hooks (#24) on real `tickgate serve` replicas and a loopback receiver: failure
and recovery alerts each delivered once, a chain with override args, a cycle refused, and
a delivery recorded by a replica killed with `kill -9` sent once by a survivor."""

import json
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx

from harness.cluster import serve, serve_many
from harness.faulty import faulty
from harness.receiver import Receipt, Receiver
from harness.waiting import eventually

NEVER = {"kind": "cron", "expression": "0 0 1 1 *"}


def alerts(receiver: Receiver, job: str) -> list[Receipt]:
    return [one for one in receiver.receipts(job) if one.path == "/alerts"]


def hook(url: str, *on: str) -> dict[str, Any]:
    return {"on": list(on), "action": {"kind": "http", "args": {"url": url}}}


def post(url: str, body: dict[str, Any]) -> dict[str, Any]:
    answer = httpx.post(url, json=body, timeout=10)
    assert answer.status_code in {201, 202}, answer.text
    document: dict[str, Any] = answer.json()
    return document


def ended(url: str, run_id: str) -> dict[str, Any]:
    def done() -> dict[str, Any] | None:
        run: dict[str, Any] = httpx.get(f"{url}/v1/runs/{run_id}", timeout=10).json()
        return run if run["status"] != "running" else None

    run = eventually(done, 30, f"run {run_id} to end")
    assert run is not None
    return run


def test_failures_then_a_recovery_are_each_delivered_once_and_a_success_chains(
    database_url: str, tmp_path: Path, receiver: Receiver
) -> None:
    """A job fails 3 times, then succeeds: 3 `failure` deliveries and 1 `recovery`, each
    once, and no `success` (not asked for). A success hook triggers another job with
    override args; a hook closing the cycle back is a 422."""
    receiver.fail_first("/flaky", 3, status=500)
    flaky = {
        "name": "flaky",
        "schedule": {"kind": "interval", "every_seconds": 2},
        "task": "http",
        "args": {"url": receiver.url_for("/flaky")},
        "hooks": [hook(receiver.url_for("/alerts"), "failure", "recovery")],
    }
    second = {
        "name": "second",
        "schedule": NEVER,
        "task": "http",
        "args": {"url": receiver.url_for("/chained"), "body": {"v": 1}},
    }
    override = {"url": receiver.url_for("/chained"), "body": {"v": 2}}
    chain = {"on": ["success"], "action": {"kind": "trigger", "job": "second", "args": override}}
    first = {"name": "first", "schedule": NEVER, "task": "log", "args": {"message": "first"}}
    with serve_many(tmp_path, 2, database_url=database_url) as (one, other):
        post(f"{one.url}/v1/jobs", flaky)

        def four_deliveries() -> bool:
            return len(alerts(receiver, "flaky")) >= 4

        eventually(four_deliveries, 60, "3 failure and 1 recovery deliveries")
        post(f"{one.url}/v1/jobs", second)
        post(f"{one.url}/v1/jobs", first | {"hooks": [chain]})
        cycle = httpx.patch(
            f"{other.url}/v1/jobs/second",
            json={"hooks": [{"on": ["failure"], "action": {"kind": "trigger", "job": "first"}}]},
            timeout=10,
        )
        run = ended(other.url, post(f"{other.url}/v1/jobs/first/trigger", {})["id"])

        def chained() -> dict[str, Any] | None:
            items = httpx.get(f"{one.url}/v1/jobs/second/runs", timeout=10).json()["items"]
            return items[0] if items and items[0]["status"] != "running" else None

        second_run = eventually(chained, 30, "the chained run")
        hooks = httpx.get(f"{one.url}/v1/runs/{run['id']}/hooks", timeout=10).json()["items"]
        httpx.post(f"{one.url}/v1/jobs/flaky/pause", timeout=10)
        time.sleep(3)  # a repeated delivery, were there one, would be in by now
    deliveries = alerts(receiver, "flaky")
    events = Counter(json.loads(one.body)["event"] for one in deliveries)
    assert events == {"failure": 3, "recovery": 1}, events
    keys = [one.headers["idempotency-key"] for one in deliveries]
    assert len(set(keys)) == len(keys) == 4
    assert [one.headers["x-tickgate-event"] for one in deliveries] == [
        json.loads(one.body)["event"] for one in deliveries
    ]
    assert cycle.status_code == 422, cycle.text
    assert "second → first → second" in cycle.json()["errors"][0]["msg"]
    assert run["status"] == "succeeded"
    assert [(h["event"], h["status"]) for h in hooks] == [("success", "delivered")]
    assert second_run is not None
    assert (second_run["trigger"], second_run["args"]) == ("chain", override)
    [delivered] = [one for one in receiver.receipts("second") if one.path == "/chained"]
    assert json.loads(delivered.body) == {"v": 2}


def test_a_delivery_recorded_by_a_killed_replica_is_sent_once_by_a_survivor(
    database_url: str, tmp_path: Path, receiver: Receiver
) -> None:
    """The replica that recorded a failure is killed (`kill -9`) before it sends its
    hook (its sender holds back, on purpose); a replica started after sends it, once."""
    receiver.respond("/down", status=500)
    job = {
        "name": "doomed",
        "schedule": NEVER,
        "task": "http",
        "args": {"url": receiver.url_for("/down")},
        "hooks": [hook(receiver.url_for("/alerts"), "failure")],
    }
    with serve(tmp_path, database_url=database_url, **faulty(hook_delay=600_000)) as a:
        post(f"{a.url}/v1/jobs", job)
        run = ended(a.url, post(f"{a.url}/v1/jobs/doomed/trigger", {})["id"])
        recorded = httpx.get(f"{a.url}/v1/runs/{run['id']}/hooks", timeout=10).json()["items"]
        a.kill()
    assert run["status"] == "failed"
    assert [(h["event"], h["status"]) for h in recorded] == [("failure", "pending")]
    with serve(tmp_path, database_url=database_url) as b:
        eventually(lambda: alerts(receiver, "doomed"), 30, "the delivery from the survivor")
        time.sleep(3)  # a second delivery, were there one, would be in by now
        sent = httpx.get(f"{b.url}/v1/runs/{run['id']}/hooks", timeout=10).json()["items"]
    [delivery] = alerts(receiver, "doomed")
    assert delivery.headers["idempotency-key"] == recorded[0]["id"]
    assert json.loads(delivery.body)["run"]["id"] == run["id"]
    assert [(h["status"], h["attempts"]) for h in sent] == [("delivered", 1)]
