"""The loopback HTTP receiver: records (job, scheduled_for, received_at) for every delivery.

It runs as a process of its own (`python -m bench.receiver`), an asyncio server with an
`httptools` HTTP/1.1 keep-alive parser (on uvloop when installed), so it keeps up with
thousands of requests a second from three replicas on a busy two-core box. The receipt
time is taken when a request's first bytes are parsed, before anything else is done.

A delivery names its job and nominal tick with Tickgate's headers `X-Tickgate-Job` and
`X-Tickgate-Scheduled-For`, or with `X-Bench-Job` / `X-Bench-Scheduled-For` (for peers),
or with the query parameters `?job=...&scheduled_for=...`. `scheduled_for` is RFC 3339
(`2026-11-29T19:00:05Z`) or POSIX seconds. Every request is answered `200 {"ok":true}`.

Control paths (not recorded): `GET /__bench/count` (receipts so far), `POST /__bench/reset`
(forget them), `GET /__bench/receipts` (tab-separated `job, scheduled_for, received_at`;
with `?after=&before=`, POSIX seconds, only the receipts for ticks in that window).

Its records are independent of Tickgate's run ledger, so a tick delivered twice, or not at
all, is counted here whatever Tickgate's own bookkeeping says. `ReceiverProcess` starts one
and reads it back; `analyze_delivery` counts duplicates, misses and lateness.
"""

import argparse
import asyncio
import contextlib
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, Self, cast
from urllib.parse import parse_qs

import httptools
import httpx

CONTROL_PREFIX = b"/__bench/"
_OK = b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: 11\r\n\r\n{"ok":true}'
_JOB_HEADERS = frozenset({b"x-tickgate-job", b"x-bench-job"})
_TICK_HEADERS = frozenset({b"x-tickgate-scheduled-for", b"x-bench-scheduled-for"})
START_DEADLINE_SECONDS = 30.0


# ---------------------------------------------------------------------------- server side


@dataclass
class _Records:
    rows: list[tuple[str, str, float]] = field(default_factory=list)
    ticks: dict[str, float | None] = field(default_factory=dict)  # parsed tick texts


class _Protocol(asyncio.Protocol):
    """One client connection: parse requests as they stream in, answer each at once."""

    def __init__(self, records: _Records) -> None:
        self._records = records
        self._parser = httptools.HttpRequestParser(self)
        self._transport: asyncio.Transport | None = None
        self._reset_request()

    def _reset_request(self) -> None:
        self._received_at = 0.0
        self._url = b""
        self._job = ""
        self._tick = ""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but quack like one.
        self._transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserError:
            if self._transport is not None:
                self._transport.close()

    # httptools callbacks
    def on_message_begin(self) -> None:
        self._reset_request()
        self._received_at = time.time()

    def on_url(self, url: bytes) -> None:
        self._url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        lowered = name.lower()
        if lowered in _JOB_HEADERS:
            self._job = value.decode("utf-8", "replace")
        elif lowered in _TICK_HEADERS:
            self._tick = value.decode("utf-8", "replace")

    def on_message_complete(self) -> None:
        transport = self._transport
        if transport is None:
            return
        path, _, query = self._url.partition(b"?")
        if path.startswith(CONTROL_PREFIX):
            # the query too: `count` and `receipts` take `after` and `before`
            transport.write(self._control(self._url[len(CONTROL_PREFIX) :].decode()))
        else:
            self._record(query)
            transport.write(_OK)
        if not self._parser.should_keep_alive():
            transport.close()

    def _record(self, query: bytes) -> None:
        job, tick = self._job, self._tick
        if (not job or not tick) and query:
            params = parse_qs(query.decode("utf-8", "replace"))
            job = job or params.get("job", [""])[-1]
            tick = tick or params.get("scheduled_for", [""])[-1]
        self._records.rows.append((job, tick, self._received_at))

    def _control(self, command: str) -> bytes:
        rows = self._records.rows
        command, _, query = command.partition("?")
        if command == "count":
            body = str(self._count(parse_qs(query))).encode()
        elif command == "reset":
            body = str(len(rows)).encode()
            self._records.rows = []
        elif command == "receipts":
            chosen = self._in_window(parse_qs(query))
            body = "".join(f"{job}\t{tick}\t{at:.6f}\n" for job, tick, at in chosen).encode()
        else:
            return b"HTTP/1.1 404 Not Found\r\ncontent-length: 0\r\n\r\n"
        head = f"HTTP/1.1 200 OK\r\ncontent-type: text/plain\r\ncontent-length: {len(body)}\r\n\r\n"
        return head.encode() + body

    def _count(self, params: dict[str, list[str]]) -> int:
        """All receipts, or (with `after` and `before`, POSIX seconds) those whose tick
        falls in [after, before)."""
        if "after" not in params or "before" not in params:
            return len(self._records.rows)
        return sum(1 for _ in self._in_window(params))

    def _in_window(self, params: dict[str, list[str]]) -> Iterable[tuple[str, str, float]]:
        """All receipts, or (with `after` and `before`) those whose tick is in the window."""
        rows = self._records.rows
        if "after" not in params or "before" not in params:
            return rows
        after, before = float(params["after"][-1]), float(params["before"][-1])
        ticks = self._records.ticks
        chosen = []
        for row in rows:
            text = row[1]
            if text not in ticks:
                ticks[text] = parse_tick(text)
            tick = ticks[text]
            if tick is not None and after <= tick < before:
                chosen.append(row)
        return chosen


