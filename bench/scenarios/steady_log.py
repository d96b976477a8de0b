"""Scenario 3, steady_log: the highest clean steady rate with the built-in `log` task.

As scenario 2 (steady), but each job runs the `log` task (nothing leaves the replica, so
this is the fire path alone) and the window is judged from Tickgate's ledger
(`window_outcomes`), at each of `steady_log_rates` for `steady_log_seconds`
after `steady_warmup_seconds`. The jobs (half 6-field cron `* * * * * *`, half 1 s
intervals) are created in one bulk `PUT /v1/jobs` through an API-only replica; then three
scheduler replicas start.

A rate is **clean** when every (job, tick) of the window has exactly one row, `succeeded`
(none missing 20 s after the window closed, none skipped, none still running or failed),
and the p99 of `started_at - scheduled_for` is under 1 s. The highest clean rate is the
largest such rate.
"""

from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

from bench.context import Context, api_only_replica, tickgate_replicas
from bench.crowd import wait_for_rows
from bench.jobs import apply_jobs
from bench.meters import standard_meter
from bench.scenarios.steady import (
    DRAIN_DEADLINE_SECONDS,
    QUIET_SECONDS,
    metered_wait,
    one_second_jobs,
    scrape_metrics,
    window_start,
)
from bench.stats import latency_summary, quantile_curve
from harness.accounting import account
from harness.postgres import Sql

NAME = "steady_log"


def run_rate(
    ctx: Context,
    rate: int,
    *,
    variant: str = "",
    env: Mapping[str, str] | None = None,
    seconds: int | None = None,
) -> dict[str, Any]:
    """One rate for `seconds` (steady_log_seconds); `variant` names a second run of it
    (with replicas' `env` on top)."""
    window = seconds or ctx.sizes.steady_log_seconds
    label = f"{NAME}-{rate}{variant}"
    url = ctx.postgres.fresh_database(f"steadylog{rate}{variant}")
    jobs = one_second_jobs(None, rate, "sl", task="log")
    names = [job["name"] for job in jobs]
    with api_only_replica(ctx, url, label=label) as api:
        create_seconds, _ = apply_jobs(api.url, jobs)
    with tickgate_replicas(ctx, url, label=label, env=env) as replicas:
        began = window_start(ctx.sizes.steady_warmup_seconds)
        ended = began + window
        cpu = metered_wait(standard_meter(ctx, replicas), began, ended)
        rss = [round(r.rss_bytes() / 2**20, 1) for r in replicas]
        wait_for_rows(
            url,
            rate * window,
            (began, ended),
            quiet_seconds=QUIET_SECONDS,
            deadline=ended + DRAIN_DEADLINE_SECONDS,
        )
        own = scrape_metrics(replicas)
    outcome = window_outcomes(url, names, began, ended)
    return (
        {"rate": rate, "jobs": rate, "create_seconds": round(create_seconds, 2)}
        | outcome
        | {"cpu_cores": cpu, "replica_rss_mib": rss, "tickgate_metrics": own}
    )


def run(ctx: Context) -> dict[str, Any]:
    levels = []
    for rate in ctx.sizes.steady_log_rates:
        ctx.say(f"steady_log: {rate} `log` fires/s for {ctx.sizes.steady_log_seconds}s")
        level = run_rate(ctx, rate)
        ctx.say(
            f"steady_log {rate}: {level['achieved_fires_per_s']}/s succeeded, "
            f"p99 {level['lateness']['p99_ms']} ms, missing {level['missing']}, "
            f"skipped {level['skipped']}, clean: {level['clean']}"
        )
        levels.append(level)
    clean = [level["rate"] for level in levels if level["clean"]]
    return {
        "status": "ok",
        "window_seconds": ctx.sizes.steady_log_seconds,
        "repeats": 1,
        "clean_rule": (
            "every (job, tick) of the window has exactly one row, succeeded (none missing "
            "20 s after the window, none skipped, running or failed), and p99 of "
            f"started_at - scheduled_for < {CLEAN_P99_S:g} s"
        ),
        "levels": levels,
        "highest_clean_rate": max(clean, default=None),
        "max_achieved_fires_per_s": max(level["achieved_fires_per_s"] for level in levels),
    }


# A steady window is clean at a rate when every tick has its one succeeded run, none was
# skipped, and 99 % started within this long of their tick.
CLEAN_P99_S = 1.0


def window_outcomes(url: str, names: Sequence[str], began: float, ended: float) -> dict[str, Any]:
    """Tick by tick over the whole seconds [began, ended): each (job, tick) should have
    exactly one row, `succeeded`. Lateness is `started_at - scheduled_for` of those runs."""
    sql = Sql(url)
    try:
        accounting = account(None, sql, dict.fromkeys(names, 1), int(began), int(ended) - 1)
    finally:
        sql.close()
    rows = [accounting.rows[tick] for tick in accounting.expected if tick in accounting.rows]
    succeeded = [row["late"] for row in rows if row["status"] == "succeeded"]
    skipped = Counter(row["skip_reason"] for row in rows if row["status"] == "skipped")
    other = Counter(row["status"] for row in rows if row["status"] not in {"succeeded", "skipped"})
    missing = len(accounting.without_rows())
    window = int(ended) - int(began)
    lateness = latency_summary(succeeded)
    p99 = lateness["p99_ms"]
    return {
        "window_s": window,
        "expected": len(accounting.expected),
        "succeeded": len(succeeded),
        "achieved_fires_per_s": round(len(succeeded) / max(window, 1), 1),
        "missing": missing,
        "skipped": sum(skipped.values()),
        "skipped_by_reason": dict(skipped),
        "other_by_status": dict(other),
        "lateness": lateness,
        "lateness_cdf_s": quantile_curve(succeeded),
        "clean": missing == 0
        and not skipped
        and not other
        and p99 is not None
        and p99 < CLEAN_P99_S * 1000,
    }
