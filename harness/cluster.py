"""Clusters of `tickgate serve` replicas: started together, stopped together.

`serve` and `serve_many` are the context managers of the tests and the benchmarks; a
`Slot` is a replica's fixed place (port, environment, database URL) in a cluster whose
replicas are killed and started again, each start an *incarnation* with a runner id of
its own (`<name>-r<slot>-<n>`, like a new pod's name), so the ledger tells them apart.
"""

import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from harness.replicas import (
    ANSWERS_PATH,
    START_DEADLINE_SECONDS,
    Replica,
    free_port,
    start_replica,
    stop_all,
    wait_ready,
)


def start_many(
    workdir: Path,
    count: int,
    *,
    database_url: str | None,
    env: Mapping[str, str] | None = None,
    each: Sequence[Mapping[str, str]] = (),
    runner_prefix: str | None = None,
) -> list[Replica]:
    """`count` replicas launched at once (so they race at startup), not yet ready.

    `env` goes to every replica; `each[i]`, when given, adds to replica i's environment;
    with `runner_prefix` the runner ids are `<prefix><i>-<port>`.
    """
    replicas = []
    for index in range(count):
        extra = dict(env or {}) | (dict(each[index]) if index < len(each) else {})
        port = free_port()
        runner_id = f"{runner_prefix}{index}-{port}" if runner_prefix else None
        replicas.append(
            start_replica(
                workdir, database_url=database_url, port=port, runner_id=runner_id, **extra
            )
        )
    return replicas


@contextmanager
def serve_many(
    workdir: Path,
    count: int,
    *,
    ready_path: str = ANSWERS_PATH,
    deadline_seconds: float = START_DEADLINE_SECONDS,
    **launch: Any,
) -> Iterator[list[Replica]]:
    """`start_many(workdir, count, **launch)`, then ready (GET `ready_path` answers 200),
    all stopped on exit."""
    replicas: list[Replica] = []
    try:
        replicas = start_many(workdir, count, **launch)
        wait_ready(replicas, ready_path, deadline_seconds)
        yield replicas
    finally:
        stop_all(replicas)


@contextmanager
def serve(workdir: Path, *, database_url: str | None, **env: str) -> Iterator[Replica]:
    """A `tickgate serve` replica on a free loopback port, stopped on exit."""
    with serve_many(workdir, 1, database_url=database_url, env=env) as replicas:
        yield replicas[0]


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
    """A replica's place in a cluster that kills and restarts its replicas."""

    name: str
    index: int
    database_url: str
    workdir: Path
    env: dict[str, str]
    proxied: bool = False  # its database URL goes through a TcpProxy
    port: int = field(default_factory=free_port)
    replica: Replica | None = None
    incarnations: list[Incarnation] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def alive(self) -> bool:
        return self.replica is not None and self.replica.alive

    def start(self) -> Replica:
        runner_id = f"{self.name}-r{self.index}-{len(self.incarnations)}"
        replica = start_replica(
            self.workdir,
            database_url=self.database_url,
            port=self.port,
            runner_id=runner_id,
            **self.env,
        )
        self.replica = replica
        self.incarnations.append(Incarnation(runner_id, replica.pid, time.time()))
        return replica

    def wait_ready(self, path: str = "/readyz") -> None:
        assert self.replica is not None
        wait_ready([self.replica], path)
        self.incarnations[-1].ready = time.time()

    def kill(self) -> None:
        """kill -9 of `tickgate serve` (its children die with it, PR_SET_PDEATHSIG)."""
        assert self.replica is not None
        self.replica.kill()
        self._ended("kill -9")

    def stop(self) -> int | None:
        if self.replica is None or not self.replica.alive:
            return None
        code = self.replica.stop()
        self._ended("stopped")
        return code

    def _ended(self, how: str) -> None:
        self.incarnations[-1].ended = time.time()
        self.incarnations[-1].how_ended = how

    def as_dict(self) -> dict[str, Any]:
        return {
            "slot": self.index,
            "proxied": self.proxied,
            "incarnations": [incarnation.as_dict() for incarnation in self.incarnations],
        }


def start_slots(slots: Sequence[Slot]) -> None:
    """Start every slot together and wait until each is ready; stop them all on failure."""
    for slot in slots:
        slot.start()
    replicas = [slot.replica for slot in slots if slot.replica is not None]
    try:
        # All together, as `wait_ready` budgets replicas started together (one by one,
        # each slot had the deadline of one replica while all of them were starting).
        wait_ready(replicas, "/readyz")
        for slot, replica in zip(slots, replicas, strict=True):
            slot.incarnations[-1].ready = slot.incarnations[-1].started + (
                replica.ready_seconds or 0.0
            )
    except BaseException:
        stop_all(replicas)
        raise
