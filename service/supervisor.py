"""One pod, two processes: `tickgate serve` with the API and the scheduler both on.

The scheduler (window and runner: the fire path) runs in a process of its own beside the
API's, so API load never delays a fire: they share no event loop and no interpreter
lock, and the kernel schedules them apart. This process only prepares and supervises:

- it imports the server once, then forks each child (no exec), which serves one role as
  `tickgate serve` would with that role alone: the scheduler listening on a unix socket
  in a private directory, the API on the pod's port, asking the scheduler over that
  socket for liveness, readiness and metrics. Importing the web stack costs about 0.7 s
  of CPU, which two exec'd children each paid again (a pod started on about 2.3 CPU
  seconds); the children share those pages with this process until they write them;
- each child names itself (`tickgate-sched`, `tickgate-api`: `ps -o comm`, `top`), and
  starts as an exec would leave it: SIGTERM and SIGINT at their defaults, and none of
  this process's exit handlers (they would stop the embedded PostgreSQL it holds);
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
import gc
import logging
import os
import signal
import sys
import tempfile
import time
import traceback
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType
from typing import NoReturn

from service.config import Listen, Settings
from service.stopping import StopRequest

log = logging.getLogger(__name__)

# How often the supervisor looks for a child that exited: a poll, because the embedded
# PostgreSQL's helpers are children of this process too.
POLL_SECONDS = 0.1
_PR_SET_PDEATHSIG = 1
_PR_SET_NAME = 15
_STOPPING_SIGNALS = (signal.SIGTERM, signal.SIGINT)
# What each child calls itself (/proc/<pid>/comm: at most 15 bytes).
PROCESS_NAMES = {"scheduler": "tickgate-sched", "api": "tickgate-api"}


@dataclass
class Child:
    """A forked child, reaped by its pid alone (the embedded PostgreSQL's helpers are
    children of this process too). `returncode` as subprocess has it: -n when signal n
    killed it."""

    role: str
    pid: int
    returncode: int | None = None

    @property
    def alive(self) -> bool:
        return self.poll() is None

    def poll(self) -> int | None:
        return self._reap(os.WNOHANG)

    def wait(self) -> int:
        returncode = self._reap(0)
        assert returncode is not None
        return returncode

    def signal(self, signum: int) -> None:
        if self.alive:
            os.kill(self.pid, signum)

    def _reap(self, options: int) -> int | None:
        if self.returncode is None:
            pid, status = os.waitpid(self.pid, options)
            if pid:
                self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode


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
        first_status = exit_status(first.wait())
        if unasked:
            log.error("the %s process exited unasked (%s): stopping", first.role, first_status)
            self.stop()
        statuses = [exit_status(child.wait()) for child in self.children]
        if unasked:
            return first_status or 1
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
        _import_the_server()
        for role in _roles(settings, listen, socket):
            if not pod.stopping:
                pod.children.append(_start(role, environment))
        log.info("serving: %s", ", ".join(f"{c.role} pid {c.pid}" for c in pod.children))
        return pod.wait()


def _import_the_server() -> None:
    """What every child needs, imported here once: a forked child finds it loaded. Then
    frozen, so that no collection in a child writes to the pages it shares with this
    process and the other child."""
    import service.server  # noqa: F401 - imported for the children

    gc.freeze()


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
    """Fork the child of `role`; in the child, serve it and never return here."""
    parent = os.getpid()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()  # or the child would write what this process had buffered
    pid = os.fork()
    if pid == 0:
        _serve_role(role, environment, parent)
    return Child(role.name, pid)


def _serve_role(role: Role, environment: Mapping[str, str], parent: int) -> NoReturn:
    """The child's life: set up as an exec would have left it, then `tickgate serve`
    with the role's arguments and settings; exit with its status. Only `os._exit`
    leaves: returning, or exiting through this process's frames and exit handlers,
    would run the supervisor's cleanups (the private directory, the embedded server)."""
    status = 1
    try:
        _become(role, parent)
        os.environ.clear()
        os.environ.update(dict(environment) | dict(role.settings))
        from service.cli import main

        main(["serve", *role.arguments])
        status = 0
    except SystemExit as exited:
        status = _exit_code(exited.code)
    except BaseException:  # noqa: BLE001 - reported as an uncaught one would be, status 1
        traceback.print_exc()
    finally:
        for stream in (sys.stdout, sys.stderr):
            stream.flush()
        os._exit(status)


def _become(role: Role, parent: int) -> None:
    """A process group of its own: a terminal's Ctrl-C reaches the supervisor only, which
    passes it on once, as SIGTERM (a second SIGINT would make uvicorn skip the grace).
    Not a session of its own: Linux shares CPU between sessions first (autogroups) and
    niceness counts only within one, so the API's would be void. Then the role's
    niceness, its name, and SIGKILL when the supervisor dies."""
    for signum in _STOPPING_SIGNALS:
        signal.signal(signum, signal.SIG_DFL)
    os.setpgid(0, 0)
    os.nice(role.niceness)
    _prctl(_PR_SET_NAME, PROCESS_NAMES[role.name].encode())
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before the death signal was armed
        os._exit(1)


def _prctl(option: int, value: int | bytes) -> None:
    """Linux's prctl; elsewhere nothing (a supervisor killed with -9 then leaves its
    children running, and they keep its name)."""
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return
    prctl(option, value)


def _exit_code(code: object) -> int:
    """SystemExit's code as the interpreter would exit with it."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


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
