"""Figures read from Tickgate's own run ledger (`tickgate_runs`), for the `log` task.

A `log` job sends nothing a receiver could count, so its scenarios judge from the ledger:
one row per (job, nominal tick), `scheduled_for` the tick, `started_at` the database's
clock when the claim statement inserted the row (`clock_timestamp()`, the same clock on
this box as the harness's), `status` `succeeded` for a run that finished, `skipped` with
a `skip_reason` for a tick that did not run. Duplicates are impossible by the unique key
(job, scheduled_for); rows per job are still counted, so a crowd job with two rows shows.

`wait_for_rows` waits for the finished rows of a window; `crowd_starts` reads a crowd
(every job due at T0); `window_outcomes` judges a steady window tick by tick.
"""

import asyncio
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg

from bench.common import fetch, latency_summary, percentile, quantile_curve

POLL_SECONDS = 0.2
# A steady window is clean at a rate when every tick has its one succeeded run, none was
# skipped, and 99 % started within this long of their tick.
CLEAN_P99_S = 1.0

_FINISHED = """
SELECT count(*) FROM tickgate_runs
WHERE scheduled_for >= to_timestamp($1) AND scheduled_for < to_timestamp($2)
  AND status <> 'running'
"""

_ROWS = """
SELECT job, extract(epoch FROM scheduled_for)::float8 AS tick, status, skip_reason, runner,
       extract(epoch FROM started_at - scheduled_for)::float8 AS late
FROM tickgate_runs
WHERE scheduled_for >= to_timestamp($1) AND scheduled_for < to_timestamp($2)
"""


async def _wait(
    url: str, expected: int, window: tuple[float, float], quiet_seconds: float, deadline: float
) -> int:
    connection = await asyncpg.connect(url)
    try:
        last, since = -1, time.monotonic()
        while time.time() < deadline:
            now = int(await connection.fetchval(_FINISHED, *window, timeout=30))
            if now >= expected:
                return now
            if now != last:
                last, since = now, time.monotonic()
            elif now and time.monotonic() - since >= quiet_seconds:
                break
            await asyncio.sleep(POLL_SECONDS)
        return max(last, 0)
    finally:
        await connection.close()


def wait_for_rows(
    url: str, expected: int, window: tuple[float, float], *, quiet_seconds: float, deadline: float
) -> int:
    """Until `expected` finished rows (not `running`) have ticks in `window` (POSIX
    seconds, end excluded), or none came for `quiet_seconds` after the first, or
    `deadline` (time.time()) passed; the count."""
    return asyncio.run(_wait(url, expected, window, quiet_seconds, deadline))


def _rows(url: str, window: tuple[float, float]) -> list[asyncpg.Record]:
    return asyncio.run(fetch(url, _ROWS, *window))


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
        offsets = self.offsets
        drain = max(offsets) if offsets else None
        return {
            "jobs": self.jobs,
            "started": len(offsets),
            "rows": self.rows,
            "missing": self.jobs - self.jobs_with_rows,
            "jobs_with_more_than_one_row": self.jobs_with_more_rows,
            "skipped_by_reason": self.skipped_by_reason,
            "status_counts": self.status_counts,
            "drain_s": _rounded(drain),
            "first_s": _rounded(min(offsets) if offsets else None),
            "p50_s": _rounded(percentile(offsets, 50)),
            "p99_s": _rounded(percentile(offsets, 99)),
            "drain_fires_per_s": round(len(offsets) / drain, 1) if drain else None,
            "drain_curve_s": quantile_curve(offsets),
            "runs_by_runner": self.runs_by_runner,
        }


def crowd_starts(url: str, t0: float, jobs: int) -> CrowdStarts:
    """Every ledger row of tick `t0`: who started when, and whether any job has two."""
    rows = _rows(url, (t0, t0 + 1))
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


def window_outcomes(url: str, names: Sequence[str], began: float, ended: float) -> dict[str, Any]:
    """Tick by tick over the whole seconds [began, ended): each (job, tick) should have
    exactly one row, `succeeded`. Lateness is `started_at - scheduled_for` of those runs."""
    ticks = range(int(began), int(ended))
    expected = {(name, float(tick)) for name in names for tick in ticks}
    rows = [row for row in _rows(url, (began, ended)) if (row["job"], row["tick"]) in expected]
    succeeded = [row["late"] for row in rows if row["status"] == "succeeded"]
    skipped = Counter(row["skip_reason"] for row in rows if row["status"] == "skipped")
    other = Counter(row["status"] for row in rows if row["status"] not in {"succeeded", "skipped"})
    missing = len(expected) - len({(row["job"], row["tick"]) for row in rows})
    lateness = latency_summary(succeeded)
    p99 = lateness["p99_ms"]
    return {
        "window_s": len(ticks),
        "expected": len(expected),
        "succeeded": len(succeeded),
        "achieved_fires_per_s": round(len(succeeded) / max(len(ticks), 1), 1),
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
