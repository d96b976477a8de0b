"""Scenario tracing: fires per second with tracing off and on, side by side in one run.

The same two loads run twice each, on three replicas, first with tracing off (no OTEL_*
variable: the default) and then on, exporting every span over OTLP/HTTP to a loopback
collector in the bench's process (`harness.otlp`):
- a crowd: `tracing_crowd_jobs` `log` jobs due in one second (as burst's `log` crowds),
  whose drain gives fires per second with the fire path saturated;
- a steady load: `tracing_rate` `log` fires a second for `tracing_seconds` (as
  steady_log), whose CPU and lateness show what tracing costs below saturation.
The `log` task sends nothing anywhere, so the difference is the fire path's spans alone.
With tracing on, the batch processor's queue is raised to `QUEUE` spans (the default,
2,048, would drop most of a crowd's spans and hide their export's cost), and the
collector's count of run traces is reported beside the runs.
"""

from collections.abc import Callable, Mapping
from typing import Any

from bench.context import Context
from bench.crowd import Margin
from bench.scenarios.burst import run_log_size
from bench.scenarios.steady_log import run_rate
from harness.otlp import Collector, collecting

NAME = "tracing"
QUEUE = 200_000
KEPT = ("drain_s", "p50_s", "p99_s", "drain_fires_per_s", "started", "missing", "cpu_cores")


def traced_env(collector: Collector) -> dict[str, str]:
    return {
        "OTEL_EXPORTER_OTLP_ENDPOINT": collector.url,
        "OTEL_BSP_MAX_QUEUE_SIZE": str(QUEUE),
        "OTEL_BSP_SCHEDULE_DELAY": "1000",
    }


def _both(
    collector: Collector, measure: Callable[[str, Mapping[str, str] | None], dict[str, Any]]
) -> dict[str, Any]:
    """`measure` tracing off, then on; with the run traces the collector got meanwhile."""
    modes = {}
    for mode, env in (("off", None), ("on", traced_env(collector))):
        before = _traces(collector)
        modes[mode] = measure(mode, env) | {"traces_received": _traces(collector) - before}
    return modes


def _traces(collector: Collector) -> int:
    return sum(1 for span in collector.spans() if span.name == "tickgate.run")


def run(ctx: Context) -> dict[str, Any]:
    jobs, rate = ctx.sizes.tracing_crowd_jobs, ctx.sizes.tracing_rate
    margin = Margin()
    with collecting() as collector:

        def crowd(mode: str, env: Mapping[str, str] | None) -> dict[str, Any]:
            ctx.say(f"tracing {mode}: a crowd of {jobs} `log` jobs")
            size = run_log_size(ctx, jobs, margin, variant=f"trace{mode}", env=env)
            margin.learn(jobs, max(size["replica_ready_s"]))
            return {key: size[key] for key in KEPT}

        def steady(mode: str, env: Mapping[str, str] | None) -> dict[str, Any]:
            ctx.say(f"tracing {mode}: {rate} `log` fires/s for {ctx.sizes.tracing_seconds}s")
            level = run_rate(
                ctx, rate, variant=f"trace{mode}", env=env, seconds=ctx.sizes.tracing_seconds
            )
            kept = ("achieved_fires_per_s", "succeeded", "missing", "skipped", "clean")
            return {key: level[key] for key in kept} | {
                "lateness_p99_ms": level["lateness"]["p99_ms"],
                "cpu_cores": level["cpu_cores"],
            }

        crowds = _both(collector, crowd)
        steadies = _both(collector, steady)
    for mode in ("off", "on"):
        ctx.say(
            f"tracing {mode}: crowd {crowds[mode]['drain_fires_per_s']} fires/s, "
            f"steady p99 {steadies[mode]['lateness_p99_ms']} ms, "
            f"traces {crowds[mode]['traces_received'] + steadies[mode]['traces_received']}"
        )
    return {
        "status": "ok",
        "repeats": 1,
        "crowd_jobs": jobs,
        "steady_rate": rate,
        "steady_seconds": ctx.sizes.tracing_seconds,
        "crowd": crowds,
        "steady": steadies,
    }
