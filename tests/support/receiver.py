"""A loopback HTTP receiver that counts what Tickgate's `http` task delivers.

It keeps its own record of every request, independent of Tickgate's run ledger, so a tick
delivered twice shows up here even if Tickgate's bookkeeping believes it ran once.

Any path is accepted with any method. A path answers after a delay and with a status set
either by `respond(path, delay=..., status=...)` or by query parameters on the URL the job
calls: `/slow?seconds=3&status=503`. `respond` can also add a `Location` header (to answer
a redirect) and pad the body to a given size.
"""

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime
from http import HTTPStatus
from urllib.parse import parse_qs, urlencode, urlsplit


@dataclass
class Receipt:
    """One request as it arrived (headers as sent; `received_at` is wall-clock time.time())."""

    method: str
    path: str
    query: dict[str, str]
    job: str | None
    scheduled_for: str | None
    run_id: str | None
    idempotency_key: str | None
    user_agent: str | None
    content_type: str | None
    body: bytes
    received_at: float
    answered_at: float | None = None
    status: int | None = None
    headers: dict[str, str] = field(default_factory=dict)  # names lower-cased

    @property
    def tick(self) -> float | None:
        """`X-Tickgate-Scheduled-For` as a POSIX timestamp, or None when absent or malformed."""
        if self.scheduled_for is None:
            return None
        try:
            return datetime.fromisoformat(self.scheduled_for).timestamp()
        except ValueError:
            return None


@dataclass
class _Answer:
    delay: float = 0.0
    status: int = 200
    location: str | None = None
    body_size: int | None = None
    headers: tuple[tuple[str, str], ...] = ()


@dataclass
class Receiver:
    """Requests seen so far, and how to answer them. Thread-safe."""

    url: str = ""
    _receipts: list[Receipt] = field(default_factory=list)
    _answers: dict[str, _Answer] = field(default_factory=dict)
    _failures: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)
    _failure_status: int = 503

    def url_for(self, path: str, *, seconds: float | None = None, status: int | None = None) -> str:
        """The absolute URL of `path`, optionally answering after `seconds` with `status`."""
        query = {
            key: str(value)
            for key, value in (("seconds", seconds), ("status", status))
            if value is not None
        }
        suffix = f"?{urlencode(query)}" if query else ""
        return f"{self.url}{path}{suffix}"

    def respond(
        self,
        path: str,
        *,
        delay: float = 0.0,
        status: int = 200,
        location: str | None = None,
        body_size: int | None = None,
        headers: tuple[tuple[str, str], ...] = (),
    ) -> None:
        """From now on, answer requests to `path` after `delay` seconds with `status`,
        a `Location` header if given, a body of `body_size` bytes if given, and `headers`."""
        with self._lock:
            self._answers[path] = _Answer(delay, status, location, body_size, headers)

    def fail_first(self, path: str, times: int, *, status: int = 503) -> None:
        """Answer the next `times` requests to `path` with `status`, then as configured."""
        with self._lock:
            self._failures[path] = times
            self._answers.setdefault(path, _Answer())
            self._failure_status = status

    def receipts(self, job: str | None = None) -> list[Receipt]:
        """Every request so far (of `job` only, if given), in arrival order."""
        with self._lock:
            return [r for r in self._receipts if job is None or r.job == job]

    def tick_counts(self) -> Counter[tuple[str | None, float | None]]:
        """How many requests arrived for each (job, scheduled tick)."""
        return Counter((r.job, r.tick) for r in self.receipts())

    def duplicates(self, *, by_tick: bool = True) -> list[str]:
        """Every run id or idempotency key that arrived more than once, and (`by_tick`)
        every (job, X-Tickgate-Scheduled-For). Pass by_tick=False when manual runs are
        expected: two triggered in one second carry the same whole-second header."""
        receipts = self.receipts()
        ticks = Counter((r.job, r.scheduled_for) for r in receipts) if by_tick else Counter()
        problems = [
            f"job {job!r} tick {scheduled!r} arrived {count} times"
            for (job, scheduled), count in ticks.items()
            if count > 1
        ]
        for header, values in (
            ("X-Tickgate-Run-Id", [r.run_id for r in receipts]),
            ("Idempotency-Key", [r.idempotency_key for r in receipts]),
        ):
            problems += [
                f"{header} {value!r} arrived {count} times"
                for value, count in Counter(values).items()
                if value is not None and count > 1
            ]
        return problems

    def _answer_for(self, path: str, query: dict[str, str]) -> _Answer:
        with self._lock:
            configured = self._answers.get(path)
            failing = self._failures.get(path, 0)
            if failing:
                self._failures[path] = failing - 1
        answer = replace(configured) if configured else _Answer()
        if failing:
            answer.status = self._failure_status
        if "seconds" in query:
            answer.delay = float(query["seconds"])
        if "status" in query:
            answer.status = int(query["status"])
        return answer

    def _record(self, receipt: Receipt) -> None:
        with self._lock:
            self._receipts.append(receipt)


@dataclass(frozen=True)
class _Request:
    method: str
    target: str
    headers: dict[str, str]  # names lower-cased; a repeated header keeps its first value
    body: bytes
    received_at: float
    close: bool  # the client asked to close after the answer


