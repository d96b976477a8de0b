"""The http task's connection discipline, against loopback targets that count what they
see: a cap per host that a crowd of runs takes turns on, a connect timeout apart from the
run's, and the per-host counts the metrics export."""

import asyncio
import logging
import socket
import uuid
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from harness.waiting import eventually_async
from service.metrics import Metrics
from service.store.targets import SqlTargetConnections
from service.tasks import TaskContext
from service.tasks.hosts import HostLimits, HostTally
from service.tasks.http import HttpArgs, HttpSender, HttpTaskError
from service.tasks.netguard import Allowlist

ANSWER = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: keep-alive\r\n\r\nok"


@dataclass
class CountingTarget:
    """A loopback HTTP/1.1 target that answers every request after `delay` seconds on
    kept-alive connections, and counts the connections open at once."""

    delay: float
    open: int = 0
    most_open: int = 0
    requests: int = 0
    port: int = 0

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.open += 1
        self.most_open = max(self.most_open, self.open)
        try:
            while await self._request(reader):
                await asyncio.sleep(self.delay)
                self.requests += 1
                writer.write(ANSWER)
                await writer.drain()
        except ConnectionError:
            pass  # the client went away: the connection is over either way
        finally:
            self.open -= 1
            writer.close()

    @staticmethod
    async def _request(reader: asyncio.StreamReader) -> bool:
        """Read one request (headers and its Content-Length body); False at EOF."""
        head = await reader.readuntil(b"\r\n\r\n") if not reader.at_eof() else b""
        if not head:
            return False
        length = 0
        for line in head.split(b"\r\n"):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        await reader.readexactly(length)
        return True


@asynccontextmanager
async def counting_target(delay: float) -> AsyncIterator[CountingTarget]:
    target = CountingTarget(delay)

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            await target.serve(reader, writer)
        except asyncio.IncompleteReadError:
            writer.close()  # the client closed a kept-alive connection

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    target.port = server.sockets[0].getsockname()[1]
    async with server:
        yield target


def context() -> TaskContext:
    now = datetime.now(UTC)
    logger = logging.LoggerAdapter(logging.getLogger("test"), {})
    return TaskContext(
        "job",
        uuid.uuid4(),
        now,
        1,
        logger,
        now + timedelta(seconds=30),
        httpx.AsyncClient(),
        SqlTargetConnections({}),
    )


def args(port: int, timeout: float = 30.0) -> HttpArgs:
    return HttpArgs.model_validate(
        {"url": f"http://127.0.0.1:{port}/hook", "timeout_seconds": timeout}
    )


@asynccontextmanager
async def sender(**kwargs: object) -> AsyncIterator[HttpSender]:
    built = HttpSender(Allowlist.from_setting("127.0.0.1"), **kwargs)  # type: ignore[arg-type]
    try:
        yield built
    finally:
        await built.aclose()


async def test_a_crowd_to_one_host_takes_turns_on_the_per_host_cap() -> None:
    """40 runs at once to one target, the cap 4: the target never sees more than 4
    connections at once, the others wait their turn (counted while they wait), and every
    run succeeds; afterwards nobody waits and the connections stay open for reuse."""
    hosts = HostTally()
    async with (
        counting_target(delay=0.05) as target,
        sender(limits=HostLimits(4), hosts=hosts) as http,
    ):
        key = f"127.0.0.1:{target.port}"
        most_waiting = 0

        async def watch() -> None:
            nonlocal most_waiting
            while True:
                most_waiting = max(most_waiting, hosts.of(key).waiting)
                await asyncio.sleep(0.005)

        watcher = asyncio.create_task(watch())
        results = await asyncio.gather(*(http.run(args(target.port), context()) for _ in range(40)))
        watcher.cancel()
        assert results == [{"status": 200, "bytes": 2}] * 40
        assert target.requests == 40
        assert target.most_open <= 4
        assert most_waiting > 0
        counts = hosts.snapshot()[key]
        assert (counts.waiting, counts.connect_failures) == (0, 0)
        assert 1 <= counts.open <= 4


