"""The API process's view of its pod's scheduler process (service/scheduler/remote.py):
a scheduler still starting is alive; one that answered once and then stops is not; an
answer read is freed at once."""

import asyncio
import gc
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import httpx

from service.scheduler.remote import OK, SchedulerProcess

HEALTHY = (
    b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 15\r\n\r\n"
    b'{"status":"ok"}'
)


EXPOSITION = b"".join(
    b'tickgate_runs_total{job="job-%06d",status="succeeded"} 1\n' % n for n in range(5000)
)
METRICS = b"HTTP/1.1 200 OK\r\ncontent-length: %d\r\n\r\n%s" % (len(EXPOSITION), EXPOSITION)


async def _answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    asked = await reader.readuntil(b"\r\n\r\n")
    writer.write(METRICS if asked.startswith(b"GET /metrics ") else HEALTHY)
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


async def test_an_answer_read_leaves_nothing_for_the_cycle_collector(tmp_path: Path) -> None:
    # The API process allocates little, so a full collection comes rarely: an answer
    # left in a reference cycle kept its body (the scheduler's whole exposition) for
    # minutes. Read with the collector off, none may be left waiting for it.
    socket = tmp_path / "scheduler.sock"
    scheduler = SchedulerProcess(socket)
    gc.collect()
    gc.disable()
    try:
        async with scheduler_answering(socket):
            assert await scheduler.liveness() == OK
            assert await scheduler.readiness() == OK
            for _ in range(3):
                assert await scheduler.exposition() == EXPOSITION
        left = [found for found in gc.get_objects() if isinstance(found, httpx.Response)]
        assert left == []
    finally:
        gc.enable()
        await scheduler.aclose()
