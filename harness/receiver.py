"""The loopback webhook receiver: counts what Tickgate's `http` task (or a peer) delivers.

Its records are independent of Tickgate's run ledger, so a tick delivered twice, or not
at all, shows up here whatever Tickgate's own bookkeeping says. One server, two ways to
run it:

- `receiving()`: on a thread of the caller's process (the tests). `Receiver.respond`
  and `fail_first` set how a path answers (delay, status, `Location`, body size,
  headers); so do query parameters on the URL a job calls: `/slow?seconds=3&status=503`.
- `ReceiverProcess.start()`: a process of its own (`python -m harness.receiver`, the
  benchmarks), so it keeps up with thousands of requests a second from three replicas
  on a busy two-core box; it is read back through control paths under `/__receiver/`
  (`count`, `reset`, `receipts`; with `?after=&before=`, POSIX seconds, only the
  receipts of ticks in that window), which are not recorded.

Requests are parsed by `httptools` as they stream in, and the receipt time is taken when
a request's first bytes are parsed. A delivery names its job and nominal tick with
Tickgate's headers `X-Tickgate-Job` and `X-Tickgate-Scheduled-For`, with `X-Bench-Job`
/ `X-Bench-Scheduled-For` (the peers), or with `?job=...&scheduled_for=...`;
`scheduled_for` is RFC 3339 or POSIX seconds.
"""

import argparse
import asyncio
import contextlib
import functools
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime
from http import HTTPStatus
from pathlib import Path
from typing import Any, Self, cast
from urllib.parse import parse_qs, urlencode, urlsplit

import httptools
import httpx

CONTROL = "/__receiver/"
_JOB_HEADERS = ("x-tickgate-job", "x-bench-job")
_TICK_HEADERS = ("x-tickgate-scheduled-for", "x-bench-scheduled-for")
START_DEADLINE_SECONDS = 30.0
# Every job of a cluster may call in the same whole second: a deep backlog keeps the
# kernel from turning connections away (seen by Tickgate as ReadError).
BACKLOG = 4096


@functools.lru_cache(maxsize=65536)
def parse_tick(text: str | None) -> float | None:
    """RFC 3339 (`...Z` or an offset) or POSIX seconds; None when absent or malformed."""
    if not text:
        return None
    with contextlib.suppress(ValueError):
        return float(text)
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


@dataclass
class Receipt:
    """One request as it arrived (`received_at` and `answered_at`: time.time()).

    A `ReceiverProcess` sends back the fields up to `runner` only (the rest keep their
    defaults): what the benchmarks count, at thousands of receipts a second.
    """

    job: str | None
    scheduled_for: str | None  # as sent
    received_at: float
    run_id: str | None = None
    runner: str | None = None  # X-Tickgate-Runner
    method: str = "POST"
    path: str = "/"
    query: dict[str, str] = field(default_factory=dict)
    idempotency_key: str | None = None
    user_agent: str | None = None
    content_type: str | None = None
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)  # names lower-cased
    answered_at: float | None = None
    status: int | None = None

    @property
    def tick(self) -> float | None:
        """The nominal tick as a POSIX timestamp, or None when absent or malformed."""
        return parse_tick(self.scheduled_for)

    def line(self) -> str:
        """The tab-separated form a `ReceiverProcess` sends back."""
        fields = (self.job, self.scheduled_for, f"{self.received_at:.6f}", self.run_id, self.runner)
        return "\t".join(value or "" for value in fields)

    @classmethod
    def of_line(cls, line: str) -> "Receipt":
        job, tick, at, run_id, runner = line.split("\t")
        return cls(job or None, tick or None, float(at), run_id or None, runner or None)


def in_window(receipts: list[Receipt], window: tuple[float, float] | None) -> list[Receipt]:
    """The receipts whose tick is in [after, before); all of them without a window."""
    if window is None:
        return receipts
    after, before = window
    return [r for r in receipts if (tick := r.tick) is not None and after <= tick < before]


