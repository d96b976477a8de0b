"""Scenario 6, bulk: one `PUT /v1/jobs` of `bulk_jobs` jobs (GitOps apply), timed.

`repeats` times, each on a fresh database with one `tickgate serve` replica: the set (jobs
with cron `0 0 1 1 *` and the `log` task, so nothing fires) is applied once, where every
job is `created`, then, `settle_seconds` later, again, where every job is `unchanged` (no
write). Each time runs from sending the request (its JSON body encoded beforehand) to the
whole answer (`bench.common.apply_jobs`). Reported: the median of each, and every attempt.
"""

import time
from collections.abc import Sequence
from typing import Any

from bench.context import Context, tickgate_replicas
from bench.jobs import apply_jobs
from bench.scenarios.scale import idle_job
from bench.stats import median_of

NAME = "bulk"


def attempt(ctx: Context, jobs: Sequence[dict[str, Any]], index: int) -> dict[str, Any]:
    url = ctx.postgres.fresh_database(f"{NAME}{index}")
    with tickgate_replicas(ctx, url, label=f"{NAME}-{index}", count=1) as replicas:
        created_s, first = apply_jobs(replicas[0].url, jobs)
        time.sleep(ctx.sizes.settle_seconds)
        unchanged_s, second = apply_jobs(replicas[0].url, jobs)
    if first["created"] != len(jobs) or second["unchanged"] != len(jobs):
        counts = [{k: v for k, v in a.items() if k != "outcomes"} for a in (first, second)]
        raise RuntimeError(f"bulk apply of {len(jobs)} jobs answered {counts}")
    return {"created_s": round(created_s, 3), "unchanged_s": round(unchanged_s, 3)}


def run(ctx: Context) -> dict[str, Any]:
    count = ctx.sizes.bulk_jobs
    jobs = [idle_job(f"bulk-{index:05d}") for index in range(count)]
    ctx.say(f"bulk: PUT /v1/jobs of {count} jobs, {ctx.sizes.repeats} time(s)")
    attempts = [attempt(ctx, jobs, index) for index in range(ctx.sizes.repeats)]
    created = median_of(a["created_s"] for a in attempts)
    unchanged = median_of(a["unchanged_s"] for a in attempts)
    ctx.say(f"bulk {count}: created in {created} s, unchanged in {unchanged} s (median)")
    return {
        "status": "ok",
        "jobs": count,
        "repeats": ctx.sizes.repeats,
        "created_s": created,
        "unchanged_s": unchanged,
        "attempts": attempts,
    }
