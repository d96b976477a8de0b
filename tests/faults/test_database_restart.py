"""PostgreSQL restart: stop the server, then start it again on the same data directory,
while three replicas run 1 s jobs and a slow run is in flight.

No replica crashes; readiness is 503 during the outage and 200 after; scheduling resumes
within 10 s of the restart; no tick runs twice; and the run whose lock connection died is
cancelled and recorded `cancelled` by the lock-lost fence.
"""

import math
import time
from pathlib import Path
from typing import Any

from harness.accounting import tally
from harness.cluster import serve_many
from harness.postgres import Sql
from harness.receiver import Receiver
from harness.replicas import Replica, stop_all
from service.embedded import start_embedded
from tests.faults.figures import FaultFigures, record
from tests.support.cluster import (
    create,
    create_every_second_jobs,
    extra_deliveries,
    http_job,
    logs,
    report,
    run_by_id,
    sleep_until,
    status_of,
    wait_until,
)

RESUME_WITHIN_SECONDS = 10.0  # the requirement: scheduling resumes within 10 s
SLOW = "slow"
LOCK_LOST = "lock lost: the connection holding the job's lock closed"
REPLICA_ENV = {
    # The orphan sweep is the fallback for a run whose end cannot be recorded; a long
    # period keeps it out of this test, so the slow run's end is the fence's own record.
    "TICKGATE_RECONCILE_SECONDS": "60",
    # The slow job's later runs (30 s calls) are cut short when the test stops replicas.
    "TICKGATE_SHUTDOWN_GRACE_SECONDS": "3",
}


def slow_run_in_flight(dsn: str) -> dict[str, Any] | None:
    sql = Sql(dsn)
    try:
        rows = sql.fetch(
            "SELECT id::text AS id, runner, extract(epoch FROM scheduled_for) AS at"
            " FROM tickgate_runs WHERE job = $1 AND status = 'running'",
            SLOW,
        )
    finally:
        sql.close()
    return dict(rows[0]) if rows else None


def all_answer(replicas: list[Replica], path: str, status: int) -> bool:
    return all(status_of(replica, path) == status for replica in replicas)


def test_postgres_restart_mid_run(tmp_path: Path, receiver: Receiver) -> None:
    figures = FaultFigures(
        "database_restart",
        "PostgreSQL restart",
        "PostgreSQL stopped and started again on the same data directory, 3 replicas",
        faults_injected=1,
    )
    data = tmp_path / "restart-pg"
    database = start_embedded(data)
    dsn = database.url
    try:
        with serve_many(tmp_path, 3, database_url=dsn, env=REPLICA_ENV) as replicas:
            periods = create_every_second_jobs(replicas, receiver, crons=4, intervals=4)
            # Every 2 s, answered after 30 s: a run of it is in flight whenever we look.
            every_two = {"kind": "cron", "expression": "*/2 * * * * *"}
            create(replicas[0], http_job(SLOW, receiver, every_two, seconds=30))
            first = math.ceil(time.time()) + 2
            wait_until(lambda: all_answer(replicas, "/readyz", 200), 30, "readiness", replicas)
            sleep_until(first + 3)
            found: list[dict[str, Any]] = []

            def caught() -> bool:
                run = slow_run_in_flight(dsn)
                found[:] = [run] if run else []
                return bool(found)

            wait_until(caught, 30, "a slow run in flight", replicas)
            held = found[0]

            stopped_at = time.time()
            database.stop()
            wait_until(
                lambda: all_answer(replicas, "/readyz", 503), 15, "readiness to fail", replicas
            )
            assert all_answer(replicas, "/healthz", 200), logs(replicas)
            time.sleep(2)  # the outage itself is what is observed here
            assert all(replica.alive for replica in replicas), logs(replicas)

            database = start_embedded(data)
            back_at = time.time()

            def resumed() -> bool:
                return any(r.received_at > back_at for r in receiver.receipts() if r.job != SLOW)

            wait_until(resumed, RESUME_WITHIN_SECONDS, "scheduling to resume", replicas)
            resumed_after = min(
                r.received_at - back_at
                for r in receiver.receipts()
                if r.job != SLOW and r.received_at > back_at
            )
            wait_until(
                lambda: all_answer(replicas, "/readyz", 200),
                60,
                "readiness after the restart",
                replicas,
            )

            # The fenced run: its lock died with its connection, so it was cancelled.
            wait_until(
                lambda: run_by_id(replicas[0], held["id"])["status"] != "running",
                30,
                "the fenced run to be recorded",
                replicas,
            )
            fenced = run_by_id(replicas[0], held["id"])
            # The job is not stuck: a later tick of it starts after the restart, on
            # whichever replica. (A tick that fell as the database went away may be the
            # one: its claim goes round again within its grace.)
            fenced_tick = float(held["at"])
            wait_until(
                lambda: any(
                    r.tick is not None and r.tick > fenced_tick and r.received_at > back_at
                    for r in receiver.receipts(SLOW)
                ),
                20,
                "a later tick of the slow job",
                replicas,
            )
            last = math.floor(back_at + RESUME_WITHIN_SECONDS) + 5
            sleep_until(last + 2)
            exit_codes = stop_all(replicas)

        # Ticks before the stop, and from 10 s after the restart on, all run exactly
        # once; those in between may be missing (the database was away), never twice.
        gap = (math.floor(stopped_at), math.ceil(back_at + RESUME_WITHIN_SECONDS) - 1)
        ticks = tally(receiver, periods, first, last, skip=lambda t: gap[0] <= t <= gap[1])
        in_gap = tally(receiver, periods, gap[0], gap[1])
        ledger = Sql(dsn)
        try:
            ticks.account(ledger)
            in_gap.account(ledger)
        finally:
            ledger.close()
    finally:
        database.stop()

    figures.ticks_expected = ticks.expected
    figures.duplicates = extra_deliveries(receiver)
    figures.misses = len(ticks.missing)
    figures.misses_allowed = len(ticks.overlap_skipped)
    figures.unaccounted = len(ticks.unaccounted) + len(in_gap.unaccounted)
    figures.notes = {
        "overlap_skips": len(ticks.overlap_skipped),
        "replicas": 3,
        "outage_seconds": round(back_at - stopped_at, 1),
        "resumed_after_seconds": round(resumed_after, 2),
        "ticks_in_outage_not_run": len(in_gap.missing),
        "fenced_run": fenced["status"],
    }
    record(figures)

    assert exit_codes == [0, 0, 0], logs(replicas)
    assert resumed_after <= RESUME_WITHIN_SECONDS
    assert (fenced["status"], fenced["error"]) == ("cancelled", LOCK_LOST), fenced
    problems = ticks.unexplained(lambda tick: False) + in_gap.duplicated
    problems += [f"{job} tick {at} has no ledger row" for job, at in in_gap.unaccounted]
    assert not problems, report(problems, replicas)
    assert not receiver.duplicates(), report(receiver.duplicates(), replicas)
