"""Lost connection for one replica only: a TCP proxy between one of three replicas and
PostgreSQL is severed, then restored.

The cut-off replica stops starting runs (its run in flight is cancelled by the lock-lost
fence, and its lock is free at once), the others run every tick meanwhile, and it rejoins
when the link is back.
"""

import math
import time
from pathlib import Path

import httpx

from harness.accounting import await_ticks
from harness.cluster import serve_many
from harness.postgres import Sql
from harness.receiver import Receiver
from harness.replicas import Replica
from harness.tcpproxy import proxying
from tests.faults.figures import FaultFigures, record
from tests.support.cluster import (
    YEARLY_CRON,
    create,
    create_every_second_jobs,
    extra_deliveries,
    http_job,
    report,
    run_by_id,
    sleep_until,
    status_of,
    unfinished_ticks,
    utc,
    wait_until,
)

CUT_SECONDS = 7.0
LOCK_LOST = "lock lost: the connection holding the job's lock closed"
REPLICA_ENV = {
    # The orphan sweep would mark the cut-off replica's run `abandoned` (its session is
    # gone); a long period keeps it out, so the run's end is the replica's own record.
    "TICKGATE_RECONCILE_SECONDS": "60",
    "TICKGATE_SHUTDOWN_GRACE_SECONDS": "3",
}


def trigger(replica: Replica, job: str) -> httpx.Response:
    return httpx.post(f"{replica.url}/v1/jobs/{job}/trigger", timeout=10)


def runs_in_flight(replica: Replica) -> float | None:
    try:
        text = httpx.get(f"{replica.url}/metrics", timeout=5).text
    except httpx.TransportError:
        return None
    for line in text.splitlines():
        if line.startswith("tickgate_runs_in_flight "):
            return float(line.split()[1])
    return None


def scheduled_runs_by(sql: Sql, runner: str, since: float, until: float | None = None) -> int:
    count: int = sql.value(
        "SELECT count(*) FROM tickgate_runs WHERE runner = $1 AND trigger = 'schedule'"
        " AND started_at > $2 AND ($3::timestamptz IS NULL OR started_at < $3)",
        runner,
        utc(since),
        utc(until) if until is not None else None,
    )
    return count


def test_one_replica_cut_off_from_postgres_then_back(
    database_url: str, tmp_path: Path, receiver: Receiver, sql: Sql
) -> None:
    figures = FaultFigures(
        "lost_connection",
        "Lost connection for one replica",
        f"TCP link between one of 3 replicas and PostgreSQL cut for {CUT_SECONDS:g} s",
        faults_injected=1,
    )
    with proxying(database_url) as proxy:
        cut_off = {"DATABASE_URL": proxy.dsn_for(database_url)}
        with serve_many(
            tmp_path, 3, database_url=database_url, env=REPLICA_ENV, each=[{}, {}, cut_off]
        ) as replicas:
            a, _, c = replicas
            periods = create_every_second_jobs(replicas, receiver, crons=5, intervals=5)
            create(a, http_job("slow", receiver, YEARLY_CRON, seconds=30))
            create(a, http_job("ping", receiver, YEARLY_CRON))
            first = math.ceil(time.time()) + 2
            wait_until(
                lambda: all(status_of(r, "/readyz") == 200 for r in replicas),
                30,
                "readiness",
                replicas,
            )
            wait_until(
                lambda: scheduled_runs_by(sql, c.runner_id, since=first - 5) > 0,
                20,
                "the proxied replica to take part",
                replicas,
            )
            # A run of C's own in flight when the link goes: a manual run is run where
            # it is asked for, and holds the job's lock for its 30 s call.
            started = trigger(c, "slow")
            assert started.status_code == 202, started.text
            fenced_id = started.json()["id"]
            wait_until(lambda: bool(receiver.receipts("slow")), 10, "the slow call", replicas)
            sleep_until(first + 3)

            cut_at = time.time()
            proxy.sever()
            wait_until(lambda: status_of(c, "/readyz") == 503, 10, "C to turn unready", replicas)
            # The fence cancelled C's run at once; its session, and the lock, are gone.
            wait_until(lambda: runs_in_flight(c) == 0, 10, "C's run to be cancelled", replicas)
            lock_was_free = trigger(a, "slow").status_code == 202
            sleep_until(cut_at + CUT_SECONDS)
            restored_at = time.time()
            proxy.restore()

            wait_until(lambda: status_of(c, "/readyz") == 200, 30, "C to be ready", replicas)
            wait_until(
                lambda: scheduled_runs_by(sql, c.runner_id, since=restored_at) > 0,
                30,
                "C to run scheduled ticks again",
                replicas,
            )
            manual = trigger(c, "ping")
            assert manual.status_code == 202, manual.text
            wait_until(
                lambda: run_by_id(a, manual.json()["id"])["status"] == "succeeded",
                15,
                "C's manual run after the link came back",
                replicas,
            )
            wait_until(
                lambda: run_by_id(a, fenced_id)["status"] != "running",
                30,
                "C to record its fenced run",
                replicas,
            )
            fenced = run_by_id(a, fenced_id)
            last = math.floor(time.time()) - 1
            # C's runs that never ended well: fenced at the cut, or claimed in a statement
            # that committed as the link went (the row stays `running` until the orphan
            # sweep, kept out here, marks it `abandoned`). Each has its row.
            in_flight_at_cut = unfinished_ticks(sql, c.runner_id)
            ticks = await_ticks(
                receiver, periods, first, last, lambda tick: tick in in_flight_at_cut, sql
            )
            started_while_cut = scheduled_runs_by(sql, c.runner_id, cut_at + 1, restored_at)
            others_while_cut = sql.value(
                "SELECT count(*) FROM tickgate_runs WHERE runner <> $1"
                " AND started_at BETWEEN $2 AND $3",
                c.runner_id,
                utc(cut_at + 1),
                utc(restored_at),
            )
            assert proxy.connections_cut > 0

    figures.ticks_expected = ticks.expected
    figures.duplicates = extra_deliveries(receiver, manual_jobs=["slow", "ping"])
    figures.misses = len(ticks.missing)
    figures.misses_allowed = len(in_flight_at_cut) + len(ticks.overlap_skipped)
    figures.unaccounted = len(ticks.unaccounted)
    figures.notes = {
        "replicas": 3,
        "connections_cut": proxy.connections_cut,
        "fenced_run": fenced["status"],
        "overlap_skips": len(ticks.overlap_skipped),
    }
    record(figures)

    assert (fenced["status"], fenced["error"]) == ("cancelled", LOCK_LOST), fenced
    assert lock_was_free, "the job's lock was still held after C's session was cut"
    assert started_while_cut == 0
    assert others_while_cut >= len(periods) * (CUT_SECONDS - 2), "the others did not go on"
    problems = ticks.unexplained(lambda tick: tick in in_flight_at_cut)
    assert not problems, report(problems, replicas)
    assert figures.duplicates == 0, report(receiver.duplicates(by_tick=False), replicas)
    assert not receiver.duplicates(by_tick=False), report(receiver.duplicates(), replicas)
