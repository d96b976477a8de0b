"""HTTP load for the api scenario: `wrk` when installed, else an httpx generator.

Both are closed-loop: `concurrency` connections, each sending its next request as soon as
the previous answer arrived, for `seconds`. Connection i talks to server i mod n, so the
connections are spread round-robin over the replicas. Modes:

- `create`: `POST /v1/jobs` with a unique name (a `once` job in 2099, task `log`);
- `list`: `GET /v1/jobs?limit=100`;
- `get`: `GET /v1/jobs/{name}` of a seeded name picked at random.

`wrk` (Debian package `wrk`; `make bench` installs it when it can) runs `bench/wrk/api.lua`
with one thread per connection. The fallback, `python -m bench.loadgen`, runs in its own
process with one httpx client (one keep-alive connection) per worker on uvloop; it is
slower than wrk and spends CPU the servers would otherwise get: the report names the
generator used. `BENCH_LOADGEN=httpx` forces the fallback.
"""

import argparse
import asyncio
import json
import os
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import httpx

LUA = Path(__file__).resolve().parent / "wrk" / "api.lua"
JOB_BODY = {
    "schedule": {"kind": "once", "at": "2099-01-01T00:00:00Z"},
    "task": "log",
    "args": {"message": "bench"},
}


@dataclass(frozen=True)
class Load:
    """What one closed-loop run asked for."""

    urls: tuple[str, ...]
    mode: str
    concurrency: int
    seconds: float
    tag: str
    seed_prefix: str = "seed-"
    seeds: int = 1


@dataclass(frozen=True)
class LoadResult:
    requests: int
    seconds: float
    rps: float
    p50_ms: float | None
    p99_ms: float | None
    max_ms: float | None
    errors: int
    non_2xx: int
    generator: str


def generator() -> str:
    """`wrk` if on PATH (and not overridden by BENCH_LOADGEN=httpx), else `httpx`."""
    if os.environ.get("BENCH_LOADGEN", "").lower() == "httpx":
        return "httpx"
    return "wrk" if shutil.which("wrk") else "httpx"


def generator_version() -> str:
    if generator() == "wrk":
        command = ["wrk", "--version"]  # wrk from PATH
        done = subprocess.run(command, capture_output=True, text=True, check=False)  # noqa: S603
        words = (done.stdout or done.stderr).split()
        # "wrk debian/4.1.0-3+b2 [epoll] Copyright ..."
        return f"wrk {words[1]}" if len(words) > 1 else "wrk"
    return f"httpx {httpx.__version__} (python -m bench.loadgen)"


def run_load(load: Load) -> LoadResult:
    return _run_wrk(load) if generator() == "wrk" else _run_httpx(load)


def _bench_json(output: str) -> dict[str, Any]:
    for line in output.splitlines():
        if line.startswith("BENCH_JSON "):
            parsed: dict[str, Any] = json.loads(line.removeprefix("BENCH_JSON "))
            return parsed
    raise RuntimeError(f"load generator printed no result:\n{output[-2000:]}")


def _run_wrk(load: Load) -> LoadResult:
    ports = ",".join(str(urlsplit(url).port) for url in load.urls)
    env = os.environ | {
        "WRK_PORTS": ports,
        "WRK_MODE": load.mode,
        "WRK_TAG": load.tag,
        "WRK_SEED_PREFIX": load.seed_prefix,
        "WRK_SEEDS": str(load.seeds),
    }
    command = [
        "wrk",
        f"-t{load.concurrency}",
        f"-c{load.concurrency}",
        f"-d{max(1, round(load.seconds))}s",
        "--timeout",
        "10s",
        "-s",
        str(LUA),
        load.urls[0],
    ]
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)  # noqa: S603
    raw = _bench_json(done.stdout + done.stderr)
    seconds = raw["duration_us"] / 1e6
    return LoadResult(
        requests=int(raw["requests"]),
        seconds=round(seconds, 3),
        rps=round(raw["requests"] / seconds, 1),
        p50_ms=round(raw["p50_us"] / 1000, 2),
        p99_ms=round(raw["p99_us"] / 1000, 2),
        max_ms=round(raw["max_us"] / 1000, 2),
        errors=int(raw["errors"]),
        non_2xx=int(raw["non_2xx"]),
        generator="wrk",
    )


def _run_httpx(load: Load) -> LoadResult:
    command = [sys.executable, "-m", "bench.loadgen", json.dumps(asdict(load))]
    done = subprocess.run(  # noqa: S603
        command, capture_output=True, text=True, check=False, cwd=LUA.parent.parent.parent
    )
    raw = _bench_json(done.stdout + done.stderr)
    return LoadResult(**raw)


# ---------------------------------------------------------------------------- httpx side


def _request(load: Load, worker: int, counter: int) -> tuple[str, str, dict[str, object] | None]:
    if load.mode == "create":
        body: dict[str, object] = {"name": f"{load.tag}-{worker}-{counter}", **JOB_BODY}
        return "POST", "/v1/jobs", body
    if load.mode == "get":
        return "GET", f"/v1/jobs/{load.seed_prefix}{random.randrange(load.seeds):05d}", None  # noqa: S311
    return "GET", "/v1/jobs?limit=100", None


async def _worker(load: Load, worker: int, until: float, latencies: list[float]) -> tuple[int, int]:
    errors = non_2xx = counter = 0
    limits = httpx.Limits(max_connections=1, max_keepalive_connections=1)
    base = load.urls[worker % len(load.urls)]
    async with httpx.AsyncClient(base_url=base, limits=limits, timeout=10) as client:
        while time.monotonic() < until:
            counter += 1
            method, path, body = _request(load, worker, counter)
            began = time.perf_counter()
            try:
                response = await client.request(method, path, json=body)
            except httpx.HTTPError:
                errors += 1
                continue
            latencies.append(time.perf_counter() - began)
            non_2xx += response.status_code >= 400
    return errors, non_2xx


async def _httpx_load(load: Load) -> LoadResult:
    latencies: list[float] = []
    began = time.monotonic()
    until = began + load.seconds
    outcomes = await asyncio.gather(
        *(_worker(load, i, until, latencies) for i in range(load.concurrency))
    )
    seconds = time.monotonic() - began
    ordered = sorted(latencies)

    def ms(q: float) -> float | None:
        if not ordered:
            return None
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000, 2)

    return LoadResult(
        requests=len(ordered),
        seconds=round(seconds, 3),
        rps=round(len(ordered) / seconds, 1),
        p50_ms=ms(0.50),
        p99_ms=ms(0.99),
        max_ms=round(ordered[-1] * 1000, 2) if ordered else None,
        errors=sum(e for e, _ in outcomes),
        non_2xx=sum(n for _, n in outcomes),
        generator="httpx",
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.loadgen", description=__doc__)
    parser.add_argument("load", help="a Load as JSON")
    args = parser.parse_args(argv)
    raw = json.loads(args.load)
    load = Load(**(raw | {"urls": tuple(raw["urls"])}))
    try:
        import uvloop

        result = uvloop.run(_httpx_load(load))
    except ImportError:  # pragma: no cover - uvloop comes with uvicorn[standard]
        result = asyncio.run(_httpx_load(load))
    sys.stdout.write(f"BENCH_JSON {json.dumps(asdict(result))}\n")


if __name__ == "__main__":
    main()
