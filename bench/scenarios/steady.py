"""Scenario 2, steady: N one-second jobs, so N fires a second, for a measured window.

For each rate: a fresh database and the receiver; N jobs (half 6-field cron
`* * * * * *`, half `interval` of 1 s anchored at 2026-01-01T00:00:00Z), each an `http`
task POSTing to the receiver, created with concurrent `PUT /v1/jobs/{name}` through an
API-only replica; then three scheduler replicas start (so the window measures steady
state, not a creation storm). After a warm-up, the window runs `steady_seconds` whole
seconds: every job should arrive exactly once for every tick in it. Reported: achieved
fires/s (distinct expected (job, tick) pairs delivered / window), lateness (receipt minus
nominal tick) p50/p99/max, duplicates, misses, the CPU of the replicas, of PostgreSQL, of
the receiver and of the whole box, and each replica's RSS. One run per rate (they are
long).
"""

import math
import time
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import httpx

from bench.context import Context, Postgres, api_only_replica, receiver, tickgate_replicas
from bench.jobs import put_jobs
from bench.meters import CpuMeter, standard_meter
from bench.stats import latency_summary, quantile_curve
from harness.accounting import analyze_delivery
from harness.receiver import Receipt, ReceiverProcess
from harness.replicas import Replica
from harness.waiting import until_quiet

NAME = "steady"
INTERVAL = {"kind": "interval", "every_seconds": 1, "anchor": "2026-01-01T00:00:00Z"}
CRON = {"kind": "cron", "expression": "* * * * * *"}
QUIET_SECONDS = 2.0
DRAIN_DEADLINE_SECONDS = 20.0


def one_second_jobs(
    target: str | None, count: int, prefix: str, task: str = "http"
) -> list[dict[str, Any]]:
    """`count` jobs firing every second: even indexes cron, odd intervals; an `http` task
    POSTing to `target`, or a `log` task (its message at `info`, below the replicas'
    WARNING, so it costs next to nothing)."""
    args: dict[str, Any] = (
        {"url": f"{target}/tick", "method": "POST", "timeout_seconds": 5}
        if task == "http"
        else {"message": "tick"}
    )
    jobs = []
    for index in range(count):
        kind = "c" if index % 2 == 0 else "i"
        jobs.append(
            {
                "name": f"{prefix}-{kind}-{index:05d}",
                "schedule": CRON if kind == "c" else INTERVAL,
                "timezone": "UTC",
                "task": task,
                "args": args,
            }
        )
    return jobs


def sleep_until(moment: float) -> None:
    while (left := moment - time.time()) > 0:
        time.sleep(min(left, 0.5))


def window_start(warmup_seconds: float) -> float:
    """The first whole second at least `warmup_seconds` from now."""
    return float(math.ceil(time.time() + warmup_seconds))


def scrape_metrics(replicas: Sequence[Replica]) -> dict[str, dict[str, float]]:
    """Tickgate's own counters summed over replicas (its view, beside the receiver's),
    and the quantiles of its lock-held-after-return histogram."""
    skipped: defaultdict[str, float] = defaultdict(float)
    runs: defaultdict[str, float] = defaultdict(float)
    held: defaultdict[str, float] = defaultdict(float)
    with httpx.Client(timeout=30) as client:
        for replica in replicas:
            try:
                text = client.get(f"{replica.url}/metrics").text
            except httpx.HTTPError:
                continue
            for line in text.splitlines():
                _count_metric(line, "tickgate_ticks_skipped_total{", "reason", skipped)
                _count_metric(line, "tickgate_runs_total{", "status", runs)
                _count_metric(line, "tickgate_lock_held_after_return_seconds_bucket{", "le", held)
    return {
        "ticks_skipped_by_reason": dict(skipped),
        "runs_by_status": dict(runs),
        "lock_held_after_task_returned_ms": _histogram_quantiles(held),
    }


def _histogram_quantiles(buckets: dict[str, float]) -> dict[str, float]:
    """p50 / p99 of a Prometheus histogram's cumulative buckets, in ms, interpolated
    within the bucket as Prometheus' histogram_quantile does."""
    bounds = sorted((float(le), count) for le, count in buckets.items() if le != "+Inf")
    total = buckets.get("+Inf", 0.0)
    if not total:
        return {}
    quantiles = {}
    for name, q in (("p50_ms", 0.5), ("p99_ms", 0.99)):
        rank, low, below = q * total, 0.0, 0.0
        for bound, count in bounds:
            if count >= rank:
                share = (rank - below) / (count - below) if count > below else 1.0
                quantiles[name] = round((low + (bound - low) * share) * 1000, 2)
                break
            low, below = bound, count
    return quantiles


def _count_metric(line: str, prefix: str, label: str, into: defaultdict[str, float]) -> None:
    if not line.startswith(prefix):
        return
    labels, _, value = line.rpartition(" ")
    marker = f'{label}="'
    start = labels.find(marker)
    if start < 0:
        return
    name = labels[start + len(marker) : labels.index('"', start + len(marker))]
    into[name] += float(value)


