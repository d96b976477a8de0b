"""Outcome hooks (#24), in-process on real PostgreSQL with the scheduler on: checked when
a job is written, written to the outbox with the run's end, sent once (a webhook, or a
chained run), listed under the run."""

import json
from datetime import datetime, timedelta
from typing import Any
from uuid import uuid4

import httpx
import pytest

from harness.receiver import Receiver
from harness.waiting import eventually_async
from service.config import Settings
from service.domain.hooks import Hook, HookPlan
from service.domain.jobs import Job
from service.domain.runs import RunTrigger, SkipReason
from service.store import Store
from service.store.ports import Orphan, Skip, TickClaim
from service.tasks import TaskDefinition, builtin_registry
from tests.support.backends import PostgresBackend
from tests.support.fire import GateArgs, Gates, lock_pool, tick_now
from tests.support.inprocess import ended_run, served

NEVER = {"kind": "cron", "expression": "0 0 1 1 *"}
SECRET = "hook-s3cret"


def http_hook(url: str, *on: str, **args: Any) -> dict[str, Any]:
    return {"on": list(on), "action": {"kind": "http", "args": {"url": url, **args}}}


def trigger_hook(job: str, *on: str, args: dict[str, Any] | None = None) -> dict[str, Any]:
    action: dict[str, Any] = {"kind": "trigger", "job": job}
    if args is not None:
        action["args"] = args
    return {"on": list(on), "action": action}


def log_job(name: str, **fields: Any) -> dict[str, Any]:
    return {"name": name, "schedule": NEVER, "task": "log", "args": {"message": name}} | fields


async def settled(client: httpx.AsyncClient, run_id: str, count: int) -> list[dict[str, Any]]:
    """The run's deliveries once `count` of them are delivered or failed."""
    found: list[dict[str, Any]] = []

    async def done() -> bool:
        found[:] = (await client.get(f"/v1/runs/{run_id}/hooks")).json()["items"]
        return sum(one["status"] in {"delivered", "failed"} for one in found) >= count

    await eventually_async(done, 30, f"{count} deliveries of run {run_id}")
    return found


@pytest.fixture
def scheduling(settings: Settings) -> Settings:
    return settings.model_copy(update={"scheduler": True})


async def test_bad_hooks_are_422s_naming_what_is_wrong(
    scheduling: Settings, receiver: Receiver
) -> None:
    outside = http_hook("http://10.1.2.3/alert", "failure")
    async with served(scheduling) as client:
        unknown = await client.post(
            "/v1/jobs",
            json=log_job("a", hooks=[{"on": ["oops"], "action": {"kind": "trigger", "job": "a"}}]),
        )
        blocked = await client.post(
            "/v1/jobs", json=log_job("a", hooks=[http_hook(receiver.url, "success"), outside])
        )
        missing = await client.post(
            "/v1/jobs", json=log_job("a", hooks=[trigger_hook("b", "success")])
        )
        assert (await client.post("/v1/jobs", json=log_job("a"))).status_code == 201
        to_a = await client.post(
            "/v1/jobs", json=log_job("b", hooks=[trigger_hook("a", "success")])
        )
        cycle = await client.patch("/v1/jobs/a", json={"hooks": [trigger_hook("b", "failure")]})
        itself = await client.patch("/v1/jobs/a", json={"hooks": [trigger_hook("a", "success")]})
    assert unknown.status_code == 422, unknown.text
    [problem] = unknown.json()["errors"]
    assert problem["loc"] == ["body", "hooks", 0, "on", 0]
    for event in ("failure", "success", "recovery", "misfire", "skip"):
        assert event in problem["msg"]
    assert blocked.status_code == 422, blocked.text
    assert blocked.json()["errors"][0]["loc"][:5] == ["body", "hooks", 1, "action", "args"]
    assert blocked.json()["errors"][0]["msg"].startswith("hook 1: ")
    assert missing.status_code == 422, missing.text
    assert missing.json()["errors"][0]["loc"] == ["body", "hooks", 0, "action", "job"]
    assert to_a.status_code == 201, to_a.text
    assert cycle.status_code == 422, cycle.text
    assert "a → b → a" in cycle.json()["errors"][0]["msg"]
    assert itself.status_code == 422, itself.text
    assert "a → a" in itself.json()["errors"][0]["msg"]


