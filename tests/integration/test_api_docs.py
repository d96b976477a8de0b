"""The API docs (/docs, /redoc) load from the package's own assets, with no internet,
and stay reachable without a token while the API itself does not."""

import re
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from starlette.types import Message, Receive, Scope, Send

from service.api.guards import BearerAuth, Tokens
from service.app import create_app
from service.config import Settings

TOKENS = {"s3cret-r": ["read"]}
PAGES = ("/docs", "/redoc")
# Every URL a page names: tags' src/href, Swagger UI's `url: '...'`, ReDoc's spec-url.
REFERENCED = re.compile(r"""(?:src|href|spec-url)="([^"]*)"|url: '([^']*)'""")
CONTENT_TYPES = {
    ".js": "text/javascript",
    ".css": "text/css",
    ".png": "image/png",
    ".json": "application/json",
}


async def served_with(settings: Settings, **changes: Any) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings.model_copy(update={"api_tokens": TOKENS} | changes))
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://localhost") as http,
    ):
        yield http


@pytest.fixture
async def guarded(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    async for http in served_with(settings):
        yield http


def referenced(page: str) -> list[str]:
    return [src or url for src, url in REFERENCED.findall(page)]


async def test_docs_pages_name_only_same_origin_assets_that_load(
    client: httpx.AsyncClient,
) -> None:
    for path in PAGES:
        page = await client.get(path)
        assert page.status_code == 200, path
        assert page.headers["content-type"].startswith("text/html")
        assert re.search("https?://", page.text) is None, page.text
        urls = referenced(page.text)
        assert "/openapi.json" in urls, urls
        assert any(url.endswith(".js") for url in urls), urls
        for url in urls:
            assert re.match("/[^/]", url), url  # this origin, never //another.host
            asset = await client.get(url)
            assert asset.status_code == 200, url
            kind = CONTENT_TYPES[url[url.rindex(".") :]]
            assert asset.headers["content-type"].startswith(kind), (url, asset.headers)
            assert len(asset.content) > 0, url


async def test_the_bundles_are_the_real_ui(client: httpx.AsyncClient) -> None:
    swagger = await client.get("/docs/assets/swagger-ui/swagger-ui-bundle.js")
    assert "SwaggerUIBundle" in swagger.text
    assert "Redoc" in (await client.get("/docs/assets/redoc/redoc.standalone.js")).text
    for license_file in ("swagger-ui/LICENSE", "redoc/LICENSE"):
        assert (await client.get(f"/docs/assets/{license_file}")).status_code == 200


async def test_openapi_offers_the_bearer_scheme_to_authorize(client: httpx.AsyncClient) -> None:
    document = (await client.get("/openapi.json")).json()
    scheme = document["components"]["securitySchemes"]["bearer"]
    assert (scheme["type"], scheme["scheme"]) == ("http", "bearer")
    assert {"bearer": []} in document["security"]


async def test_with_tokens_the_docs_are_open_and_the_api_is_not(
    guarded: httpx.AsyncClient,
) -> None:
    for path in PAGES:
        page = await guarded.get(path)
        assert page.status_code == 200, path
        for url in referenced(page.text):
            assert (await guarded.get(url)).status_code == 200, url
    for guarded_path in ("/v1/jobs", "/v1/runs"):
        assert (await guarded.get(guarded_path)).status_code == 401, guarded_path
        read = {"authorization": "Bearer s3cret-r"}
        assert (await guarded.get(guarded_path, headers=read)).status_code == 200


async def test_operators_can_close_the_docs(settings: Settings) -> None:
    async for http in served_with(settings, open_paths="/healthz,/readyz,/metrics"):
        for path in ("/docs", "/redoc", "/openapi.json", "/docs/assets/swagger-ui/swagger-ui.css"):
            assert (await http.get(path)).status_code == 401, path
        assert (await http.get("/healthz")).status_code == 200


@pytest.mark.parametrize("path", ["/docs/assets/../../v1/jobs", "/docs/assets/x/../../v1/runs"])
async def test_an_open_folder_opens_no_path_that_climbs_out_of_it(path: str) -> None:
    reached: list[str] = []

    async def api(scope: Scope, _receive: Receive, _send: Send) -> None:
        reached.append(scope["path"])

    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    async def receive() -> Message:
        return {"type": "http.request", "body": b"", "more_body": False}

    guard = BearerAuth(api, Tokens({"t": frozenset({"read"})}), frozenset({"/docs/assets/"}))
    scope = {"type": "http", "method": "GET", "path": path, "headers": []}
    await guard(scope, receive, send)
    assert reached == []
    assert sent[0]["status"] == 401


async def test_the_docs_page_never_keeps_a_token_in_the_browser(
    client: httpx.AsyncClient,
) -> None:
    """A token typed into /docs lasts as long as the page: Swagger UI's
    persistAuthorization would keep it in localStorage (#42)."""
    page = (await client.get("/docs")).text
    assert '"persistAuthorization": false' in page, page
