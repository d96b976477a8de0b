"""Ownership across real replicas: each job's owner claims its ticks, a survivor takes
them over (a new owner, or the audit of the tick cursors) when the owner dies, and changes
of members never make a tick run twice or go unaccounted.

Every job is an `http` task calling a loopback receiver that counts deliveries on its
own; the ledger rows are read straight from PostgreSQL.
"""

import math
import time
from collections import defaultdict
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import httpx

from harness.accounting import Accounting, await_accounting, rfc3339
from harness.cluster import serve_many
from harness.postgres import Sql
from harness.receiver import Receiver
from harness.replicas import Replica, start_replica
from harness.waiting import eventually
from service.scheduler.window import HANDOVER_SECONDS
from tests.support.cluster import (
    FAST_ORPHAN_SWEEPS,
    create_all,
    every_second_specs,
    http_job,
    next_whole_second,
    report,
    sleep_until,
)

# Ownership is off by default for now; these replicas turn it on.
OWNERSHIP = {"TICKGATE_OWNERSHIP": "true"}
TAKEOVER_SECONDS = 2
# Generous, for a loaded 2-core box: a tick the owner left starts within the takeover
# time plus this after its tick (the audit runs every half takeover period, and the
# owner's death must first show in the database).
TAKEOVER_SLACK_SECONDS = 8
EVERY_TEN_SECONDS: dict[str, Any] = {"kind": "cron", "expression": "*/10 * * * * *"}


def owners(accounting: Accounting) -> dict[str, set[str]]:
    """The runners that ran each job's ticks in the window."""
    ran: dict[str, set[str]] = defaultdict(set)
    for (job, _), row in accounting.rows.items():
        if row["status"] != "skipped":
            ran[job].add(row["runner"])
    return ran


def test_each_job_is_run_by_its_owner_alone(
    database_url: str, tmp_path: Path, receiver: Receiver, sql: Sql
) -> None:
    """With the members steady, every tick of a job runs on one replica, its owner, and
    the jobs are spread over all three. (Replicas started together may first see only
    themselves; the window opens once any handover that caused has ended.)"""
    with serve_many(tmp_path, 3, database_url=database_url, env=OWNERSHIP) as replicas:
        specs, periods = every_second_specs(receiver, {"cron": 30, "interval": 30})
        create_all(replicas, specs)
        first = next_whole_second(time.time(), HANDOVER_SECONDS + 3)
        last = first + 9
        sleep_until(last + 1)
        accounting = await_accounting(receiver, sql, periods, first, last)
        assert not accounting.problems(), report(accounting.problems(), replicas)
        ran = owners(accounting)
        shared = {job: runners for job, runners in ran.items() if len(runners) > 1}
        assert not shared, report([f"{job} ran on {r}" for job, r in shared.items()], replicas)
        assert {runner for runners in ran.values() for runner in runners} == {
            replica.runner_id for replica in replicas
        }


def test_a_killed_owner_s_ticks_run_on_a_survivor_within_the_takeover_time(
    database_url: str, tmp_path: Path, receiver: Receiver, sql: Sql
) -> None:
    """kill -9 of an owner: from then on its jobs' ticks run on a survivor, each no
    later than the takeover time (plus slack) after the tick, and none twice."""
    env = FAST_ORPHAN_SWEEPS | OWNERSHIP | {"TICKGATE_TAKEOVER_SECONDS": str(TAKEOVER_SECONDS)}
    with serve_many(tmp_path, 3, database_url=database_url, env=env) as replicas:
        specs, periods = every_second_specs(receiver, {"cron": 15, "interval": 15})
        create_all(replicas, specs)
        warm_first = next_whole_second(time.time(), HANDOVER_SECONDS + 3)
        sleep_until(warm_first + 4)
        warm = await_accounting(receiver, sql, periods, warm_first, warm_first + 2)
        owned = owners(warm)
        victim = replicas[0]
        victims_jobs = {job for job, runners in owned.items() if runners == {victim.runner_id}}
        assert victims_jobs, report(["the victim owned no job"], replicas)
        killed_at = time.time()
        victim.kill()
        first, last = math.floor(killed_at), math.floor(killed_at) + 10
        sleep_until(last + TAKEOVER_SECONDS + 2)

        def judge(accounting: Accounting) -> list[str]:
            return _takeover_problems(accounting, victim, victims_jobs, killed_at)

        accounting = await_accounting(
            receiver, sql, periods, first, last, deadline_seconds=60, problems_of=judge
        )
        problems = judge(accounting)
        assert not problems, report(problems, replicas)


