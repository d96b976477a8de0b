"""Crowds: many `once` jobs due at the same second T0 (scenarios burst and replicas).

One API-only replica (`TICKGATE_SCHEDULER=off`) creates a template job at T0 through
`PUT`; its row is cloned in SQL under the other names (`bench.common.clone_jobs`: 10^4..
10^5 jobs through the API would take minutes); the scheduler replicas start afterwards
and load them all at their first sync. T0 must be far enough ahead for all of that:
`Margin` learns the first sync's cost per job from each crowd for the next, bigger one.
"""

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from bench.common import Context, api_only_replica, clone_jobs, put_jobs

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
