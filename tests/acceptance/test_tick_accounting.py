"""Every nominal tick of an active job ends in exactly one ledger row, across replicas.

Real `tickgate serve` processes share one freshly migrated PostgreSQL database; every job
is an `http` task calling a loopback receiver that counts deliveries on its own. A tick
is accounted for when it has exactly one row in `tickgate_runs` and that row is a run
delivered exactly once (with the row's run id) or a recorded skip delivered never
(`Accounting` in tests/support/cluster.py).

Tests that need no special replica share one module-scoped cluster of three replicas on
a database of its own; each deletes its jobs (and with them their rows) when it ends, so
their windows never overlap and none sees another's jobs.
"""

import threading
import time
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import pytest

from harness.accounting import (
    Accounting,
    await_accounting,
    ledger_rows,
    rfc3339,
    row_text,
    unfounded_overlaps,
)
from harness.cluster import serve_many
from harness.faulty import faulty
from harness.postgres import Sql
from harness.receiver import Receiver
from harness.replicas import Replica
from tests.support.cluster import (
    EVERY_SECOND_CRON,
    SCHEDULE_KINDS,
    create,
    create_all,
    delete_all_jobs,
    every_second_specs,
    http_job,
    next_whole_second,
    overlapping_runs,
    report,
    send_all,
    sleep_until,
    wait_until,
)
from tests.support.db import TemplateDatabases


@pytest.fixture(scope="module")
def shared_database(templates: TemplateDatabases) -> Iterator[str]:
    with templates.cloned_url() as url:
        yield url