def duplicates(receipts: list[Receipt], *, by_tick: bool = True) -> list[str]:
    """Every run id or idempotency key that arrived more than once, and (`by_tick`)
    every (job, X-Tickgate-Scheduled-For). Pass by_tick=False when manual runs are
    expected: two triggered in one second carry the same whole-second header."""
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
        """`duplicates` of every receipt so far."""
        return duplicates(self.receipts(), by_tick=by_tick)

    def reset(self) -> int:
        """Forget every receipt; how many there were."""
        with self._lock:
            count, self._receipts = len(self._receipts), []
            return count

    def answer_for(self, path: str, query: dict[str, str]) -> _Answer:
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

    def record(self, receipt: Receipt) -> None:
        with self._lock:
            self._receipts.append(receipt)

    def control(self, command: str, query: dict[str, str]) -> str | None:
        """The body of a control path's answer, None for an unknown one."""
        window = (float(query["after"]), float(query["before"])) if "after" in query else None
        if command == "count":
            return str(len(in_window(self.receipts(), window)))
        if command == "reset":
            return str(self.reset())
        if command == "receipts":
            return "".join(f"{r.line()}\n" for r in in_window(self.receipts(), window))
        return None


def _head(version: str, status: int, keep: bool, extra: list[str]) -> bytes:
    lines = [
        f"{version} {status} {_reason(status)}",
        *extra,
        f"Connection: {'keep-alive' if keep else 'close'}",
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def _reason(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Unknown"


class _Request:
    """The request being parsed: httptools' callbacks fill it in."""

    def __init__(self) -> None:
        self.received_at = time.time()
        self.url = b""
        self.headers: dict[str, str] = {}
        self.body = b""

    def receipt(self, method: str, path: str, query: dict[str, str]) -> Receipt:
        headers = self.headers
        return Receipt(
            job=_first(headers, _JOB_HEADERS) or query.get("job"),
            scheduled_for=_first(headers, _TICK_HEADERS) or query.get("scheduled_for"),
            received_at=self.received_at,
            run_id=headers.get("x-tickgate-run-id"),
            runner=headers.get("x-tickgate-runner"),
            method=method,
            path=path,
            query=query,
            idempotency_key=headers.get("idempotency-key"),
            user_agent=headers.get("user-agent"),
            content_type=headers.get("content-type"),
            body=self.body,
            headers=headers,
        )


def _first(headers: dict[str, str], names: tuple[str, ...]) -> str | None:
    return next((headers[name] for name in names if name in headers), None)


class _Protocol(asyncio.Protocol):
    """One client connection: parse requests as they stream in, answer each."""

    def __init__(self, receiver: Receiver, keep_alive: bool, connections: set["_Protocol"]) -> None:
        self._receiver = receiver
        self._keep_alive = keep_alive
        self._version = "HTTP/1.1" if keep_alive else "HTTP/1.0"
        self._connections = connections
        self._parser = httptools.HttpRequestParser(self)
        self._transport: asyncio.Transport | None = None
        self._request = _Request()
        self._timers: set[asyncio.TimerHandle] = set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but quack like one.
        self._transport = cast(asyncio.Transport, transport)
        self._connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self._connections.discard(self)
        for timer in self._timers:
            timer.cancel()
        self._transport = None

    def close(self) -> None:
        if self._transport is not None:
            self._transport.close()

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError:
            self.close()  # not HTTP: nothing to answer

    # httptools' callbacks
    def on_message_begin(self) -> None:
        self._request = _Request()

    def on_url(self, url: bytes) -> None:
        self._request.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        # a repeated header keeps its first value
        self._request.headers.setdefault(name.decode("latin-1").lower(), value.decode("latin-1"))

    def on_body(self, body: bytes) -> None:
        self._request.body += body

    def on_message_complete(self) -> None:
        parts = urlsplit(self._request.url.decode("latin-1"))
        query = {key: values[-1] for key, values in parse_qs(parts.query).items()}
        keep = self._keep_alive and self._parser.should_keep_alive()
        if parts.path.startswith(CONTROL):
            self._control(parts.path.removeprefix(CONTROL), query, keep)
            return
        method = self._parser.get_method().decode("latin-1")
        receipt = self._request.receipt(method, parts.path, query)
        self._receiver.record(receipt)
        answer = self._receiver.answer_for(parts.path, query)
        if answer.delay > 0:
            loop = asyncio.get_running_loop()
            timer = loop.call_later(answer.delay, self._answer, receipt, answer, keep)
            self._timers.add(timer)
        else:
            self._answer(receipt, answer, keep)

    def _control(self, command: str, query: dict[str, str], keep: bool) -> None:
        body = self._receiver.control(command, query)
        payload = (body or "").encode()
        status = 404 if body is None else 200
        extra = ["Content-Type: text/plain", f"Content-Length: {len(payload)}"]
        self._write(_head(self._version, status, keep, extra) + payload, keep)

    def _answer(self, receipt: Receipt, answer: _Answer, keep: bool) -> None:
        payload = b'{"ok":true}' if answer.body_size is None else b"x" * answer.body_size
        extra = ["Content-Type: application/json", f"Content-Length: {len(payload)}"]
        if answer.location is not None:
            extra.append(f"Location: {answer.location}")
        extra += [f"{name}: {value}" for name, value in answer.headers]
        if self._write(_head(self._version, answer.status, keep, extra) + payload, keep):
            receipt.status = answer.status
            receipt.answered_at = time.time()

    def _write(self, data: bytes, keep: bool) -> bool:
        """Send `data` (and close unless `keep`); False if the client went away first."""
        transport = self._transport
        if transport is None or transport.is_closing():
            return False
        transport.write(data)
        if not keep:
            transport.close()
        return True


async def _serve(
    receiver: Receiver, keep_alive: bool, port: int, ready: "Future[str]", stop: asyncio.Event
) -> None:
    connections: set[_Protocol] = set()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(
        lambda: _Protocol(receiver, keep_alive, connections), "127.0.0.1", port, backlog=BACKLOG
    )
    ready.set_result(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}")
    await stop.wait()
    server.close()
    for connection in list(connections):
        connection.close()
    await server.wait_closed()


@contextmanager
def receiving(*, keep_alive: bool = False) -> Iterator[Receiver]:
    """A receiver on 127.0.0.1 at a free port, serving from a background thread; it
    closes each connection after one answer (HTTP/1.0) unless `keep_alive`."""
    receiver = Receiver()
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    ready: Future[str] = Future()
    serving = _serve(receiver, keep_alive, 0, ready, stop)
    thread = threading.Thread(target=loop.run_until_complete, args=(serving,), daemon=True)
    thread.start()
    receiver.url = ready.result(timeout=10)
    try:
        yield receiver
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(10)
        loop.close()


class ReceiverProcess:
    """A receiver in a child process; `url` is where jobs should send their requests."""

    def __init__(self, process: subprocess.Popen[str], port: int) -> None:
        self.process = process
        self.url = f"http://127.0.0.1:{port}"
        self._http = httpx.Client(base_url=self.url, timeout=30)

    @classmethod
    def start(cls, log_path: Path | None = None) -> Self:
        stderr = log_path.open("w") if log_path else subprocess.DEVNULL
        process = subprocess.Popen(
            [sys.executable, "-m", "harness.receiver"],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            cwd=Path(__file__).resolve().parent.parent,
        )
        assert process.stdout is not None
        line = process.stdout.readline()
        if not line.startswith("PORT "):
            process.kill()
            raise RuntimeError(f"receiver did not start (said {line!r})")
        return cls(process, int(line.split()[1]))

    @property
    def pid(self) -> int:
        return self.process.pid

    def count(self, window: tuple[float, float] | None = None) -> int:
        """Receipts so far; with `window` (after, before), those for ticks inside it."""
        return int(self._get("count", window))

    def reset(self) -> int:
        return int(self._get("reset", None))

    def receipts(self, window: tuple[float, float] | None = None) -> list[Receipt]:
        """Every receipt; with `window` (after, before), those for ticks inside it."""
        return [Receipt.of_line(line) for line in self._get("receipts", window).splitlines()]

    def _get(self, command: str, window: tuple[float, float] | None) -> str:
        params = {"after": window[0], "before": window[1]} if window else {}
        return self._http.get(f"{CONTROL}{command}", params=params).text

    def stop(self) -> None:
        self._http.close()
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        if self.process.stdout is not None:
            self.process.stdout.close()


async def _announce(port: int) -> None:
    """Serve forever, keep-alive, after telling the parent the port on stdout."""
    ready: Future[str] = Future()
    serving = asyncio.ensure_future(_serve(Receiver(), True, port, ready, asyncio.Event()))
    url = await asyncio.wrap_future(ready)
    sys.stdout.write(f"PORT {url.rsplit(':', 1)[1]}\n")
    sys.stdout.flush()
    await serving


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m harness.receiver", description=__doc__)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    runner: Any = asyncio.run
    with contextlib.suppress(ImportError):
        import uvloop  # the faster loop, installed with Tickgate (uvicorn's)

        runner = uvloop.run
    with contextlib.suppress(KeyboardInterrupt):
        runner(_announce(args.port))


if __name__ == "__main__":
    main()
