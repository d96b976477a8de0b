"""A silent link for one replica: a TCP proxy between one of two replicas and PostgreSQL
stops forwarding without closing anything (a node that lost power, a failover without a
FIN), then forwards again.

Nobody hears a word: without bounds PostgreSQL would keep the replica's sessions, and
the advisory lock of its run in progress, for the operating system's two hours of
keepalive, and the replica would go on running a job whose lock may be lost. With them
(`service/store/link.py`): the silent replica fences its run within half the link
timeout (a heartbeat goes unanswered), PostgreSQL ends its quiet sessions a sixth of it
later and the lock is free for the other replica, which runs the job and every
tick meanwhile; when the link is back, the silent replica records its fenced run (or the
other's orphan sweep has marked it) and rejoins.
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
from service.store.link import Link
from tests.faults.figures import FaultFigures, record
from tests.support.cluster import (
    ADVISORY_LOCKS_ON_KEYS,
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
    wait_until,
)

LINK_SECONDS = 15.0  # TICKGATE_DB_LINK_TIMEOUT_SECONDS: fence within 7.5 s, free within 10 s
FENCE_BOUND = Link(LINK_SECONDS).fence_seconds
FREE_BOUND = Link(LINK_SECONDS).free_seconds
SLACK_SECONDS = 15.0  # a loaded 2-core box; the old code never gets there at all
LOCK_LOST = "lock lost: the connection holding the job's lock closed"
REPLICA_ENV = {
    "TICKGATE_DB_LINK_TIMEOUT_SECONDS": f"{LINK_SECONDS:g}",
    "TICKGATE_RECONCILE_SECONDS": "5",
    "TICKGATE_SHUTDOWN_GRACE_SECONDS": "3",
}


def trigger(replica: Replica, job: str) -> httpx.Response:
    return httpx.post(f"{replica.url}/v1/jobs/{job}/trigger", timeout=10)


def fenced_in_log(replica: Replica, job: str) -> bool:
    """The replica's log says it cancelled its run of `job` for a lost lock."""
    return any(LOCK_LOST in line and job in line for line in replica.log().splitlines())


def locks_held(sql: Sql, key: int) -> int:
    held: int = sql.value(ADVISORY_LOCKS_ON_KEYS, [key])
    return held


def test_a_replica_whose_link_goes_silent_fences_its_run_and_its_locks_are_freed(
    database_url: str, tmp_path: Path, receiver: Receiver, sql: Sql
) -> None:
    figures = FaultFigures(
        "silent_link",
        "Silent link for one replica",
        "TCP proxy between one of 2 replicas and PostgreSQL stops forwarding without"
        f" closing (a blackhole), link timeout {LINK_SECONDS:g} s",
        faults_injected=1,
    )
    with proxying(database_url) as proxy:
        silent = {"DATABASE_URL": proxy.dsn_for(database_url)}
        with serve_many(
            tmp_path, 2, database_url=database_url, env=REPLICA_ENV, each=[{}, silent]
        ) as replicas:
            a, c = replicas
            periods = create_every_second_jobs(replicas, receiver, crons=3, intervals=3)
            slow = create(a, http_job("slow", receiver, YEARLY_CRON, seconds=300))
            first = math.ceil(time.time()) + 2
            wait_until(
                lambda: all(status_of(r, "/readyz") == 200 for r in replicas),
                30,
                "readiness",
                replicas,
            )
            # C's run in flight when the link goes silent: a manual run is run where it
            # is asked for, and holds the job's lock for its 300 s call.
            started = trigger(c, "slow")
            assert started.status_code == 202, started.text
            fenced_id = started.json()["id"]
            wait_until(lambda: bool(receiver.receipts("slow")), 10, "the slow call", replicas)
            assert locks_held(sql, int(slow["lock_key"])) == 1
            sleep_until(first + 3)

            silent_at = time.time()
            proxy.blackhole()
            # While C's session lives on the server, the job's lock is held there.
            assert trigger(a, "slow").status_code == 409
            # (b) C notices the silence and fences its run.
            wait_until(
                lambda: fenced_in_log(c, "slow"),
                FENCE_BOUND + SLACK_SECONDS,
                "C to fence its run",
                replicas,
            )
            fenced_after = time.time() - silent_at
            # (a) PostgreSQL ends C's quiet sessions: the lock is free for A.
            wait_until(
                lambda: locks_held(sql, int(slow["lock_key"])) == 0,
                FREE_BOUND + SLACK_SECONDS,
                "the stranded lock to be freed",
                replicas,
            )
            freed_after = time.time() - silent_at
            elsewhere = trigger(a, "slow")
            assert elsewhere.status_code == 202, elsewhere.text
            # By now PostgreSQL has ended every session of C's that it kept: what C sent
            # into the silence dies with them rather than arriving late.
            sleep_until(silent_at + FREE_BOUND + 2)
            restored_at = time.time()
            proxy.restore()

            wait_until(lambda: status_of(c, "/readyz") == 200, 60, "C to be ready", replicas)
            wait_until(
                lambda: run_by_id(a, fenced_id)["status"] != "running",
                60,
                "C's fenced run to be recorded",
                replicas,
            )
            fenced = run_by_id(a, fenced_id)
            last = math.floor(time.time()) - 1
            # C's runs that never ended well: fenced, or claimed in a statement whose
            # answer the silence swallowed (PostgreSQL ran it; C never heard). Each
            # has its row.
            in_flight_at_silence = unfinished_ticks(sql, c.runner_id)
            ticks = await_ticks(
                receiver, periods, first, last, lambda tick: tick in in_flight_at_silence, sql
            )

    figures.ticks_expected = ticks.expected
    figures.duplicates = extra_deliveries(receiver, manual_jobs=["slow"])
    figures.misses = len(ticks.missing)
    figures.misses_allowed = len(in_flight_at_silence) + len(ticks.overlap_skipped)
    figures.unaccounted = len(ticks.unaccounted)
    figures.notes = {
        "replicas": 2,
        "link_timeout_s": LINK_SECONDS,
        "fenced_after_s": round(fenced_after, 1),
        "fence_bound_s": FENCE_BOUND,
        "lock_freed_after_s": round(freed_after, 1),
        "free_bound_s": FREE_BOUND,
        "silent_for_s": round(restored_at - silent_at, 1),
        "fenced_run": fenced["status"],
        "overlap_skips": len(ticks.overlap_skipped),
    }
    record(figures)

    assert fenced_after < freed_after, "C ran on after its lock was free for another replica"
    assert (fenced["status"], fenced["error"]) in {
        ("cancelled", LOCK_LOST),
        ("abandoned", "the replica running this stopped without finishing it"),
    }, fenced
    problems = ticks.unexplained(lambda tick: tick in in_flight_at_silence)
    assert not problems, report(problems, replicas)
    assert figures.duplicates == 0, report(receiver.duplicates(by_tick=False), replicas)