async def _read_request(reader: asyncio.StreamReader) -> _Request | None:
    """The next request on the connection, or None once the client closed it."""
    line = await reader.readline()
    if not line.strip():
        return None
    received_at = time.time()
    method, target, version = line.decode("latin-1").split()
    headers: dict[str, str] = {}
    while (header := await reader.readline()) not in (b"\r\n", b"\n", b""):
        name, _, value = header.decode("latin-1").partition(":")
        headers.setdefault(name.strip().lower(), value.strip())
    if headers.get("transfer-encoding", "").lower() == "chunked":
        body = await _read_chunked(reader)
    else:
        body = await reader.readexactly(int(headers.get("content-length") or 0))
    closing = headers.get("connection", "").lower() == "close" or version == "HTTP/1.0"
    return _Request(method, target, headers, body, received_at, closing)


async def _read_chunked(reader: asyncio.StreamReader) -> bytes:
    body = b""
    while size := int((await reader.readline()).split(b";")[0], 16):
        body += await reader.readexactly(size)
        await reader.readline()
    while (await reader.readline()) not in (b"\r\n", b"\n", b""):
        pass  # trailers
    return body


def _receipt_of(request: _Request, path: str, query: dict[str, str]) -> Receipt:
    headers = request.headers
    return Receipt(
        method=request.method,
        path=path,
        query=query,
        job=headers.get("x-tickgate-job"),
        scheduled_for=headers.get("x-tickgate-scheduled-for"),
        run_id=headers.get("x-tickgate-run-id"),
        idempotency_key=headers.get("idempotency-key"),
        user_agent=headers.get("user-agent"),
        content_type=headers.get("content-type"),
        body=request.body,
        received_at=request.received_at,
        headers=headers,
    )


class _Server:
    """Serves the receiver from an asyncio loop on a thread of its own: one thread for
    every connection, so a crowd of requests arriving in the same moment (a whole
    second of jobs) is taken in at once rather than a thread started per connection.
    Without `keep_alive` each connection is closed after one answer (HTTP/1.0)."""

    def __init__(self, receiver: Receiver, keep_alive: bool) -> None:
        self._receiver = receiver
        self._keep_alive = keep_alive
        self._version = "HTTP/1.1" if keep_alive else "HTTP/1.0"
        self._handlers: set[asyncio.Task[None]] = set()

    async def serve(self, ready: "Future[str]", stop: asyncio.Event) -> None:
        # Every job of a cluster calls at the same whole second: a deep backlog keeps
        # the kernel from turning connections away (seen by Tickgate as ReadError).
        server = await asyncio.start_server(self._connected, "127.0.0.1", 0, backlog=1024)
        host, port = server.sockets[0].getsockname()[:2]
        ready.set_result(f"http://{host!s}:{port}")
        await stop.wait()
        server.close()
        for handler in list(self._handlers):
            handler.cancel()
        await asyncio.gather(*self._handlers, return_exceptions=True)
        await server.wait_closed()

    async def _connected(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        handler = asyncio.current_task()
        assert handler is not None
        self._handlers.add(handler)
        try:
            while (request := await _read_request(reader)) is not None:
                keep = self._keep_alive and not request.close
                if not await self._answer(request, writer, keep) or not keep:
                    break
        except (ConnectionError, asyncio.IncompleteReadError, ValueError):
            pass  # a client that goes away mid-request or mid-answer is expected here
        except asyncio.CancelledError:
            # The receiver is closing (`serve` cancels its handlers). Ending quietly keeps
            # asyncio's stream callback from logging the cancellation as an error.
            return
        finally:
            self._handlers.discard(handler)
            writer.close()

    async def _answer(self, request: _Request, writer: asyncio.StreamWriter, keep: bool) -> bool:
        """Record the request and answer it; False if the receiver closed first."""
        receiver = self._receiver
        parts = urlsplit(request.target)
        query = {key: values[-1] for key, values in parse_qs(parts.query).items()}
        receipt = _receipt_of(request, parts.path, query)
        receiver._record(receipt)
        answer = receiver._answer_for(parts.path, query)
        if answer.delay > 0:
            await asyncio.sleep(answer.delay)
        payload = b'{"ok":true}' if answer.body_size is None else b"x" * answer.body_size
        head = [
            f"{self._version} {answer.status} {_reason(answer.status)}",
            "Content-Type: application/json",
            f"Content-Length: {len(payload)}",
            f"Connection: {'keep-alive' if keep else 'close'}",
        ]
        if answer.location is not None:
            head.append(f"Location: {answer.location}")
        head.extend(f"{name}: {value}" for name, value in answer.headers)
        writer.write(("\r\n".join(head) + "\r\n\r\n").encode("latin-1") + payload)
        await writer.drain()
        receipt.status = answer.status
        receipt.answered_at = time.time()
        return True


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"


@contextmanager
def receiving(*, keep_alive: bool = False) -> Iterator[Receiver]:
    """A receiver on 127.0.0.1 at a free port, serving from a background thread; it
    closes each connection after one answer (HTTP/1.0) unless `keep_alive`."""
    receiver = Receiver()
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    ready: Future[str] = Future()
    server = _Server(receiver, keep_alive)
    thread = threading.Thread(
        target=loop.run_until_complete, args=(server.serve(ready, stop),), daemon=True
    )
    thread.start()
    receiver.url = ready.result(timeout=10)
    try:
        yield receiver
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(10)
        loop.close()