def _takeover_problems(
    accounting: Accounting, victim: Replica, victims_jobs: set[str], killed_at: float
) -> list[str]:
    """Every tick has one row and at most one delivery; a run of the victim's (cut
    short by the kill) may be abandoned; every other run succeeded, delivered once; the
    victim's jobs' ticks after the kill ran on a survivor in time."""
    problems = []
    for tick in accounting.expected:
        job, at = tick
        name = f"{job} tick {rfc3339(at)}"
        row = accounting.rows.get(tick)
        delivered = accounting.receipts.get(tick, [])
        if row is None:
            problems.append(f"{name} has no ledger row")
            continue
        if len(delivered) > 1:
            problems.append(f"{name} delivered {len(delivered)} times")
        if row["runner"] == victim.runner_id and row["status"] in {"running", "abandoned"}:
            continue
        if row["status"] != "succeeded" or delivered != [row["id"]]:
            problems.append(f"{name}: {row['status']} by {row['runner']}, delivered {delivered}")
        elif job in victims_jobs and at > killed_at:
            late = row["started_at"].timestamp() - at
            if row["runner"] == victim.runner_id:
                problems.append(f"{name} ran on the killed replica after the kill")
            elif late > TAKEOVER_SECONDS + TAKEOVER_SLACK_SECONDS:
                problems.append(f"{name} started {late:.1f}s after its tick")
    return problems


def test_members_joining_and_leaving_mid_crowd_run_no_tick_twice(
    database_url: str, tmp_path: Path, receiver: Receiver, sql: Sql
) -> None:
    """Two replicas fire 100 one-second jobs; a third joins, then one of the first two
    stops: ownership moves twice, and every tick still runs exactly once."""
    with serve_many(tmp_path, 2, database_url=database_url, env=OWNERSHIP) as replicas:
        specs, periods = every_second_specs(receiver, {"cron": 50, "interval": 50})
        create_all(replicas, specs)
        first = next_whole_second(time.time(), 4)
        last = first + 24
        sleep_until(first + 4)
        joining = start_replica(tmp_path, database_url=database_url, **OWNERSHIP)
        try:
            eventually(joining.answers, 60, "the joining replica")
            sleep_until(first + 14)
            replicas[0].stop()
            sleep_until(last + 1)
            everyone = [*replicas, joining]
            accounting = await_accounting(receiver, sql, periods, first, last, deadline_seconds=60)
            assert not accounting.problems(), report(accounting.problems(), everyone)
            assert not receiver.duplicates(), report(receiver.duplicates(), everyone)
        finally:
            joining.stop()


def test_a_crowd_of_2000_jobs_at_one_instant_has_every_tick_accounted(
    database_url: str, tmp_path: Path, receiver: Receiver, sql: Sql
) -> None:
    """2,000 jobs due at the same instant, over three replicas: each tick runs once
    and has its one ledger row (the crowd comes again every 10 s; the window is one
    instant)."""
    with serve_many(tmp_path, 3, database_url=database_url, env=OWNERSHIP) as replicas:
        specs = [
            http_job(f"crowd-{index:04d}", receiver, EVERY_TEN_SECONDS) for index in range(2000)
        ]
        # One bulk apply (PUT /v1/jobs), as a GitOps user makes a crowd: one transaction,
        # where 2,000 POSTs would spend the test's time on creating it.
        applied = httpx.put(f"{replicas[0].url}/v1/jobs", json={"jobs": specs}, timeout=120)
        assert applied.status_code == 200, applied.text
        instant = _next_multiple(time.time() + 5, 10)
        sleep_until(instant + 1)
        periods: Mapping[str, int] = {spec["name"]: 10 for spec in specs}
        accounting = await_accounting(
            receiver, sql, periods, instant, instant, deadline_seconds=120
        )
        assert len(accounting.expected) == 2000
        assert not accounting.problems(), report(accounting.problems(), replicas)
        assert not receiver.duplicates(), report(receiver.duplicates(), replicas)


def _next_multiple(after: float, period: int) -> int:
    return math.ceil(after / period) * period
