"""Scenario 4, burst: N jobs all due in the same second T0 (`bench.crowd`).

`http` crowds, for each size in `burst_jobs`: a fresh database and the receiver; the
crowd seeded as `bench.crowd` says (each job an `http` task POSTing to the receiver);
three scheduler replicas start, load every job at their first sync, and wait for T0. If
a replica was not ready one second before T0 the result says so
(`ready_before_t0: false`). Reported: the drain time (last receipt minus T0: the
receiver sees each start a moment after it happens), the time by which half and 99 % had
arrived, duplicates and misses, CPU over the drain, and a drain curve (quantiles of
receipt minus T0) for the plot.

`log` crowds, for each size in `burst_log_jobs`: the same with the built-in `log` task and
no receiver, judged from the ledger (`bench.crowd.crowd_starts`): the drain time is the
last `started_at` minus T0, with the half and 99 % points and the curve; every job must
have exactly one row (rows per job are counted), and a row that is a skip is no start.
"""

import time
from collections.abc import Mapping
from typing import Any

from bench.context import Context, receiver, tickgate_replicas
from bench.crowd import (
    GRACE_SECONDS,
    QUIET_SECONDS,
    Margin,
    crowd_starts,
    log_once_job,
    once_job,
    received_crowd,
    seed_crowd,
    wait_drained,
    wait_for_rows,
)
from bench.meters import standard_meter
from bench.scenarios.steady import scrape_metrics, sleep_until

NAME = "burst"


def _ledger_drained(ctx: Context, url: str, count: int, t0: float) -> None:
    """As `bench.crowd.wait_drained`, counting the crowd's finished rows in the ledger."""
    sleep_until(t0 + 2)
    done = wait_for_rows(
        url, count, (t0, t0 + 1), quiet_seconds=QUIET_SECONDS, deadline=t0 + GRACE_SECONDS + 15
    )
    if done < count:
        ctx.say(f"burst: stopped waiting at {done}/{count} rows")


def run_size(ctx: Context, count: int, margin: Margin) -> dict[str, Any]:
    label = f"{NAME}-{count}"
    url = ctx.postgres.fresh_database(f"{NAME}{count}")
    names = [f"b-{index:06d}" for index in range(count)]
    with receiver(ctx, label) as target:
        args = {"url": f"{target.url}/burst", "method": "POST", "timeout_seconds": 5}

        def http_job(name: str, t0: float) -> dict[str, Any]:
            return once_job(name, t0, "http", args)

        t0, clone_seconds = seed_crowd(
            ctx, url, label, names, job_at=http_job, lead_seconds=margin.seconds(count)
        )
        with tickgate_replicas(ctx, url, label=label) as replicas:
            ready_at = time.time()
            meter = standard_meter(ctx, replicas, {"receiver": target.pid})
            sleep_until(t0)
            meter.start()
            wait_drained(ctx, NAME, count, t0, target)
            cpu = meter.stop()
            receipts = target.receipts()
            own = scrape_metrics(replicas)
            ready = [r.ready_seconds for r in replicas]
    return {
        "jobs": count,
        "clone_seconds": round(clone_seconds, 2),
        "replica_ready_s": [round(s or 0, 2) for s in ready],
        "ready_before_t0": ready_at < t0 - 1,
        **received_crowd(receipts, names, t0),
        "cpu_cores": cpu,
        "tickgate_metrics": own,
    }


def run_log_size(
    ctx: Context,
    count: int,
    margin: Margin,
    *,
    variant: str = "",
    env: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A crowd of `log` jobs, from the ledger; `variant` names a second run of the same
    size (with replicas' `env` on top)."""
    label = f"{NAME}-log-{count}{variant}"
    url = ctx.postgres.fresh_database(f"{NAME}log{count}{variant}")
    names = [f"l-{index:06d}" for index in range(count)]
    t0, clone_seconds = seed_crowd(
        ctx, url, label, names, job_at=log_once_job, lead_seconds=margin.seconds(count)
    )
    with tickgate_replicas(ctx, url, label=label, env=env) as replicas:
        ready_at = time.time()
        meter = standard_meter(ctx, replicas)
        sleep_until(t0)
        meter.start()
        _ledger_drained(ctx, url, count, t0)
        cpu = meter.stop()
        own = scrape_metrics(replicas)
        ready = [r.ready_seconds for r in replicas]
    starts = crowd_starts(url, t0, count).summary()
    return {
        "task": "log",
        "clone_seconds": round(clone_seconds, 2),
        "replica_ready_s": [round(s or 0, 2) for s in ready],
        "ready_before_t0": ready_at < t0 - 1,
        **starts,
        "duplicates": starts["jobs_with_more_than_one_row"],
        "cpu_cores": cpu,
        "tickgate_metrics": own,
    }


def _say(ctx: Context, size: dict[str, Any], task: str) -> None:
    done = size.get("delivered", size.get("started"))
    ctx.say(
        f"burst {size['jobs']} {task}: drain {size['drain_s']} s, started {done}, "
        f"dup {size['duplicates']}, miss {size.get('misses', size.get('missing'))}, "
        f"synced before T0: {size['ready_before_t0']}"
    )


def run(ctx: Context) -> dict[str, Any]:
    sizes, log_sizes = [], []
    margin = Margin()
    for count in sorted(ctx.sizes.burst_jobs):
        ctx.say(f"burst: {count} `http` jobs due at one second")
        size = run_size(ctx, count, margin)
        margin.learn(count, max(size["replica_ready_s"]))
        _say(ctx, size, "http")
        sizes.append(size)
    for count in sorted(ctx.sizes.burst_log_jobs):
        ctx.say(f"burst: {count} `log` jobs due at one second (judged from the ledger)")
        size = run_log_size(ctx, count, margin)
        _say(ctx, size, "log")
        log_sizes.append(size)
    return {
        "status": "ok",
        "repeats": 1,
        "sizes": sizes,
        "log_sizes": log_sizes,
        "duplicates": sum(size["duplicates"] for size in [*sizes, *log_sizes]),
    }
