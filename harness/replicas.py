"""Real `tickgate serve` processes on loopback ports: start, wait ready, stop, kill.

One launcher for the tests, the benchmarks and the soak. A replica's environment is the
caller's minus every `TICKGATE_*` setting and `DATABASE_URL` (a developer's own settings
must not leak into a replica under test), plus its data directory, runner id and leave
for the `http` task to call the loopback receiver; the caller's `env` goes on top.
"""

import contextlib
import itertools
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil

from harness.faulty import FAULTS_VARIABLE
from harness.waiting import eventually
from service.supervisor import PROCESS_NAMES

REPO = Path(__file__).resolve().parent.parent
# The tree whose `tickgate serve` the replicas run: this checkout, or another one with a
# venv of its own named by TICKGATE_SERVED_TREE (`python -m bench.versus` so runs an
# older commit's replicas under this harness). Its `service` package must come first on
# the replicas' PYTHONPATH, ahead of any other tree's.
SERVED = Path(os.environ.get("TICKGATE_SERVED_TREE") or REPO).resolve()
TICKGATE = (
    str(Path(sys.executable).with_name("tickgate"))
    if SERVED == REPO
    else str(SERVED / ".venv" / "bin" / "tickgate")
)
START_DEADLINE_SECONDS = 60.0
STOP_DEADLINE_SECONDS = 40.0
# Answers without a database and without a token: a replica is up (tests' default).
ANSWERS_PATH = "/v1/tasks"


def free_port() -> int:
    """A loopback port nothing listens on, below the kernel's ephemeral range.

    A port the kernel hands out (bind to 0) is one any outgoing connection may take as
    its own while nothing listens on it: a replica killed and started again on its
    slot's port may then fail to listen, and exit (as one did under CI's load).
    Below the ephemeral range only a listener takes a port, and each process walks its
    own block (by pytest-xdist worker, else by PID), so two never pick the same one."""
    for _ in range(_BLOCK):
        port = next(_ports)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError(f"no free loopback port in {_BLOCK} tries")


