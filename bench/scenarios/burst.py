"""Scenario 3, burst: N jobs all due in the same second T0.

For each size: a fresh database; one API-only replica (`TICKGATE_SCHEDULER=off`) creates
a template `once` job at T0 (an `http` task to the receiver) through `PUT`; its row is
cloned in SQL under N-1 more names (10^4..10^5 jobs through the API would take minutes);
then three scheduler replicas start, load every job at their first sync, and wait for T0.
T0 is chosen far enough ahead for all of that (`Margin`); if a replica was not ready
one second before T0 the result says so (`ready_before_t0: false`).

Reported: the drain time (last receipt minus T0: the receiver sees each start a moment
after it happens), the time by which half and 99 % had arrived, duplicates and misses,
CPU over the drain, and a drain curve (quantiles of receipt minus T0) for the plot.
"""

import math
import time
from dataclasses import dataclass
from typing import Any

from bench.common import (
    Context,
    ReceiverProcess,
    analyze_delivery,
    api_only_replica,
    clone_jobs,
    percentile,
    put_jobs,
    quantile_curve,
    receiver,
    standard_meter,
    tickgate_replicas,
)
from bench.scenarios.steady import scrape_metrics, sleep_until

NAME = "burst"
QUIET_SECONDS = 5.0
GRACE_SECONDS = 60  # the jobs' misfire grace (the default)


@dataclass
class Margin:
    """Seconds from creating the template to T0: clone, replica start, first sync, slack.

    Sizes run in ascending order; each measured ready time refines the per-job cost of
    the first sync for the next, bigger size (the sync time depends on the service)."""

    per_job_s: float = 0.001
    fixed_s: float = 1.0

    def seconds(self, jobs: int) -> float:
        return 4.0 + jobs * 0.00005 + 1.5 * (self.fixed_s + self.per_job_s * jobs)

    def learn(self, jobs: int, ready_s: float) -> None:
        self.per_job_s = max(0.0, ready_s - self.fixed_s) / jobs if jobs else self.per_job_s


def _template(name: str, target: str, t0: float) -> dict[str, Any]:
    at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t0))
    return {
        "name": name,
        "schedule": {"kind": "once", "at": at},
        "timezone": "UTC",
        "task": "http",
        "args": {"url": f"{target}/burst", "method": "POST", "timeout_seconds": 5},
    }


def _wait_drained(ctx: Context, count: int, t0: float, target: ReceiverProcess) -> None:
    """Until every job arrived, or nothing arrived for a while, or the grace ran out."""
    sleep_until(t0 + 2)
    arrived = target.wait_for(count, quiet_seconds=QUIET_SECONDS, deadline=t0 + GRACE_SECONDS + 15)
    if arrived < count:
        ctx.say(f"burst: stopped waiting at {arrived}/{count}")


def run_size(ctx: Context, count: int, margin: Margin) -> dict[str, Any]:
    label = f"{NAME}-{count}"
    url = ctx.postgres.fresh_database(f"{NAME}{count}")
    names = [f"b-{index:06d}" for index in range(count)]
    with receiver(ctx, label) as target:
        with api_only_replica(ctx, url, label=label) as api:
            t0 = float(math.ceil(time.time() + margin.seconds(count)))
            put_jobs([api.url], [_template(names[0], target.url, t0)])
            clone_seconds = clone_jobs(url, names[0], names[1:])
        with tickgate_replicas(ctx, url, label=label) as replicas:
            ready_at = time.time()
            meter = standard_meter(ctx, replicas, {"receiver": target.pid})
            sleep_until(t0)
            meter.start()
            _wait_drained(ctx, count, t0, target)
            cpu = meter.stop()
            receipts = target.receipts()
            own = scrape_metrics(replicas)
            ready = [r.ready_seconds for r in replicas]
    delivery = analyze_delivery(receipts, {(name, t0) for name in names})
    offsets = delivery.lateness
    return {
        "jobs": count,
        "clone_seconds": round(clone_seconds, 2),
        "replica_ready_s": [round(s or 0, 2) for s in ready],
        "ready_before_t0": ready_at < t0 - 1,
        "drain_s": round(max(offsets), 3) if offsets else None,
        "first_s": round(min(offsets), 3) if offsets else None,
        "p50_s": _rounded(percentile(offsets, 50)),
        "p99_s": _rounded(percentile(offsets, 99)),
        "delivered": delivery.delivered,
        "misses": delivery.misses,
        "duplicates": delivery.duplicates,
        "duplicate_examples": delivery.duplicate_examples,
        "drain_fires_per_s": round(delivery.delivered / max(offsets), 1) if offsets else None,
        "cpu_cores": cpu,
        "drain_curve_s": quantile_curve(offsets),
        "tickgate_metrics": own,
    }


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def run(ctx: Context) -> dict[str, Any]:
    sizes = []
    margin = Margin()
    for count in sorted(ctx.sizes.burst_jobs):
        ctx.say(f"burst: {count} jobs due at one second")
        size = run_size(ctx, count, margin)
        margin.learn(count, max(size["replica_ready_s"]))
        ctx.say(
            f"burst {count}: drain {size['drain_s']} s, delivered {size['delivered']}, "
            f"dup {size['duplicates']}, miss {size['misses']}, "
            f"synced before T0: {size['ready_before_t0']}"
        )
        sizes.append(size)
    return {
        "status": "ok",
        "repeats": 1,
        "sizes": sizes,
        "duplicates": sum(size["duplicates"] for size in sizes),
    }