async def test_new_connections_open_two_at_a_time_until_they_answer() -> None:
    """30 runs at once to a target answering after 0.5 s, the cap 64: until the first
    answer only 2 connections open (the host's backlog is spared), then 2 more per round
    trip as connections answer; every run succeeds."""
    hosts = HostTally()
    async with counting_target(delay=0.5) as target, sender(hosts=hosts) as http:
        runs = asyncio.gather(*(http.run(args(target.port), context()) for _ in range(30)))
        first_round = 0
        while target.requests == 0:  # watched until the first answer
            first_round = max(first_round, target.open)
            await asyncio.sleep(0.005)
        results = await runs
    assert first_round == 2
    assert results == [{"status": 200, "bytes": 2}] * 30
    # Round trips of 0.5 s: 2, 4, 6, 8 and 10 at once serve the 30.
    assert 4 <= target.most_open <= 12


async def test_a_run_that_times_out_while_waiting_for_a_connection_waits_no_more() -> None:
    """Cap 1, one slow run holds the connection: the next run's own timeout ends its
    wait, with the run's timeout error, and it is not counted waiting any more."""
    hosts = HostTally()
    async with (
        counting_target(delay=1.0) as target,
        sender(limits=HostLimits(1), hosts=hosts) as http,
    ):
        slow = asyncio.create_task(http.run(args(target.port), context()))
        await eventually_async(lambda: target.open == 1, 10, "the first run to connect")
        with pytest.raises(HttpTaskError, match=r"timed out after 0\.2s"):
            await http.run(args(target.port, timeout=0.2), context())
        assert hosts.of(f"127.0.0.1:{target.port}").waiting == 0
        assert await slow == {"status": 200, "bytes": 2}


@contextmanager
def unanswered_port() -> Iterator[int]:
    """A loopback port whose accept queue is full: the kernel drops further SYNs, so a
    connect hangs as it would toward a dead host."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    port = listener.getsockname()[1]
    fillers = []
    try:
        for _ in range(2):  # a backlog of 0 still queues one; the second fills it
            filler = socket.socket()
            filler.setblocking(False)
            filler.connect_ex(("127.0.0.1", port))
            fillers.append(filler)
        yield port
    finally:
        for filler in fillers:
            filler.close()
        listener.close()


async def test_a_connect_that_hangs_fails_after_the_connect_timeout_naming_the_host() -> None:
    """A host that never completes the handshake fails the run after the connect
    timeout, well inside the run's own 30 s, with an error naming host and port, and
    counts a connect failure for it."""
    hosts = HostTally()
    with unanswered_port() as port:
        async with sender(connect_timeout_seconds=0.5, hosts=hosts) as http:
            started = asyncio.get_running_loop().time()
            with pytest.raises(HttpTaskError) as failed:
                await http.run(args(port), context())
            took = asyncio.get_running_loop().time() - started
    assert str(failed.value) == (
        f"POST http://127.0.0.1:{port}/hook: connect to 127.0.0.1:{port} timed out after 0.5s"
    )
    assert took < 20  # the run's own timeout (30 s) did not end it
    assert hosts.snapshot()[f"127.0.0.1:{port}"].connect_failures == 1


async def test_the_metrics_export_each_host_s_connections() -> None:
    hosts = HostTally()
    async with counting_target(delay=0) as target, sender(hosts=hosts) as http:
        await http.run(args(target.port), context())
        text = Metrics(hosts=hosts).exposition().decode()
    host = f'host="127.0.0.1:{target.port}"'
    assert f"tickgate_http_connections_open{{{host}}} 1.0" in text
    assert f"tickgate_http_runs_waiting_for_connection{{{host}}} 0.0" in text
    assert f"tickgate_http_connect_failures_total{{{host}}} 0.0" in text
