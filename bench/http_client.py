"""`python -m bench.http_client`: the CPU cost of one `http` task run, client side.

Runs N `http` task calls against the loopback receiver (`bench.receiver`, a process of
its own) with `--concurrency` of them in flight, like a crowd of ticks due at one
instant, each run in an asyncio task of its own as the runner starts them. For every
variant it reports requests/s and CPU seconds of this process per 1,000 requests
(`time.process_time`: the receiver's CPU is not counted). Variants:

- `task`: the `http` task as the service runs it (`http_task(...).run`, args parsed per
  run as the runner does);
- `httpx`: for comparison, the same request through httpx's client (the task's client
  until it moved to aiohttp), the host vetted but not pinned.

Repeats run the variants interleaved and report medians, so a busy box skews them alike.
"""

import argparse
import asyncio
import contextlib
import logging
import statistics
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from pydantic import JsonValue

from harness.receiver import ReceiverProcess
from service.tasks.base import TaskContext
from service.tasks.http import (
    HttpArgs,
    HttpTaskError,
    request_body,
    request_headers,
    shown,
)
from service.tasks.netguard import Allowlist, vet

Run = Callable[[dict[str, JsonValue], TaskContext], Awaitable[JsonValue]]


@dataclass(frozen=True)
class Variant:
    name: str
    run: Run
    close: Callable[[], Awaitable[None]]


class NoSql:
    def names(self) -> frozenset[str]:
        return frozenset()

    async def execute(
        self, target: str, statement: str, timeout_seconds: float, keep_rows: int = 0
    ) -> Any:
        raise KeyError(target)


def contexts(count: int, jobs: int, http: httpx.AsyncClient) -> Iterator[TaskContext]:
    logger = logging.LoggerAdapter(logging.getLogger("bench.http_client"), {})
    tick = datetime.now(UTC).replace(microsecond=0)
    deadline = tick + timedelta(hours=1)
    sql = NoSql()
    for index in range(count):
        job = f"job-{index % jobs}"
        yield TaskContext(job, uuid.uuid4(), tick, 1, logger, deadline, http, sql)


def task_variant(allow: Allowlist) -> Variant:
    from service.tasks.http import http_task

    definition = http_task(allow)
    if definition.warm is not None:
        definition.warm()

    async def run(args: dict[str, JsonValue], context: TaskContext) -> JsonValue:
        return await definition.run(definition.parse_args(args), context)

    assert definition.close is not None
    return Variant("task", run, definition.close)


def httpx_variant(allow: Allowlist) -> Variant:
    """For comparison: httpx's client (and httpcore's pools under it) as the task used it
    until it moved to aiohttp: 16 pools keeping 4 connections each, a job always in the
    same one. The host is vetted but not pinned (httpx connects by name), so this is the
    cost of httpx's request machinery; the target is an IP literal, so no DNS lookup is
    skipped or added."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=4, keepalive_expiry=15.0)
    clients = [httpx.AsyncClient(trust_env=False, limits=limits) for _ in range(16)]

    async def close() -> None:
        for each in clients:
            await each.aclose()

    async def run(raw: dict[str, JsonValue], context: TaskContext) -> JsonValue:
        args = HttpArgs.model_validate(raw)
        url = httpx.URL(str(args.url))
        await vet(url, allow)
        client = clients[hash(context.job) % len(clients)]
        request = client.build_request(
            args.method,
            url,
            headers=request_headers(args, context),
            json=request_body(args, context),
            timeout=args.timeout_seconds,
        )
        response = await client.send(request, stream=True)
        try:
            size = sum([len(chunk) async for chunk in response.aiter_raw()])
        finally:
            await response.aclose()
        if not args.succeeded(response.status_code):
            raise HttpTaskError(f"{args.method} {shown(url)} answered {response.status_code}")
        return {"status": response.status_code, "bytes": size}

    return Variant("httpx", run, close)


@dataclass(frozen=True)
class Measure:
    variant: str
    requests: int
    seconds: float
    cpu_seconds: float
    failures: int

    @property
    def per_second(self) -> float:
        return self.requests / self.seconds

    @property
    def cpu_per_1000(self) -> float:
        return self.cpu_seconds / self.requests * 1000


async def crowd(
    variant: Variant, args: dict[str, JsonValue], count: int, concurrency: int, jobs: int
) -> Measure:
    """`count` runs, `concurrency` at a time, each in a task of its own."""
    room = asyncio.Semaphore(concurrency)
    failures = 0

    async def one(context: TaskContext) -> None:
        nonlocal failures
        try:
            await variant.run(args, context)
        except (HttpTaskError, OSError) as error:
            failures += 1
            if failures == 1:
                print(f"  {variant.name}: {type(error).__name__}: {error}")
        finally:
            room.release()

    async with httpx.AsyncClient() as http:
        started, cpu = time.perf_counter(), time.process_time()
        async with asyncio.TaskGroup() as group:
            for context in contexts(count, jobs, http):
                await room.acquire()
                group.create_task(one(context))
        seconds, cpu = time.perf_counter() - started, time.process_time() - cpu
    return Measure(variant.name, count, seconds, cpu, failures)


def variants(allow: Allowlist, names: list[str]) -> list[Variant]:
    makers: dict[str, Callable[[Allowlist], Variant]] = {
        "task": task_variant,
        "httpx": httpx_variant,
    }
    return [makers[name](allow) for name in names]


async def measure(options: argparse.Namespace, url: str) -> dict[str, list[Measure]]:
    allow = Allowlist.from_setting("127.0.0.1")
    args: dict[str, JsonValue] = {"url": f"{url}/hook"}
    chosen = variants(allow, options.variants.split(","))
    results: dict[str, list[Measure]] = {variant.name: [] for variant in chosen}
    for variant in chosen:  # warm: connections open, imports done, caches filled
        await crowd(variant, args, options.concurrency * 2, options.concurrency, options.jobs)
    for repeat in range(options.repeat):
        for variant in chosen if repeat % 2 == 0 else reversed(chosen):
            result = await crowd(variant, args, options.requests, options.concurrency, options.jobs)
            results[variant.name].append(result)
            print(
                f"  {variant.name:8} {result.per_second:7.0f} req/s  "
                f"{result.cpu_per_1000:6.3f} CPU s/1000  failures {result.failures}"
            )
    for variant in chosen:
        await variant.close()
    return results


def summary(results: dict[str, list[Measure]]) -> str:
    lines = [
        "| variant | req/s (median) | CPU s / 1000 req (median) | min | max |",
        "|---|---|---|---|---|",
    ]
    for name, runs in results.items():
        cpu = [run.cpu_per_1000 for run in runs]
        rate = statistics.median(run.per_second for run in runs)
        lines.append(
            f"| {name} | {rate:.0f} | {statistics.median(cpu):.3f} | "
            f"{min(cpu):.3f} | {max(cpu):.3f} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.http_client", description=__doc__)
    parser.add_argument("--requests", type=int, default=5000)
    parser.add_argument("--concurrency", type=int, default=200)
    parser.add_argument("--jobs", type=int, default=1000, help="distinct job names")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--variants", default="task,httpx")
    parser.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop")
    options = parser.parse_args(argv)
    receiver = ReceiverProcess.start()
    try:
        runner: Callable[[Any], Any] = asyncio.run
        if options.loop == "uvloop":
            import uvloop

            runner = uvloop.run
        results = runner(measure(options, receiver.url))
    finally:
        with contextlib.suppress(OSError):
            receiver.stop()
    print(summary(results))


if __name__ == "__main__":
    main()
