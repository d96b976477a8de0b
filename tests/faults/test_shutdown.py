"""Shutdown: SIGTERM while a long run is in flight, next to steady 1 s ticks.

The run completes within the shutdown grace, or is cancelled when the grace runs out and
recorded `cancelled`. Either way the replica exits cleanly, no run stays `running`, no
advisory lock is left, and no tick starts after the signal.
"""

import math
import signal
import time
from pathlib import Path

import httpx
import pytest

from harness.accounting import await_ticks
from harness.cluster import serve_many
from harness.postgres import Sql
from harness.receiver import Receiver
from harness.waiting import eventually
from tests.faults.figures import FaultFigures, record
from tests.support.cluster import (
    ADVISORY_LOCKS_ON_KEYS,
    EVERY_SECOND_CRON,
    YEARLY_CRON,
    create,
    extra_deliveries,
    http_job,
    sleep_until,
    utc,
)


@pytest.mark.parametrize(
    ("call_seconds", "grace_seconds", "outcome"),
    [(4, 20, "succeeded"), (30, 2, "cancelled")],
    ids=["completes-within-grace", "cancelled-after-grace"],
)
def test_sigterm_during_a_long_run(
    database_url: str,
    tmp_path: Path,
    receiver: Receiver,
    sql: Sql,
    call_seconds: float,
    grace_seconds: float,
    outcome: str,
) -> None:
    figures = FaultFigures(
        f"shutdown_{outcome}",
        f"Shutdown, run {'completes' if outcome == 'succeeded' else 'outlives the grace'}",
        f"SIGTERM during a {call_seconds:g} s run, grace {grace_seconds:g} s",
        faults_injected=1,
    )
    env = {"TICKGATE_SHUTDOWN_GRACE_SECONDS": str(grace_seconds)}
    with serve_many(tmp_path, 1, database_url=database_url, env=env) as replicas:
        [replica] = replicas
        keys = [
            create(replica, http_job("long", receiver, YEARLY_CRON, seconds=call_seconds))[
                "lock_key"
            ],
            create(replica, http_job("ticker", receiver, EVERY_SECOND_CRON))["lock_key"],
        ]
        first = math.ceil(time.time()) + 1
        sleep_until(first + 3)  # steady ticks first
        started = httpx.post(f"{replica.url}/v1/jobs/long/trigger", timeout=10)
        assert started.status_code == 202, started.text
        run_id = started.json()["id"]
        eventually(lambda: bool(receiver.receipts("long")), 10, "the long call to start")
        signalled_at = time.time()
        replica.process.send_signal(signal.SIGTERM)
        exit_code = replica.wait_exit(grace_seconds + 20)
        exited_at = time.time()
        last = math.floor(signalled_at) - 1
        ticks = await_ticks(receiver, {"ticker": 1}, first, last, lambda tick: False, sql)

    run = dict(
        sql.fetch(
            "SELECT status, error, finished_at FROM tickgate_runs WHERE id = $1::uuid", run_id
        )[0]
    )
    late_ticks = [
        r.scheduled_for for r in receiver.receipts("ticker") if (r.tick or 0) > signalled_at + 1
    ]
    figures.ticks_expected = ticks.expected
    figures.duplicates = extra_deliveries(receiver, manual_jobs=["long"])
    figures.misses = len(ticks.missing)
    figures.misses_allowed = len(ticks.overlap_skipped)
    figures.unaccounted = len(ticks.unaccounted)
    figures.notes = {"run": run["status"], "exit_seconds": round(exited_at - signalled_at, 1)}
    record(figures)

    assert exit_code == 0, replica.log_tail()
    assert run["status"] == outcome, (run, replica.log_tail())
    if outcome == "succeeded":
        [call] = receiver.receipts("long")
        assert call.status == 200, "the long call was cut off instead of answered"
        assert call.answered_at is not None
        assert call.answered_at > signalled_at
        assert run["finished_at"] < utc(signalled_at + grace_seconds)
    else:
        assert run["error"] == "cancelled: the replica shut down"
        assert run["finished_at"] >= utc(signalled_at + grace_seconds - 0.5)
        assert exited_at - signalled_at < grace_seconds + 10
    assert not sql.value("SELECT count(*) FROM tickgate_runs WHERE status = 'running'")
    assert sql.value(ADVISORY_LOCKS_ON_KEYS, [int(key) for key in keys]) == 0
    assert not late_ticks, f"ticks started after SIGTERM: {late_ticks}"
    assert not ticks.unexplained(lambda tick: False), ticks
    assert not receiver.duplicates(by_tick=False)
    # The lock went with the unlock statement, not with a killed session: no unlock
    # failure, and no session returned to the pool holding a lock, was logged.
    errors = [line for line in replica.log().splitlines() if '"level": "ERROR"' in line]
    assert not errors, errors
