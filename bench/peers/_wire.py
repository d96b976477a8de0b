"""What every peer worker shares: its command line, the job names, the receiver contract,
readiness and stop signals.

Workers run in the peer venvs, never in Tickgate's, so this module needs only the standard
library at import time (httpx, present in every peer venv, is imported when a worker first
posts). `bench.peers` imports it too, for the job names, so both sides name jobs alike.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

#: the one task (function, entrypoint) every peer registers; job names travel as arguments
FIRE_TASK = "tickgate_bench_fire"
#: how many DB connections a peer process may pool (Tickgate's API pool defaults to 10)
POOL_MAX = 10
#: jobs a peer process may run at once where the peer has such a knob
#: (Tickgate's TICKGATE_MAX_CONCURRENT_RUNS defaults to 32)
CONCURRENCY = 32
#: misfire grace where the peer has one (Tickgate's default misfire_grace_seconds)
MISFIRE_GRACE_SECONDS = 60

log = logging.getLogger("peer")


def job_names(prefix: str, count: int) -> list[str]:
    """The names of a job set's jobs; the harness expects exactly these."""
    return [f"{prefix}{i:05d}" for i in range(count)]


def tick_text(epoch_seconds: int) -> str:
    """A nominal tick as Tickgate's http task sends it: RFC 3339, UTC, whole seconds, Z."""
    return datetime.fromtimestamp(epoch_seconds, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass(frozen=True)
class Spec:
    """What a worker (or its prepare step) is asked to do; parsed from its command line."""

    peer: str
    mode: str  # "prepare" (schema + schedules, then exit) or "run"
    dsn: str
    receiver: str
    kind: str  # "steady" or "burst"
    count: int
    prefix: str
    at: int | None
    index: int
    ready_file: Path | None

    @property
    def names(self) -> list[str]:
        return job_names(self.prefix, self.count)

    @property
    def runner(self) -> str:
        return f"{self.peer}-{self.index}-{os.getpid()}"


def parse_args(peer: str, argv: list[str] | None = None) -> Spec:
    parser = argparse.ArgumentParser(prog=f"{peer}_worker")
    parser.add_argument("mode", choices=["prepare", "run"])
    parser.add_argument("--dsn", required=True)
    parser.add_argument("--receiver", required=True)
    parser.add_argument("--kind", choices=["steady", "burst"], required=True)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--prefix", required=True)
    parser.add_argument("--at", type=int, default=None)
    parser.add_argument("--index", type=int, default=0)
    parser.add_argument("--ready-file", type=Path, default=None)
    ns = parser.parse_args(argv)
    if ns.kind == "burst" and ns.at is None:
        parser.error("--at is required for a burst")
    logging.basicConfig(
        level=os.environ.get("PEER_LIBRARY_LOG_LEVEL", "WARNING"),
        format=f"%(asctime)s {peer}[{ns.index}] %(levelname)s %(name)s: %(message)s",
    )
    log.setLevel(logging.INFO)
    return Spec(
        peer=peer,
        mode=ns.mode,
        dsn=ns.dsn,
        receiver=ns.receiver,
        kind=ns.kind,
        count=ns.count,
        prefix=ns.prefix,
        at=ns.at,
        index=ns.index,
        ready_file=ns.ready_file,
    )


class Receiver:
    """POSTs one delivery per fire, with the headers Tickgate's http task sends."""

    def __init__(self, spec: Spec) -> None:
        import httpx

        self._url = spec.receiver
        self._peer = spec.peer
        self._runner = spec.runner
        self._client: Any = httpx.AsyncClient(timeout=30.0)

    async def fire(self, job: str, tick: int) -> None:
        scheduled_for = tick_text(tick)
        response = await self._client.post(
            self._url,
            headers={
                "X-Tickgate-Job": job,
                "X-Tickgate-Scheduled-For": scheduled_for,
                "X-Tickgate-Peer": self._peer,
                "X-Tickgate-Runner": self._runner,
            },
            json={"job": job, "scheduled_for": scheduled_for, "runner": self._runner},
        )
        response.raise_for_status()

    async def aclose(self) -> None:
        await self._client.aclose()


def mark_ready(spec: Spec) -> None:
    if spec.ready_file is not None:
        spec.ready_file.write_text(str(os.getpid()))
    log.info("ready: %s %s x%d", spec.kind, spec.peer, spec.count)


def run(main: Coroutine[Any, Any, None]) -> None:
    """Run a worker's coroutine on uvloop (as pgqueuer's own CLI does, and as Tickgate runs
    under uvicorn[standard]), else on asyncio's default loop."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(main)
    else:
        uvloop.run(main)


def on_stop_signal(callback: Callable[[], None]) -> None:
    """Call `callback` on SIGTERM or SIGINT (from inside the running event loop)."""
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, callback)
