"""What HTTP says of methods, which FastAPI's routes leave out: every GET answers HEAD
(load balancers and probes send it), and a 405 lists in `Allow` every method its path
serves, not only those of the first route that matched the path."""

from fastapi import FastAPI
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send


class HeadAsGet:
    """HEAD runs the GET route and sends its status and headers without the body."""

    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "HEAD":
            await self._app(scope, receive, send)
            return

        async def headers_only(message: Message) -> None:
            if message["type"] == "http.response.body":
                message = {**message, "body": b""}
            await send(message)

        await self._app({**scope, "method": "GET"}, receive, headers_only)


def allowed_methods(app: FastAPI, scope: Scope) -> list[str]:
    """Every method some route serves at the scope's path, HEAD wherever GET is."""
    methods: set[str] = set()
    for route in app.router.routes:
        match, _ = route.matches(scope)
        if match is not Match.NONE:
            methods |= getattr(route, "methods", None) or set()
    if "GET" in methods:
        methods.add("HEAD")
    return sorted(methods)


def install_method_semantics(app: FastAPI) -> None:
    """HEAD for every GET; the 405's Allow is service/api/errors.py's (allowed_methods)."""
    app.add_middleware(HeadAsGet)
