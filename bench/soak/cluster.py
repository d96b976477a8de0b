"""The soak's cluster: a restartable embedded PostgreSQL, three replica slots, one proxy.

`Database` keeps its data directory across a stop and a start (the bench's own server
is deleted on stop), the way `tests/faults/test_database_restart.py` restarts one:
`service.embedded.start_embedded` on the same directory, so the socket and the URL stay
the same and the replicas reconnect by themselves.

A `Slot` is a replica's place in the cluster: a port, an environment and a database URL
(the last slot's goes through `TcpProxy`, the loopback proxy of the fault tests, which
can blackhole the link). Each start is an *incarnation* with a runner id of its own
(`soak-r<slot>-<n>`, like a new pod's name), so the ledger tells incarnations apart.
`kill` is `kill -9` of the `tickgate serve` process (its scheduler and API children die
with it, `PR_SET_PDEATHSIG`); `start` brings a new incarnation up on the same port.
"""

import asyncio
import contextlib
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import asyncpg

from bench.common import (
    EMBEDDED_SETTINGS,
    Replica,
    free_port,
    replica_env,
    spawn,
    stop_replicas,
    tickgate_command,
    wait_ready,
    with_database,
)
from service.embedded import EmbeddedPostgres, start_embedded

DATABASE = "soak"
STOP_DEADLINE_SECONDS = 30.0


async def _execute(url: str, statement: str) -> None:
    connection = await asyncpg.connect(url, timeout=10)
    try:
        await connection.execute(statement)
    finally:
        await connection.close()


class Database:
    """The embedded PostgreSQL in `<workdir>/pg`, stopped and started on demand."""

    def __init__(self, workdir: Path) -> None:
        self._data = workdir / "pg"
        first = start_embedded(self._data)  # initdb; then raise the limits and restart
        first.stop()
        with (first.pgdata / "postgresql.conf").open("a") as conf:
            conf.write("\n# tickgate soak\n")
            conf.writelines(f"{key} = '{value}'\n" for key, value in EMBEDDED_SETTINGS.items())
        self._server: EmbeddedPostgres | None = start_embedded(self._data)
        self.admin_url = self._server.url
        asyncio.run(_execute(self.admin_url, f"CREATE DATABASE {DATABASE}"))
        self.url = with_database(self.admin_url, DATABASE)

    @property
    def running(self) -> bool:
        return self._server is not None

    def stop(self) -> None:
        if self._server is not None:
            self._server.stop()
            self._server = None

    def start(self) -> None:
        if self._server is None:
            self._server = start_embedded(self._data)
            if self._server.url != self.admin_url:
                raise RuntimeError(f"restarted at {self._server.url}, not {self.admin_url}")


@dataclass
class Incarnation:
    """One start of a slot's replica: who it was and when it lived (time.time())."""

    runner_id: str
    pid: int
    started: float
    ready: float | None = None
    ended: float | None = None
    how_ended: str | None = None  # "kill -9", "stopped"

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


@dataclass
class Slot:
    index: int
    database_url: str
    workdir: Path
    env: dict[str, str]
    proxied: bool = False
    port: int = field(default_factory=free_port)
    replica: Replica | None = None
    incarnations: list[Incarnation] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def alive(self) -> bool:
        return self.replica is not None and self.replica.process.poll() is None

    def start(self) -> Replica:
        runner_id = f"soak-r{self.index}-{len(self.incarnations)}"
        environment = replica_env(self.database_url, runner_id, self.workdir) | self.env
        log_path = self.workdir / f"{runner_id}.log"
        replica = spawn([*tickgate_command(), "serve"], environment, log_path, runner_id, self.port)
        self.replica = replica
        self.incarnations.append(Incarnation(runner_id, replica.pid, time.time()))
        return replica

    def wait_ready(self) -> None:
        assert self.replica is not None
        wait_ready([self.replica])
        self.incarnations[-1].ready = time.time()

    def kill(self) -> None:
        assert self.replica is not None
        self.replica.process.send_signal(signal.SIGKILL)
        self.replica.process.wait(30)
        self._ended("kill -9")

    def stop(self) -> int | None:
        if self.replica is None or self.replica.process.poll() is not None:
            return None
        codes = stop_replicas([self.replica], STOP_DEADLINE_SECONDS)
        self._ended("stopped")
        return codes[0] if codes else None

    def _ended(self, how: str) -> None:
        self.incarnations[-1].ended = time.time()
        self.incarnations[-1].how_ended = how

    def as_dict(self) -> dict[str, Any]:
        return {
            "slot": self.index,
            "proxied": self.proxied,
            "incarnations": [incarnation.as_dict() for incarnation in self.incarnations],
        }


def start_slots(slots: list[Slot]) -> None:
    """Start every slot together and wait until each is ready."""
    for slot in slots:
        slot.start()
    try:
        for slot in slots:
            slot.wait_ready()
    except BaseException:
        for slot in slots:
            with contextlib.suppress(Exception):
                slot.stop()
        raise
