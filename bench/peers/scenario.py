"""The peers scenario: `run(ctx)`, called by `bench.scenarios.peers` as `bench.peers.run`.

For each peer, the same steady rates and burst sizes as Tickgate's own scenarios
(`ctx.sizes.peer_steady_rates`, `steady_seconds`, `steady_warmup_seconds`,
`peer_burst_jobs`: Tickgate's rates and sizes without the largest, above every peer's
saturation), with
the same receiver and the same counting (`bench.scenarios.steady.finish_window`,
`bench.common.analyze_delivery`): a fresh database each time, 3 peer processes, and a
result in the shapes Tickgate's scenarios use, so the report can set them side by side.
Where Tickgate's results are already in `ctx.results`, each peer also gets Tickgate's
ratios over it (`tickgate_vs_peer`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import psutil

from bench.context import Context, receiver, skipped
from bench.meters import CpuMeter, processes_of
from bench.peers import (
    PEERS,
    BurstInstantPassed,
    JobSet,
    capabilities,
    install,
    installed_versions,
    start,
    stop,
)
from bench.scenarios.steady import finish_window, sleep_until, window_start
from bench.stats import percentile, quantile_curve
from harness.accounting import analyze_delivery
from harness.receiver import ReceiverProcess
from harness.replicas import REPO
from harness.waiting import until_quiet

NAME = "peers"
PROCESSES = 3
ROOT = REPO / "bench" / ".peers"
BURST_GRACE_SECONDS = 60  # as Tickgate's burst: the jobs' misfire grace
BURST_QUIET_SECONDS = 5.0
#: seconds of prepare per burst job (measured on the 2-core box, with slack): APScheduler 4
#: adds schedules one transaction each; the others insert in one batch
_PREPARE_PER_JOB = {"apscheduler4": 0.006, "procrastinate": 0.0006, "pgqueuer": 0.0006}
_SHORT = {"apscheduler4": "a4", "procrastinate": "pr", "pgqueuer": "pq"}


def run(ctx: Context) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for peer in PEERS:
        results[peer] = _run_peer(ctx, peer)
    return {
        "status": "ok",
        "processes_per_peer": PROCESSES,
        "peers": results,
        "duplicates_by_peer": {name: peer.get("duplicates", 0) for name, peer in results.items()},
    }


def _run_peer(ctx: Context, peer: str) -> dict[str, Any]:
    ctx.say(f"peers: {peer}: installing (cached in {ROOT})")
    try:
        python = install(peer, ROOT)
    except Exception as error:  # noqa: BLE001 - a peer that cannot install is reported
        return skipped(f"install failed: {str(error)[-500:]}")
    notes = capabilities(peer)
    result: dict[str, Any] = {
        "status": "ok",
        "version": notes["version"],
        "installed": installed_versions(peer, ROOT),
        "notes": notes,
    }
    levels = [
        _guarded(ctx, peer, "steady", rate, _steady_level, python)
        for rate in ctx.sizes.peer_steady_rates
    ]
    sizes = [
        _guarded(ctx, peer, "burst", count, _burst_size, python)
        for count in ctx.sizes.peer_burst_jobs
    ]
    achieved = [level["achieved_fires_per_s"] for level in levels if "error" not in level]
    result["steady"] = {
        "window_seconds": ctx.sizes.steady_seconds,
        "levels": levels,
        "max_achieved_fires_per_s": max(achieved) if achieved else None,
    }
    result["burst"] = {"sizes": sizes}
    result["duplicates"] = sum(x.get("duplicates", 0) for x in [*levels, *sizes])
    result["tickgate_vs_peer"] = _ratios(ctx, result)
    if not achieved and not any("error" not in size for size in sizes):
        result["status"] = "skipped"
        result["reason"] = "every level and size failed; see their errors"
    return result


def _guarded(  # noqa: PLR0917
    ctx: Context,
    peer: str,
    what: str,
    size: int,
    measure: Callable[[Context, str, Any, int], dict[str, Any]],
    python: Any,
) -> dict[str, Any]:
    key = "rate" if what == "steady" else "jobs"
    ctx.say(f"peers: {peer}: {what} {size}")
    try:
        outcome = measure(ctx, peer, python, size)
    except Exception as error:  # noqa: BLE001 - one failed level must not lose the others
        ctx.say(f"peers: {peer}: {what} {size} failed: {error}")
        return {key: size, "error": str(error)[-1000:]}
    if what == "steady":
        ctx.say(
            f"peers: {peer} steady {size}: achieved {outcome['achieved_fires_per_s']}/s, "
            f"p99 {outcome['lateness']['p99_ms']} ms, dup {outcome['duplicates']}, "
            f"miss {outcome['misses']}"
        )
    else:
        ctx.say(
            f"peers: {peer} burst {size}: drain {outcome['drain_s']} s, delivered "
            f"{outcome['delivered']}, dup {outcome['duplicates']}, miss {outcome['misses']}"
        )
    return outcome


def _meter(ctx: Context, pids: list[int], target: ReceiverProcess) -> CpuMeter:
    """The peer's processes (as `replicas`, like Tickgate's), PostgreSQL, the receiver."""
    groups: dict[str, tuple[Callable[[], list[psutil.Process]], int | None]] = {
        "replicas": (processes_of(pids), None),
        "receiver": (processes_of([target.pid]), None),
    }
    if ctx.postgres.pid is not None:
        groups["postgres"] = (ctx.postgres.processes, ctx.postgres.pid)
    return CpuMeter(groups)


def _rss_mib(pids: list[int]) -> list[float]:
    sizes = []
    for pid in pids:
        try:
            sizes.append(round(psutil.Process(pid).memory_info().rss / 2**20, 1))
        except psutil.Error:
            sizes.append(0.0)
    return sizes


def _steady_level(ctx: Context, peer: str, python: Any, rate: int) -> dict[str, Any]:
    label = f"peers-{peer}-steady-{rate}"
    url = ctx.postgres.fresh_database(f"{_SHORT[peer]}_steady{rate}")
    jobs = JobSet("steady", rate, prefix=f"{_SHORT[peer]}-s-")
    with receiver(ctx, label) as target:
        began_start = time.monotonic()
        procs = start(
            peer, python, url, f"{target.url}/tick", jobs, PROCESSES, log_dir=ctx.logdir(label)
        )
        try:
            start_seconds = time.monotonic() - began_start
            pids = [p.pid for p in procs]
            began = window_start(ctx.sizes.steady_warmup_seconds)
            ended = began + ctx.sizes.steady_seconds
            meter = _meter(ctx, pids, target)
            sleep_until(began)
            meter.start()
            sleep_until(ended)
            cpu = meter.stop()
            rss = _rss_mib(pids)
            # same as Tickgate: late deliveries of window ticks may arrive while it runs on
            window = finish_window(target, jobs.names(), began, ended)
        finally:
            exit_codes = stop(procs)
    return (
        {"rate": rate, "jobs": rate, "start_seconds": round(start_seconds, 2)}
        | window
        | {
            "cpu_cores": cpu,
            "replica_rss_mib": rss,
            "exit_codes": exit_codes,
        }
    )


def _burst_size(ctx: Context, peer: str, python: Any, count: int) -> dict[str, Any]:
    label = f"peers-{peer}-burst-{count}"
    margin = 12.0 + count * _PREPARE_PER_JOB[peer]
    for attempt in (1, 2):
        url = ctx.postgres.fresh_database(f"{_SHORT[peer]}_burst{count}")
        t0 = float(math.ceil(time.time() + margin))
        jobs = JobSet("burst", count, at=t0, prefix=f"{_SHORT[peer]}-b-")
        with receiver(ctx, f"{label}-{attempt}") as target:
            began_start = time.monotonic()
            try:
                procs = start(
                    peer,
                    python,
                    url,
                    f"{target.url}/burst",
                    jobs,
                    PROCESSES,
                    log_dir=ctx.logdir(f"{label}-{attempt}"),
                )
            except BurstInstantPassed:
                if attempt == 2:
                    raise
                margin = 2 * (time.monotonic() - began_start) + 15
                ctx.say(
                    f"peers: {peer}: burst {count}: preparing overran T0; again with {margin:.0f} s"
                )
                continue
            try:
                start_seconds = time.monotonic() - began_start
                ready_at = time.time()
                pids = [p.pid for p in procs]
                meter = _meter(ctx, pids, target)
                sleep_until(t0)
                meter.start()
                _wait_drained(ctx, count, t0, target)
                cpu = meter.stop()
                receipts = target.receipts()
            finally:
                exit_codes = stop(procs)
        break
    delivery = analyze_delivery(receipts, {(name, t0) for name in jobs.names()})
    offsets = list(delivery.lateness)
    return {
        "jobs": count,
        "start_seconds": round(start_seconds, 2),
        "ready_before_t0": ready_at < t0 - 1,
        "drain_s": round(max(offsets), 3) if offsets else None,
        "first_s": round(min(offsets), 3) if offsets else None,
        "p50_s": _rounded(percentile(offsets, 50)),
        "p99_s": _rounded(percentile(offsets, 99)),
        "delivered": delivery.delivered,
        "misses": delivery.misses,
        "duplicates": delivery.duplicates,
        "duplicate_examples": delivery.duplicate_examples,
        "drain_fires_per_s": round(delivery.delivered / max(offsets), 1) if offsets else None,
        "cpu_cores": cpu,
        "drain_curve_s": quantile_curve(offsets),
        "exit_codes": exit_codes,
    }


def _wait_drained(ctx: Context, count: int, t0: float, target: ReceiverProcess) -> None:
    """Until every job arrived, nothing arrived for a while, or the grace ran out
    (Tickgate's burst waits the same way)."""
    sleep_until(t0 + 2)
    deadline = t0 + BURST_GRACE_SECONDS + 15
    arrived = until_quiet(target.count, count, quiet_seconds=BURST_QUIET_SECONDS, deadline=deadline)
    if arrived < count:
        ctx.say(f"peers: burst stalled at {arrived}/{count}")


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 3)


