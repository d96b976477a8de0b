"""Slow replica and clock skew: of three replicas one holds every fire back 300 ms, one's
clock runs 2 s ahead and one's 2 s behind. No tick runs twice, none is lost, and no live
run is taken for an orphan (orphans are judged on the database's clock).
"""

import math
import time
from pathlib import Path

from harness.accounting import await_ticks
from harness.cluster import serve_many
from harness.faulty import faulty
from harness.postgres import Sql
from harness.receiver import Receiver
from tests.faults.figures import FaultFigures, record
from tests.support.cluster import (
    EVERY_FIVE_SECONDS_CRON,
    FAST_ORPHAN_SWEEPS,
    create,
    create_every_second_jobs,
    extra_deliveries,
    http_job,
    report,
    sleep_until,
)

SLOW = faulty(fire_delay=300)
AHEAD = faulty(clock_offset=2000)
BEHIND = faulty(clock_offset=-2000)


def test_a_slow_replica_and_skewed_clocks_cause_no_duplicate(
    database_url: str, tmp_path: Path, receiver: Receiver, sql: Sql
) -> None:
    figures = FaultFigures(
        "slow_and_skewed",
        "Slow replica and clock skew",
        "3 replicas: fires held back 300 ms; clock +2 s; clock -2 s",
        faults_injected=3,
    )
    with serve_many(
        tmp_path,
        3,
        database_url=database_url,
        env=FAST_ORPHAN_SWEEPS,
        each=[SLOW, AHEAD, BEHIND],
    ) as replicas:
        ahead = replicas[1]
        periods = create_every_second_jobs(replicas, receiver, crons=6, intervals=6)
        for index in range(2):
            # Runs of 3 s, in flight across several orphan sweeps of every replica.
            name = f"slow-{index}"
            create(replicas[index], http_job(name, receiver, EVERY_FIVE_SECONDS_CRON, seconds=3))
            periods[name] = 5
        first = math.ceil(time.time()) + 3
        last = first + 14
        sleep_until(last + 1)
        ticks = await_ticks(receiver, periods, first, last, lambda tick: False, sql)
        # Each replica's runs: how far from its nominal tick each one started (DB clock).
        leads = {
            row["runner"]: (row["runs"], row["earliest"])
            for row in sql.fetch(
                "SELECT runner, count(*) AS runs,"
                " min(extract(epoch FROM started_at - scheduled_for))::float8 AS earliest"
                " FROM tickgate_runs GROUP BY runner"
            )
        }
        # With ownership, a tick a replica's skewed clock left to be taken over runs a
        # few seconds late and may find the next one busy: an overlap skip, recorded.
        statuses = {
            row["status"]: row["count"]
            for row in sql.fetch(
                "SELECT status, count(*) FROM tickgate_runs"
                " WHERE skip_reason IS DISTINCT FROM 'overlap' GROUP BY status"
            )
        }

    figures.ticks_expected = ticks.expected
    figures.duplicates = extra_deliveries(receiver)
    figures.misses = len(ticks.missing)
    figures.misses_allowed = len(ticks.overlap_skipped)
    figures.unaccounted = len(ticks.unaccounted)
    figures.notes = {
        "replicas": 3,
        "overlap_skips": len(ticks.overlap_skipped),
        "runs_by_replica": {
            label: leads.get(replica.runner_id, (0, None))[0]
            for label, replica in zip(("slow", "ahead", "behind"), replicas, strict=True)
        },
    }
    record(figures)

    problems = ticks.unexplained(lambda tick: False)
    assert not problems, report(problems, replicas)
    assert not receiver.duplicates(), report(receiver.duplicates(), replicas)
    # The skew was real: the replica whose clock runs ahead started ticks ~2 s early.
    runs_ahead, earliest_ahead = leads.get(ahead.runner_id, (0, None))
    assert runs_ahead, leads
    assert earliest_ahead is not None
    assert earliest_ahead < -1.5, leads
    assert set(statuses) <= {"succeeded", "running"}, statuses
