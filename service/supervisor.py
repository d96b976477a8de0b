"""One pod, two processes: `tickgate serve` with the API and the scheduler both on.

The scheduler (window and runner: the fire path) runs in a process of its own beside the
API's, so API load never delays a fire: they share no event loop and no interpreter
lock, and the kernel schedules them apart. This process only prepares and supervises:

- each child is `tickgate serve` with one role: the scheduler listening on a unix
  socket in a private directory, the API on the pod's port, asking the scheduler over
  that socket for liveness, readiness and metrics;
- the API runs TICKGATE_API_NICENESS nicer than the scheduler: when the pod's CPU is
  short (a busy API, a CPU limit), the fire path is served first;
- both get the same database URL (the embedded server this process holds, if any) and
  the same runner id, so runs and logs name the pod;
- SIGTERM or SIGINT here becomes SIGTERM to both: readiness fails at once and each
  shuts down as a lone replica would (the scheduler gives its runs their grace);
- a child that exits unasked takes the pod down: the other is stopped the same way and
  this process exits non-zero, so Kubernetes restarts the container;
- on Linux the children die with this process, kill -9 included (PR_SET_PDEATHSIG).
"""

import ctypes
import logging
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType

from service.config import Listen, Settings
from service.stopping import StopRequest

log = logging.getLogger(__name__)

# How often the supervisor looks for a child that exited: a poll, because the embedded
# PostgreSQL's helpers are children of this process too.
POLL_SECONDS = 0.1
_PR_SET_PDEATHSIG = 1
_STOPPING_SIGNALS = (signal.SIGTERM, signal.SIGINT)


@dataclass(frozen=True)
class Child:
    role: str
    process: subprocess.Popen[bytes]

    @property
    def alive(self) -> bool:
        return self.process.poll() is None

    def signal(self, signum: int) -> None:
        if self.alive:
            self.process.send_signal(signum)


@dataclass
class Pod:
    """The children and whether stopping them was asked for."""

    children: list[Child] = field(default_factory=list)
    stopping: bool = False

    def stop(self) -> None:
        self.stopping = True
        for child in self.children:
            child.signal(signal.SIGTERM)

    def first_exit(self) -> Child:
        """Block until a child exits; that child."""
        while True:
            for child in self.children:
                if not child.alive:
                    return child
            time.sleep(POLL_SECONDS)

    def wait(self) -> int:
        """Wait for every child; the pod's exit status. A child that exited unasked
        stops the other and makes the status non-zero."""
        if not self.children:
            return 0  # stopped before any was started
        first = self.first_exit()
        unasked = not self.stopping
        if unasked:
            status = exit_status(first.process.returncode)
            log.error("the %s process exited unasked (%s): stopping", first.role, status)
            self.stop()
        statuses = [exit_status(child.process.wait()) for child in self.children]
        if unasked:
            return exit_status(first.process.returncode) or 1
        return max(statuses)


def exit_status(returncode: int) -> int:
    """A child's return code as a shell reports it: 128 + n when signal n killed it."""
    return 128 - returncode if returncode < 0 else returncode


def supervise(settings: Settings, listen: Listen, stop: StopRequest) -> int:
    """Run the scheduler and the API in two processes until both exit; the pod's status.
    A SIGTERM noted in `stop` before this process forwarded signals starts neither."""
    pod = Pod()
    with (
        tempfile.TemporaryDirectory(prefix="tickgate-") as private,
        _forwarded_signals(pod, stop),
    ):
        socket = Path(private) / "scheduler.sock"
        environment = _shared_environment(settings)
        for role in _roles(settings, listen, socket):
            if not pod.stopping:
                pod.children.append(_start(role, environment))
        log.info("serving: %s", ", ".join(f"{c.role} pid {c.process.pid}" for c in pod.children))
        return pod.wait()


@dataclass(frozen=True)
class Role:
    """One child: its `tickgate serve` arguments, its own settings, its niceness."""

    name: str
    arguments: tuple[str, ...]
    settings: Mapping[str, str]
    niceness: int = 0


def _roles(settings: Settings, listen: Listen, socket: Path) -> tuple[Role, Role]:
    jobs = {} if settings.apply_jobs is None else {"TICKGATE_APPLY_JOBS": str(settings.apply_jobs)}
    scheduler = Role("scheduler", ("--uds", str(socket)), {"TICKGATE_API": "false"})
    api = Role(
        "api",
        listen.arguments(),
        {"TICKGATE_SCHEDULER": "false", "TICKGATE_SCHEDULER_SOCKET": str(socket)} | jobs,
        settings.api_niceness,
    )
    return scheduler, api


def _shared_environment(settings: Settings) -> dict[str, str]:
    """This process's environment, with what both children must agree on fixed here.
    The jobs file is the API's to apply (once per pod, as PUT would)."""
    inherited = {k: v for k, v in os.environ.items() if k != "TICKGATE_APPLY_JOBS"}
    shared = {"TICKGATE_RUNNER_ID": settings.runner_id}
    # A DSN read from a file reaches the children as that file, not in their environment;
    # the embedded server's (made by this process) can only be passed on.
    if settings.database_url_file is None:
        shared["DATABASE_URL"] = str(settings.database_url)
    if settings.sql_self_url and settings.sql_self_url_file is None:
        shared["TICKGATE_SQL_SELF_URL"] = settings.sql_self_url
    return inherited | shared


def _start(role: Role, environment: Mapping[str, str]) -> Child:
    # A process group of its own: a terminal's Ctrl-C reaches this process only, which
    # passes it on once, as SIGTERM (a second SIGINT would make uvicorn skip the grace).
    # Not a session of its own: Linux shares CPU between sessions first (autogroups)
    # and niceness counts only within one, so the API's would be void.
    process = subprocess.Popen(  # noqa: S603 - our own interpreter and package
        [sys.executable, "-m", "service", "serve", *role.arguments],
        env=dict(environment) | dict(role.settings),
        process_group=0,
        preexec_fn=_before_exec(role.niceness),  # noqa: PLW1509 - no thread runs here
    )
    return Child(role.name, process)


def _before_exec(niceness: int) -> Callable[[], None]:
    """Run in the child before exec: lower its priority by `niceness` (the API's: a
    busy API then yields the CPU to the fire path), and have it SIGKILLed when this
    process dies (Linux only; elsewhere a supervisor killed with -9 leaves it running)."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        prctl = None
    parent = os.getpid()

    def prepare() -> None:
        os.nice(niceness)
        if prctl is not None:
            prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        if os.getppid() != parent:  # the parent died before the death signal was armed
            os._exit(1)

    return prepare


@contextmanager
def _forwarded_signals(pod: Pod, stop: StopRequest) -> Iterator[None]:
    def forward(signum: int, frame: FrameType | None) -> None:
        log.info("signal %d received: stopping the scheduler and API processes", signum)
        pod.stop()

    previous = {signum: signal.signal(signum, forward) for signum in _STOPPING_SIGNALS}
    if stop.asked:
        pod.stop()
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
