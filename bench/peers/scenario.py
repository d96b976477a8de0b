"""The peers scenario: `run(ctx)`, called by `bench.scenarios.peers` as `bench.peers.run`.

Each peer runs Tickgate's steady rates and burst sizes without the largest (above every
peer's saturation), counted the same way (`bench.scenarios.steady.finish_window`,
`bench.crowd.received_crowd`): a fresh database each time, 3 peer processes, results in
the shapes of Tickgate's, and Tickgate's ratios over it (`tickgate_vs_peer`) where
Tickgate's results are in `ctx.results`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import psutil

from bench.context import Context, receiver, skipped
from bench.crowd import received_crowd, wait_drained
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
from harness.receiver import ReceiverProcess
from harness.replicas import REPO

NAME = "peers"
PROCESSES = 3
ROOT = REPO / "bench" / ".peers"
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
                wait_drained(ctx, f"{NAME}: {peer}: burst", count, t0, target)
                cpu = meter.stop()
                receipts = target.receipts()
            finally:
                exit_codes = stop(procs)
        break
    return {
        "jobs": count,
        "start_seconds": round(start_seconds, 2),
        "ready_before_t0": ready_at < t0 - 1,
        **received_crowd(receipts, jobs.names(), t0),
        "cpu_cores": cpu,
        "exit_codes": exit_codes,
    }


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
