"""The pod's scheduler as its API process sees it, when `tickgate serve` runs the two in
processes of their own (service/supervisor.py): asked over a unix socket whether it
lives, whether it is ready, and for its metrics."""

import logging
import time
from pathlib import Path

import httpx
from pydantic import BaseModel, ValidationError

log = logging.getLogger(__name__)

OK = "ok"
# The scheduler's readiness checks the database within 1 s itself; a little more here.
PROBE_SECONDS = 2.0
# A scrape may take a while on a busy box; Prometheus' default timeout is 10 s.
METRICS_SECONDS = 5.0
# How long a scheduler process that has not yet opened its socket counts as starting
# (alive) rather than dead: its startup migrates and syncs against the database.
STARTING_SECONDS = 120.0


class _Checks(BaseModel):
    checks: dict[str, str]


class SchedulerProcess:
    def __init__(self, socket: Path, starting_seconds: float = STARTING_SECONDS) -> None:
        self._http = httpx.AsyncClient(
            transport=httpx.AsyncHTTPTransport(uds=str(socket)),
            # A loopback name: a server without tokens answers no other `Host` (#42).
            base_url="http://localhost",
            timeout=PROBE_SECONDS,
        )
        self._starting_until: float | None = time.monotonic() + starting_seconds

    async def liveness(self) -> str:
        """'ok', or why the scheduler process does not count as alive. Before its socket
        first answers, a refused connection means it is still starting, which is alive:
        the supervisor takes the pod down if it exits, and readiness says "not ready"."""
        try:
            response = await self._get("/healthz")
        except httpx.ConnectError as error:
            return OK if self._still_starting() else f"scheduler process not answering: {error!r}"
        except httpx.HTTPError as error:
            return f"scheduler process not answering: {error!r}"
        self._starting_until = None
        return OK if response.status_code == 200 else f"scheduler process: {response.text}"

    def _still_starting(self) -> bool:
        return self._starting_until is not None and time.monotonic() < self._starting_until

    async def readiness(self) -> str:
        """'ok', or which of the scheduler process's own readiness checks failed."""
        try:
            response = await self._get("/readyz")
        except httpx.HTTPError as error:
            return f"scheduler process not answering: {error!r}"
        if response.status_code == 200:
            return OK
        try:
            checks = _Checks.model_validate_json(response.content).checks
        except ValidationError:
            return f"scheduler process answered {response.status_code}"
        failed = (f"{name}: {verdict}" for name, verdict in checks.items() if verdict != OK)
        return "; ".join(failed)

    async def exposition(self) -> bytes | None:
        """The scheduler process's metrics, or None (logged) when it does not answer."""
        try:
            response = await self._get("/metrics", METRICS_SECONDS)
            response.raise_for_status()
        except httpx.HTTPError as error:
            log.warning("scheduler process metrics not read: %r", error)
            return None
        return response.content

    async def _get(self, path: str, seconds: float = PROBE_SECONDS) -> httpx.Response:
        """GET `path`, the answer read whole and freed by reference counting alone.
        httpx 0.28's response and its stream point at each other (encode/httpx#3733),
        so each answer, an exposition of hundreds of KB with it, waited for a full
        collection, which this quiet process runs rarely: the 30-minute soak saw it grow
        about 0.8 MiB a minute. Read and closed, the response needs its stream no more."""
        response = await self._http.get(path, timeout=seconds)
        response.stream = httpx.ByteStream(b"")
        return response

    async def aclose(self) -> None:
        await self._http.aclose()
