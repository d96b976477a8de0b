"""The alternatives, side by side: runs `bench.peers` when that package is present.

Contract for `bench.peers` (built separately): it exposes

    def run(ctx: bench.common.Context) -> dict[str, Any]

returning `{"status": "ok" | "skipped", "peers": {NAME: PEER}}` (plus anything else),
where each PEER may hold, in the same shapes as Tickgate's scenarios so the report can
put them side by side and take ratios:

- `"steady": {"levels": [{"rate", "achieved_fires_per_s", "lateness": {"p50_ms",
  "p99_ms", "max_ms"}, "duplicates", "misses", "cpu_cores": {...}}, ...],
  "max_achieved_fires_per_s"}` (see `bench.scenarios.steady.finish_window`, which
  computes everything but the CPU from a receiver and the expected job names);
- `"burst": {"sizes": [{"jobs", "drain_s", "duplicates", "misses"}, ...]}`;
- `"version"`, `"notes"`, or `"status": "skipped", "reason"` for a peer that could not run.

Peers use the same `ctx.postgres` (`fresh_database`), `ReceiverProcess` (send
`X-Bench-Job` and `X-Bench-Scheduled-For` headers, or `?job=&scheduled_for=`),
`CpuMeter` and `ctx.sizes` (`peer_steady_rates`, `steady_seconds`, `peer_burst_jobs`). A
peer's duplicates are reported but do not fail the run: only Tickgate's do.
"""

import importlib
from typing import Any

from bench.context import Context, skipped

NAME = "peers"


def run(ctx: Context) -> dict[str, Any]:
    try:
        peers = importlib.import_module("bench.peers")
    except ModuleNotFoundError as error:
        if error.name not in {"bench.peers"}:
            raise
        return skipped("bench.peers is not present")
    runner = getattr(peers, "run", None)
    if runner is None:
        return skipped("bench.peers has no run(ctx)")
    result: dict[str, Any] = runner(ctx)
    result.setdefault("status", "ok")
    return result
