"""Peers: the schedulers Tickgate is measured against, run the same way.

Each peer gets its own venv with pinned versions (`install`), a prepare step that builds its
schema (and, for a burst, its one-off jobs) in a fresh database, and `processes` worker
processes sharing that database (`start`). Every fire POSTs to the harness's receiver with
the headers Tickgate's http task sends (`X-Tickgate-Job`, `X-Tickgate-Scheduled-For`: the
nominal tick, RFC 3339 UTC with Z, whole seconds), so deliveries are counted per (job, tick)
the same way for every system, without trusting any peer's own bookkeeping.

The workers (`<peer>_worker.py`) run with the peer venv's python and import only their
library, httpx and `_wire` (beside them); never tickgate, never `bench.common`.
"""

from __future__ import annotations

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from bench.peers._wire import job_names

__all__ = [
    "PEERS",
    "PINS",
    "BurstInstantPassed",
    "JobSet",
    "capabilities",
    "install",
    "installed_versions",
    "run",
    "start",
    "stop",
    "worker_script",
]

PEERS: tuple[str, ...] = ("apscheduler4", "procrastinate", "pgqueuer")

_HTTPX = ("httpx==0.28.1", "httpcore==1.0.9", "h11==0.16.0", "certifi==2026.10.19.post1")

#: the exact requirements of each peer's venv: the library and its whole closure
PINS: dict[str, tuple[str, ...]] = {
    "apscheduler4": (
        "APScheduler==4.0.0a6",
        # newer anyio breaks APScheduler 4.0.0a6's asyncpg event broker
        "anyio==4.9.0",
        "sniffio==1.3.1",
        "asyncpg==0.32.0",
        "SQLAlchemy[asyncio]==2.1.9",
        "greenlet==3.5.6",
        "attrs==26.1.0",
        "tenacity==9.2.1",
        "tzlocal==5.4.5",
        "typing_extensions==4.16.0",
        "idna==3.20",
        "uvloop==0.23.0",
        *_HTTPX,
    ),
    "procrastinate": (
        "procrastinate==3.10.0",
        "psycopg[binary]==3.3.9",
        "psycopg-binary==3.3.9",
        "psycopg-pool==3.3.3",
        "croniter==7.0.0",
        "python-dateutil==4.0.0",
        "asgiref==3.13.0",
        "attrs==26.1.0",
        "packaging==26.4",
        "tzdata==2026.6",
        "anyio==4.16.0",
        "typing_extensions==4.16.0",
        "idna==3.20",
        "uvloop==0.23.0",
        *_HTTPX,
    ),
    "pgqueuer": (
        "pgqueuer==1.6.0",
        "asyncpg==0.32.0",
        "croniter==7.0.0",
        "python-dateutil==4.0.0",
        "pydantic==2.14.4",
        "pydantic_core==2.50.5",
        "pydantic-settings==2.16.3",
        "annotated-types==0.8.0",
        "annotated-doc==0.0.7",
        "typing-inspection==0.4.5",
        "python-dotenv==1.2.4",
        "typer==0.29.2",
        "rich==15.0.0",
        "markdown-it-py==4.3.0",
        "mdurl==0.1.2",
        "Pygments==2.21.0",
        "shellingham==1.5.4",
        "tabulate==0.10.0",
        "tzdata==2026.6",
        "uvloop==0.23.0",
        "anyio==4.16.0",
        "typing_extensions==4.16.0",
        "idna==3.20",
        *_HTTPX,
    ),
}

_HERE = Path(__file__).resolve().parent


class BurstInstantPassed(ValueError):
    """`start` was given a burst whose instant passed before its workers ran."""


def run(ctx: Any) -> dict[str, Any]:
    """The harness's `peers` scenario (`bench.scenarios.peers` calls it): every peer at
    the same steady rates and burst sizes as Tickgate. See `bench.peers.scenario`."""
    from bench.peers.scenario import run as run_scenario

    return run_scenario(ctx)


