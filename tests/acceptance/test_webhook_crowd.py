"""A crowd waits its turn at a small webhook instead of flooding it (#23).

300 jobs firing every second, on three replicas, all calling one small webhook: Python's
`http.server` with a listen backlog of 5 (tests/support/smallhook.py). Before the
per-host cap, each run opened a connection of its own: the backlog overflowed, the
kernel dropped connects, runs waited out TCP's SYN retransmits, and 1,447 of 6,800
ticks in 30 s were skipped as `overlap`. With the cap (the default, 64 connections per
replica and host, kept-alive ones reused first), over a 15 s window:
- every tick has one ledger row, a run that succeeded, and no tick is skipped (as
  `overlap` or otherwise);
- every tick is delivered exactly once, with its run's id;
- the webhook, counting connections itself, never sees more than the cap open at once
  from any replica.
"""

import time
from pathlib import Path

import httpx

from harness.accounting import await_accounting
from harness.cluster import serve_many
from harness.postgres import Sql
from tests.support.cluster import EVERY_SECOND_INTERVAL, next_whole_second, report, sleep_until
from tests.support.smallhook import SmallHook, small_hook

JOBS = 300
CAP = 64  # TICKGATE_HTTP_MAX_CONNECTIONS_PER_HOST's default: what a new user gets
WINDOW_SECONDS = 15
# From the jobs' creation to the window: every replica has loaded them and run a tick.
LEAD_SECONDS = 4
RUNNERS = "SELECT id::text AS id, runner FROM tickgate_runs WHERE job LIKE 'hook-%'"


def test_a_crowd_takes_turns_on_a_small_webhook_and_every_tick_is_delivered_once(
    database_url: str, tmp_path: Path, sql: Sql
) -> None:
    with small_hook() as hook, serve_many(tmp_path, 3, database_url=database_url) as replicas:
        jobs = [_job(f"hook-{index:03d}", hook) for index in range(JOBS)]
        applied = httpx.put(f"{replicas[0].url}/v1/jobs", json={"jobs": jobs}, timeout=60)
        assert applied.status_code == 200, applied.text
        first = next_whole_second(time.time(), LEAD_SECONDS)
        last = first + WINDOW_SECONDS - 1
        sleep_until(last + 1)
        periods = dict.fromkeys((job["name"] for job in jobs), 1)
        # No skip reason is allowed: not `overlap`, not `misfire`.
        await_accounting(hook, sql, periods, first, last, deadline_seconds=60)
        runners = {row["id"]: row["runner"] for row in sql.fetch(RUNNERS)}
        peaks = hook.peaks(runners)
        assert set(peaks) == {replica.runner_id for replica in replicas}, report(
            [f"connections by runner: {peaks}"], replicas
        )
        assert max(peaks.values()) <= CAP, f"connections open at once, by replica: {peaks}"


def _job(name: str, hook: SmallHook) -> dict[str, object]:
    return {
        "name": name,
        "schedule": EVERY_SECOND_INTERVAL,
        "task": "http",
        "args": {"url": f"{hook.url}/hook/{name}", "timeout_seconds": 10},
        "timeout_seconds": 20,
    }
