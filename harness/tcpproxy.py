"""A loopback TCP proxy in front of PostgreSQL that a test can cut and mend.

One replica's `DATABASE_URL` points at the proxy; the others connect directly. `sever()`
closes every connection through the proxy at once (both ends: the replica sees its
connections close, PostgreSQL sees its sessions end and drops their advisory locks) and
turns new ones away; `restore()` lets connections through again.

`blackhole()` is the silent kind of failure (a node that lost power, a failover without
a FIN, a stuck middlebox): every connection stays open at both ends, but nothing is
forwarded either way, and new connections are accepted and never forwarded. Neither end
hears a word. `restore()` forwards again, old connections and new.

The upstream is PostgreSQL's Unix socket (the embedded test server listens on nothing
else) or a TCP address, taken from the server's DSN. Everything runs on one background
thread around a selector; the proxy listens on 127.0.0.1 only.
"""

import selectors
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from urllib.parse import parse_qs, quote, urlsplit, urlunsplit

_CHUNK = 64 * 1024
_DEFAULT_PORT = 5432


@dataclass(frozen=True)
class Upstream:
    """Where PostgreSQL listens: a Unix socket path, or a TCP host and port."""

    unix_path: str | None = None
    host: str | None = None
    port: int = _DEFAULT_PORT

    @classmethod
    def of_dsn(cls, dsn: str) -> "Upstream":
        """PostgreSQL's address in `dsn`: `?host=/dir` (a socket dir), or host:port."""
        parts = urlsplit(dsn)
        query = {key: values[-1] for key, values in parse_qs(parts.query).items()}
        host = query.get("host") or parts.hostname or "/tmp"  # noqa: S108 - libpq default
        port = int(query.get("port") or parts.port or _DEFAULT_PORT)
        if host.startswith("/"):
            return cls(unix_path=f"{host.rstrip('/')}/.s.PGSQL.{port}", port=port)
        return cls(host=host, port=port)

    def connect(self) -> socket.socket:
        if self.unix_path is not None:
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            upstream.settimeout(5)
            try:
                upstream.connect(self.unix_path)
            except OSError:
                upstream.close()  # PostgreSQL is down (restarting): nothing to forward to
                raise
        else:
            upstream = socket.create_connection((self.host or "127.0.0.1", self.port), timeout=5)
        upstream.settimeout(None)
        return upstream


def loopback_dsn(dsn: str, port: int) -> str:
    """`dsn` (user, password, database) rewritten to reach 127.0.0.1:`port` without TLS:
    a proxy or pooler in front of the server `dsn` names."""
    parts = urlsplit(dsn)
    user = quote(parts.username or "postgres", safe="")
    password = f":{quote(parts.password, safe='')}" if parts.password else ""
    query = "&".join(
        f"{key}={values[-1]}"
        for key, values in parse_qs(parts.query).items()
        if key not in {"host", "port", "sslmode"}
    )
    query = f"{query}&sslmode=disable" if query else "sslmode=disable"
    netloc = f"{user}{password}@127.0.0.1:{port}"
    return urlunsplit(("postgresql", netloc, parts.path, query, ""))


@dataclass(eq=False)
class _Pair:
    client: socket.socket
    upstream: socket.socket

    def peer_of(self, sock: socket.socket) -> socket.socket:
        return self.upstream if sock is self.client else self.client