async def _serve(host: str, port: int) -> None:
    records = _Records()
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: _Protocol(records), host, port, backlog=4096)
    bound = server.sockets[0].getsockname()[1]
    sys.stdout.write(f"PORT {bound}\n")
    sys.stdout.flush()
    async with server:
        await server.serve_forever()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.receiver", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args(argv)
    try:
        import uvloop

        runner: Any = uvloop.run
    except ImportError:  # pragma: no cover - uvloop comes with uvicorn[standard]
        runner = asyncio.run
    with contextlib.suppress(KeyboardInterrupt):
        runner(_serve(args.host, args.port))


# ---------------------------------------------------------------------------- client side


@dataclass(frozen=True)
class Receipt:
    """One delivery: the job, its nominal tick and arrival, both POSIX seconds."""

    job: str
    scheduled_for: float | None
    received_at: float


class ReceiverProcess:
    """A receiver in a child process; `url` is where jobs should send their requests."""

    def __init__(self, process: subprocess.Popen[str], port: int) -> None:
        self.process = process
        self.port = port
        self.url = f"http://127.0.0.1:{port}"
        self._http = httpx.Client(base_url=self.url, timeout=30)

    @classmethod
    def start(cls, log_path: Path | None = None) -> Self:
        stderr = log_path.open("w") if log_path else subprocess.DEVNULL
        process = subprocess.Popen(
            [sys.executable, "-m", "bench.receiver"],
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
        params = {"after": window[0], "before": window[1]} if window else {}
        return int(self._http.get("/__bench/count", params=params).text)

    def reset(self) -> int:
        return int(self._http.post("/__bench/reset").text)

    def receipts(self, window: tuple[float, float] | None = None) -> list[Receipt]:
        """Every receipt; with `window` (after, before), those for ticks inside it."""
        params = {"after": window[0], "before": window[1]} if window else {}
        return parse_receipts(self._http.get("/__bench/receipts", params=params).text)

    def wait_for(
        self,
        expected: int,
        *,
        window: tuple[float, float] | None = None,
        quiet_seconds: float,
        deadline: float,
    ) -> int:
        """Wait until `expected` receipts (for ticks in `window`) arrived, or none came
        for `quiet_seconds` after the first, or `deadline` (time.time()) passed; the count.
        Before the first receipt only the deadline ends the wait: a big burst can take a
        while to deliver anything."""
        last, since = self.count(window), time.monotonic()
        while last < expected and time.time() < deadline:
            time.sleep(0.2)
            now = self.count(window)
            if now != last:
                last, since = now, time.monotonic()
            elif last and time.monotonic() - since >= quiet_seconds:
                break
        return last

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


def parse_tick(text: str) -> float | None:
    """RFC 3339 (`...Z` or an offset) or POSIX seconds; None when absent or malformed."""
    if not text:
        return None
    try:
        return float(text)
    except ValueError:
        pass
    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        return None


def parse_receipts(text: str) -> list[Receipt]:
    ticks: dict[str, float | None] = {}
    receipts = []
    for line in text.splitlines():
        job, tick, at = line.split("\t")
        if tick not in ticks:
            ticks[tick] = parse_tick(tick)
        receipts.append(Receipt(job, ticks[tick], float(at)))
    return receipts


# ---------------------------------------------------------------------------- analysis


@dataclass(frozen=True)
class Delivery:
    """What arrived, against what should have.

    `expected`: (job, tick) pairs that should have arrived once each. `delivered`: how
    many of them arrived at least once. `misses`: expected pairs that never arrived.
    `duplicates`: receipts beyond the first for any (job, tick), expected or not (a
    duplicate anywhere, warm-up included, is a correctness bug). `lateness`: receipt minus
    nominal tick, in seconds, of each delivered expected pair's first arrival.
    """

    expected: int
    delivered: int
    misses: int
    duplicates: int
    duplicate_examples: list[str]
    unexpected: int
    lateness: list[float]
    first_received: float | None
    last_received: float | None


def analyze_delivery(receipts: Iterable[Receipt], expected: set[tuple[str, float]]) -> Delivery:
    counts: Counter[tuple[str, float | None]] = Counter()
    first: dict[tuple[str, float], float] = {}
    for receipt in receipts:
        key = (receipt.job, receipt.scheduled_for)
        counts[key] += 1
        if receipt.scheduled_for is not None and counts[key] == 1:
            first[(receipt.job, receipt.scheduled_for)] = receipt.received_at
    repeated = {key: n for key, n in counts.items() if n > 1}
    delivered = [key for key in expected if key in first]
    arrivals = [first[key] for key in delivered]
    return Delivery(
        expected=len(expected),
        delivered=len(delivered),
        misses=len(expected) - len(delivered),
        duplicates=sum(n - 1 for n in repeated.values()),
        duplicate_examples=[
            f"{job} @ {tick} x{n}" for (job, tick), n in list(repeated.items())[:5]
        ],
        unexpected=sum(1 for key in first if key not in expected),
        lateness=[first[key] - key[1] for key in delivered],
        first_received=min(arrivals, default=None),
        last_received=max(arrivals, default=None),
    )


if __name__ == "__main__":
    main()
