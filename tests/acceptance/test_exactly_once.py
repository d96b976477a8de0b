"""Each tick runs exactly once across replicas.

Real `tickgate serve` processes share one freshly migrated PostgreSQL database, and every
job is an `http` task calling a loopback receiver that counts deliveries on its own, so a
tick run twice shows up even if Tickgate's own ledger hides it.
"""

import json
import math
import re
import signal
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import asyncpg
import httpx

from harness.accounting import rfc3339, tally
from harness.cluster import serve_many
from harness.faulty import faulty
from harness.postgres import Sql
from harness.receiver import Receiver
from harness.replicas import Replica, stop_all
from harness.waiting import eventually
from tests.support.cluster import (
    ADVISORY_LOCKS_ON_KEYS,
    EVERY_FIVE_SECONDS_CRON,
    EVERY_SECOND_CRON,
    EVERY_SECOND_INTERVAL,
    FAST_ORPHAN_SWEEPS,
    YEARLY_CRON,
    create,
    create_every_second_jobs,
    http_job,
    job_lock_keys,
    logs,
    report,
    run_by_id,
    sleep_until,
    utc,
    wait_until,
)

RFC3339_UTC = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z"

# Runs `running` now, started within the last 1.5 s (so a 3 s call is surely still in
# flight), with the backend that holds the job's advisory lock. A bigint advisory key k
# shows in pg_locks as classid = high 32 bits, objid = low 32 bits, objsubid = 1.
IN_FLIGHT_WITH_LOCK_HOLDER = """
    SELECT r.id::text AS id, r.job, r.runner, l.pid
    FROM tickgate_runs r
    JOIN unnest($1::text[], $2::bigint[]) AS k(job, lock_key) ON k.job = r.job
    JOIN pg_locks l
      ON l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
     AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
     AND ((l.classid::bigint << 32) | l.objid::bigint) = k.lock_key
    WHERE r.status = 'running' AND r.started_at > now() - interval '1500 milliseconds'
    ORDER BY r.started_at DESC
"""


# --- helpers ------------------------------------------------------------------------------


RECONCILE_SECONDS = float(FAST_ORPHAN_SWEEPS["TICKGATE_RECONCILE_SECONDS"])


def last_syncs(replica: Replica, members: int) -> list[datetime]:
    """Each member's last sync, as /v1/cluster reports them; [] until all `members`
    have synced."""
    body = httpx.get(f"{replica.url}/v1/cluster", timeout=10).json()
    syncs = [m["last_sync"] for m in body["members"] if m["last_sync"]]
    return [datetime.fromisoformat(sync) for sync in syncs] if len(syncs) == members else []


def tick_problems(
    receiver: Receiver,
    periods: Mapping[str, int],
    first: int,
    last: int,
    may_miss: Callable[[int], bool] = lambda tick: False,
) -> list[str]:
    """Each job's nominal ticks in [first, last] that did not arrive exactly once, as the
    one accountant (`harness.accounting.tally`) counts them. A tick for which
    `may_miss(tick)` holds may be absent, but never duplicated."""
    counted = tally(receiver, periods, first, last)
    missing = [
        f"{job} tick {rfc3339(at)} arrived 0 times"
        for job, at in counted.missing
        if not may_miss(int(at))
    ]
    return counted.duplicated + missing


def delivered(receiver: Receiver, job: str) -> Callable[[], bool]:
    """A condition: the receiver got at least one call of `job`."""
    return lambda: bool(receiver.receipts(job))


def runs_of(replica: Replica, job: str, **params: str) -> list[dict[str, Any]]:
    response = httpx.get(f"{replica.url}/v1/jobs/{job}/runs", params=params, timeout=10)
    assert response.status_code == 200, response.text
    items: list[dict[str, Any]] = response.json()["items"]
    return items


def assert_each_tick_once(
    receiver: Receiver,
    periods: Mapping[str, int],
    first: int,
    last: int,
    replicas: Sequence[Replica],
    may_miss: Callable[[int], bool] = lambda tick: False,
) -> None:
    """Wait (generously) for every expected tick, then require exactly one delivery each."""

    def each_once() -> bool:
        problems = tick_problems(receiver, periods, first, last, may_miss)
        assert not problems, report(problems, replicas)
        return True

    eventually(each_once, 15, "every expected tick, once each")


