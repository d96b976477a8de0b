"""Start real `tickgate serve` processes and wait for conditions with deadlines."""

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil

TICKGATE = str(Path(sys.executable).with_name("tickgate"))
START_DEADLINE_SECONDS = 60.0


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def wait_for(condition: Callable[[], bool], deadline_seconds: float, what: str) -> None:
    """Poll `condition` until it holds; fail naming `what` after the deadline."""
    deadline = time.monotonic() + deadline_seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {deadline_seconds}s waiting for {what}")
        time.sleep(0.05)


@dataclass
class Replica:
    process: subprocess.Popen[bytes]
    url: str
    log_path: Path
    runner_id: str = ""

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def log_tail(self, lines: int = 80) -> str:
        """The last `lines` lines of the log, headed by the runner id, for failure messages."""
        tail = "\n".join(self.log().splitlines()[-lines:])
        return f"--- {self.runner_id} ({self.url}) log tail ---\n{tail}"

    def answers(self) -> bool:
        if self.process.poll() is not None:
            raise AssertionError(f"replica exited early:\n{self.log()}")
        try:
            return httpx.get(f"{self.url}/v1/tasks", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    def stop(self, sig: int = signal.SIGTERM, deadline_seconds: float = 40.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(sig)
        return self.wait_exit(deadline_seconds)

    def wait_exit(self, deadline_seconds: float = 40.0) -> int:
        """The exit code; SIGKILL (and -9) if the process outlives the deadline."""
        try:
            return self.process.wait(deadline_seconds)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait(10)

    def kill(self) -> int:
        """SIGKILL (kill -9): the process dies at once and cleans nothing up."""
        return self.stop(signal.SIGKILL, deadline_seconds=10)

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def children(self) -> dict[str, psutil.Process]:
        """The scheduler and API processes `tickgate serve` supervises, by role."""
        found = {}
        for child in psutil.Process(self.process.pid).children():
            command = child.cmdline()
            if "serve" in command:
                found["scheduler" if "--uds" in command else "api"] = child
        return found

    def cpu_seconds(self) -> float:
        """User + system CPU of the replica: the supervisor and its live children."""
        tree = [psutil.Process(self.process.pid), *self.children().values()]
        return sum(sum(process.cpu_times()[:2]) for process in tree)


def start_replica(workdir: Path, *, database_url: str | None, **env: str) -> Replica:
    """Launch `tickgate serve` on a free loopback port without waiting for it to answer."""
    port = free_port()
    environment = {k: v for k, v in os.environ.items() if k != "DATABASE_URL"}
    environment |= {"TICKGATE_DATA_DIR": str(workdir / "data"), "TICKGATE_RUNNER_ID": f"r{port}"}
    # The http task may reach the loopback receiver (and nothing else private); `env`
    # can override it.
    environment |= {"TICKGATE_HTTP_ALLOW": "127.0.0.1"}
    environment |= {"DATABASE_URL": database_url} if database_url else {}
    environment |= env
    log_path = workdir / f"replica-{port}.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            [TICKGATE, "serve", "--host", "127.0.0.1", "--port", str(port)],
            env=environment,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=workdir,
        )
    return Replica(process, f"http://127.0.0.1:{port}", log_path, environment["TICKGATE_RUNNER_ID"])


def stop_all(
    replicas: Sequence[Replica], sig: int = signal.SIGTERM, deadline_seconds: float = 40.0
) -> list[int]:
    """Signal every replica once, then wait for each: they shut down in parallel.

    Never signal twice: a second SIGTERM landing after the interpreter has restored the
    default handlers (late in a clean exit) would turn exit code 0 into -15.
    """
    for replica in replicas:
        if replica.alive:
            replica.process.send_signal(sig)
    return [replica.wait_exit(deadline_seconds) for replica in replicas]


@contextmanager
def serve(workdir: Path, *, database_url: str | None, **env: str) -> Iterator[Replica]:
    """A `tickgate serve` replica on a free loopback port, stopped on exit."""
    replica = start_replica(workdir, database_url=database_url, **env)
    try:
        wait_for(replica.answers, START_DEADLINE_SECONDS, f"replica {replica.url}")
        yield replica
    finally:
        replica.stop()


@contextmanager
def serve_many(
    workdir: Path,
    count: int,
    *,
    database_url: str | None,
    env: Mapping[str, str] | None = None,
    each: Sequence[Mapping[str, str]] = (),
) -> Iterator[list[Replica]]:
    """`count` replicas started together (so they race at startup), all stopped on exit.

    `env` goes to every replica; `each[i]`, when given, adds to replica i's environment.
    """
    replicas: list[Replica] = []
    try:
        for index in range(count):
            extra = dict(env or {}) | (dict(each[index]) if index < len(each) else {})
            replicas.append(start_replica(workdir, database_url=database_url, **extra))
        for replica in replicas:
            wait_for(replica.answers, START_DEADLINE_SECONDS, f"replica {replica.url}")
        yield replicas
    finally:
        stop_all(replicas)
