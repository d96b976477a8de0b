"""A target that echoes what it was sent, in every form a careless service would, and an
OAuth token endpoint, both recording each request: the tests of #42 ask where a secret
went and whether any answer shows it.

`/echo` answers 200 with JSON holding the request's `Authorization` header as it came,
upper-cased, URL-encoded, in base64 at each of the three alignments, and inside a JSON
string (so its quotes and backslashes are escaped), and repeats it in `X-Request-Id`.
`/token` answers a client-credentials grant with `tok-<n>`. Anything else answers 204.
"""

import base64
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import quote

from harness.threaded import serving


@dataclass(frozen=True)
class Seen:
    """One request as it arrived (header names lower-cased)."""

    method: str
    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class Echo:
    url: str = ""
    seen: list[Seen] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def requests(self, path: str | None = None) -> list[Seen]:
        with self.lock:
            return [one for one in self.seen if path is None or one.path == path]

    def everything(self) -> str:
        """Every header value and body received, as one text to search."""
        return "\n".join(
            f"{one.path} {one.headers} {one.body.decode('utf-8', 'replace')}"
            for one in self.requests()
        )


def echoed(value: str) -> dict[str, Any]:
    """The forms /echo answers `value` in (also the forms a test looks for)."""
    raw = value.encode()
    return {
        "raw": value,
        "upper": value.upper(),
        "url": quote(value, safe=""),
        "base64": [base64.b64encode(b"x" * lead + raw).decode() for lead in range(3)],
        "quoted": json.dumps({"said": value}),
    }


def _handler(echo: Echo) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            headers = {name.lower(): value for name, value in self.headers.items()}
            with echo.lock:
                echo.seen.append(Seen(self.command, self.path.split("?")[0], headers, body))
                count = len(echo.seen)
            if self.path.startswith("/echo"):
                said = headers.get("authorization", "")
                self._answer(200, json.dumps(echoed(said)).encode(), ("X-Request-Id", said))
            elif self.path.startswith("/token"):
                token = {"access_token": f"tok-{count}", "token_type": "Bearer"}
                self._answer(200, json.dumps(token | {"expires_in": 3600}).encode())
            else:
                self._answer(204, b"")

        do_GET = do_POST
        do_PUT = do_POST

        def _answer(self, status: int, body: bytes, *extra: tuple[str, str]) -> None:
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            for name, value in extra:
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: Any) -> None:
            return None

    return Handler


@contextmanager
def echoing() -> Iterator[Echo]:
    echo = Echo()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(echo))
    with serving(server, "echo") as url:
        echo.url = url
        yield echo