# --- tests --------------------------------------------------------------------------------


def test_three_replicas_run_each_tick_once_and_survive_a_kill_9(
    database_url: str, tmp_path: Path, receiver: Receiver, sql: Sql
) -> None:
    slow_jobs = [f"slow-{i}" for i in range(3)]
    with serve_many(tmp_path, 3, database_url=database_url, env=FAST_ORPHAN_SWEEPS) as replicas:
        periods = create_every_second_jobs(replicas, receiver, crons=10, intervals=10)
        lock_keys: dict[str, int] = {}
        for index, name in enumerate(slow_jobs):
            # Answers after 3 s: a kill -9 is sure to catch one of these in flight.
            job = http_job(name, receiver, EVERY_FIVE_SECONDS_CRON, seconds=3)
            lock_keys[name] = int(create(replicas[index], job)["lock_key"])
            periods[name] = 5

        # 1. A 20 s window starting a couple of seconds after every job exists.
        first = math.ceil(time.time()) + 2
        last = first + 19
        sleep_until(last + 2)
        assert_each_tick_once(receiver, periods, first, last, replicas)

        # 2. kill -9 a replica while one of its slow runs is in flight.
        in_flight: list[asyncpg.Record] = []

        def slow_run_in_flight() -> bool:
            in_flight[:] = sql.fetch(
                IN_FLIGHT_WITH_LOCK_HOLDER, list(lock_keys), list(lock_keys.values())
            )
            return bool(in_flight)

        eventually(slow_run_in_flight, 30, "a slow run in flight holding its advisory lock")
        caught = in_flight[0]
        victim = next(r for r in replicas if r.runner_id == caught["runner"])
        survivors = [r for r in replicas if r is not victim]
        killed_at = time.time()
        victim.kill()

        # The survivors go on: every tick once, except ticks in flight at the kill.
        sleep_until(killed_at + 10)
        assert_each_tick_once(
            receiver,
            periods,
            last + 1,
            math.floor(killed_at) + 8,
            replicas,
            may_miss=lambda tick: killed_at - 2 <= tick <= killed_at + 2,
        )

        # The run caught in flight is abandoned once no session holds the job's lock ...
        wait_until(
            lambda: run_by_id(survivors[0], caught["id"])["status"] == "abandoned",
            30,
            f"run {caught['id']} of the killed replica to be abandoned",
            replicas,
        )
        # ... and so is every other run the killed replica left running.
        wait_until(
            lambda: (
                not sql.value(
                    "SELECT count(*) FROM tickgate_runs WHERE runner = $1 AND status = 'running'",
                    victim.runner_id,
                )
            ),
            30,
            "no run of the killed replica left running",
            replicas,
        )
        # The dead replica's session, and the advisory lock it held, are gone.
        eventually(
            lambda: not sql.value("SELECT count(*) FROM pg_locks WHERE pid = $1", caught["pid"]),
            30,
            f"the killed replica's backend {caught['pid']} to release its advisory lock",
        )
        wrongly_abandoned = sql.fetch(
            "SELECT id::text, job, runner FROM tickgate_runs"
            " WHERE status = 'abandoned' AND runner = ANY($1::text[])",
            [r.runner_id for r in survivors],
        )
        assert not wrongly_abandoned, f"live replicas' runs abandoned: {wrongly_abandoned}"
        slow_runs = runs_of(survivors[1], caught["job"], limit="100")
        assert any(run["runner"] != victim.runner_id for run in slow_runs), slow_runs
        every_key = job_lock_keys(survivors[0])

    # Nothing was delivered twice at any time, and every delivery is a ledger row.
    assert not receiver.duplicates(), report(receiver.duplicates(), replicas)
    ledger = {
        row["id"]: (row["job"], row["scheduled_for"].timestamp())
        for row in sql.fetch("SELECT id::text, job, scheduled_for FROM tickgate_runs")
    }
    strays = [
        f"{r.job} {r.scheduled_for} run {r.run_id}"
        for r in receiver.receipts()
        if ledger.get(r.run_id or "") != (r.job, r.tick)
    ]
    assert not strays, strays[:20]
    assert not sql.value("SELECT count(*) FROM tickgate_runs WHERE status = 'running'")
    assert sql.value(ADVISORY_LOCKS_ON_KEYS, every_key) == 0