class TcpProxy:
    """Forwards 127.0.0.1:<port> to PostgreSQL until severed. Thread-safe controls."""

    def __init__(self, upstream: Upstream) -> None:
        self._upstream = upstream
        self._listener = socket.create_server(("127.0.0.1", 0), backlog=128)
        self._listener.setblocking(False)
        self.port: int = self._listener.getsockname()[1]
        self._selector = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_r.setblocking(False)
        self._pairs: list[_Pair] = []
        self._lock = threading.Lock()
        self._severed = False
        self._blackholed = False
        self._held: list[socket.socket] = []  # accepted while blackholed, not yet forwarded
        self._stopping = False
        self._commands: list[tuple[str, threading.Event]] = []
        self.connections_accepted = 0
        self.connections_cut = 0
        self._thread = threading.Thread(target=self._serve, name="tcpproxy", daemon=True)

    def start(self) -> "TcpProxy":
        self._selector.register(self._listener, selectors.EVENT_READ, "listen")
        self._selector.register(self._wake_r, selectors.EVENT_READ, "wake")
        self._thread.start()
        return self

    def dsn_for(self, dsn: str) -> str:
        """`dsn` (any database of the upstream server) rewritten to go through the proxy."""
        return loopback_dsn(dsn, self.port)

    @property
    def open_connections(self) -> int:
        with self._lock:
            return len(self._pairs)

    def sever(self) -> None:
        """Close every connection through the proxy now, and refuse new ones."""
        self._command("sever")

    def blackhole(self) -> None:
        """Stop forwarding without closing anything: every connection through the
        proxy, and each new one (accepted, never forwarded), goes silent."""
        self._command("blackhole")

    def restore(self) -> None:
        """Let connections through again (after `sever` or `blackhole`)."""
        self._command("restore")

    def close(self) -> None:
        self._command("stop")
        self._thread.join(10)
        self._selector.close()
        for sock in (self._listener, self._wake_r, self._wake_w):
            sock.close()

    def _command(self, name: str) -> None:
        done = threading.Event()
        with self._lock:
            self._commands.append((name, done))
        self._wake_w.send(b"x")
        if not done.wait(10):
            raise AssertionError(f"the proxy did not carry out {name!r} within 10 s")

    def _serve(self) -> None:
        while not self._stopping:
            for key, _ in self._selector.select(timeout=0.5):
                if key.data == "listen":
                    self._accept()
                elif key.data == "wake":
                    self._run_commands()
                else:
                    self._pump(key.fileobj, key.data)  # type: ignore[arg-type]
        self._cut_all()

    def _run_commands(self) -> None:
        with suppress(BlockingIOError):
            while self._wake_r.recv(1024):
                pass
        with self._lock:
            commands, self._commands = self._commands, []
        for name, done in commands:
            if name == "sever":
                self._severed = True
                self._cut_all()
            elif name == "blackhole":
                self._go_silent()
            elif name == "restore":
                self._severed = False
                self._speak_again()
            elif name == "stop":
                self._stopping = True
            done.set()

    def _accept(self) -> None:
        try:
            client, _ = self._listener.accept()
        except BlockingIOError:
            return
        if self._severed:
            client.close()  # refused: the client sees the connection close at once
            return
        if self._blackholed:
            self._held.append(client)  # accepted, and never answered
            return
        self._forward(client)

    def _forward(self, client: socket.socket) -> None:
        try:
            upstream = self._upstream.connect()
        except OSError:
            client.close()
            return
        pair = _Pair(client, upstream)
        for sock in (client, upstream):
            sock.setblocking(True)
            self._selector.register(sock, selectors.EVENT_READ, pair)
        with self._lock:
            self._pairs.append(pair)
            self.connections_accepted += 1

    def _pump(self, sock: socket.socket, pair: _Pair) -> None:
        try:
            data = sock.recv(_CHUNK)
            if data:
                pair.peer_of(sock).sendall(data)
                return
        except OSError:
            pass
        self._close(pair)

    def _go_silent(self) -> None:
        """Stop reading from both ends of every connection: what either side sends
        stays in the kernel's buffers, and nothing is closed."""
        self._blackholed = True
        with self._lock:
            pairs = list(self._pairs)
        for pair in pairs:
            for sock in (pair.client, pair.upstream):
                with suppress(KeyError, ValueError):
                    self._selector.unregister(sock)

    def _speak_again(self) -> None:
        if not self._blackholed:
            return
        self._blackholed = False
        with self._lock:
            pairs = list(self._pairs)
        for pair in pairs:
            for sock in (pair.client, pair.upstream):
                self._selector.register(sock, selectors.EVENT_READ, pair)
        held, self._held = self._held, []
        for client in held:
            self._forward(client)

    def _cut_all(self) -> None:
        with self._lock:
            pairs = list(self._pairs)
        for pair in pairs:
            self._close(pair)
            with self._lock:
                self.connections_cut += 1
        held, self._held = self._held, []
        for client in held:
            client.close()

    def _close(self, pair: _Pair) -> None:
        with self._lock:
            if pair not in self._pairs:
                return
            self._pairs.remove(pair)
        for sock in (pair.client, pair.upstream):
            with suppress(KeyError, ValueError):
                self._selector.unregister(sock)
            with suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()


@contextmanager
def proxying(upstream_dsn: str) -> Iterator[TcpProxy]:
    """A started proxy to the server of `upstream_dsn`, closed on exit."""
    proxy = TcpProxy(Upstream.of_dsn(upstream_dsn)).start()
    try:
        yield proxy
    finally:
        proxy.close()