async def test_a_failed_run_s_hook_is_delivered_once_and_listed_under_the_run(
    scheduling: Settings, receiver: Receiver
) -> None:
    receiver.respond("/fails", status=500)
    alert = http_hook(
        receiver.url_for("/alerts"),
        "failure",
        "success",
        headers={"X-Token": SECRET},
        secret_headers=["X-Token"],
    )
    job = {
        "name": "flaky",
        "schedule": NEVER,
        "task": "http",
        "args": {"url": receiver.url_for("/fails")},
        "labels": {"team": "ops"},
        "hooks": [alert],
    }
    async with served(scheduling) as client:
        made = await client.post("/v1/jobs", json=job)
        assert made.status_code == 201, made.text
        started = (await client.post("/v1/jobs/flaky/trigger")).json()
        run = await ended_run(client, started["id"])
        [delivery] = await settled(client, run["id"], 1)
        of_job = (await client.get("/v1/jobs/flaky/hooks?limit=5")).json()["items"]
        no_job = await client.get("/v1/jobs/nope/hooks")
        shown = (await client.get("/v1/jobs/flaky")).json()
        put_back = await client.put(
            "/v1/jobs/flaky", json={k: v for k, v in shown.items() if k in job}
        )
    assert run["status"] == "failed"
    assert (delivery["event"], delivery["status"], delivery["attempts"]) == (
        "failure",
        "delivered",
        1,
    )
    assert delivery["action"]["args"]["headers"]["X-Token"] == "***"
    assert [one["id"] for one in of_job] == [delivery["id"]]
    assert no_job.status_code == 404
    [receipt] = [one for one in receiver.receipts("flaky") if one.path == "/alerts"]
    assert receipt.headers["idempotency-key"] == delivery["id"]
    assert receipt.headers["x-tickgate-event"] == "failure"
    assert receipt.headers["x-token"] == SECRET
    body = json.loads(receipt.body)
    assert (body["event"], body["delivery_id"]) == ("failure", delivery["id"])
    assert body["job"] == {"name": "flaky", "labels": {"team": "ops"}}
    assert (body["run"]["id"], body["run"]["status"]) == (run["id"], "failed")
    assert body["link"] == f"/ui/runs/{run['id']}"
    assert shown["hooks"][0]["action"]["args"]["headers"]["X-Token"] == "***"
    assert put_back.status_code == 200, put_back.text
    assert put_back.json()["version"] == shown["version"]  # "***" kept the secret


async def test_a_hook_sent_back_masked_keeps_its_own_secret_when_another_is_removed(
    scheduling: Settings, receiver: Receiver
) -> None:
    """Two hooks with a secret of the same name; the first removed and the second sent
    back as shown ("***"): it keeps its own secret, never the removed hook's."""
    hooks = [
        http_hook(
            receiver.url_for(f"/{name}"),
            "success",
            headers={"X-Token": f"{name}-s3cret"},
            secret_headers=["X-Token"],
        )
        for name in ("first", "second")
    ]
    async with served(scheduling) as client:
        made = await client.post("/v1/jobs", json=log_job("two-hooks", hooks=hooks))
        assert made.status_code == 201, made.text
        shown = (await client.get("/v1/jobs/two-hooks")).json()
        kept = await client.patch("/v1/jobs/two-hooks", json={"hooks": shown["hooks"][1:]})
        moved = {**shown["hooks"][1], "action": {**shown["hooks"][1]["action"]}}
        moved["action"]["args"] = {**moved["action"]["args"], "url": receiver.url_for("/new")}
        refused = await client.patch("/v1/jobs/two-hooks", json={"hooks": [moved]})
        started = (await client.post("/v1/jobs/two-hooks/trigger")).json()
        await settled(client, (await ended_run(client, started["id"]))["id"], 1)
    assert kept.status_code == 200, kept.text
    assert refused.status_code == 422, refused.text
    [receipt] = receiver.receipts("two-hooks")
    assert (receipt.path, receipt.headers["x-token"]) == ("/second", "second-s3cret")


async def test_a_success_hook_chains_another_job_with_its_args(scheduling: Settings) -> None:
    louder = {"message": "chained", "level": "warning"}
    async with served(scheduling) as client:
        assert (await client.post("/v1/jobs", json=log_job("second"))).status_code == 201
        first = log_job("first", hooks=[trigger_hook("second", "success", args=louder)])
        assert (await client.post("/v1/jobs", json=first)).status_code == 201
        started = (await client.post("/v1/jobs/first/trigger")).json()
        run = await ended_run(client, started["id"])
        [delivery] = await settled(client, run["id"], 1)
        chained = await ended_run(client, delivery["answer"]["run_id"])
    assert delivery["status"] == "delivered", delivery
    assert (chained["job"], chained["trigger"], chained["args"]) == ("second", "chain", louder)
    assert chained["note"] == f"success of first (run {run['id']})"
    assert chained["status"] == "succeeded"


async def test_default_hooks_reach_every_job_but_those_that_opt_out(
    scheduling: Settings, receiver: Receiver
) -> None:
    defaults = [http_hook(receiver.url_for("/everyone"), "success")]
    hooks = [Hook.model_validate(hook) for hook in defaults]
    configured = scheduling.model_copy(update={"default_hooks": hooks})
    async with served(configured) as client:
        for job in (log_job("in"), log_job("out", default_hooks=False)):
            assert (await client.post("/v1/jobs", json=job)).status_code == 201
        runs = [(await client.post(f"/v1/jobs/{n}/trigger")).json() for n in ("in", "out")]
        for run in runs:
            await ended_run(client, run["id"])
        [delivery] = await settled(client, runs[0]["id"], 1)
        none = (await client.get(f"/v1/runs/{runs[1]['id']}/hooks")).json()["items"]
        unknown = await client.get("/v1/runs/00000000-0000-4000-8000-000000000000/hooks")
    assert (delivery["is_default"], delivery["status"]) == (True, "delivered")
    assert [r.job for r in receiver.receipts()] == ["in"]
    assert none == []
    assert unknown.status_code == 404


