"""`python -m bench.http_client`: the CPU cost of one `http` task run, client side.

Runs N `http` task calls against the loopback receiver (`bench.receiver`, a process of
its own) with `--concurrency` of them in flight, like a crowd of ticks due at one
instant, each run in an asyncio task of its own as the runner starts them. For every
variant it reports requests/s and CPU seconds of this process per 1,000 requests
(`time.process_time`: the receiver's CPU is not counted). Variants:

- `task`: the `http` task as the service runs it (`http_task(...).run`, args parsed per
  run as the runner does);
- `aiohttp`: aiohttp's client (installed by hand, not a dependency) behind the same
  SSRF guard: the host vetted once per hop, a resolver that answers only the vetted
  addresses, no DNS cache; skipped when aiohttp is not installed.

Repeats run the variants interleaved and report medians, so a busy box skews them alike.
"""

import argparse
import asyncio
import contextlib
import json
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

from bench.receiver import ReceiverProcess
from service.tasks.base import TaskContext
from service.tasks.http import (
    HttpArgs,
    HttpTaskError,
    request_body,
    request_headers,
    shown,
)
from service.tasks.netguard import Allowlist, VettedTarget, vet

Run = Callable[[dict[str, JsonValue], TaskContext], Awaitable[JsonValue]]


@dataclass(frozen=True)
class Variant:
    name: str
    run: Run
    close: Callable[[], Awaitable[None]]


class NoSql:
    def names(self) -> frozenset[str]:
        return frozenset()

    async def execute(self, target: str, statement: str, timeout_seconds: float) -> Any:
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


def httpcore_variant(allow: Allowlist) -> Variant:
    """httpcore's pools used directly (no httpx client or transport) behind the same
    pinned network backend: a prototype of the lighter path."""
    import httpcore

    from service.tasks.http import (
        KEEPALIVE_CONNECTIONS,
        KEEPALIVE_SECONDS,
        POOL_SHARDS,
        PinnedBackend,
        pinning,
    )

    backend = PinnedBackend(httpcore.AnyIOBackend())
    ssl_context = httpx.create_ssl_context()
    pools = [
        httpcore.AsyncConnectionPool(
            ssl_context=ssl_context,
            network_backend=backend,
            max_connections=None,
            max_keepalive_connections=KEEPALIVE_CONNECTIONS,
            keepalive_expiry=KEEPALIVE_SECONDS,
        )
        for _ in range(POOL_SHARDS)
    ]

    async def run(raw: dict[str, JsonValue], context: TaskContext) -> JsonValue:
        args = HttpArgs.model_validate(raw)
        url = httpx.URL(str(args.url))
        with pinning() as pins:
            target = await vet(url, allow)
            pins[target.host] = target
            body = json.dumps(
                request_body(args, context), ensure_ascii=False, separators=(",", ":")
            ).encode()
            headers = [
                (b"Host", url.netloc),
                (b"Accept", b"*/*"),
                (b"Accept-Encoding", b"gzip, deflate"),
                (b"Connection", b"keep-alive"),
                *((k.encode(), v.encode()) for k, v in request_headers(args, context).items()),
                (b"Content-Length", str(len(body)).encode()),
                (b"Content-Type", b"application/json"),
            ]
            t = args.timeout_seconds
            pool = pools[hash(context.job) % len(pools)]
            async with pool.stream(
                args.method.encode(),
                httpcore.URL(
                    scheme=url.raw_scheme, host=url.raw_host, port=url.port, target=url.raw_path
                ),
                headers=headers,
                content=body,
                extensions={"timeout": {"connect": t, "read": t, "write": t, "pool": t}},
            ) as response:
                size = 0
                async for chunk in response.aiter_stream():
                    size += len(chunk)
                if not args.succeeded(response.status):
                    raise HttpTaskError(f"{args.method} {shown(url)} answered {response.status}")
                return {"status": response.status, "bytes": size}

    async def close() -> None:
        for pool in pools:
            await pool.aclose()

    return Variant("httpcore", run, close)