def _own_ports() -> Iterator[int]:
    low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    blocks = max(1, (low - _FIRST) // _BLOCK)  # one, where the range starts lower
    worker = os.environ.get("PYTEST_XDIST_WORKER", "")
    index = int(worker[2:]) if worker.startswith("gw") else os.getpid()
    first = _FIRST + (index % blocks) * _BLOCK
    return itertools.cycle(range(first, first + _BLOCK))


_FIRST, _BLOCK = 10_000, 1_000  # blocks of ports from 10000 up to the ephemeral range
_ports = _own_ports()


@dataclass
class Replica:
    """One server process on a loopback port (a `tickgate serve`, or a baseline app)."""

    process: subprocess.Popen[bytes]
    url: str
    log_path: Path
    runner_id: str = ""
    started_at: float = 0.0  # time.monotonic() at Popen
    ready_seconds: float | None = None  # from Popen to the first answer of `wait_ready`

    @property
    def pid(self) -> int:
        return self.process.pid

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def log_tail(self, lines: int = 80) -> str:
        """The last `lines` lines of the log, headed by the runner id, for failure messages."""
        tail = "\n".join(self.log().splitlines()[-lines:])
        return f"--- {self.runner_id} ({self.url}) log tail ---\n{tail}"

    def answers(self, path: str = ANSWERS_PATH) -> bool:
        """Whether GET `path` answers 200 now; AssertionError once the process is gone."""
        assert self.alive, f"replica exited early:\n{self.log_tail()}"
        try:
            return httpx.get(f"{self.url}{path}", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    def stop(
        self, sig: int = signal.SIGTERM, deadline_seconds: float = STOP_DEADLINE_SECONDS
    ) -> int:
        if self.alive:
            self.process.send_signal(sig)
        return self.wait_exit(deadline_seconds)

    def wait_exit(self, deadline_seconds: float = STOP_DEADLINE_SECONDS) -> int:
        """The exit code; SIGKILL (and -9) if the process outlives the deadline."""
        try:
            return self.process.wait(deadline_seconds)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait(10)

    def kill(self) -> int:
        """SIGKILL (kill -9): the process dies at once and cleans nothing up."""
        return self.stop(signal.SIGKILL, deadline_seconds=10)

    def children(self) -> dict[str, psutil.Process]:
        """The scheduler and API processes `tickgate serve` supervises, by role, once
        each has named itself (a moment after it is forked)."""
        found = {}
        for child in psutil.Process(self.pid).children():
            with contextlib.suppress(psutil.NoSuchProcess):  # exited since the listing
                if (role := _role_of(child)) is not None:
                    found[role] = child
        return found

    def cpu_seconds(self) -> float:
        """User + system CPU of the replica: the supervisor and its live children."""
        tree = [psutil.Process(self.pid), *self.children().values()]
        return sum(sum(process.cpu_times()[:2]) for process in tree)

    def rss_bytes(self) -> int:
        """RSS of the server and its descendants."""
        return tree_rss_bytes(self.pid)


_ROLES = {name: role for role, name in PROCESS_NAMES.items()}


def _role_of(child: psutil.Process) -> str | None:
    """The role a child of `tickgate serve` names itself; a child of a release that
    exec'd its children (`bench.versus` serves older ones) is known by its command."""
    if (role := _ROLES.get(child.name())) is not None:
        return role
    command = child.cmdline()
    if "serve" in command and "-m" in command:
        return "scheduler" if "--uds" in command else "api"
    return None


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
        try:
            total += int(process.memory_info().rss)
        except psutil.Error:
            continue  # a child that exited between the listing and the reading
    return total


def tree_pss_bytes(pid: int) -> int:
    """The tree's proportional set size: each page counted once over the processes that
    share it. Summed RSS counts a page the supervisor shares with its forked children
    once per process; PSS is closer to what the pod's memory limit is charged. A read
    costs about 1 ms per process (smaps_rollup), 25 times an RSS read."""
    total = 0
    for process in process_tree(pid):
        try:
            total += int(process.memory_full_info().pss)
        except psutil.Error:
            continue  # as above
    return total


def replica_env(
    workdir: Path, runner_id: str, database_url: str | None, env: Mapping[str, str]
) -> dict[str, str]:
    """The environment of a replica (see the module's docstring)."""
    inherited = {
        key: value
        for key, value in os.environ.items()
        # OTEL_*: a replica traces only when its caller asks (the tracing test, bench)
        if not key.startswith(("TICKGATE_", "OTEL_")) and key != "DATABASE_URL"
    }
    python_path = os.pathsep.join(filter(None, [str(SERVED), os.environ.get("PYTHONPATH")]))
    return (
        inherited
        | {"TICKGATE_DATA_DIR": str(workdir / "data"), "TICKGATE_RUNNER_ID": runner_id}
        | {"TICKGATE_HTTP_ALLOW": "127.0.0.1", "PYTHONUNBUFFERED": "1"}
        # `python -m bench.baseline_app` and the tests' plugins from any directory
        | {"PYTHONPATH": python_path}
        | ({"DATABASE_URL": database_url} if database_url else {})
        | dict(env)
    )


def spawn(
    command: Sequence[str], env: Mapping[str, str], log_path: Path, runner_id: str, port: int
) -> Replica:
    """Launch `command --host 127.0.0.1 --port <port>`, its output into `log_path`."""
    with log_path.open("wb") as log:
        process = subprocess.Popen(  # noqa: S603 - our own server commands
            [*command, "--host", "127.0.0.1", "--port", str(port)],
            env=dict(env),
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=log_path.parent,
        )
    return Replica(process, f"http://127.0.0.1:{port}", log_path, runner_id, time.monotonic())


def start_replica(
    workdir: Path,
    *,
    database_url: str | None,
    port: int | None = None,
    runner_id: str | None = None,
    **env: str,
) -> Replica:
    """Launch `tickgate serve` (on a free port unless given) without waiting for it."""
    port = port or free_port()
    runner_id = runner_id or f"r{port}"
    environment = replica_env(workdir, runner_id, database_url, env)
    log_path = workdir / f"{runner_id}.log"
    return spawn(_serve_command(environment), environment, log_path, runner_id, port)


def _serve_command(environment: Mapping[str, str]) -> list[str]:
    """`tickgate serve`, through harness/faulty.py when the replica has faults injected."""
    if FAULTS_VARIABLE in environment:
        return [str(Path(TICKGATE).with_name("python")), "-m", "harness.faulty", "serve"]
    return [TICKGATE, "serve"]


def wait_ready(
    replicas: Iterable[Replica],
    path: str = ANSWERS_PATH,
    deadline_seconds: float = START_DEADLINE_SECONDS,
) -> None:
    """Until every replica's GET `path` answers 200, polled together; records when each
    first did (`ready_seconds`), so start-up times are measured, not only awaited.
    Replicas started together share the cores they start on: each one adds
    `deadline_seconds` to the wait (a loaded two-core box takes a minute for one)."""
    pending = list(replicas)

    def all_ready() -> bool:
        # Not an AssertionError: `eventually` would wait out the deadline for a dead one.
        if exited := [replica.log_tail(30) for replica in pending if not replica.alive]:
            raise RuntimeError("replica exited before it was ready:\n" + "\n".join(exited))
        for replica in [replica for replica in pending if replica.answers(path)]:
            replica.ready_seconds = time.monotonic() - replica.started_at
            pending.remove(replica)
        assert not pending, "\n".join(replica.log_tail(30) for replica in pending)
        return True

    eventually(all_ready, deadline_seconds * max(len(pending), 1), f"GET {path} to answer 200")


def stop_all(
    replicas: Sequence[Replica],
    sig: int = signal.SIGTERM,
    deadline_seconds: float = STOP_DEADLINE_SECONDS,
) -> list[int]:
    """Signal every replica once, then wait for each: they shut down in parallel.

    Never signal twice: a second SIGTERM landing after the interpreter has restored the
    default handlers (late in a clean exit) would turn exit code 0 into -15.
    """
    for replica in replicas:
        if replica.alive:
            replica.process.send_signal(sig)
    return [replica.wait_exit(deadline_seconds) for replica in replicas]
