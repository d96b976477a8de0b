"""Replica crash: kill -9 one of three replicas during steady 1 s ticks.

The survivors carry every job; no tick runs twice; the only ticks that may be missing are
those the killed replica had claimed and not finished; its runs become `abandoned`; and
no advisory lock stays held by its sessions.
"""

import math
import time
from pathlib import Path

import asyncpg

from harness.accounting import await_ticks
from harness.cluster import serve_many
from harness.postgres import Sql
from harness.receiver import Receiver
from harness.waiting import eventually
from tests.faults.figures import FaultFigures, record
from tests.support.cluster import (
    ADVISORY_LOCKS_ON_KEYS,
    EVERY_FIVE_SECONDS_CRON,
    FAST_ORPHAN_SWEEPS,
    create,
    create_every_second_jobs,
    extra_deliveries,
    http_job,
    job_lock_keys,
    report,
    run_by_id,
    sleep_until,
    utc,
    wait_until,
)

# A slow run in flight now (started within the last 1.5 s, so its 3 s call is surely
# still going), with the backend that holds it.
SLOW_RUN_IN_FLIGHT = """
    SELECT id::text AS id, job, runner, backend_pid FROM tickgate_runs
    WHERE status = 'running' AND job LIKE 'slow-%'
      AND started_at > clock_timestamp() - interval '1500 milliseconds'
    ORDER BY started_at DESC
"""


def test_kill_9_of_one_replica_loses_at_most_its_in_flight_ticks(
    database_url: str, tmp_path: Path, receiver: Receiver, sql: Sql
) -> None:
    figures = FaultFigures(
        "replica_crash",
        "Replica crash",
        "kill -9 of one of 3 replicas during steady 1 s ticks",
        faults_injected=1,
    )
    with serve_many(tmp_path, 3, database_url=database_url, env=FAST_ORPHAN_SWEEPS) as replicas:
        periods = create_every_second_jobs(replicas, receiver, crons=6, intervals=6)
        for index in range(3):
            # Answers after 3 s: the kill is sure to catch one of these in flight.
            name = f"slow-{index}"
            create(replicas[index], http_job(name, receiver, EVERY_FIVE_SECONDS_CRON, seconds=3))
            periods[name] = 5
        first = math.ceil(time.time()) + 2
        sleep_until(first + 3)

        in_flight: list[asyncpg.Record] = []

        def slow_run_in_flight() -> bool:
            in_flight[:] = sql.fetch(SLOW_RUN_IN_FLIGHT)
            return bool(in_flight)

        eventually(slow_run_in_flight, 30, "a slow run in flight")
        caught = in_flight[0]
        victim = next(r for r in replicas if r.runner_id == caught["runner"])
        survivors = [r for r in replicas if r is not victim]
        killed_at = time.time()
        victim.kill()
        sleep_until(killed_at + 8)
        last = math.floor(killed_at) + 6

        # Its runs in flight become `abandoned` once their sessions (and locks) are gone.
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
        assert run_by_id(survivors[0], caught["id"])["status"] == "abandoned"
        in_flight_ticks = {
            (row["job"], float(row["at"]))
            for row in sql.fetch(
                "SELECT job, extract(epoch FROM scheduled_for)::float8 AS at"
                " FROM tickgate_runs WHERE runner = $1 AND status = 'abandoned'",
                victim.runner_id,
            )
        }
        ticks = await_ticks(
            receiver, periods, first, last, lambda tick: tick in in_flight_ticks, sql
        )

        victim_pids = [
            row["backend_pid"]
            for row in sql.fetch(
                "SELECT DISTINCT backend_pid FROM tickgate_runs WHERE runner = $1",
                victim.runner_id,
            )
        ]
        eventually(
            lambda: (
                not sql.value(
                    "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = ANY($1)",
                    victim_pids,
                )
            ),
            30,
            "the killed replica's sessions to hold no advisory lock",
        )
        wrongly_abandoned = sql.fetch(
            "SELECT id::text, job, runner FROM tickgate_runs"
            " WHERE status = 'abandoned' AND runner <> $1",
            victim.runner_id,
        )
        # The survivors carry every job after the kill, and only they run anything.
        after_kill = sql.fetch(
            "SELECT DISTINCT job, runner FROM tickgate_runs WHERE started_at > $1",
            utc(killed_at + 1),
        )
        every_key = job_lock_keys(survivors[0])

    figures.ticks_expected = ticks.expected
    figures.duplicates = extra_deliveries(receiver)
    figures.misses = len(ticks.missing)
    figures.misses_allowed = len(in_flight_ticks) + len(ticks.overlap_skipped)
    figures.unaccounted = len(ticks.unaccounted)
    figures.notes = {
        "replicas": 3,
        "jobs": len(periods),
        "overlap_skips": len(ticks.overlap_skipped),
    }
    record(figures)

    problems = ticks.unexplained(lambda tick: tick in in_flight_ticks)
    assert not problems, report(problems, replicas)
    assert not receiver.duplicates(), report(receiver.duplicates(), replicas)
    assert not wrongly_abandoned, f"live replicas' runs abandoned: {wrongly_abandoned}"
    assert {row["job"] for row in after_kill} == set(periods), after_kill
    assert {row["runner"] for row in after_kill} <= {r.runner_id for r in survivors}
    assert not sql.value("SELECT count(*) FROM tickgate_runs WHERE status = 'running'")
    assert sql.value(ADVISORY_LOCKS_ON_KEYS, every_key) == 0
