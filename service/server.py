"""One role of `tickgate serve` in this process: the app under uvicorn.

Apart from the command line (service/cli.py) so that the supervisor (service/supervisor.py),
which serves nothing itself, never loads the web stack."""

import asyncio
import logging
import socket
from types import FrameType

import uvicorn
from fastapi import FastAPI

from service.app import begin_shutdown, create_app
from service.config import Listen, Settings
from service.faults import injected
from service.gc_tuning import settle_after_startup
from service.stopping import StopRequest
from service.store.migrate import migrate_database
from service.store.pooling import refuse_shared_sessions

log = logging.getLogger(__name__)

# How long an idle HTTP connection stays open. Longer than a client's pool keeps one
# (httpx: 5 s) and than a load balancer's idle timeout (AWS ALB: 60 s): whoever reuses
# it must be the one to close it first. uvicorn's 5 s raced httpx's 5 s, and a request
# sent as the replica closed the connection was lost.
KEEP_ALIVE_SECONDS = 65


def serve_app(settings: Settings, listen: Listen, stop: StopRequest) -> None:
    """The API, or the scheduler with its probes and metrics, until a signal stops it.

    First, before anything opens a lock session, refuse a DATABASE_URL whose sessions
    other clients share, as transaction pooling does (service/store/pooling.py), then
    migrate (service/store/migrate.py), refusing a database whose migrations disagree
    with this release's. Both here rather than in the app's lifespan (which finds the
    schema at head then): a refusal is a ConfigurationError, which `tickgate` reports in
    one line and exits 2, where uvicorn would log a traceback and exit 3."""
    asyncio.run(_prepare_database(str(settings.database_url)))
    if stop.asked:
        return
    app = create_app(settings, faults=injected())
    config = uvicorn.Config(
        app,
        host=listen.host,
        port=listen.port,
        uds=None if listen.uds is None else str(listen.uds),
        log_level=settings.log_level.lower(),
        log_config=None,
        timeout_keep_alive=KEEP_ALIVE_SECONDS,
    )
    _Server(config, app, stop).run()


async def _prepare_database(dsn: str) -> None:
    await refuse_shared_sessions(dsn)
    applied = await migrate_database(dsn)
    log.info("%d migrations applied now", len(applied))


class _Server(uvicorn.Server):
    """uvicorn's server, telling the app the moment a shutdown signal arrives, and not
    starting at all for one that came before it listened for signals."""

    def __init__(self, config: uvicorn.Config, app: FastAPI, stop: StopRequest) -> None:
        super().__init__(config)
        self._app = app
        self._stop = stop

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        begin_shutdown(self._app)
        super().handle_exit(sig, frame)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        # uvicorn handles signals by now; one noted before that is this server's too.
        if self._stop.asked:
            self.should_exit = True
            return
        await super().startup(sockets)
        settle_after_startup()