async def test_skips_misfires_and_abandoned_runs_write_their_deliveries(
    database_url: str,
) -> None:
    """The statements that record a skip and the orphan sweep's `abandoned` write the
    deliveries of the hooks on those events, the job's own and the cluster's defaults."""
    default = Hook.model_validate(http_hook("http://127.0.0.1:9/defaults", "failure"))
    store = await Store.open(database_url, max_size=4, hooks=HookPlan((default,)))
    try:
        async with lock_pool(database_url, 4) as sessions:
            backend = PostgresBackend(database_url, store, sessions)
            own = [http_hook("http://127.0.0.1:9/skips", "misfire", "skip")]
            job = await backend.add_job("hooked", hooks=own)
            at = tick_now()
            skips = [
                Skip(job, at - timedelta(seconds=5), RunTrigger.SCHEDULE, SkipReason.MISFIRE, "n"),
                Skip(job, at - timedelta(seconds=4), RunTrigger.SCHEDULE, SkipReason.OVERLAP, "n"),
            ]
            misfire, overlap = await store.record_skips(skips, "r")
            async with sessions.session(5) as doomed:
                claim = (await doomed.claim([_claim_of(job, at)]))[0]
                assert claim.run is not None
                doomed.terminate()
            orphan = await _the_orphan(store)
            [abandoned] = await store.abandon([orphan])
        deliveries = {
            run.id: sorted(
                (one.event.value, one.is_default)
                for one in await store.run_deliveries(run.id) or []
            )
            for run in (misfire, overlap, abandoned)
        }
    finally:
        await store.close()
    assert deliveries[misfire.id] == [("misfire", False), ("skip", False)]
    assert deliveries[overlap.id] == [("skip", False)]
    assert deliveries[abandoned.id] == [("failure", True)]


def _claim_of(job: Job, at: datetime) -> TickClaim:
    return TickClaim(job, at, RunTrigger.SCHEDULE, "r", uuid4(), True, False)


async def _the_orphan(store: Store) -> Orphan:
    found: list[Orphan] = []

    async def one() -> bool:
        found[:] = await store.orphans(10)
        return len(found) == 1

    await eventually_async(one, 30, "the run to be orphaned")
    return found[0]


async def test_a_backfill_over_a_skip_that_wrote_a_delivery_runs_it_and_spares_other_runs(
    settings: Settings, store: Store
) -> None:
    """#41, finding 2: the backfill turns the skip row into the tick's run and keeps its
    id, which the skip's delivery names; the answer is a 2xx, the delivery stays listed
    under that run, and a manual run in flight on the same side session goes on."""
    gates = Gates()
    registry = builtin_registry(http_allow="127.0.0.1")
    registry.register(TaskDefinition("wait", "blocks on a gate", GateArgs, gates.wait))
    skip_hook = http_hook("http://127.0.0.1:9/skips", "skip")
    hooked = log_job("hooked", schedule={"kind": "cron", "expression": "* * * * * *"})
    async with served(settings, registry) as client:
        made = await client.post("/v1/jobs", json=hooked | {"hooks": [skip_hook]})
        assert made.status_code == 201, made.text
        slow = {"name": "slow", "schedule": NEVER, "task": "wait", "args": {"gate": "slow"}}
        assert (await client.post("/v1/jobs", json=slow)).status_code == 201
        [job] = await store.get_jobs(["hooked"])
        at = await _past(store, job.first_tick)
        skip = Skip(job, at, RunTrigger.SCHEDULE, SkipReason.OVERLAP, "a run was in progress")
        [skipped] = await store.record_skips([skip], "r")
        manual = (await client.post("/v1/jobs/slow/trigger")).json()
        window = {"from": at.isoformat(), "to": at.isoformat()}
        backfilled = await client.post("/v1/jobs/hooked/backfill", json=window)
        assert backfilled.status_code == 200, backfilled.text
        [run] = backfilled.json()["items"]
        ended = await ended_run(client, run["id"])
        listed = (await client.get(f"/v1/runs/{run['id']}/hooks")).json()["items"]
        gates["slow"].set()
        slow_run = await ended_run(client, manual["id"])
    assert run["id"] == str(skipped.id)
    assert (ended["trigger"], ended["status"]) == ("backfill", "succeeded")
    assert [one["event"] for one in listed] == ["skip"]
    assert (slow_run["status"], slow_run["error"]) == ("succeeded", None)


async def _past(store: Store, tick: datetime | None) -> datetime:
    """`tick`, once the store's clock is past it."""
    assert tick is not None

    async def passed() -> bool:
        return await store.clock() > tick

    await eventually_async(passed, 30, f"the clock to pass {tick.isoformat()}")
    return tick
