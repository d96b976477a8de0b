"""Crowds: many `once` jobs due at the same second T0 (scenarios burst and replicas).

One API-only replica (`TICKGATE_SCHEDULER=off`) creates a template job at T0 through
`PUT`; its row is cloned in SQL under the other names (`bench.jobs.clone_jobs`: 10^4..
10^5 jobs through the API would take minutes); the scheduler replicas start afterwards
and load them all at their first sync. T0 must be far enough ahead for all of that:
`Margin` learns the first sync's cost per job from each crowd for the next, bigger one.
"""

import math
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from bench.context import Context, api_only_replica
from bench.jobs import clone_jobs, put_jobs
from bench.stats import percentile, quantile_curve
from harness.accounting import analyze_delivery, ledger_rows
from harness.postgres import Sql
from harness.receiver import Receipt, ReceiverProcess
from harness.waiting import until_quiet

GRACE_SECONDS = 60  # the jobs' misfire grace (the default)
QUIET_SECONDS = 5.0  # a crowd is drained when nothing more started for this long


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


def once_job(name: str, t0: float, task: str, args: dict[str, Any]) -> dict[str, Any]:
    at = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t0))
    return {
        "name": name,
        "schedule": {"kind": "once", "at": at},
        "timezone": "UTC",
        "task": task,
        "args": args,
    }


def log_once_job(name: str, t0: float) -> dict[str, Any]:
    """A `log` job at `t0`. Its message is at `info`, below the replicas' WARNING: the
    task costs next to nothing, so a crowd of them measures the fire path alone."""
    return once_job(name, t0, "log", {"message": "crowd"})


def seed_crowd(
    ctx: Context,
    url: str,
    label: str,
    names: Sequence[str],
    *,
    job_at: Callable[[str, float], dict[str, Any]],
    lead_seconds: float,
) -> tuple[float, float]:
    """Every name as a `once` job at T0, `lead_seconds` from now (a whole second):
    `job_at(names[0], t0)` through the API, the rest cloned. (T0, seconds to clone)."""
    with api_only_replica(ctx, url, label=label) as api:
        t0 = float(math.ceil(time.time() + lead_seconds))
        put_jobs([api.url], [job_at(names[0], t0)])
        return t0, clone_jobs(url, names[0], names[1:])


# The finished rows (not `running`) of the ticks in [$1, $2).
_FINISHED = """
SELECT count(*) FROM tickgate_runs
WHERE scheduled_for >= to_timestamp($1) AND scheduled_for < to_timestamp($2)
  AND status <> 'running'
"""


def wait_for_rows(
    url: str, expected: int, window: tuple[float, float], *, quiet_seconds: float, deadline: float
) -> int:
    """The finished rows of ticks in `window` (POSIX seconds, end excluded) once they are
    `expected`, or stopped growing for `quiet_seconds`, or at `deadline` (time.time())."""
    sql = Sql(url)
    try:
        return until_quiet(
            lambda: int(sql.value(_FINISHED, *window)),
            expected,
            quiet_seconds=quiet_seconds,
            deadline=deadline,
        )
    finally:
        sql.close()


def _rounded(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


@dataclass(frozen=True)
class CrowdStarts:
    """A crowd of `jobs` jobs due at `t0`, as the ledger has it."""

    jobs: int
    rows: int
    jobs_with_rows: int
    jobs_with_more_rows: int  # a job with more than one row for T0 (never, by the key)
    skipped_by_reason: dict[str, int]
    status_counts: dict[str, int]
    offsets: list[float]  # started_at - T0 of each row that is a run (not a skip)
    runs_by_runner: dict[str, int]

    def summary(self) -> dict[str, Any]:
        return {
            "jobs": self.jobs,
            "started": len(self.offsets),
            "rows": self.rows,
            "missing": self.jobs - self.jobs_with_rows,
            "jobs_with_more_than_one_row": self.jobs_with_more_rows,
            "skipped_by_reason": self.skipped_by_reason,
            "status_counts": self.status_counts,
            **drain_figures(self.offsets),
            "runs_by_runner": self.runs_by_runner,
        }


def drain_figures(offsets: Sequence[float]) -> dict[str, Any]:
    """A crowd's starts, seconds after T0: the last, the first, half, 99 %, the rate."""
    drain = max(offsets) if offsets else None
    return {
        "drain_s": _rounded(drain),
        "first_s": _rounded(min(offsets) if offsets else None),
        "p50_s": _rounded(percentile(offsets, 50)),
        "p99_s": _rounded(percentile(offsets, 99)),
        "drain_fires_per_s": round(len(offsets) / drain, 1) if drain else None,
        "drain_curve_s": quantile_curve(offsets),
    }


def received_crowd(receipts: Sequence[Receipt], names: Sequence[str], t0: float) -> dict[str, Any]:
    """A crowd of `http` jobs due at `t0`, as the receiver counted it."""
    delivery = analyze_delivery(receipts, {(name, t0) for name in names})
    return {
        **drain_figures(delivery.lateness),
        "delivered": delivery.delivered,
        "misses": delivery.misses,
        "duplicates": delivery.duplicates,
        "duplicate_examples": delivery.duplicate_examples,
    }


def wait_drained(ctx: Context, who: str, count: int, t0: float, target: ReceiverProcess) -> None:
    """Until every job arrived, nothing arrived for a while, or the grace ran out."""
    time.sleep(max(0.0, t0 + 2 - time.time()))
    deadline = t0 + GRACE_SECONDS + 15
    arrived = until_quiet(target.count, count, quiet_seconds=QUIET_SECONDS, deadline=deadline)
    if arrived < count:
        ctx.say(f"{who}: stopped waiting at {arrived}/{count}")


def crowd_starts(url: str, t0: float, jobs: int) -> CrowdStarts:
    """Every ledger row of tick `t0`: who started when, and whether any job has two."""
    sql = Sql(url)
    try:
        rows = ledger_rows(sql, None, t0, t0)
    finally:
        sql.close()
    per_job = Counter(row["job"] for row in rows)
    runs = [row for row in rows if row["status"] != "skipped"]
    return CrowdStarts(
        jobs=jobs,
        rows=len(rows),
        jobs_with_rows=len(per_job),
        jobs_with_more_rows=sum(1 for count in per_job.values() if count > 1),
        skipped_by_reason=dict(Counter(r["skip_reason"] for r in rows if r["status"] == "skipped")),
        status_counts=dict(Counter(row["status"] for row in rows)),
        offsets=[row["late"] for row in runs],
        runs_by_runner=dict(Counter(row["runner"] for row in runs)),
    )