@dataclass(frozen=True)
class JobSet:
    """What a peer schedules.

    steady: `count` recurring jobs, each due every second (whole-second ticks), from the
    first tick after the peer's prepare step until `stop`. burst: `count` one-off jobs,
    all due at the whole-second instant `at` (epoch seconds), which must be far enough
    ahead to cover the prepare step and the processes' start-up.
    Job names are `names()`: `prefix` and a five-digit index.
    """

    kind: Literal["steady", "burst"]
    count: int
    at: float | None = None
    prefix: str = "peer-"

    def __post_init__(self) -> None:
        if self.count < 1:
            raise ValueError("count must be at least 1")
        if self.kind == "burst":
            if self.at is None or self.at != int(self.at):
                raise ValueError("a burst needs `at`, a whole number of epoch seconds")
        elif self.kind == "steady":
            if self.at is not None:
                raise ValueError("a steady set takes no `at`")
        else:
            raise ValueError(f"unknown kind {self.kind!r}")

    def names(self) -> tuple[str, ...]:
        return tuple(job_names(self.prefix, self.count))

    def worker_args(self) -> list[str]:
        args = ["--kind", self.kind, "--count", str(self.count), "--prefix", self.prefix]
        if self.at is not None:
            args += ["--at", str(int(self.at))]
        return args


def _check(peer: str) -> None:
    if peer not in PEERS:
        raise ValueError(f"unknown peer {peer!r}; one of {', '.join(PEERS)}")


def worker_script(peer: str) -> Path:
    _check(peer)
    return _HERE / f"{peer}_worker.py"


