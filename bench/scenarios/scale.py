"""Scenario 7, scale: `scale_jobs` active jobs in the database.

An API-only replica creates one template job (cron `0 0 1 1 *`, UTC: it does not fire
during the run) through `PUT`; its row is cloned in SQL under the other names. Then a
replica is timed from process start to the first 200 of `GET /readyz` (which waits for
the scheduler's first full sync): first one alone on the box (`solo`), then three
started together (`together`, as in a rollout; they share two cores). Reported: each
replica's ready time and RSS (peak from start to a few seconds after ready, sampled every
0.2 s), and paging on the three: the time to walk every job with
`GET /v1/jobs?limit=1000` and the cursor, plus the latency of `GET /v1/jobs?limit=100`
(first page) and of a `prefix` page deep in the list.
"""

import time
from collections.abc import Sequence
from typing import Any

import httpx

from bench.context import BENCH_ENV, READY_DEADLINE_SECONDS, Context, api_only_replica
from bench.jobs import clone_jobs, put_jobs
from bench.meters import RssSampler
from bench.stats import latency_summary
from harness.cluster import start_many
from harness.replicas import Replica, stop_all, wait_ready

NAME = "scale"
SAMPLES = 20


def idle_job(name: str) -> dict[str, Any]:
    """A job that does not fire during a run (cron `0 0 1 1 *`, UTC)."""
    return {
        "name": name,
        "schedule": {"kind": "cron", "expression": "0 0 1 1 *"},
        "timezone": "UTC",
        "task": "log",
        "args": {"message": "scale"},
    }


def _started(ctx: Context, url: str, count: int, label: str) -> tuple[list[Replica], list[float]]:
    """`count` replicas, ready; their peak RSS (MiB) from start until `settle_seconds` after."""
    replicas = start_many(ctx.logdir(label), count, database_url=url, env=BENCH_ENV)
    try:
        with RssSampler([r.pid for r in replicas]) as rss:
            wait_ready(replicas, "/readyz", READY_DEADLINE_SECONDS)
            time.sleep(ctx.sizes.settle_seconds)
    except BaseException:
        stop_all(replicas)
        raise
    return replicas, rss.peaks_mib()


def _walk(client: httpx.Client, urls: Sequence[str], limit: int) -> dict[str, Any]:
    """Every job, page by page, round-robin over the replicas."""
    cursor: str | None = None
    pages = items = 0
    durations = []
    began = time.perf_counter()
    while True:
        params: dict[str, str | int] = {"limit": limit} | ({"cursor": cursor} if cursor else {})
        started = time.perf_counter()
        response = client.get(f"{urls[pages % len(urls)]}/v1/jobs", params=params)
        response.raise_for_status()
        durations.append(time.perf_counter() - started)
        body = response.json()
        pages += 1
        items += len(body["items"])
        cursor = body.get("next_cursor")
        if not cursor:
            break
    return {
        "limit": limit,
        "pages": pages,
        "items": items,
        "total_s": round(time.perf_counter() - began, 3),
        "page": latency_summary(durations),
    }


def _timed_gets(client: httpx.Client, url: str, params: dict[str, str | int]) -> dict[str, Any]:
    durations = []
    for _ in range(SAMPLES):
        started = time.perf_counter()
        client.get(url, params=params).raise_for_status()
        durations.append(time.perf_counter() - started)
    return latency_summary(durations)


def _paging(urls: Sequence[str], count: int) -> dict[str, Any]:
    with httpx.Client(timeout=120) as client:
        walk = _walk(client, urls, 1000)
        first = _timed_gets(client, f"{urls[0]}/v1/jobs", {"limit": 100})
        prefix = f"j-{count // 2:06d}"[:-2]  # the 100 names from the middle of the list
        deep = _timed_gets(client, f"{urls[0]}/v1/jobs", {"limit": 100, "prefix": prefix})
        scrape = _timed_gets(client, f"{urls[0]}/metrics", {})
    return {
        "walk_limit_1000": walk,
        "first_page_limit_100": first,
        "prefix_page_limit_100": deep,
        "metrics_scrape": scrape,
    }


def run(ctx: Context) -> dict[str, Any]:
    count = ctx.sizes.scale_jobs
    url = ctx.postgres.fresh_database(NAME)
    names = [f"j-{index:06d}" for index in range(count)]
    ctx.say(f"scale: {count} jobs")
    with api_only_replica(ctx, url, label=NAME) as api:
        put_jobs([api.url], [idle_job(names[0])])
        clone_seconds = clone_jobs(url, names[0], names[1:])
    solo, solo_rss = _started(ctx, url, 1, f"{NAME}-solo")
    stop_all(solo)
    replicas, rss = _started(ctx, url, 3, NAME)
    try:
        paging = _paging([r.url for r in replicas], count)
    finally:
        stop_all(replicas)
    ready = [round(r.ready_seconds or 0.0, 2) for r in replicas]
    solo_ready = round(solo[0].ready_seconds or 0.0, 2)
    ctx.say(
        f"scale {count}: solo ready {solo_ready} s, {solo_rss[0]} MiB; together ready "
        f"{ready} s, RSS {rss} MiB; walk {paging['walk_limit_1000']['total_s']} s"
    )
    return {
        "status": "ok",
        "jobs": count,
        "clone_seconds": round(clone_seconds, 2),
        "solo_ready_s": solo_ready,
        "solo_rss_peak_mib": solo_rss[0],
        "replica_ready_s": ready,
        "replica_rss_peak_mib": rss,
        "paging": paging,
        "repeats": 1,
    }
