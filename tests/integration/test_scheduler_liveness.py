"""The API process's view of its pod's scheduler process (service/scheduler/remote.py):
a scheduler still starting is alive; one that answered once and then stops is not."""

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

from service.scheduler.remote import OK, SchedulerProcess

HEALTHY = (
    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 15\r\n\r\n"
    b'{"status":"ok"}'
)


async def _answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    await reader.readuntil(b"\r\n\r\n")
    writer.write(HEALTHY)
    await writer.drain()
    writer.close()


@asynccontextmanager
async def scheduler_answering(socket: Path) -> AsyncIterator[None]:
    """A stand-in for the scheduler process's probe server on its unix socket."""
    server = await asyncio.start_unix_server(_answer, path=str(socket))
    try:
        yield
    finally:
        server.close()
        await server.wait_closed()


async def test_a_scheduler_that_has_not_opened_its_socket_yet_is_starting_so_alive(
    tmp_path: Path,
) -> None:
    scheduler = SchedulerProcess(tmp_path / "scheduler.sock")
    try:
        assert await scheduler.liveness() == OK
        # Readiness is what says "not yet".
        assert await scheduler.readiness() != OK
    finally:
        await scheduler.aclose()


async def test_a_scheduler_that_answered_and_then_went_away_is_not_alive(tmp_path: Path) -> None:
    socket = tmp_path / "scheduler.sock"
    scheduler = SchedulerProcess(socket)
    try:
        async with scheduler_answering(socket):
            assert await scheduler.liveness() == OK
        verdict = await scheduler.liveness()
        assert verdict.startswith("scheduler process not answering"), verdict
    finally:
        await scheduler.aclose()


async def test_a_scheduler_that_never_opens_its_socket_stops_counting_as_starting(
    tmp_path: Path,
) -> None:
    scheduler = SchedulerProcess(tmp_path / "scheduler.sock", starting_seconds=0)
    try:
        verdict = await scheduler.liveness()
        assert verdict.startswith("scheduler process not answering"), verdict
    finally:
        await scheduler.aclose()
