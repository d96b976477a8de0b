"""A loopback server of the standard library answering on a thread of the caller's
process, for as long as a block lasts."""

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import HTTPServer


@contextmanager
def serving(server: HTTPServer, name: str) -> Iterator[str]:
    """`server` (bound already) serving on a thread named `name`; yields its URL."""
    host, port = server.server_address[:2]
    thread = threading.Thread(target=server.serve_forever, name=name, daemon=True)
    thread.start()
    try:
        yield f"http://{host!s}:{port}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