def aiohttp_variant(allow: Allowlist) -> Variant | None:
    """aiohttp behind the guard: vet each hop, then a resolver that answers the vetted
    addresses of the current exchange only (a contextvar, as the task's pinning)."""
    try:
        import aiohttp
        from aiohttp.abc import AbstractResolver, ResolveResult
    except ImportError:
        return None
    from contextvars import ContextVar

    pins: ContextVar[dict[str, VettedTarget]] = ContextVar("bench_pins")

    class PinnedResolver(AbstractResolver):
        async def resolve(self, host: str, port: int = 0, family: int = 0) -> list[ResolveResult]:
            target = pins.get({}).get(host)
            if target is None or target.port != port:
                raise OSError(f"{host}:{port} was not vetted")
            return [
                ResolveResult(
                    hostname=host,
                    host=str(address),
                    port=port,
                    family=2 if address.version == 4 else 10,
                    proto=0,
                    flags=0,
                )
                for address in target.addresses
            ]

        async def close(self) -> None:
            return None

    sessions: list[aiohttp.ClientSession] = []

    def session() -> aiohttp.ClientSession:
        if not sessions:
            connector = aiohttp.TCPConnector(
                resolver=PinnedResolver(),
                use_dns_cache=False,
                limit=0,
                keepalive_timeout=15.0,
                ssl=httpx.create_ssl_context(),
            )
            sessions.append(
                aiohttp.ClientSession(
                    connector=connector, auto_decompress=False, trust_env=False
                )
            )
        return sessions[0]

    async def run(raw: dict[str, JsonValue], context: TaskContext) -> JsonValue:
        args = HttpArgs.model_validate(raw)
        url = httpx.URL(str(args.url))
        token = pins.set({})
        try:
            target = await vet(url, allow)
            pins.get()[target.host] = target
            body = json.dumps(
                request_body(args, context), ensure_ascii=False, separators=(",", ":")
            ).encode()
            headers = request_headers(args, context) | {"Content-Type": "application/json"}
            async with session().request(
                args.method,
                str(url),
                headers=headers,
                data=body,
                allow_redirects=False,
                timeout=aiohttp.ClientTimeout(total=args.timeout_seconds),
            ) as response:
                size = 0
                async for chunk in response.content.iter_any():
                    size += len(chunk)
                if not args.succeeded(response.status):
                    raise HttpTaskError(f"{args.method} {shown(url)} answered {response.status}")
                return {"status": response.status, "bytes": size}
        finally:
            pins.reset(token)

    async def close() -> None:
        for each in sessions:
            await each.close()

    return Variant("aiohttp", run, close)


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
    makers: dict[str, Callable[[Allowlist], Variant | None]] = {
        "task": task_variant,
        "httpcore": httpcore_variant,
        "aiohttp": aiohttp_variant,
    }
    chosen = []
    for name in names:
        made = makers[name](allow)
        if made is None:
            print(f"{name}: skipped (not installed)")
        else:
            chosen.append(made)
    return chosen


async def measure(options: argparse.Namespace, url: str) -> dict[str, list[Measure]]:
    allow = Allowlist.from_setting("127.0.0.1")
    args: dict[str, JsonValue] = {"url": f"{url}/hook"}
    chosen = variants(allow, options.variants.split(","))
    results: dict[str, list[Measure]] = {variant.name: [] for variant in chosen}
    for variant in chosen:  # warm: connections open, imports done, caches filled
        await crowd(variant, args, options.concurrency * 2, options.concurrency, options.jobs)
    for repeat in range(options.repeat):
        for variant in chosen if repeat % 2 == 0 else reversed(chosen):
            result = await crowd(
                variant, args, options.requests, options.concurrency, options.jobs
            )
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
    parser.add_argument("--variants", default="task,httpcore,aiohttp")
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
