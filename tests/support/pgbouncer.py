"""A real PgBouncer in front of the test PostgreSQL, started by the test.

The `pgbouncer` fixture starts PgBouncer (the distribution's package: 1.18 on Debian
bookworm) on a free loopback port with a generated ini: every database of the test
server (`* =`), trust authentication of the server's user (named in a userlist), the
pool mode the test asks for, and any other setting it gives. The test PostgreSQL
listens on a Unix socket only (the DSN's `?host=/dir`, see `Upstream.of_dsn`).

PgBouncer refuses to run as root; as root it is told to switch (`-u`) to the user
owning the server's socket directory, who can reach the socket.

A machine without pgbouncer fails these tests saying what to install: never a silent
skip. `make test` installs it when it runs as root.
"""

import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit

import pytest

from harness.replicas import free_port
from harness.tcpproxy import Upstream, loopback_dsn

MISSING = (
    "pgbouncer is not installed; the PgBouncer tests run the real one. Install it "
    "(Debian/Ubuntu: `apt-get install pgbouncer`; macOS: `brew install pgbouncer`), or run "
    "`make test` as root, which installs it."
)
START_DEADLINE_SECONDS = 30.0
# Searched beside PATH: Debian installs pgbouncer in /usr/sbin, not on a user's PATH.
_SBIN = ("/usr/sbin", "/usr/local/sbin")


@dataclass
class PgBouncer:
    """A running PgBouncer: where it listens, its log, and DSNs through it."""

    pool_mode: str
    port: int
    process: subprocess.Popen[bytes]
    log_path: Path

    def dsn_for(self, dsn: str) -> str:
        """`dsn` (a database of the test server) through this PgBouncer."""
        return loopback_dsn(dsn, self.port)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        """Shut it down (SIGTERM: at once, closing every connection)."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(10)


# The `pgbouncer` fixture: start one in a pool mode, with ini settings.
StartPgBouncer = Callable[..., PgBouncer]


def pgbouncer_binary() -> str:
    search = os.pathsep.join([os.environ.get("PATH", ""), *_SBIN])
    found = shutil.which("pgbouncer", path=search)
    if found is None:
        pytest.fail(MISSING, pytrace=False)
    return found


@contextmanager
def running_pgbouncer(server_url: str, pool_mode: str, **settings: str) -> Iterator[PgBouncer]:
    """PgBouncer in `pool_mode` in front of the server of `server_url`, with `settings`
    (ini keys of its [pgbouncer] section) added; stopped, and its files removed, on exit."""
    binary = pgbouncer_binary()
    upstream = Upstream.of_dsn(server_url)
    socket_dir = Path(upstream.unix_path).parent if upstream.unix_path else None
    user = _run_as(socket_dir)
    workdir = Path(tempfile.mkdtemp(prefix="tickgate-pgbouncer-"))
    try:
        port = free_port()
        ini = _write_ini(workdir, server_url, upstream, port, pool_mode, settings)
        if user is not None:
            entry = pwd.getpwnam(user)
            os.chown(workdir, entry.pw_uid, entry.pw_gid)
        log_path = workdir / "pgbouncer.log"
        with log_path.open("wb") as log:
            command = [binary, *(["-u", user] if user else []), str(ini)]
            process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        bouncer = PgBouncer(pool_mode, port, process, log_path)
        try:
            _wait_until_listening(bouncer)
            yield bouncer
        finally:
            bouncer.stop()
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture
def pgbouncer(server_url: str) -> Iterator[StartPgBouncer]:
    """Starts PgBouncers in front of the test server, all stopped at the test's end:
    `pgbouncer("session")`, `pgbouncer("transaction", server_round_robin="1")`."""
    with ExitStack() as stack:

        def start(pool_mode: str, **settings: str) -> PgBouncer:
            return stack.enter_context(running_pgbouncer(server_url, pool_mode, **settings))

        yield start


def _run_as(socket_dir: Path | None) -> str | None:
    """None unless root; as root, the owner of the server's socket directory (else nobody)."""
    if os.geteuid() != 0:
        return None
    owner = pwd.getpwuid(socket_dir.stat().st_uid).pw_name if socket_dir else "root"
    return "nobody" if owner == "root" else owner


def _write_ini(
    workdir: Path,
    server_url: str,
    upstream: Upstream,
    port: int,
    pool_mode: str,
    settings: dict[str, str],
) -> Path:
    parts = urlsplit(server_url)
    user = unquote(parts.username or "postgres")
    host = str(Path(upstream.unix_path).parent) if upstream.unix_path else upstream.host
    target = f"host={host} port={upstream.port} user={user}"
    if parts.password:
        target += f" password={unquote(parts.password)}"
    (workdir / "userlist.txt").write_text(f'"{user}" ""\n')
    # Room for several replicas in session mode: each holds about 27 connections.
    values = {
        "listen_addr": "127.0.0.1",
        "listen_port": str(port),
        "unix_socket_dir": "",
        "auth_type": "trust",
        "auth_file": str(workdir / "userlist.txt"),
        "pool_mode": pool_mode,
        "max_client_conn": "500",
        "default_pool_size": "80",
    } | settings
    lines = ["[databases]", f"* = {target}", "", "[pgbouncer]"]
    lines += [f"{key} = {value}" for key, value in values.items()]
    ini = workdir / "pgbouncer.ini"
    ini.write_text("\n".join(lines) + "\n")
    return ini


def _wait_until_listening(bouncer: PgBouncer) -> None:
    deadline = time.monotonic() + START_DEADLINE_SECONDS
    while True:
        if bouncer.process.poll() is not None:
            pytest.fail(f"pgbouncer exited at startup:\n{bouncer.log()}", pytrace=False)
        try:
            socket.create_connection(("127.0.0.1", bouncer.port), timeout=1).close()
            return
        except OSError:
            if time.monotonic() > deadline:
                pytest.fail(f"pgbouncer did not listen in time:\n{bouncer.log()}", pytrace=False)
            time.sleep(0.05)
