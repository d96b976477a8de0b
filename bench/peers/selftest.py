"""Manual self-test of the peers (not collected by pytest):

    .venv/bin/python -m bench.peers.selftest [apscheduler4 procrastinate pgqueuer]

For each peer: installs its venv (cached in bench/.peers), starts an embedded PostgreSQL,
creates a fresh database per scenario, runs a small steady set and a small burst against
the harness's loopback receiver (`harness.receiver.receiving`), and prints receipts per
job and tick, duplicates, misses and lateness (and, for a tick delivered twice, which
processes delivered it).
Exits 1 if a peer delivered none of a scenario's expected ticks; duplicates and misses are
findings about the peer, printed, not failures of the wiring.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import statistics
import tempfile
import time
from collections import Counter
from pathlib import Path

import asyncpg

from bench.peers import PEERS, JobSet, install, installed_versions, start, stop
from harness.receiver import Receiver, receiving
from service.embedded import start_embedded

ROOT = Path(__file__).resolve().parents[2] / "bench" / ".peers"


async def create_database(admin_dsn: str, name: str) -> None:
    connection = await asyncpg.connect(admin_dsn)
    try:
        await connection.execute(f'DROP DATABASE IF EXISTS "{name}"')
        await connection.execute(f'CREATE DATABASE "{name}"')
    finally:
        await connection.close()


def summarize(title: str, jobs: JobSet, receiver: Receiver, ticks: range) -> bool:
    rows: list[tuple[str, int, float]] = []
    runners: dict[tuple[str, int], list[str]] = {}
    for receipt in receiver.receipts():
        if receipt.job is None or receipt.tick is None:
            continue
        rows.append((receipt.job, round(receipt.tick), receipt.received_at))
        runners.setdefault((receipt.job, round(receipt.tick)), []).append(receipt.runner or "?")
    per_tick = Counter((job, tick) for job, tick, _ in rows)
    duplicates = sum(n - 1 for n in per_tick.values() if n > 1)
    expected = {(job, tick) for job in jobs.names() for tick in ticks}
    seen_in_window = expected & per_tick.keys()
    misses = len(expected) - len(seen_in_window)
    lateness = sorted(received - tick for job, tick, received in rows if (job, tick) in expected)
    print(f"  {title}: {len(rows)} deliveries, {len(per_tick)} distinct (job, tick)")
    print(
        f"    window {len(ticks)} tick(s) x {jobs.count} jobs = {len(expected)} expected:"
        f" {len(seen_in_window)} seen, {misses} missed, {duplicates} duplicate deliveries"
    )
    if lateness:
        p95 = lateness[min(len(lateness) - 1, math.ceil(0.95 * len(lateness)) - 1)]
        print(
            f"    lateness s: min {lateness[0]:.3f} p50 {statistics.median(lateness):.3f}"
            f" p95 {p95:.3f} max {lateness[-1]:.3f}"
        )
    for job in jobs.names():
        got = sorted(tick for (j, tick) in per_tick if j == job)
        marks = "".join(
            "." if per_tick[(job, t)] == 0 else str(min(per_tick[(job, t)], 9)) for t in ticks
        )
        print(f"    {job}: {len(got)} tick(s) seen; window [{marks}]")
    for (job, tick), n in sorted(per_tick.items()):
        if n > 1:
            by = ", ".join(runners[(job, tick)])
            print(f"    DUPLICATE {job} @ {tick}: {n} deliveries, by {by}")
    # a peer's duplicates are a finding about the peer, not a fault of the wiring
    return bool(seen_in_window)


def run_peer(peer: str, admin_dsn: str, dsn_for: dict[str, str], args: argparse.Namespace) -> bool:
    python = install(peer, ROOT)
    versions = installed_versions(peer, ROOT)
    print(f"== {peer} ({python})")
    print("   " + ", ".join(f"{k}=={v}" for k, v in sorted(versions.items())))
    ok = True
    logs = ROOT / peer / "logs"

    # steady
    asyncio.run(create_database(admin_dsn, f"peers_{peer}_steady"))
    steady = JobSet("steady", args.count)
    with receiving() as receiver:
        url = f"{receiver.url}/hook"
        procs = start(
            peer, python, dsn_for[f"peers_{peer}_steady"], url, steady, log_dir=logs / "steady"
        )
        begin = math.ceil(time.time())
        time.sleep(args.seconds)
        end = math.floor(time.time())
        stop(procs)
    ok &= summarize(
        f"steady {args.count} jobs x 1/s for {args.seconds}s (window: ticks after all "
        "workers ran, minus the last 2 s)",
        steady,
        receiver,
        range(begin + 1, end - 2),
    )

    # burst
    asyncio.run(create_database(admin_dsn, f"peers_{peer}_burst"))
    at = math.ceil(time.time()) + args.burst_lead
    burst = JobSet("burst", args.burst_count, at=at)
    with receiving() as receiver:
        url = f"{receiver.url}/hook"
        procs = start(
            peer, python, dsn_for[f"peers_{peer}_burst"], url, burst, log_dir=logs / "burst"
        )
        time.sleep(max(0.0, at + args.burst_wait - time.time()))
        stop(procs)
    ok &= summarize(
        f"burst {args.burst_count} jobs at one instant", burst, receiver, range(at, at + 1)
    )
    return ok


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("peers", nargs="*", default=list(PEERS))
    parser.add_argument("--count", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--burst-count", type=int, default=20)
    parser.add_argument("--burst-lead", type=int, default=15, help="seconds until the burst")
    parser.add_argument("--burst-wait", type=float, default=8.0, help="seconds after it")
    args = parser.parse_args()

    with tempfile.TemporaryDirectory(prefix="peers-selftest-") as data:
        embedded = start_embedded(Path(data), delete_on_stop=True)
        try:
            names = [f"peers_{p}_{k}" for p in args.peers for k in ("steady", "burst")]
            dsn_for = {name: embedded.url_for(name) for name in names}
            results = {peer: run_peer(peer, embedded.url, dsn_for, args) for peer in args.peers}
        finally:
            embedded.stop()
    print("== result: " + ", ".join(f"{p} {'ok' if ok else 'FAILED'}" for p, ok in results.items()))
    return 0 if all(results.values()) else 1


if __name__ == "__main__":
    raise SystemExit(main())
