"""What the tests against real replicas (acceptance, faults) share: jobs calling the
receiver, a blocking SQL connection, waiting with the replicas' logs, and the count of
deliveries beyond the first. Which ticks arrived once, twice or never, against the
ledger, is `harness.accounting`'s (`await_ticks`)."""

import asyncio
import itertools
import math
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

import httpx

from harness.accounting import Tick, rfc3339, row_text
from harness.postgres import Sql
from harness.receiver import Receiver
from harness.replicas import Replica
from harness.waiting import eventually

EVERY_SECOND_CRON: dict[str, Any] = {"kind": "cron", "expression": "* * * * * *"}
EVERY_SECOND_INTERVAL: dict[str, Any] = {
    "kind": "interval",
    "every_seconds": 1,
    "anchor": "2026-01-01T00:00:00Z",
}
YEARLY_CRON: dict[str, Any] = {"kind": "cron", "expression": "0 0 1 1 *"}
EVERY_FIVE_SECONDS_CRON: dict[str, Any] = {"kind": "cron", "expression": "*/5 * * * * *"}
# Orphans are swept (and mirrors reconciled) every 2 s instead of every 30 s.
FAST_ORPHAN_SWEEPS = {"TICKGATE_RECONCILE_SECONDS": "2"}

# Advisory locks held on any of the given bigint keys (classid = high 32 bits, objid = low
# 32 bits, objsubid = 1), in the current database.
ADVISORY_LOCKS_ON_KEYS = """
    SELECT count(*) FROM pg_locks
    WHERE locktype = 'advisory' AND objsubid = 1
      AND database = (SELECT oid FROM pg_database WHERE datname = current_database())
      AND ((classid::bigint << 32) | objid::bigint) = ANY($1::bigint[])
"""