def install(peer: str, root: Path) -> Path:
    """Create (once) `root/<peer>/venv` with the peer's pinned requirements; return its
    python. Idempotent: a venv whose recorded requirements and base interpreter match is
    reused. `root/<peer>/freeze.txt` records what pip installed, `install.log` its output.
    `root` gets a `.gitignore` of `*`, so it never shows in git.
    """
    _check(peer)
    root.mkdir(parents=True, exist_ok=True)
    ignore = root / ".gitignore"
    if not ignore.exists():
        ignore.write_text("*\n")
    home = root / peer
    home.mkdir(exist_ok=True)
    venv = home / "venv"
    python = venv / "bin" / "python"
    stamp = home / "installed.json"
    wanted = {"requirements": list(PINS[peer]), "base": sys.base_prefix, "v": sys.version}
    with (home / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if python.exists() and stamp.exists() and json.loads(stamp.read_text()) == wanted:
                return python
            stamp.unlink(missing_ok=True)
            shutil.rmtree(venv, ignore_errors=True)
            requirements = home / "requirements.txt"
            requirements.write_text("\n".join(PINS[peer]) + "\n")
            with (home / "install.log").open("w") as out:
                pip = [str(python), "-m", "pip", "install", "--disable-pip-version-check"]
                for command in (
                    [sys.executable, "-m", "venv", str(venv)],
                    [*pip, "--no-input", "-r", str(requirements)],
                ):
                    out.write(f"$ {' '.join(command)}\n")
                    out.flush()
                    done = subprocess.run(  # noqa: S603
                        command, stdout=out, stderr=subprocess.STDOUT, check=False
                    )
                    if done.returncode != 0:
                        raise RuntimeError(
                            f"installing {peer} failed ({done.returncode}):\n"
                            + _tail(home / "install.log")
                        )
            freeze = subprocess.run(  # noqa: S603
                [str(python), "-m", "pip", "freeze", "--disable-pip-version-check"],
                capture_output=True,
                text=True,
                check=True,
            )
            (home / "freeze.txt").write_text(freeze.stdout)
            stamp.write_text(json.dumps(wanted, indent=1))
            return python
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def installed_versions(peer: str, root: Path) -> dict[str, str]:
    """What `install` put in the peer's venv (from its pip freeze), name -> version."""
    _check(peer)
    versions: dict[str, str] = {}
    for line in (root / peer / "freeze.txt").read_text().splitlines():
        name, sep, version = line.partition("==")
        if sep:
            versions[name] = version
    return versions


def start(  # noqa: PLR0917 - the harness's agreed positional signature
    peer: str,
    python: Path,
    dsn: str,
    receiver_url: str,
    jobs: JobSet,
    processes: int = 3,
    *,
    log_dir: Path | None = None,
    ready_timeout: float = 120.0,
) -> list[subprocess.Popen[bytes]]:
    """Prepare the peer in the (fresh) database `dsn`, then start `processes` workers
    and wait until each says it is running. Worker output goes to
    `log_dir/<peer>-<i>.log` (default: `<venv>/../logs/`; `prepare.log` there too).
    Raises RuntimeError (with the log's tail) if preparing or any worker fails, and
    BurstInstantPassed (a ValueError) if a burst's instant passed before the workers ran.
    """
    _check(peer)
    if processes < 1:
        raise ValueError("processes must be at least 1")
    logs = log_dir if log_dir is not None else python.parent.parent.parent / "logs"
    logs.mkdir(parents=True, exist_ok=True)
    base = [
        str(python),
        str(worker_script(peer)),
        "--dsn",
        dsn,
        "--receiver",
        receiver_url,
        *jobs.worker_args(),
    ]
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}

    prepare_log = logs / f"{peer}-prepare.log"
    with prepare_log.open("w") as out:
        done = subprocess.run(  # noqa: S603
            [*base[:2], "prepare", *base[2:]],
            stdout=out,
            stderr=subprocess.STDOUT,
            env=env,
            timeout=600,
            check=False,
        )
    if done.returncode != 0:
        raise RuntimeError(f"{peer} prepare failed ({done.returncode}):\n{_tail(prepare_log)}")

    ready_dir = Path(tempfile.mkdtemp(prefix=f"peer-{peer}-"))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for index in range(processes):
            ready = ready_dir / f"{index}.ready"
            with (logs / f"{peer}-{index}.log").open("w") as out:
                procs.append(
                    subprocess.Popen(  # noqa: S603
                        [
                            *base[:2],
                            "run",
                            *base[2:],
                            "--index",
                            str(index),
                            "--ready-file",
                            str(ready),
                        ],
                        stdout=out,
                        stderr=subprocess.STDOUT,
                        env=env,
                    )
                )
        deadline = time.monotonic() + ready_timeout
        while not all((ready_dir / f"{i}.ready").exists() for i in range(processes)):
            dead = [i for i, p in enumerate(procs) if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                what = f"worker {dead[0]} exited" if dead else "workers not ready in time"
                log = logs / f"{peer}-{dead[0] if dead else 0}.log"
                raise RuntimeError(f"{peer}: {what}:\n{_tail(log)}")
            time.sleep(0.05)
        if jobs.kind == "burst" and jobs.at is not None and time.time() >= jobs.at:
            raise BurstInstantPassed(
                f"{peer}: the burst instant passed before the workers ran; pick `at` later"
            )
    except BaseException:
        stop(procs)
        raise
    finally:
        shutil.rmtree(ready_dir, ignore_errors=True)
    return procs


def stop(procs: list[subprocess.Popen[bytes]], timeout: float = 15.0) -> list[int]:
    """SIGTERM every process, wait up to `timeout` seconds in all, SIGKILL the rest;
    return their exit codes (negative: the signal that ended them)."""
    for proc in procs:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + timeout
    for proc in procs:
        try:
            proc.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return [proc.returncode for proc in procs]


def _tail(path: Path, lines: int = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"({path} unreadable)"


_COMMON = {
    "processes": "3 identical processes (the count `start` is given) on one shared database",
    "delivery": "the job POSTs to the receiver with X-Tickgate-Job and "
    "X-Tickgate-Scheduled-For, like Tickgate's http task (httpx, 30 s timeout); "
    "duplicates and misses are the receiver's count, not the peer's",
}

_CAPABILITIES: dict[str, dict[str, str]] = {
    "apscheduler4": {
        "version": "APScheduler 4.0.0a6 (pre-release), anyio 4.9.0, SQLAlchemy 2.1.9, "
        "asyncpg 0.32.0",
        "store": "SQLAlchemyDataStore (asyncpg engine, pool 5+5) shared by every process; "
        "AsyncpgEventBroker (LISTEN/NOTIFY) between them",
        "steady": "native: one schedule per job, CronTrigger(second='*'), "
        "coalesce=all (every tick, like Tickgate's coalesce=False)",
        "burst": "native: one schedule per job with DateTrigger(at)",
        "nominal_tick": "native: the job's scheduled fire time (current_job, minus jitter)",
        "config": "role both in every process; max_running_jobs=None on the task (the "
        "default 1 runs one job of the task at a time cluster-wide); misfire grace 60 s "
        "(Tickgate's default); max_concurrent_jobs 100 per process (library default); "
        "async executor only",
        "limits": "pre-release; needs anyio==4.9.0 (newer anyio breaks its asyncpg event "
        "broker). A process claims at most 100 due schedules per pass",
        **_COMMON,
    },
    "procrastinate": {
        "version": "procrastinate 3.10.0, psycopg 3.3.9 (binary), croniter 7.0.0",
        "store": "procrastinate's schema; PsycopgConnector pool up to 10 per worker",
        "steady": "native: one @app.periodic(cron='* * * * * *', periodic_id=<job>) per job "
        "(sixth cron field = seconds); every worker's periodic deferrer defers each tick, "
        "PostgreSQL keeps one defer per (task, periodic_id, tick)",
        "burst": "closest equivalent: periodic tasks are cron only, so a burst is one job "
        "per name deferred with schedule_at=at (procrastinate's one-off at an instant)",
        "nominal_tick": "native: periodic jobs get the tick as `timestamp`; burst jobs "
        "use the job's scheduled_at",
        "config": "concurrency 32 per worker (Tickgate's default runs in flight; the "
        "library default is 1); fetch_job_polling_interval 1 s (default 5 s): a job "
        "deferred with schedule_at wakes no worker when it falls due, so polling bounds "
        "its lateness",
        "limits": "the periodic deferrer sleeps until the next tick plus a 0.5 s margin "
        "(by design), so steady lateness is at least ~0.5 s; it defers every periodic "
        "task one call at a time, in every worker. Duplicates: each defer also deletes "
        "that task's older defer rows, so a worker that lags a tick behind another "
        "re-defers a tick whose row is gone, and it runs twice (two procrastinate_jobs "
        "rows for one periodic_id and timestamp; seen at 100 jobs/s with 3 workers on 2 "
        "cores, and once at start-up with 5 jobs)",
        **_COMMON,
    },
    "pgqueuer": {
        "version": "pgqueuer 1.6.0, asyncpg 0.32.0, croniter 7.0.0",
        "store": "pgqueuer's schema; asyncpg pool up to 10 per process "
        "(PgQueuer.from_asyncpg_pool)",
        "steady": "native but coarse: one @pgq.schedule(<job>, '* * * * * *') per job "
        "(sixth cron field = seconds). A process's loop sleeps until the next tick plus "
        "1 s leeway, so it checks about every 2 s, and a tick that no process checks in "
        "its second is never run (no catch-up): 3 processes whose loops drift apart "
        "cover most seconds; in lockstep every other tick was missed (seen with 5 jobs)",
        "burst": "closest equivalent: schedules are cron only, so a burst is one queued "
        "job per name with execute_after=at (pgqueuer's one-off at a time), run by the "
        "queue manager of the same processes",
        "nominal_tick": "derived: a schedule's function gets its row already moved to the "
        "next run, so the fire is attributed to the latest cron tick at or before pgqueuer "
        "picked it (the row's `updated`, database clock); burst jobs use round("
        "execute_after)",
        "config": "PgQueuer.run (queue and scheduler managers) in every process; "
        "library defaults otherwise (batch_size 10, no concurrency cap)",
        "limits": "a schedule runs at most once at a time cluster-wide (status "
        "'picked' until its function returns)",
        **_COMMON,
    },
}


def capabilities(peer: str) -> dict[str, str]:
    """How the peer expresses each scenario, and what it cannot, for the report."""
    _check(peer)
    return dict(_CAPABILITIES[peer])
