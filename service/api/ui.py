"""The dashboard at /ui/ (and / redirects there): server-rendered page shells from
service/ui whose plain scripts call /v1 with the user's bearer token, so the UI can do
nothing a client with that token could not. Open by default (TICKGATE_OPEN_PATHS has
"/" and "/ui/"): the pages and assets hold no data."""

from uuid import UUID

from fastapi import FastAPI, Request
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.staticfiles import StaticFiles
from fastapi.templating import Jinja2Templates
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.deps import proxy_prefix
from service.api.jobs import NamePath
from service.ui import STATIC, TEMPLATES

UI_PATH = "/ui"
# Only the service's own origin: no CDN, no inline script or style, no framing.
CONTENT_SECURITY_POLICY = (
    "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
    "connect-src 'self'; frame-ancestors 'none'; base-uri 'self'; form-action 'self'"
)

_templates = Jinja2Templates(directory=TEMPLATES)


def install_ui(app: FastAPI) -> None:
    app.mount(f"{UI_PATH}/static", StaticFiles(directory=STATIC), name="ui-static")
    app.add_api_route("/", to_dashboard, include_in_schema=False)
    app.add_api_route(UI_PATH, to_dashboard, include_in_schema=False)
    app.add_api_route(f"{UI_PATH}/", jobs_page, include_in_schema=False)
    app.add_api_route(f"{UI_PATH}/new", new_page, include_in_schema=False)
    app.add_api_route(f"{UI_PATH}/jobs/{{name}}", job_page, include_in_schema=False)
    app.add_api_route(f"{UI_PATH}/jobs/{{name}}/edit", edit_page, include_in_schema=False)
    app.add_api_route(f"{UI_PATH}/runs", runs_page, include_in_schema=False)
    app.add_api_route(f"{UI_PATH}/runs/{{run_id}}", run_page, include_in_schema=False)
    app.add_api_route(f"{UI_PATH}/cluster", cluster_page, include_in_schema=False)
    app.add_middleware(UiHeaders)


async def to_dashboard(request: Request) -> RedirectResponse:
    return RedirectResponse(f"{proxy_prefix(request)}{UI_PATH}/", status_code=307)


async def jobs_page(request: Request) -> HTMLResponse:
    return _page(request, "jobs.html", "Jobs")


async def job_page(request: Request, name: NamePath) -> HTMLResponse:
    return _page(request, "job.html", name, job=name)


async def new_page(request: Request) -> HTMLResponse:
    """A new job; `?clone=NAME` starts from that job."""
    return _page(request, "edit.html", "New job", job="")


async def edit_page(request: Request, name: NamePath) -> HTMLResponse:
    return _page(request, "edit.html", f"Edit {name}", job=name)


async def runs_page(request: Request) -> HTMLResponse:
    return _page(request, "runs.html", "Runs")


async def run_page(request: Request, run_id: UUID) -> HTMLResponse:
    return _page(request, "run.html", f"Run {run_id}", run=str(run_id))


async def cluster_page(request: Request) -> HTMLResponse:
    return _page(request, "cluster.html", "Cluster")


def _page(request: Request, template: str, title: str, **context: str) -> HTMLResponse:
    root = proxy_prefix(request)
    values = {"title": title, "root": root, "static": f"{root}{UI_PATH}/static"} | context
    return _templates.TemplateResponse(request, template, values)


class UiHeaders:
    """The Content-Security-Policy (and no sniffing or framing) on every UI response."""

    def __init__(self, app: ASGIApp) -> None:
        self._app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not _is_ui(scope["path"]):
            await self._app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *_UI_HEADERS]
            await send(message)

        await self._app(scope, receive, with_headers)


_UI_HEADERS = [
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"same-origin"),
]


def _is_ui(path: str) -> bool:
    return path in ("/", UI_PATH) or path.startswith(f"{UI_PATH}/")
