"""A small webhook, as a small service would run one: Python's `http.server`, a thread
per connection, keep-alive, and a listen backlog of 5 (a burst of connects beyond what
its accept loop keeps up with is dropped by the kernel, and retried only after TCP's
1 s SYN timeout).

It records each delivery as `harness.receiver.Receipt`, and each connection itself:
when it was accepted and closed, and the run ids sent on it. A connection belongs to
one replica, so the ledger's runner of any of its runs names the replica that opened it.
"""

import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from harness.receiver import Receipt
from harness.threaded import serving

BACKLOG = 5


@dataclass
class Connection:
    accepted: float
    closed: float | None = None
    run_ids: list[str] = field(default_factory=list)


class SmallHook:
    """What the webhook saw: its deliveries and its connections."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._receipts: list[Receipt] = []
        self.connections: list[Connection] = []
        self.url = ""

    def receipts(self) -> list[Receipt]:
        with self._lock:
            return list(self._receipts)

    def opened(self) -> Connection:
        connection = Connection(time.time())
        with self._lock:
            self.connections.append(connection)
        return connection

    def received(self, connection: Connection, receipt: Receipt) -> None:
        with self._lock:
            self._receipts.append(receipt)
            if receipt.run_id:
                connection.run_ids.append(receipt.run_id)

    def peaks(self, runner_of: Mapping[str, str]) -> dict[str, int]:
        """The most connections each replica (`runner_of`: run id to runner) had open
        at once: a sweep over each connection's [accepted, closed]."""
        now = time.time()
        events: dict[str, list[tuple[float, int]]] = {}
        with self._lock:
            for connection in self.connections:
                runners = {runner_of.get(run_id) for run_id in connection.run_ids} - {None}
                assert len(runners) <= 1, f"one connection carried runs of {runners}"
                for runner in runners:
                    moments = events.setdefault(str(runner), [])
                    moments += [(connection.accepted, 1), (connection.closed or now, -1)]
        return {runner: _most_at_once(moments) for runner, moments in events.items()}


def _most_at_once(moments: list[tuple[float, int]]) -> int:
    # A close and an open at the same instant: the close first.
    open_now = most = 0
    for _, step in sorted(moments):
        open_now += step
        most = max(most, open_now)
    return most


def _handler(hook: SmallHook) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive

        def setup(self) -> None:
            super().setup()
            self.connection_record = hook.opened()

        def finish(self) -> None:
            self.connection_record.closed = time.time()
            super().finish()

        def do_POST(self) -> None:
            received_at = time.time()
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            headers = {name.lower(): value for name, value in self.headers.items()}
            receipt = Receipt(
                job=headers.get("x-tickgate-job"),
                scheduled_for=headers.get("x-tickgate-scheduled-for"),
                received_at=received_at,
                run_id=headers.get("x-tickgate-run-id"),
            )
            hook.received(self.connection_record, receipt)
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            return None

    return Handler


class _Server(ThreadingHTTPServer):
    request_queue_size = BACKLOG
    daemon_threads = True


@contextmanager
def small_hook() -> Iterator[SmallHook]:
    """The webhook on 127.0.0.1, for as long as the block lasts."""
    hook = SmallHook()
    with serving(_Server(("127.0.0.1", 0), _handler(hook)), "small-hook") as hook.url:
        yield hook
