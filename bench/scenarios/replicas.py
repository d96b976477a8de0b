"""Scenario 9, replicas: saturated fires/s with 1, 2 and 4 replicas that own their jobs.

For each count in `replica_counts`: a fresh database; a crowd of `replica_crowd_jobs`
`log` jobs due at T0 (`bench.crowd`); that many `tickgate serve` replicas started with
`TICKGATE_OWNERSHIP=on` (each job has an owner replica that claims its ticks). T0 leaves
the members' views `ownership_settle_seconds` to settle after the replicas are ready (a
job a replica no longer owns stays in its mirror for 10 s). The crowd saturates the
cluster: fires/s = jobs / drain time (last `started_at` minus T0, from the ledger, as
the burst scenario's `log` crowds). Reported per step: that rate, the half and 99 %
points, CPU (cores) over the drain for the replicas summed, each replica and PostgreSQL,
each replica's peak RSS from ready to drained, and how many runs each replica made.
"""

import itertools
import time
from typing import Any

from bench.context import OWNERSHIP_ON, Context, tickgate_replicas
from bench.crowd import (
    GRACE_SECONDS,
    QUIET_SECONDS,
    Margin,
    crowd_starts,
    log_once_job,
    seed_crowd,
    wait_for_rows,
)
from bench.meters import RssSampler, replica_meter
from bench.scenarios.steady import sleep_until

NAME = "replicas"
START_SECONDS_PER_REPLICA = 1.5  # on two cores, replicas starting together queue


def run_step(ctx: Context, count: int, margin: Margin) -> dict[str, Any]:
    jobs = ctx.sizes.replica_crowd_jobs
    label = f"{NAME}-{count}"
    url = ctx.postgres.fresh_database(f"{NAME}{count}")
    names = [f"o-{index:06d}" for index in range(jobs)]
    settle = ctx.sizes.ownership_settle_seconds
    lead = margin.seconds(jobs) + START_SECONDS_PER_REPLICA * count + settle
    t0, _ = seed_crowd(ctx, url, label, names, job_at=log_once_job, lead_seconds=lead)
    with tickgate_replicas(ctx, url, label=label, count=count, env=OWNERSHIP_ON) as replicas:
        ready_at = time.time()
        with RssSampler([r.pid for r in replicas]) as rss:
            meter = replica_meter(ctx, replicas)
            sleep_until(t0)
            meter.start()
            window = (t0, t0 + 1)
            deadline = t0 + GRACE_SECONDS + 15
            wait_for_rows(url, jobs, window, quiet_seconds=QUIET_SECONDS, deadline=deadline)
            cpu = meter.stop()
        ready = [round(r.ready_seconds or 0.0, 2) for r in replicas]
        runners = [r.runner_id for r in replicas]
    starts = crowd_starts(url, t0, jobs).summary()
    return {
        "replicas": count,
        "replica_ready_s": ready,
        "ready_before_t0": ready_at < t0 - 1,
        "settled_before_t0": ready_at < t0 - settle,
        **starts,
        "fires_per_s": starts["drain_fires_per_s"],
        "duplicates": starts["jobs_with_more_than_one_row"],
        "cpu_cores": cpu,
        "cpu_cores_each": [cpu.get(f"r{index}") for index in range(count)],
        "rss_peak_mib_each": rss.peaks_mib(),
        "runs_each": [starts["runs_by_runner"].get(runner, 0) for runner in runners],
    }


def run(ctx: Context) -> dict[str, Any]:
    steps = []
    margin = Margin(per_job_s=0.0003)
    for count in ctx.sizes.replica_counts:
        ctx.say(
            f"replicas: {count} owning replica(s), {ctx.sizes.replica_crowd_jobs} `log` jobs at T0"
        )
        step = run_step(ctx, count, margin)
        margin.learn(ctx.sizes.replica_crowd_jobs, max(step["replica_ready_s"]))
        ctx.say(
            f"replicas {count}: {step['fires_per_s']} fires/s (drain {step['drain_s']} s), "
            f"CPU each {step['cpu_cores_each']}, RSS each {step['rss_peak_mib_each']} MiB, "
            f"settled before T0: {step['settled_before_t0']}"
        )
        steps.append(step)
    rates = [step["fires_per_s"] or 0.0 for step in steps]
    return {
        "status": "ok",
        "jobs": ctx.sizes.replica_crowd_jobs,
        "env": "TICKGATE_OWNERSHIP=on",
        "repeats": 1,
        "steps": steps,
        "rises_every_step": all(b > a for a, b in itertools.pairwise(rates)),
        "duplicates": sum(step["duplicates"] for step in steps),
    }
