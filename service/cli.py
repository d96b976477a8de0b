"""`tickgate serve | migrate | openapi`."""

import argparse
import asyncio
import json
import logging
import signal
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

import uvicorn

from service.app import create_app
from service.config import Settings
from service.embedded import start_embedded
from service.store import Store

log = logging.getLogger("tickgate")


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    settings = Settings()
    logging.basicConfig(
        level=settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    args.command(settings, args)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="tickgate", description=__doc__)
    commands = parser.add_subparsers(required=True, metavar="COMMAND")
    serve = commands.add_parser("serve", help="run migrations, then serve the API and scheduler")
    serve.add_argument("--host", default="127.0.0.1")
    serve.add_argument("--port", type=int, default=8080)
    serve.set_defaults(command=_serve)
    migrate = commands.add_parser("migrate", help="apply database migrations and exit")
    migrate.set_defaults(command=_migrate)
    openapi = commands.add_parser("openapi", help="print the OpenAPI document")
    openapi.set_defaults(command=_openapi)
    return parser


def _serve(settings: Settings, args: argparse.Namespace) -> None:
    # uvicorn re-raises the SIGTERM it handled once it has shut down; with the default
    # disposition that would kill us before the embedded database is released.
    signal.signal(signal.SIGTERM, _already_shut_down)
    with _database(settings) as ready:
        app = create_app(ready)
        config = uvicorn.Config(
            app, host=args.host, port=args.port, log_level=settings.log_level.lower()
        )
        uvicorn.Server(config).run()


def _already_shut_down(signum: int, frame: FrameType | None) -> None:
    log.info("signal %d received after shutdown", signum)


def _migrate(settings: Settings, _: argparse.Namespace) -> None:
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
    app = create_app(settings.model_copy(update={"database_url": "postgresql://unused"}))
    json.dump(app.openapi(), sys.stdout, indent=2, sort_keys=True)
    sys.stdout.write("\n")


@contextmanager
def _database(settings: Settings) -> Iterator[Settings]:
    """Settings with a database URL: the configured one, or an embedded server's."""
    if settings.database_url:
        yield settings
        return
    embedded = start_embedded(settings.data_dir)
    log.info("DATABASE_URL is unset: using embedded PostgreSQL in %s", embedded.pgdata)
    try:
        yield settings.model_copy(update={"database_url": embedded.url})
    finally:
        embedded.stop()
