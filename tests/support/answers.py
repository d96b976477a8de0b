"""A webhook target whose answers a run keeps as its output (#24): /fail answers 500 with
a JSON error echoing the X-Token header (in the body and a header), /big 2 MiB of text,
anything else bytes that are no text."""

import json
from http.server import BaseHTTPRequestHandler
from typing import Any

BIG = 2 * 1024 * 1024
BINARY = bytes(range(256)) * 4


class Target(BaseHTTPRequestHandler):
    """/fail: 500 with a JSON error echoing X-Token (in the body and a header); /big:
    2 MiB of text; /binary: bytes that are no text."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length", "0")))
        token = self.headers.get("X-Token", "")
        if self.path == "/fail":
            body = json.dumps({"error": "token rejected", "token": token}).encode()
            self._answer(500, body, "application/json", (("X-Request-Id", f"req-{token}"),))
        elif self.path == "/big":
            self._answer(200, b"x" * BIG, "text/plain; charset=utf-8")
        else:
            self._answer(200, BINARY, "application/octet-stream")

    def _answer(
        self, status: int, body: bytes, content_type: str, extra: tuple[tuple[str, str], ...] = ()
    ) -> None:
        self.send_response(status)
        for name, value in (("Content-Type", content_type), *extra):
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:
        return None