def test_a_lock_held_elsewhere_stops_the_job_on_every_replica(
    database_url: str, tmp_path: Path, receiver: Receiver, sql: Sql
) -> None:
    with serve_many(tmp_path, 3, database_url=database_url, env=FAST_ORPHAN_SWEEPS) as replicas:
        key = int(create(replicas[0], http_job("locked", receiver, EVERY_SECOND_CRON))["lock_key"])
        create(replicas[1], http_job("control", receiver, EVERY_SECOND_CRON))
        eventually(lambda: bool(receiver.receipts("locked")), 15, "the job to fire")

        # Held as a Go replica would hold it: a session-level lock on the job's key.
        holder = Sql(database_url)
        try:
            holder.value("SET lock_timeout = '20s'")  # a lock never released fails, not hangs
            holder.value("SELECT pg_advisory_lock($1)", key)
            locked_at = time.time()
            sleep_until(locked_at + 5)
            released_at = time.time()
            assert holder.value("SELECT pg_advisory_unlock($1)", key) is True
        finally:
            holder.close()

        wait_until(
            lambda: any(r.received_at > released_at for r in receiver.receipts("locked")),
            15,
            "the job to fire again after the lock was released",
            replicas,
        )

        while_held = [
            r for r in receiver.receipts("locked") if locked_at < r.received_at < released_at
        ]
        assert not while_held, [r.scheduled_for for r in while_held]
        started_while_held = sql.value(
            "SELECT count(*) FROM tickgate_runs"
            " WHERE job = 'locked' AND started_at > $1 AND started_at < $2",
            utc(locked_at),
            utc(released_at),
        )
        assert started_while_held == 0
        # The replicas were alive all along: the other job kept firing meanwhile.
        control = [
            r for r in receiver.receipts("control") if locked_at < r.received_at < released_at
        ]
        assert len(control) >= 3, logs(replicas)
    assert not receiver.duplicates(), receiver.duplicates()


def test_changes_reach_every_replica_and_a_job_outlives_its_creator(
    database_url: str, tmp_path: Path, receiver: Receiver, sql: Sql
) -> None:
    with serve_many(tmp_path, 2, database_url=database_url, env=FAST_ORPHAN_SWEEPS) as replicas:
        a, b = replicas
        create(b, http_job("to-delete", receiver, EVERY_SECOND_CRON))
        create(b, http_job("to-pause", receiver, EVERY_SECOND_INTERVAL))
        for name in ("to-delete", "to-pause"):
            eventually(delivered(receiver, name), 15, f"{name} to fire")

        deleted = httpx.delete(f"{a.url}/v1/jobs/to-delete", timeout=10)
        deleted_at = time.time()
        assert deleted.status_code == 204, deleted.text
        paused = httpx.post(f"{a.url}/v1/jobs/to-pause/pause", timeout=10)
        paused_at = time.time()
        assert paused.status_code == 200, paused.text
        assert paused.json()["state"] == "paused"

        # Created on A, which dies at once: B runs the job.
        create(a, http_job("born-on-a", receiver, EVERY_SECOND_CRON))
        a.kill()
        wait_until(
            lambda: bool(
                sql.value(
                    "SELECT count(*) FROM tickgate_runs WHERE job = 'born-on-a'"
                    " AND runner = $1 AND status = 'succeeded'",
                    b.runner_id,
                )
            ),
            20,
            "B to run the job A created",
            replicas,
        )
        assert receiver.receipts("born-on-a"), logs(replicas)

        # Watch a while longer for runs of the deleted and the paused job.
        sleep_until(max(deleted_at, paused_at) + 6)

    for name, changed_at in (("to-delete", deleted_at), ("to-pause", paused_at)):
        late_ticks = [
            r.scheduled_for for r in receiver.receipts(name) if (r.tick or 0) > changed_at + 2
        ]
        assert not late_ticks, f"{name} ran ticks after the change: {late_ticks}"
        late_starts = sql.fetch(
            "SELECT scheduled_for, started_at, runner FROM tickgate_runs"
            " WHERE job = $1 AND started_at > $2",
            name,
            utc(changed_at + 2),
        )
        assert not late_starts, f"{name} started runs after the change: {late_starts}"
    assert not receiver.duplicates(), receiver.duplicates()


