"""Scenario 5, api: REST throughput and latency, against a bare FastAPI + asyncpg baseline.

Closed-loop load (`bench.loadgen`: wrk if installed, else the httpx generator) at each
concurrency, connections spread round-robin over three replicas, for three endpoints:
`POST /v1/jobs` (a new `once` job in 2099 each time), `GET /v1/jobs?limit=100` and
`GET /v1/jobs/{name}` (over `api_seed_jobs` seeded jobs). Each cell is the median of
`repeats` runs of `api_seconds`.

Three conditions, in one run on one machine:
- `tickgate_idle`: three Tickgate replicas with nothing to fire;
- `tickgate_loaded`: the same while `api_loaded_rate` one-second jobs fire (scenario 2's
  jobs), whose deliveries are checked for duplicates and misses like scenario 2, over
  the whole loaded run and over the ticks that fell while the generator ran at the
  highest concurrency (`at_top_concurrency`, every endpoint);
- `baseline`: three `bench.baseline_app` processes (same uvicorn settings) on a database
  of their own, seeded the same way.
"""

import asyncio
import json
import math
import sys
import time
from collections.abc import Sequence
from typing import Any

import asyncpg

from bench import baseline_app
from bench.context import BENCH_ENV, READY_DEADLINE_SECONDS, Context, receiver, tickgate_replicas
from bench.jobs import put_jobs
from bench.loadgen import JOB_BODY, Load, generator, generator_version, run_load
from bench.meters import standard_meter
from bench.scenarios.steady import finish_window, one_second_jobs, sleep_until, window_start
from bench.stats import latency_summary, median_of
from harness.accounting import analyze_delivery
from harness.receiver import Receipt
from harness.replicas import Replica, free_port, replica_env, spawn, stop_all, wait_ready

NAME = "api"
MODES = {"create": "POST /v1/jobs", "list": "GET /v1/jobs?limit=100", "get": "GET /v1/jobs/{name}"}
SEED_PREFIX = "seed-"


def _seed_jobs(count: int) -> list[dict[str, Any]]:
    return [{"name": f"{SEED_PREFIX}{index:05d}", **JOB_BODY} for index in range(count)]


def measure(ctx: Context, urls: Sequence[str], condition: str) -> list[dict[str, Any]]:
    """Every endpoint at every concurrency, median of `repeats` runs each."""
    cells = []
    for mode, endpoint in MODES.items():
        for concurrency in ctx.sizes.api_concurrency:
            began = time.time()
            runs = [
                run_load(
                    Load(
                        urls=tuple(urls),
                        mode=mode,
                        concurrency=concurrency,
                        seconds=ctx.sizes.api_seconds,
                        tag=f"w-{condition}-c{concurrency}-r{attempt}-{int(time.time())}",
                        seed_prefix=SEED_PREFIX,
                        seeds=ctx.sizes.api_seed_jobs,
                    )
                )
                for attempt in range(ctx.sizes.repeats)
            ]
            cell = _cell(condition, endpoint, concurrency, runs) | {"span": (began, time.time())}
            ctx.say(
                f"api {condition} {endpoint} c{concurrency}: {cell['rps']} req/s, "
                f"p50 {cell['p50_ms']} ms, p99 {cell['p99_ms']} ms"
            )
            cells.append(cell)
    return cells


def _cell(condition: str, endpoint: str, concurrency: int, runs: Sequence[Any]) -> dict[str, Any]:
    return {
        "condition": condition,
        "endpoint": endpoint,
        "concurrency": concurrency,
        "rps": median_of(r.rps for r in runs),
        "p50_ms": median_of(r.p50_ms for r in runs),
        "p99_ms": median_of(r.p99_ms for r in runs),
        "errors": sum(r.errors for r in runs),
        "non_2xx": sum(r.non_2xx for r in runs),
        "runs": [r.__dict__ for r in runs],
    }


