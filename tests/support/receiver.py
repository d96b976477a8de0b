"""A loopback HTTP receiver that counts what Tickgate's `http` task delivers.

It keeps its own record of every request, independent of Tickgate's run ledger, so a tick
delivered twice shows up here even if Tickgate's bookkeeping believes it ran once.

Any path is accepted with any method. A path answers after a delay and with a status set
either by `respond(path, delay=..., status=...)` or by query parameters on the URL the job
calls: `/slow?seconds=3&status=503`. `respond` can also add a `Location` header (to answer
a redirect) and pad the body to a given size.
"""

import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
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
    _closing: threading.Event = field(default_factory=threading.Event)
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


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    # Every job of a cluster calls at the same whole second; the default backlog of 5
    # would make the kernel turn connections away (seen by Tickgate as ReadError).
    request_queue_size = 1024
    receiver: Receiver

    def handle_error(self, request: Any, client_address: Any) -> None:
        # A client that goes away mid-answer (a replica killed with SIGKILL while a slow
        # request is held) is expected here; the receipt was recorded on arrival.
        return


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def _handle(self) -> None:
        received_at = time.time()
        receiver = self.server.receiver
        parts = urlsplit(self.path)
        query = {key: values[-1] for key, values in parse_qs(parts.query).items()}
        length = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(length) if length else b""
        receipt = Receipt(
            method=self.command,
            path=parts.path,
            query=query,
            job=self.headers.get("X-Tickgate-Job"),
            scheduled_for=self.headers.get("X-Tickgate-Scheduled-For"),
            run_id=self.headers.get("X-Tickgate-Run-Id"),
            idempotency_key=self.headers.get("Idempotency-Key"),
            user_agent=self.headers.get("User-Agent"),
            content_type=self.headers.get("Content-Type"),
            body=body,
            received_at=received_at,
            headers={name.lower(): value for name, value in self.headers.items()},
        )
        receiver._record(receipt)
        answer = receiver._answer_for(parts.path, query)
        if answer.delay > 0 and receiver._closing.wait(answer.delay):
            return
        payload = b'{"ok":true}' if answer.body_size is None else b"x" * answer.body_size
        self.send_response(answer.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(payload)))
        if answer.location is not None:
            self.send_header("Location", answer.location)
        for name, value in answer.headers:
            self.send_header(name, value)
        self.end_headers()
        try:
            self.wfile.write(payload)
        except ConnectionError:  # a client that stops reading a large body hangs up
            return
        self.wfile.flush()
        receipt.status = answer.status
        receipt.answered_at = time.time()

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _handle

    def log_message(self, format: str, *args: Any) -> None:
        return


class _KeepAliveHandler(_Handler):
    protocol_version = "HTTP/1.1"


@contextmanager
def receiving(*, keep_alive: bool = False) -> Iterator[Receiver]:
    """A receiver on 127.0.0.1 at a free port, serving from a background thread; it
    closes each connection after one answer (HTTP/1.0) unless `keep_alive`."""
    receiver = Receiver()
    server = _Server(("127.0.0.1", 0), _KeepAliveHandler if keep_alive else _Handler)
    server.receiver = receiver
    host, port = server.server_address[:2]
    receiver.url = f"http://{host!s}:{port}"
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    try:
        yield receiver
    finally:
        receiver._closing.set()
        server.shutdown()
        server.server_close()
        thread.join(10)
