"""Scenario 8, scale_out: `scale_out_jobs` jobs (10^6 in a full run) over
`scale_out_replicas` (4) replicas that own their jobs (`TICKGATE_OWNERSHIP=on`).

The jobs are cloned as in scenario 7 (scale: cron `0 0 1 1 *`, nothing fires during the
run). The replicas start together, as in a rollout, and are timed from process start to
the first 200 of `GET /readyz` (the scheduler's first sync); each replica's peak RSS
(its process tree, sampled every 0.2 s; and its PSS, which counts the pages the
supervisor shares with its forked children once, every second) runs from start to
`ownership_settle_seconds` after the last was ready, so the hand-over of jobs a
replica no longer owns is inside it.
The same replicas with a single job, measured first, are what memory per job is judged
against (`one_job`).

Memory: a replica holds only the jobs with a tick in its window (none here), but the
harness still assumes the worst of older releases, which mirrored their jobs (each
replica loads every job, `WORST_KIB_PER_JOB` each) and, if the
box's available memory cannot hold it, measures the largest size that fits (a multiple
of 10,000) and says so. While the replicas run, a guard kills them if available memory
falls under `FLOOR_MIB`; the size is then halved and tried once more.
"""

import contextlib
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import psutil

from bench.context import BENCH_ENV, OWNERSHIP_ON, Context, api_only_replica
from bench.jobs import clone_jobs, put_jobs
from bench.meters import RssSampler
from bench.scenarios.scale import idle_job
from harness.cluster import start_many
from harness.replicas import Replica, process_tree, stop_all, wait_ready

NAME = "scale_out"
READY_DEADLINE_SECONDS = 900.0
WORST_KIB_PER_JOB = 3.0  # scale (100k jobs): under 3 KiB a job per replica tree
BASE_MIB_PER_REPLICA = 250.0  # a replica tree with few jobs: about 210 MiB
FLOOR_MIB = 1024.0  # left for PostgreSQL and everything else on the box
STEP = 10_000


def fitting_jobs(wanted: int, replicas: int, available_mib: float) -> int:
    """The most jobs (up to `wanted`, a multiple of STEP below it) whose worst case fits."""
    per_replica_mib = (available_mib - 2 * FLOOR_MIB) / replicas - BASE_MIB_PER_REPLICA
    fits = int(per_replica_mib * 1024 / WORST_KIB_PER_JOB)
    return wanted if fits >= wanted else max(0, fits // STEP * STEP)


def available_mib() -> float:
    return float(psutil.virtual_memory().available) / 2**20


class MemoryGuard:
    """Kills the replicas' process trees when the box's available memory falls under
    FLOOR_MIB (checked every 0.5 s), before the kernel's OOM killer picks something."""

    def __init__(self, replicas: Sequence[Replica]) -> None:
        self._replicas = list(replicas)
        self.tripped_at_mib: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _loop(self) -> None:
        while not self._stop.wait(0.5):
            left = available_mib()
            if left < FLOOR_MIB:
                self.tripped_at_mib = round(left, 1)
                for replica in self._replicas:
                    for process in reversed(process_tree(replica.pid)):
                        with contextlib.suppress(psutil.Error):
                            process.kill()
                return

    def __enter__(self) -> "MemoryGuard":
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(5)


@contextlib.contextmanager
def _replicas(ctx: Context, url: str, label: str) -> Iterator[list[Replica]]:
    env = BENCH_ENV | OWNERSHIP_ON
    replicas = start_many(
        ctx.logdir(label), ctx.sizes.scale_out_replicas, database_url=url, env=env
    )
    try:
        yield replicas
    finally:
        stop_all(replicas)


def measure(ctx: Context, count: int) -> dict[str, Any]:
    """`count` jobs, the replicas started together: ready times and peak RSS each."""
    url = ctx.postgres.fresh_database(f"{NAME}{count}")
    names = [f"j-{index:07d}" for index in range(count)]
    label = f"{NAME}-{count}"
    with api_only_replica(ctx, url, label=label) as api:
        put_jobs([api.url], [idle_job(names[0])])
        clone_seconds = clone_jobs(url, names[0], names[1:])
    settle = max(ctx.sizes.settle_seconds, ctx.sizes.ownership_settle_seconds)
    with (
        _replicas(ctx, url, label) as replicas,
        MemoryGuard(replicas) as guard,
        RssSampler([r.pid for r in replicas]) as rss,
    ):
        try:
            wait_ready(replicas, "/readyz", READY_DEADLINE_SECONDS)
            time.sleep(settle)
        except AssertionError:
            if guard.tripped_at_mib is None:
                raise
    if guard.tripped_at_mib is not None:
        note = f"available memory fell to {guard.tripped_at_mib} MiB: replicas killed"
        return {"jobs": count, "did_not_fit": note, "rss_peak_mib_each": rss.peaks_mib()}
    ready = [round(r.ready_seconds or 0.0, 2) for r in replicas]
    return {
        "jobs": count,
        "clone_seconds": round(clone_seconds, 2),
        "replica_ready_s": ready,
        "all_ready_s": max(ready),
        "rss_peak_mib_each": rss.peaks_mib(),
        "pss_peak_mib_each": rss.pss_peaks_mib(),
        "memory_guard_tripped_at_mib": guard.tripped_at_mib,
    }


def _ready_and_rss(result: dict[str, Any]) -> dict[str, Any]:
    """The figures the memory per job is judged against: the same replicas with one job."""
    keys = ("all_ready_s", "rss_peak_mib_each", "pss_peak_mib_each")
    return {key: result.get(key) for key in keys}


def run(ctx: Context) -> dict[str, Any]:
    wanted, count = ctx.sizes.scale_out_jobs, ctx.sizes.scale_out_replicas
    free = available_mib()
    size = fitting_jobs(wanted, count, free)
    ctx.say(f"scale_out: 1 job, then {size} over {count} owning replicas ({free:.0f} MiB free)")
    one = _ready_and_rss(measure(ctx, 1))
    attempts = [measure(ctx, size)] if size else []
    if attempts and "did_not_fit" in attempts[0]:
        ctx.say(f"scale_out: {size} jobs did not fit in memory; trying {size // 2}")
        attempts.append(measure(ctx, size // 2))
    result = attempts[-1] if attempts else {"jobs": 0}
    if "all_ready_s" in result:
        ctx.say(
            f"scale_out {result['jobs']}: all ready in {result['all_ready_s']} s, "
            f"peak RSS each {result['rss_peak_mib_each']} MiB"
        )
    return {
        "status": "ok",
        "replicas": count,
        "env": "TICKGATE_OWNERSHIP=on",
        "wanted_jobs": wanted,
        "available_mib_at_start": round(free),
        "fits_note": None if size == wanted else f"only {size:,} jobs fit the worst case here",
        "earlier_attempts": attempts[:-1],
        "one_job": one,
        **result,
        "repeats": 1,
    }