def test_a_slow_replica_causes_no_duplicate(
    database_url: str, tmp_path: Path, receiver: Receiver
) -> None:
    slow = faulty(fire_delay=300)
    with serve_many(
        tmp_path, 3, database_url=database_url, each=[{}, {}, slow], env=FAST_ORPHAN_SWEEPS
    ) as replicas:
        periods = create_every_second_jobs(replicas, receiver, crons=8, intervals=8)
        first = math.ceil(time.time()) + 2
        last = first + 14
        sleep_until(last + 2)
        assert_each_tick_once(receiver, periods, first, last, replicas)
    assert not receiver.duplicates(), report(receiver.duplicates(), replicas)


def test_a_tick_missed_while_every_replica_was_down_is_caught_up_once(
    database_url: str, tmp_path: Path, receiver: Receiver, sql: Sql
) -> None:
    with serve_many(tmp_path, 2, database_url=database_url, env=FAST_ORPHAN_SWEEPS) as replicas:
        tick = math.ceil(time.time()) + 6
        # Hourly ticks anchored at `tick`: the first one after creation is `tick`.
        schedule = {"kind": "interval", "every_seconds": 3600, "anchor": rfc3339(tick)}
        create(replicas[0], http_job("catch-me", receiver, schedule, misfire_grace_seconds=60))
        assert stop_all(replicas) == [0, 0], logs(replicas)
    assert time.time() < tick - 0.5, "replicas took too long to stop; the tick was not missed"
    sleep_until(tick + 1.5)
    assert not receiver.receipts("catch-me")
    assert not sql.value("SELECT count(*) FROM tickgate_runs")

    with serve_many(tmp_path, 2, database_url=database_url, env=FAST_ORPHAN_SWEEPS) as replicas:
        wait_until(
            lambda: bool(receiver.receipts("catch-me")),
            30,
            "the missed tick to be caught up",
            replicas,
        )
        # Both replicas have done their startup catch-up and resynced since: a second
        # catch-up of the tick, if any, would have started by then.
        resynced_after = datetime.now(UTC) + timedelta(seconds=RECONCILE_SECONDS)
        eventually(
            lambda: all(sync > resynced_after for sync in last_syncs(replicas[0], 2)),
            30,
            "both replicas to resync after the catch-up",
        )
        eventually(
            lambda: sql.value("SELECT count(*) FROM tickgate_runs WHERE status = 'running'") == 0,
            20,
            "the catch-up run to finish",
        )
        runs = runs_of(replicas[1], "catch-me")
        assert [(run["trigger"], run["status"]) for run in runs] == [("catchup", "succeeded")]
        assert datetime.fromisoformat(runs[0]["scheduled_for"]).timestamp() == tick

    rows = sql.fetch("SELECT job, scheduled_for, trigger, status FROM tickgate_runs")
    assert [(r["job"], r["scheduled_for"].timestamp(), r["trigger"]) for r in rows] == [
        ("catch-me", tick, "catchup")
    ]
    delivered = receiver.receipts("catch-me")
    assert [(r.tick, r.run_id) for r in delivered] == [(tick, runs[0]["id"])], logs(replicas)


def test_sigterm_lets_the_run_in_flight_finish(
    database_url: str, tmp_path: Path, receiver: Receiver, sql: Sql
) -> None:
    with serve_many(
        tmp_path,
        1,
        database_url=database_url,
        env=FAST_ORPHAN_SWEEPS | {"TICKGATE_SHUTDOWN_GRACE_SECONDS": "20"},
    ) as replicas:
        [replica] = replicas
        at = math.ceil(time.time()) + 2
        keys = [
            create(
                replica,
                http_job("slow-once", receiver, {"kind": "once", "at": rfc3339(at)}, seconds=3),
            )["lock_key"],
            create(replica, http_job("ticker", receiver, EVERY_SECOND_CRON))["lock_key"],
        ]
        eventually(lambda: bool(receiver.receipts("slow-once")), 20, "the one-time run to start")
        signalled_at = time.time()
        exit_code = replica.stop(signal.SIGTERM, deadline_seconds=40)
        assert exit_code == 0, replica.log_tail()

    [call] = receiver.receipts("slow-once")
    assert call.status == 200, "the slow call was cut off instead of answered"
    assert call.answered_at is not None
    assert call.answered_at > signalled_at
    rows = sql.fetch("SELECT id::text, status, trigger FROM tickgate_runs WHERE job = 'slow-once'")
    assert [(r["id"], r["status"], r["trigger"]) for r in rows] == [
        (call.run_id, "succeeded", "schedule")
    ], replica.log_tail()
    assert sql.value("SELECT state FROM tickgate_jobs WHERE name = 'slow-once'") == "completed"
    assert not sql.value("SELECT count(*) FROM tickgate_runs WHERE status = 'running'")
    after_signal = [
        r.scheduled_for for r in receiver.receipts("ticker") if (r.tick or 0) > signalled_at + 1
    ]
    assert not after_signal, f"ticks started after SIGTERM: {after_signal}"
    assert sql.value(ADVISORY_LOCKS_ON_KEYS, [int(key) for key in keys]) == 0