@pytest.fixture(scope="module")
def shared_replicas(
    shared_database: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[list[Replica]]:
    workdir = tmp_path_factory.mktemp("tick-accounting")
    with serve_many(workdir, 3, database_url=shared_database) as replicas:
        yield replicas


@pytest.fixture
def cluster(shared_replicas: list[Replica], receiver: Receiver) -> Iterator[list[Replica]]:
    """The shared replicas, alive and without jobs; the test's jobs are deleted after it
    (before its receiver closes)."""
    dead = [replica.log_tail() for replica in shared_replicas if not replica.alive]
    assert not dead, "\n".join(dead)
    yield shared_replicas
    delete_all_jobs(shared_replicas[0])


@pytest.fixture
def cluster_sql(shared_database: str) -> Iterator[Sql]:
    connection = Sql(shared_database)
    try:
        yield connection
    finally:
        connection.close()


def runs_listed(replica: Replica, job: str, **params: str) -> list[dict[str, Any]]:
    response = httpx.get(f"{replica.url}/v1/jobs/{job}/runs", params=params, timeout=10)
    assert response.status_code == 200, response.text
    items: list[dict[str, Any]] = response.json()["items"]
    return items


# --- 1. what was seen ---------------------------------------------------------------------


def test_freshly_started_replicas_lose_no_tick(
    database_url: str, tmp_path: Path, receiver: Receiver, sql: Sql
) -> None:
    """3 replicas started just now, 30 jobs firing every second or two (cron, interval,
    `*/2` cron), created ~3 s before a 20 s window: each tick delivered once, one row,
    no skips."""
    with serve_many(tmp_path, 3, database_url=database_url) as replicas:
        specs, periods = every_second_specs(receiver, {"cron": 10, "interval": 10, "cron2": 10})
        create_all(replicas, specs)
        first = next_whole_second(time.time(), 3)
        last = first + 19
        sleep_until(last + 1)
        accounting = await_accounting(receiver, sql, periods, first, last)
        problems = accounting.problems()
        assert not problems, report(problems, replicas)
        assert len(accounting.expected) == 10 * 20 + 10 * 20 + 10 * 10
    assert not receiver.duplicates(), report(receiver.duplicates(), replicas)


# --- 2. a replica slow to record its runs' ends ---------------------------------------------


def test_a_replica_slow_to_record_ends_loses_no_tick(
    database_url: str, tmp_path: Path, receiver: Receiver, sql: Sql
) -> None:
    """One replica of three holds every run's end record (and so the job's lock) back
    1.5 s after the call returned. The next tick finds the job busy: it is recorded as
    an overlap skip, or runs once the end is recorded. Never no row, never twice."""
    late = faulty(record_delay=1500)
    with serve_many(tmp_path, 3, database_url=database_url, each=[{}, {}, late]) as replicas:
        slow = replicas[2]
        # Twenty jobs: with ownership the slow replica owns about a third of them.
        specs, periods = every_second_specs(receiver, {"cron": 10, "interval": 10}, prefix="late-")
        create_all(replicas, specs)
        first = next_whole_second(time.time(), 2)
        last = first + 14
        sleep_until(last + 1)
        accounting = await_accounting(
            receiver, sql, periods, first, last, skip_reasons={"overlap"}, deadline_seconds=40
        )
        problems = accounting.problems(skip_reasons={"overlap"})
        for job in periods:
            problems += overlapping_runs(ledger_rows(sql, [job], 0, last))
        assert not problems, report(problems, replicas)
        # Twenty jobs, fifteen ticks each: the slow replica surely ran some of them.
        by_slow = [
            row
            for row in accounting.rows.values()
            if row["runner"] == slow.runner_id and row["status"] != "skipped"
        ]
        assert by_slow, f"the slow replica ran no tick of the window\n{report([], replicas)}"
    assert not receiver.duplicates(), report(receiver.duplicates(), replicas)


# --- 3. 300 jobs for half a minute ------------------------------------------------------


def test_300_jobs_for_half_a_minute_lose_no_tick(
    cluster: list[Replica], receiver: Receiver, cluster_sql: Sql
) -> None:
    """100 one-second crons, 100 one-second intervals, 100 two-second crons, created in
    bulk; a 30 s window from a few seconds later: no duplicate, no missing delivery, one
    row per tick, and no skip but an honest overlap: the receiver answers at once, yet on
    a starved machine a run can outlast its one-second period, and the skip is then right
    only while that run was in flight."""
    specs, periods = every_second_specs(
        receiver, {"cron": 100, "interval": 100, "cron2": 100}, prefix="bulk-"
    )
    create_all(cluster, specs)
    first = next_whole_second(time.time(), 3)
    last = first + 29
    sleep_until(last + 1)

    def problems_of(accounting: Accounting) -> list[str]:
        history = ledger_rows(cluster_sql, list(periods), first - 2, last)
        return accounting.problems({"overlap"}) + unfounded_overlaps(accounting, history)

    accounting = await_accounting(
        receiver, cluster_sql, periods, first, last, deadline_seconds=60, problems_of=problems_of
    )
    assert len(accounting.expected) == 100 * 30 + 100 * 30 + 100 * 15
    assert not receiver.duplicates(), report(receiver.duplicates(), cluster)


# --- 4. overlap "skip" --------------------------------------------------------------------


def test_overlapped_ticks_are_listed_as_skipped(
    cluster: list[Replica], receiver: Receiver, cluster_sql: Sql
) -> None:
    """A job every second whose run takes 2.5 s, overlap "skip": the ticks that come
    while a run is in progress are rows `skipped`/`overlap`, listed by the runs API;
    every tick has one row; runs never overlap in time."""
    job = "slow-skip"
    create(cluster[0], http_job(job, receiver, EVERY_SECOND_CRON, seconds=2.5, overlap="skip"))
    first = next_whole_second(time.time(), 2)
    last = first + 11
    sleep_until(last + 1)
    accounting = await_accounting(
        receiver, cluster_sql, {job: 1}, first, last, skip_reasons={"overlap"}
    )
    problems = accounting.problems(skip_reasons={"overlap"})
    problems += overlapping_runs(ledger_rows(cluster_sql, [job], 0, last))
    assert not problems, report(problems, cluster)

    skipped = {row["at"] for row in accounting.rows_with("skipped", "overlap")}
    ran = {row["at"] for row in accounting.rows_with("succeeded")}
    # 2.5 s runs of a 1 s job: at most one tick in two runs.
    assert len(skipped) >= len(accounting.expected) // 2, (sorted(ran), sorted(skipped))
    listed = runs_listed(cluster[1], job, status="skipped", limit="1000")
    assert all(
        (item["status"], item["skip_reason"], item["attempts"]) == ("skipped", "overlap", 0)
        for item in listed
    ), listed
    in_window = {
        at for item in listed if first <= (at := datetime_seconds(item["scheduled_for"])) <= last
    }
    assert in_window == skipped, (sorted(in_window), sorted(skipped))
    assert not receiver.duplicates(), report(receiver.duplicates(), cluster)


def datetime_seconds(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


# --- 5. delete and re-create ----------------------------------------------------------------

STORM_JOBS = [f"storm-{index}" for index in range(5)]
STORM_ROUNDS = 20
STORM_ROUND_SECONDS = 0.85

# Every run claimed, as claimed: rows of deleted jobs go with them, so a test-only
# trigger keeps each claim's run id and claim time (`started_at`, the database's
# clock_timestamp() inside the claim statement) in a table of the test's own.
CLAIM_AUDIT = [
    """CREATE TABLE test_claims (id uuid PRIMARY KEY, job text, scheduled_for timestamptz,
        started_at timestamptz, runner text)""",
    """CREATE FUNCTION test_claim_audit() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            INSERT INTO test_claims VALUES (NEW.id, NEW.job, NEW.scheduled_for,
                NEW.started_at, NEW.runner) ON CONFLICT (id) DO NOTHING;
            RETURN NULL;
        END $$""",
    """CREATE TRIGGER test_claim_audit AFTER INSERT ON tickgate_runs FOR EACH ROW
        WHEN (NEW.status = 'running') EXECUTE FUNCTION test_claim_audit()""",
]
CLAIM_AUDIT_DROP = [
    "DROP TRIGGER IF EXISTS test_claim_audit ON tickgate_runs",
    "DROP FUNCTION IF EXISTS test_claim_audit()",
    "DROP TABLE IF EXISTS test_claims",
]


def storm_job(receiver: Receiver, name: str, index: int, round_: int) -> dict[str, Any]:
    """Round `round_`'s definition of `name`: another schedule, method and URL (the path
    names the round), and every other round a call that takes 0.3 s, so deletes also
    catch runs in flight."""
    kind = list(SCHEDULE_KINDS)[(round_ + index) % len(SCHEDULE_KINDS)]
    seconds = 0.3 if round_ % 2 else None
    job = http_job(name, receiver, SCHEDULE_KINDS[kind][0], seconds=seconds)
    job["args"]["url"] = receiver.url_for(f"/storm/{name}/{round_}", seconds=seconds)
    job["args"]["method"] = "PUT" if round_ % 2 else "POST"
    job["description"] = f"round {round_}: {kind}"
    return job


def test_a_deleted_job_never_runs_after_it_is_made_anew(
    cluster: list[Replica], receiver: Receiver, cluster_sql: Sql
) -> None:
    """20 rounds of DELETE then POST of the same 5 names, each round with another
    schedule, method and URL (whose path names the round), on rotating replicas.

    What is assertable without a race: the claim statement reads the job row under a
    key-share lock and admits a tick only for the incarnation the replica scheduled it
    from, and DELETE waits for that lock. So every run of round k was claimed before
    round k+1's DELETE returned: its claim time (kept by a test-only trigger, since
    rows go with their job) is earlier. Its delivery may come later (a run claimed
    just before the delete, or a call in flight), and is allowed to: delivery times
    are not asserted, claim times are. Round k's runs were also claimed after its POST
    was sent, and their ticks come after it (no tick before a job exists fires). A run
    of a new incarnation calling an old URL would show as a claim after the delete.
    Afterwards the last round's jobs run every tick once, with their own URL."""
    for statement in CLAIM_AUDIT:
        cluster_sql.value(statement)
    try:
        deleted: dict[tuple[str, int], float] = {}  # the round's DELETE returned
        posting: dict[tuple[str, int], float] = {}  # the round's POST was sent
        start = next_whole_second(time.time(), 1)
        with httpx.Client(timeout=30) as client:
            for round_ in range(STORM_ROUNDS):
                # Rounds start at ever other fractions of a second: deletes land just
                # before, at and after ticks.
                sleep_until(start + round_ * STORM_ROUND_SECONDS)
                for index, name in enumerate(STORM_JOBS):
                    via = cluster[(round_ + index) % len(cluster)]
                    gone = client.delete(f"{via.url}/v1/jobs/{name}")
                    deleted[(name, round_)] = time.time()
                    assert gone.status_code in {204, 404}, gone.text
                    assert round_ == 0 or gone.status_code == 204, gone.text
                    to = cluster[(round_ + index + 1) % len(cluster)]
                    posting[(name, round_)] = time.time()
                    made = client.post(
                        f"{to.url}/v1/jobs", json=storm_job(receiver, name, index, round_)
                    )
                    assert made.status_code == 201, f"{made.text}\n{report([], cluster)}"
        storm_ended = time.time()

        # The last round's jobs go on: a few seconds of every tick once, own URL.
        last_round = STORM_ROUNDS - 1
        periods = {
            name: SCHEDULE_KINDS[list(SCHEDULE_KINDS)[(last_round + i) % len(SCHEDULE_KINDS)]][1]
            for i, name in enumerate(STORM_JOBS)
        }
        first = next_whole_second(storm_ended, 1)
        last = first + 5
        sleep_until(last + 1)
        accounting = await_accounting(receiver, cluster_sql, periods, first, last)
        problems = accounting.problems()

        # Let every run in flight end, so that every delivery has its claim recorded.
        wait_until(
            lambda: (
                not cluster_sql.value(
                    "SELECT count(*) FROM tickgate_runs WHERE status = 'running'"
                    " AND scheduled_for <= to_timestamp($1::float8)",
                    float(last),
                )
            ),
            30,
            "the storm's runs to end",
            cluster,
        )
        # The last round's jobs go on firing: take the deliveries before the claims,
        # so that every delivery taken was claimed before the claims are read.
        storm = [r for r in receiver.receipts() if r.path.startswith("/storm/")]
        claims = {
            str(row["id"]): row
            for row in cluster_sql.fetch("SELECT id, job, started_at, runner FROM test_claims")
        }
    finally:
        for statement in CLAIM_AUDIT_DROP:
            cluster_sql.value(statement)

    in_flight_at_delete = 0
    for receipt in storm:
        _, _, name, round_text = receipt.path.split("/")
        round_ = int(round_text)
        what = f"{name} round {round_} tick {receipt.scheduled_for} run {receipt.run_id}"
        claim = claims.get(receipt.run_id or "")
        if receipt.job != name or receipt.tick is None or claim is None:
            problems.append(f"{what}: delivered as {receipt.job!r} with no claim recorded")
            continue
        claimed_at = claim["started_at"].timestamp()
        made_at = posting[(name, round_)]
        if receipt.tick <= made_at or claimed_at <= made_at:
            problems.append(f"{what}: claimed at {claimed_at:.3f}, before the job was made")
        if round_ < last_round:
            gone = deleted[(name, round_ + 1)]
            if claimed_at >= gone:
                problems.append(
                    f"{what}: claimed by {claim['runner']} at {claimed_at:.3f},"
                    f" after the job's DELETE returned at {gone:.3f}"
                )
            if receipt.received_at > posting[(name, round_ + 1)]:
                in_flight_at_delete += 1
    assert not problems, report(problems, cluster)
    assert not receiver.duplicates(), report(receiver.duplicates(), cluster)
    # The storm did fire the jobs: most rounds of most jobs ran something.
    rounds_run = {r.path for r in storm if not r.path.endswith(f"/{last_round}")}
    assert len(rounds_run) >= STORM_ROUNDS * len(STORM_JOBS) // 4, (
        f"only {len(rounds_run)} of the storm's job rounds delivered anything"
        f" ({in_flight_at_delete} deliveries came after the next round's POST was sent)"
    )


# --- 6. edits never cost a tick -------------------------------------------------------------


def test_an_edit_storm_loses_no_tick(
    cluster: list[Replica], receiver: Receiver, cluster_sql: Sql
) -> None:
    """50 one-second jobs, each PATCHed (its description) every 200 ms, round-robin
    over the replicas, from a thread, for a 15 s window: every tick delivered once, one
    row each, no skips. Each edit is a new version: claims made from the one before
    are stale and must be judged again, never dropped."""
    specs, periods = every_second_specs(receiver, {"cron": 25, "interval": 25}, prefix="edited-")
    create_all(cluster, specs)
    stop = threading.Event()
    sweeps: list[float] = []
    failures: list[str] = []

    def edit() -> None:
        while not stop.is_set():
            began = time.monotonic()
            edit_no = len(sweeps)
            requests = [
                (
                    "PATCH",
                    f"{cluster[(edit_no + i) % len(cluster)].url}/v1/jobs/{name}",
                    {"description": f"edit {edit_no}"},
                )
                for i, name in enumerate(periods)
            ]
            failures.extend(
                f"{status} {text}" for status, text in send_all(requests, 8) if status != 200
            )
            sweeps.append(time.monotonic() - began)
            stop.wait(max(0.0, began + 0.2 - time.monotonic()))

    editor = threading.Thread(target=edit, daemon=True)
    editor.start()
    try:
        first = next_whole_second(time.time(), 3)
        last = first + 14
        sleep_until(last + 1)
    finally:
        stop.set()
        editor.join(60)
    assert not editor.is_alive()
    assert not failures, failures[:10]
    accounting = await_accounting(receiver, cluster_sql, periods, first, last)
    problems = accounting.problems()
    assert not problems, report(problems, cluster)
    versions = cluster_sql.fetch(
        "SELECT min(version) AS least FROM tickgate_jobs WHERE name = ANY($1::text[])",
        list(periods),
    )
    # Every sweep edited every job (version 1 is the create), and the storm was one: a
    # sweep at least every 3 s of the window even on a loaded machine (every 200 ms idle).
    assert versions[0]["least"] >= 1 + len(sweeps), (versions[0]["least"], len(sweeps))
    assert len(sweeps) >= 5, sweeps
    assert not receiver.duplicates(), report(receiver.duplicates(), cluster)


# --- 7. queue_one -------------------------------------------------------------------------


def test_queue_one_runs_one_at_a_time_in_order(
    cluster: list[Replica], receiver: Receiver, cluster_sql: Sql
) -> None:
    """A job every 2 s whose run takes 2.5 s, overlap "queue_one", three replicas:
    every tick has one row; runs never overlap in time and start in scheduled_for
    order; a tick is skipped (overlap) only while another tick already waited: one
    that had come by the time the skip was recorded, and had not started when the
    skipped tick fell due."""
    job = "queued"
    schedule = {"kind": "interval", "every_seconds": 2, "anchor": "2026-01-01T00:00:00Z"}
    create(cluster[0], http_job(job, receiver, schedule, seconds=2.5, overlap="queue_one"))
    first = next_whole_second(time.time(), 2)
    last = first + 15
    sleep_until(last + 1)
    accounting = await_accounting(
        receiver, cluster_sql, {job: 2}, first, last, skip_reasons={"overlap"}, deadline_seconds=60
    )
    problems = accounting.problems(skip_reasons={"overlap"})

    rows = sorted(ledger_rows(cluster_sql, [job], 0, last), key=lambda row: row["at"])
    problems += overlapping_runs(rows)
    runs = sorted(
        (row for row in rows if row["status"] != "skipped"), key=lambda r: r["started_at"]
    )
    started = [row["at"] for row in runs]
    if started != sorted(started):
        problems.append("runs started out of scheduled_for order:")
        problems += [f"  {rfc3339(row['at'])}: {row_text(row)}" for row in rows]
    for skip in (row for row in rows if row["status"] == "skipped"):
        recorded = skip["started_at"].timestamp()
        waiting = [
            run
            for run in runs
            if run["at"] != skip["at"]
            and run["at"] <= recorded
            and run["started_at"].timestamp() >= skip["at"]
        ]
        if skip["skip_reason"] != "overlap" or not waiting:
            problems.append(
                f"tick {rfc3339(skip['at'])} skipped ({skip['skip_reason']}) at"
                f" {recorded:.3f} with no other tick waiting"
            )
    assert not problems, report(problems, cluster)
    assert not receiver.duplicates(), report(receiver.duplicates(), cluster)
