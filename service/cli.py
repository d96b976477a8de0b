# PYTHON_ARGCOMPLETE_OK (argcomplete's global completion looks for this mark)
"""`tickgate serve | migrate | openapi | jobs | completion`."""

import argparse
import asyncio
import ipaddress
import json
import logging
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from service.client.commands import add_jobs_command
from service.client.completion import add_completion_command, complete_if_asked
from service.config import (
    ConfigurationError,
    Listen,
    Settings,
    process_role,
    token_scopes,
    with_secret_files,
)
from service.embedded import start_embedded
from service.logs import configure_logging
from service.stopping import StopRequest
from service.supervisor import supervise

# The web stack (service.app, service.server, uvicorn) is imported where a command needs
# it: the client commands never load it. (The supervisor of `tickgate serve` does, once,
# for the children it forks.)

log = logging.getLogger("tickgate")


def main(argv: list[str] | None = None) -> None:
    parser = _parser()
    complete_if_asked(parser)
    args = parser.parse_args(argv)
    settings = Settings()
    configure_logging(settings.log_level, settings.log_format, process_role(settings))
    try:
        args.command(with_secret_files(settings), args)
    except ConfigurationError as error:
        # Misconfiguration an operator must fix: one clear line, no traceback.
        log.error("%s", error)
        raise SystemExit(2) from error


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tickgate", description=__doc__)
    commands = parser.add_subparsers(required=True, metavar="COMMAND")
    serve = commands.add_parser(
        "serve",
        help="run migrations, then serve the API and the scheduler (each in its own process)",
    )
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8080)
    serve.add_argument(
        "--uds", type=Path, metavar="PATH", help="listen on this unix socket instead"
    )
    serve.add_argument(
        "--apply-jobs",
        type=Path,
        metavar="FILE",
        help="YAML/JSON jobs upserted at startup as PUT would (env TICKGATE_APPLY_JOBS)",
    )
    serve.set_defaults(command=_serve)
    migrate = commands.add_parser("migrate", help="apply database migrations and exit")
    migrate.set_defaults(command=_migrate)
    openapi = commands.add_parser("openapi", help="print the OpenAPI document")
    openapi.set_defaults(command=_openapi)
    add_jobs_command(commands)
    add_completion_command(commands)
    return parser


def _serve(settings: Settings, args: argparse.Namespace) -> None:
    stop = StopRequest()
    stop.install()
    if args.apply_jobs is not None:
        settings = settings.model_copy(update={"apply_jobs": args.apply_jobs})
    _refuse_no_role(settings)
    if settings.api and args.uds is None:
        _refuse_anonymous_exposure(settings, args.host)
    listen = Listen(args.host, args.port, args.uds)
    with _database(settings) as ready:
        _check_configuration(ready)
        if stop.asked:
            log.info("stopped before serving")
            return
        if ready.api and ready.scheduler:
            raise SystemExit(supervise(ready, listen, stop))
        from service.server import serve_app

        serve_app(ready, listen, stop)


def _check_configuration(settings: Settings) -> None:
    from service.app import check_configuration

    check_configuration(settings)


def _refuse_no_role(settings: Settings) -> None:
    if not (settings.api or settings.scheduler):
        log.error("TICKGATE_API and TICKGATE_SCHEDULER are both off: nothing to serve")
        raise SystemExit(2)


def _refuse_anonymous_exposure(settings: Settings, host: str) -> None:
    """Without tokens anyone who reaches the port may create jobs; only loopback may
    be served that way, unless the operator says so explicitly."""
    if token_scopes(settings) or settings.allow_anonymous or _is_loopback(host):
        return
    log.error(
        "refusing to serve on %s without API tokens: set TICKGATE_API_TOKENS (or "
        "TICKGATE_API_TOKENS_FILE), or TICKGATE_ALLOW_ANONYMOUS=1",
        host,
    )
    raise SystemExit(2)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _migrate(settings: Settings, _: argparse.Namespace) -> None:
    from service.store import Store

    async def run(dsn: str) -> int:
        store = await Store.open(dsn, max_size=1)
        try:
            return await store.migrate()
        finally:
            await store.close()

    with _database(settings) as ready:
        applied = asyncio.run(run(str(ready.database_url)))
        log.info("%d migrations applied", applied)


def _openapi(settings: Settings, _: argparse.Namespace) -> None:
    from service.app import create_app

    app = create_app(settings.model_copy(update={"database_url": "postgresql://unused"}))
    json.dump(app.openapi(), sys.stdout, indent=2, sort_keys=True)
    sys.stdout.write("\n")


@contextmanager
def _database(settings: Settings) -> Iterator[Settings]:
    """Settings with a database URL: the configured one, or an embedded server's."""
    if settings.database_url:
        yield settings
        return
    if settings.require_database_url:
        log.error("DATABASE_URL is required here (TICKGATE_REQUIRE_DATABASE_URL is set)")
        raise SystemExit(2)
    embedded = start_embedded(settings.data_dir)
    log.info("DATABASE_URL is unset: using embedded PostgreSQL in %s", embedded.pgdata)
    try:
        roles = embedded.service_roles()
        self_url = settings.sql_self_url or roles.self_url
        yield settings.model_copy(update={"database_url": roles.url, "sql_self_url": self_url})
    finally:
        embedded.stop()