def test_runs_api_manual_trigger(database_url: str, tmp_path: Path, receiver: Receiver) -> None:
    with serve_many(tmp_path, 2, database_url=database_url, env=FAST_ORPHAN_SWEEPS) as replicas:
        a, b = replicas
        create(a, http_job("manual", receiver, YEARLY_CRON))
        create(a, http_job("manual-slow", receiver, YEARLY_CRON, seconds=3))

        triggered = httpx.post(f"{a.url}/v1/jobs/manual/trigger", timeout=10)
        assert triggered.status_code == 202, f"{triggered.text}\n{a.log_tail()}"
        run = triggered.json()
        assert (run["job"], run["status"], run["trigger"]) == ("manual", "running", "manual")
        assert run["runner"] == a.runner_id
        wait_until(
            lambda: run_by_id(b, run["id"])["status"] == "succeeded",
            15,
            "manual run to succeed",
            replicas,
        )
        done = run_by_id(b, run["id"])
        assert (done["trigger"], done["attempts"], done["error"]) == ("manual", 1, None)
        assert done["finished_at"] is not None
        assert done["duration_ms"] >= 0

        [call] = receiver.receipts("manual")
        assert call.idempotency_key == run["id"]
        assert call.run_id == run["id"]
        assert call.method == "POST"
        assert (call.user_agent or "").startswith("tickgate/")
        assert re.fullmatch(RFC3339_UTC, call.scheduled_for or ""), call.scheduled_for
        assert json.loads(call.body) == {
            "job": "manual",
            "run_id": run["id"],
            "scheduled_for": call.scheduled_for,
        }

        # A second run: listed newest first, one page at a time.
        second = httpx.post(f"{b.url}/v1/jobs/manual/trigger", timeout=10).json()
        eventually(
            lambda: run_by_id(a, second["id"])["status"] == "succeeded", 15, "second manual run"
        )
        assert [r["id"] for r in runs_of(a, "manual")] == [second["id"], run["id"]]
        page = httpx.get(f"{a.url}/v1/jobs/manual/runs", params={"limit": 1}, timeout=10).json()
        assert [r["id"] for r in page["items"]] == [second["id"]]
        assert page["next_cursor"]
        rest = runs_of(a, "manual", limit="1", cursor=page["next_cursor"])
        assert [r["id"] for r in rest] == [run["id"]]
        assert len(runs_of(b, "manual", status="succeeded")) == 2
        assert runs_of(b, "manual", status="failed") == []

        # A "skip" job running anywhere cannot be triggered again.
        slow = httpx.post(f"{a.url}/v1/jobs/manual-slow/trigger", timeout=10)
        assert slow.status_code == 202, slow.text
        eventually(lambda: bool(receiver.receipts("manual-slow")), 15, "the slow call")
        for replica in (b, a):
            again = httpx.post(f"{replica.url}/v1/jobs/manual-slow/trigger", timeout=10)
            assert again.status_code == 409, again.text
        eventually(
            lambda: run_by_id(a, slow.json()["id"])["status"] == "succeeded",
            15,
            "the slow manual run to succeed",
        )

        missing = httpx.get(f"{a.url}/v1/runs/{uuid.uuid4()}", timeout=10)
        assert missing.status_code == 404, missing.text
    # Each run delivered once. Manual runs are told apart by run id, not by tick: the
    # header carries whole seconds, and two triggers can fall in the same second.
    assert not receiver.duplicates(by_tick=False), receiver.duplicates(by_tick=False)
    assert len(receiver.receipts()) == 3