def _ratio(numerator: Any, denominator: Any) -> float | None:
    if not numerator or not denominator:
        return None
    return round(float(numerator) / float(denominator), 2)


def _ratios(ctx: Context, peer: dict[str, Any]) -> dict[str, Any]:
    """Tickgate over the peer where more is better (fires/s), the peer over Tickgate where
    less is better (lateness, drain): above 1 means Tickgate did better."""
    ours_steady = ctx.results.get("steady") or {}
    ours_burst = ctx.results.get("burst") or {}
    if ours_steady.get("status") != "ok" and ours_burst.get("status") != "ok":
        return {"note": "Tickgate's steady and burst results are not in this run"}
    by_rate = {level["rate"]: level for level in ours_steady.get("levels", [])}
    by_jobs = {size["jobs"]: size for size in ours_burst.get("sizes", [])}
    levels = []
    for level in peer["steady"]["levels"]:
        ours = by_rate.get(level["rate"])
        if ours is None or "error" in level:
            continue
        levels.append(
            {
                "rate": level["rate"],
                "fires_per_s_tickgate_over_peer": _ratio(
                    ours["achieved_fires_per_s"], level["achieved_fires_per_s"]
                ),
                "p99_lateness_peer_over_tickgate": _ratio(
                    level["lateness"]["p99_ms"], ours["lateness"]["p99_ms"]
                ),
            }
        )
    sizes = []
    for size in peer["burst"]["sizes"]:
        ours = by_jobs.get(size["jobs"])
        if ours is None or "error" in size:
            continue
        sizes.append(
            {
                "jobs": size["jobs"],
                "drain_peer_over_tickgate": _ratio(size["drain_s"], ours["drain_s"]),
                "p99_peer_over_tickgate": _ratio(size["p99_s"], ours["p99_s"]),
            }
        )
    return {
        "max_fires_per_s_tickgate_over_peer": _ratio(
            ours_steady.get("max_achieved_fires_per_s"),
            peer["steady"]["max_achieved_fires_per_s"],
        ),
        "steady": levels,
        "burst": sizes,
    }