def finish_window(
    receipts_from: ReceiverProcess,
    names: Sequence[str],
    began: float,
    ended: float,
) -> dict[str, Any]:
    """Wait for late deliveries, then count the window's ticks against the receipts."""
    ticks = range(int(began), int(ended))
    expected = {(name, float(tick)) for name in names for tick in ticks}
    until_quiet(
        lambda: receipts_from.count((began, ended)),
        len(expected),
        quiet_seconds=QUIET_SECONDS,
        deadline=time.time() + DRAIN_DEADLINE_SECONDS,
    )
    delivery = analyze_delivery(receipts_from.receipts(), expected)
    seconds = max(len(ticks), 1)
    return {
        "window_s": len(ticks),
        "expected": delivery.expected,
        "delivered": delivery.delivered,
        "achieved_fires_per_s": round(delivery.delivered / seconds, 1),
        "misses": delivery.misses,
        "duplicates": delivery.duplicates,
        "duplicate_examples": delivery.duplicate_examples,
        "lateness": latency_summary(delivery.lateness),
        "lateness_cdf_s": quantile_curve(delivery.lateness),
    }


def run_rate(ctx: Context, rate: int) -> dict[str, Any]:
    label = f"{NAME}-{rate}"
    url = ctx.postgres.fresh_database(f"{NAME}{rate}")
    with receiver(ctx, label) as target:
        jobs = one_second_jobs(target.url, rate, "s")
        with api_only_replica(ctx, url, label=label) as api:
            create_seconds = put_jobs([api.url], jobs)
        with tickgate_replicas(ctx, url, label=label) as replicas:
            began = window_start(ctx.sizes.steady_warmup_seconds)
            ended = began + ctx.sizes.steady_seconds
            meter = standard_meter(ctx, replicas, {"receiver": target.pid})
            cpu = metered_wait(meter, began, ended)
            rss = [round(r.rss_bytes() / 2**20, 1) for r in replicas]
            result = finish_window(target, [j["name"] for j in jobs], began, ended)
            own = scrape_metrics(replicas)
            held = lock_held_after_return(url, target.receipts())
    return (
        {"rate": rate, "jobs": rate, "create_seconds": round(create_seconds, 2)}
        | result
        | {"cpu_cores": cpu, "replica_rss_mib": rss, "tickgate_metrics": own}
        | held
    )


def lock_held_after_return(database_url: str, receipts: Sequence[Receipt]) -> dict[str, Any]:
    """How long each run's lock stayed held after its task returned: the run's recorded
    end (written, with the unlock, in one statement, on the database's clock) minus the
    moment the receiver answered its call (same box, same clock). Over every run since
    the replicas started, and over each replica's first second of runs (a cold start)."""
    rows = Postgres(database_url).fetch(
        """SELECT job, extract(epoch FROM scheduled_for)::float8 AS tick,
                      extract(epoch FROM finished_at)::float8 AS ended, runner,
                      extract(epoch FROM min(started_at) OVER (PARTITION BY runner))::float8
                          AS first_start,
                      extract(epoch FROM started_at)::float8 AS started
               FROM tickgate_runs WHERE status = 'succeeded'"""
    )
    answered = {(r.job, r.tick): r.received_at for r in receipts}
    held, first = [], []
    for row in rows:
        at = answered.get((row["job"], row["tick"]))
        if at is None:
            continue
        held.append(max(0.0, row["ended"] - at))
        if row["started"] - row["first_start"] < 1.0:
            first.append(held[-1])
    return {
        "lock_held_after_return": latency_summary(held),
        "lock_held_after_return_first_second": latency_summary(first),
    }


def metered_wait(meter: CpuMeter, began: float, ended: float) -> dict[str, float]:
    sleep_until(began)
    meter.start()
    sleep_until(ended)
    return meter.stop()


def run(ctx: Context) -> dict[str, Any]:
    levels = []
    for rate in ctx.sizes.steady_rates:
        ctx.say(f"steady: {rate} fires/s for {ctx.sizes.steady_seconds}s")
        level = run_rate(ctx, rate)
        ctx.say(
            f"steady {rate}: achieved {level['achieved_fires_per_s']}/s, "
            f"p99 {level['lateness']['p99_ms']} ms, dup {level['duplicates']}, "
            f"miss {level['misses']}, lock held after return p99 "
            f"{level['lock_held_after_return']['p99_ms']} ms"
        )
        levels.append(level)
    return {
        "status": "ok",
        "window_seconds": ctx.sizes.steady_seconds,
        "repeats": 1,
        "levels": levels,
        "duplicates": sum(level["duplicates"] for level in levels),
        "max_achieved_fires_per_s": max(level["achieved_fires_per_s"] for level in levels),
    }