def http_job(
    name: str,
    receiver: Receiver,
    schedule: Mapping[str, Any],
    *,
    seconds: float | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """A job calling the receiver at /tick/<name>, answered after `seconds` if given."""
    call_timeout = max(10.0, (seconds or 0) + 10)
    return {
        "name": name,
        "schedule": dict(schedule),
        "task": "http",
        "args": {
            "url": receiver.url_for(f"/tick/{name}", seconds=seconds),
            "timeout_seconds": call_timeout,
        },
        "timeout_seconds": int(call_timeout + 10),
    } | fields


def create(replica: Replica, job: Mapping[str, Any]) -> dict[str, Any]:
    response = httpx.post(f"{replica.url}/v1/jobs", json=dict(job), timeout=10)
    assert response.status_code == 201, f"{response.text}\n{replica.log_tail()}"
    body: dict[str, Any] = response.json()
    return body


def create_every_second_jobs(
    replicas: Sequence[Replica], receiver: Receiver, crons: int, intervals: int
) -> dict[str, int]:
    """Every-second cron and interval jobs, created round-robin; each job's period."""
    names = [f"cron-{i:02d}" for i in range(crons)]
    names += [f"interval-{i:02d}" for i in range(intervals)]
    for index, name in enumerate(names):
        schedule = EVERY_SECOND_CRON if name.startswith("cron") else EVERY_SECOND_INTERVAL
        create(replicas[index % len(replicas)], http_job(name, receiver, schedule))
    return dict.fromkeys(names, 1)


def status_of(replica: Replica, path: str) -> int:
    """The HTTP status of GET `path`, or 0 if the replica does not answer."""
    try:
        return httpx.get(f"{replica.url}{path}", timeout=5).status_code
    except httpx.TransportError:
        return 0


def run_by_id(replica: Replica, run_id: str) -> dict[str, Any]:
    response = httpx.get(f"{replica.url}/v1/runs/{run_id}", timeout=10)
    assert response.status_code == 200, response.text
    run: dict[str, Any] = response.json()
    return run


def triggered_run(replica: Replica, name: str, deadline_seconds: float = 30) -> dict[str, Any]:
    """Trigger the job on the replica and wait for its run to end: the run as answered."""
    started = httpx.post(f"{replica.url}/v1/jobs/{name}/trigger", timeout=10)
    assert started.status_code == 202, started.text

    def over() -> dict[str, Any] | None:
        run = run_by_id(replica, started.json()["id"])
        return run if run["status"] not in {"running", "pending"} else None

    return eventually(over, deadline_seconds, f"the run of {name}")


def job_lock_keys(replica: Replica) -> list[int]:
    response = httpx.get(f"{replica.url}/v1/jobs", params={"limit": 1000}, timeout=10)
    assert response.status_code == 200, response.text
    return [int(job["lock_key"]) for job in response.json()["items"]]


def utc(moment: float) -> datetime:
    return datetime.fromtimestamp(moment, UTC)


def next_whole_second(after: float, margin: float = 0.0) -> int:
    return math.ceil(after + margin)


def sleep_until(moment: float) -> None:
    """Let a window of time elapse: the window itself is what the test observes."""
    time.sleep(max(0.0, moment - time.time()))


def logs(replicas: Sequence[Replica]) -> str:
    return "\n".join(replica.log_tail() for replica in replicas)


def readiness(replicas: Sequence[Replica]) -> str:
    """Each replica's answer to /readyz now: which check keeps it from being ready."""
    answers = []
    for replica in replicas:
        try:
            answer = httpx.get(f"{replica.url}/readyz", timeout=5)
            answers.append(f"{replica.url}/readyz: {answer.status_code} {answer.text}")
        except httpx.HTTPError as error:
            answers.append(f"{replica.url}/readyz: {error!r}")
    return "\n".join(answers)


def wait_until(
    condition: Callable[[], bool], deadline_seconds: float, what: str, replicas: Sequence[Replica]
) -> None:
    """Poll `condition`; at the deadline fail naming `what`, with the replicas' readiness
    and logs as they are then (not as they were when the wait began)."""
    try:
        eventually(condition, deadline_seconds, what)
    except AssertionError as error:
        raise AssertionError(f"{error}\n{readiness(replicas)}\n{logs(replicas)}") from None


def report(problems: Sequence[str], replicas: Sequence[Replica]) -> str:
    shown = "\n".join(problems[:40])
    more = f"\n... and {len(problems) - 40} more" if len(problems) > 40 else ""
    return f"{len(problems)} problems:\n{shown}{more}\n{logs(replicas)}"


def extra_deliveries(receiver: Receiver, manual_jobs: Sequence[str] = ()) -> int:
    """Deliveries beyond the first of any run id or idempotency key, or of any (job,
    tick) of a job not in `manual_jobs` (manual runs carry the whole second they were
    asked for, and two may share one)."""
    receipts = receiver.receipts()
    extra = 0
    for key in (
        Counter((r.job, r.scheduled_for) for r in receipts if r.job not in manual_jobs),
        Counter(r.run_id for r in receipts if r.run_id),
        Counter(r.idempotency_key for r in receipts if r.idempotency_key),
    ):
        extra = max(extra, sum(count - 1 for count in key.values() if count > 1))
    return extra


def claimed_by(sql: Sql, runner: str) -> set[Tick]:
    """Every (job, tick) whose ledger row names `runner`."""
    rows = sql.fetch(
        "SELECT job, extract(epoch FROM scheduled_for)::float8 AS at FROM tickgate_runs"
        " WHERE runner = $1",
        runner,
    )
    return {(row["job"], float(row["at"])) for row in rows}


# --- whole-window tick accounting: deliveries and ledger rows, tick by tick ---------------

EVERY_TWO_SECONDS_CRON: dict[str, Any] = {"kind": "cron", "expression": "*/2 * * * * *"}
# Each kind of every-second job: its schedule and period (ticks are the whole seconds
# divisible by the period: true of these crons and of intervals anchored at midnight UTC).
SCHEDULE_KINDS: dict[str, tuple[dict[str, Any], int]] = {
    "cron": (EVERY_SECOND_CRON, 1),
    "interval": (EVERY_SECOND_INTERVAL, 1),
    "cron2": (EVERY_TWO_SECONDS_CRON, 2),
}


def every_second_specs(
    receiver: Receiver, counts: Mapping[str, int], prefix: str = ""
) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """`counts[kind]` jobs of each kind of SCHEDULE_KINDS, named `<prefix><kind>-NNN`,
    calling the receiver (answered at once); the specs and each job's period."""
    specs: list[dict[str, Any]] = []
    periods: dict[str, int] = {}
    for kind, count in counts.items():
        schedule, period = SCHEDULE_KINDS[kind]
        for index in range(count):
            name = f"{prefix}{kind}-{index:03d}"
            specs.append(http_job(name, receiver, schedule))
            periods[name] = period
    return specs, periods


def create_all(replicas: Sequence[Replica], jobs: Sequence[Mapping[str, Any]]) -> None:
    """POST every job, round-robin over the replicas, many at once (bulk, quickly)."""
    requests = [
        ("POST", f"{replicas[i % len(replicas)].url}/v1/jobs", dict(job))
        for i, job in enumerate(jobs)
    ]
    failed = [f"{status} {text}" for status, text in send_all(requests) if status != 201]
    assert not failed, report(failed, replicas)


def delete_all_jobs(replica: Replica) -> None:
    """Delete every job there is (their ledger rows go with them)."""
    response = httpx.get(f"{replica.url}/v1/jobs", params={"limit": 1000}, timeout=30)
    assert response.status_code == 200, response.text
    names = [job["name"] for job in response.json()["items"]]
    requests = [("DELETE", f"{replica.url}/v1/jobs/{name}", None) for name in names]
    failed = [f"{status} {text}" for status, text in send_all(requests) if status not in {204, 404}]
    assert not failed, failed[:10]


def send_all(
    requests: Sequence[tuple[str, str, Mapping[str, Any] | None]], concurrency: int = 24
) -> list[tuple[int, str]]:
    """Send (method, url, json body) requests, `concurrency` at a time; each one's
    (status, body text), in order."""

    async def send_them() -> list[tuple[int, str]]:
        gate = asyncio.Semaphore(concurrency)
        limits = httpx.Limits(max_connections=concurrency)
        async with httpx.AsyncClient(timeout=60, limits=limits) as client:

            async def one(method: str, url: str, body: Mapping[str, Any] | None) -> tuple[int, str]:
                async with gate:
                    sent = await client.request(
                        method, url, json=dict(body) if body is not None else None
                    )
                    return sent.status_code, sent.text

            return await asyncio.gather(*(one(*request) for request in requests))

    return asyncio.run(send_them())


def overlapping_runs(rows: Sequence[Any]) -> list[str]:
    """Runs (not skips) of one job that overlapped in time: each must start no earlier
    than the one before it ended (an end is recorded in the statement releasing the
    job's lock, so the next run's claim comes after it)."""
    runs = sorted(
        (row for row in rows if row["status"] != "skipped"), key=lambda row: row["started_at"]
    )
    return [
        f"{rfc3339(later['at'])} started at {later['started_at']:%H:%M:%S.%f}, before"
        f" {rfc3339(earlier['at'])} ({row_text(earlier)}) ended"
        for earlier, later in itertools.pairwise(runs)
        if earlier["finished_at"] is None or later["started_at"] < earlier["finished_at"]
    ]


def unfinished_ticks(sql: Sql, runner_id: str) -> set[tuple[str, float]]:
    """(job, tick) of the runs of `runner_id` that never ended well: fenced (cancelled),
    abandoned, or still `running`. A replica cut off mid-run may miss these; each has its
    row."""
    rows = sql.fetch(
        "SELECT job, extract(epoch FROM scheduled_for)::float8 AS at FROM tickgate_runs"
        " WHERE runner = $1 AND status IN ('running', 'cancelled', 'abandoned')",
        runner_id,
    )
    return {(row["job"], float(row["at"])) for row in rows}