def _tickgate(ctx: Context) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    url = ctx.postgres.fresh_database(NAME)
    with receiver(ctx, NAME) as target, tickgate_replicas(ctx, url, label=NAME) as replicas:
        urls = [r.url for r in replicas]
        put_jobs(urls, _seed_jobs(ctx.sizes.api_seed_jobs))
        ctx.say("api: tickgate, idle")
        cells = measure(ctx, urls, "tickgate_idle")
        rate = ctx.sizes.api_loaded_rate
        jobs = one_second_jobs(target.url, rate, "load")
        put_jobs(urls, jobs)
        ctx.say(f"api: tickgate, while {rate} fires/s")
        began = window_start(2)
        sleep_until(began)
        meter = standard_meter(ctx, replicas, {"receiver": target.pid})
        meter.start()
        loaded = measure(ctx, urls, "tickgate_loaded")
        cells += loaded
        ended = float(int(time.time()))
        cpu = meter.stop()
        names = [j["name"] for j in jobs]
        background = finish_window(target, names, began, ended)
        top = max(ctx.sizes.api_concurrency)
        spans = [cell["span"] for cell in loaded if cell["concurrency"] == top]
        background["at_top_concurrency"] = {"concurrency": top} | fires_within(
            target.receipts(), names, spans
        )
    background |= {"rate": rate, "cpu_cores": cpu}
    return cells, background


def fires_within(
    receipts: Sequence[Receipt], names: Sequence[str], spans: Sequence[tuple[float, float]]
) -> dict[str, Any]:
    """The deliveries of the ticks that fell while the load generator ran at one
    concurrency: every whole second inside one of `spans`."""
    ticks = {float(t) for began, ended in spans for t in range(math.ceil(began), int(ended))}
    delivery = analyze_delivery(receipts, {(name, tick) for name in names for tick in ticks})
    return {
        "ticks_s": len(ticks),
        "expected": delivery.expected,
        "delivered": delivery.delivered,
        "misses": delivery.misses,
        "lateness": latency_summary(delivery.lateness),
    }


async def _baseline_schema(url: str) -> None:
    connection = await asyncpg.connect(url)
    try:
        await connection.execute(baseline_app._SCHEMA)
    finally:
        await connection.close()


async def _seed_baseline(url: str, count: int) -> None:
    connection = await asyncpg.connect(url)
    try:
        body = json.dumps(JOB_BODY)
        await connection.executemany(
            "INSERT INTO baseline_jobs (name, body) VALUES ($1, $2)",
            [(f"{SEED_PREFIX}{index:05d}", body) for index in range(count)],
        )
    finally:
        await connection.close()


def _baseline(ctx: Context) -> list[dict[str, Any]]:
    url = ctx.postgres.fresh_database("baseline")
    asyncio.run(_baseline_schema(url))
    asyncio.run(_seed_baseline(url, ctx.sizes.api_seed_jobs))
    workdir = ctx.logdir(f"{NAME}-baseline")
    servers: list[Replica] = []
    try:
        for index in range(3):
            port = free_port()
            runner = f"baseline-{index}-{port}"
            env = replica_env(workdir, runner, url, BENCH_ENV)
            command = [sys.executable, "-m", "bench.baseline_app"]
            servers.append(spawn(command, env, workdir / f"{runner}.log", runner, port))
        wait_ready(servers, "/readyz", READY_DEADLINE_SECONDS)
        ctx.say("api: bare FastAPI + asyncpg baseline")
        return measure(ctx, [s.url for s in servers], "baseline")
    finally:
        stop_all(servers)


def _ratios(cells: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Tickgate idle over baseline, per endpoint and concurrency."""
    base = {(c["endpoint"], c["concurrency"]): c for c in cells if c["condition"] == "baseline"}
    ratios = []
    for cell in cells:
        other = base.get((cell["endpoint"], cell["concurrency"]))
        if cell["condition"] == "baseline" or other is None or not other["rps"]:
            continue
        ratios.append(
            {
                "condition": cell["condition"],
                "endpoint": cell["endpoint"],
                "concurrency": cell["concurrency"],
                "rps_over_baseline": round((cell["rps"] or 0) / other["rps"], 3),
            }
        )
    return ratios


def run(ctx: Context) -> dict[str, Any]:
    cells, background = _tickgate(ctx)
    cells += _baseline(ctx)
    return {
        "status": "ok",
        "generator": generator(),
        "generator_version": generator_version(),
        "seconds": ctx.sizes.api_seconds,
        "repeats": ctx.sizes.repeats,
        "cells": cells,
        "over_baseline": _ratios(cells),
        "background_fires": background,
        "duplicates": background["duplicates"],
    }
