"""The API docs, /docs (Swagger UI) and /redoc, served from assets inside the package
(service/api/static, see its README.md): FastAPI's default pages load them from a CDN
and stay blank without internet."""

from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_redoc_html, get_swagger_ui_html
from fastapi.responses import HTMLResponse
from fastapi.staticfiles import StaticFiles

from service.api.deps import proxy_prefix

ASSETS = Path(__file__).parent / "static"
# Open by default, with /docs, /redoc and /openapi.json (TICKGATE_OPEN_PATHS): Swagger
# UI and ReDoc fetch the document before anyone can give them a token.
ASSETS_PATH = "/docs/assets"


def install_docs(app: FastAPI) -> None:
    """Needs the app built with `docs_url=None, redoc_url=None`."""
    app.mount(ASSETS_PATH, StaticFiles(directory=ASSETS), name="docs-assets")
    app.add_api_route("/docs", swagger_ui, include_in_schema=False)
    app.add_api_route("/redoc", redoc, include_in_schema=False)


async def swagger_ui(request: Request) -> HTMLResponse:
    root = proxy_prefix(request)
    return get_swagger_ui_html(
        openapi_url=f"{root}{request.app.openapi_url}",
        title=f"{request.app.title} API",
        swagger_js_url=f"{root}{ASSETS_PATH}/swagger-ui/swagger-ui-bundle.js",
        swagger_css_url=f"{root}{ASSETS_PATH}/swagger-ui/swagger-ui.css",
        swagger_favicon_url=f"{root}{ASSETS_PATH}/swagger-ui/favicon-32x32.png",
        # Swagger UI would otherwise send the document to validator.swagger.io; a token
        # typed into it lasts as long as the page (never kept in localStorage).
        swagger_ui_parameters={"validatorUrl": None, "persistAuthorization": False},
    )


async def redoc(request: Request) -> HTMLResponse:
    root = proxy_prefix(request)
    return get_redoc_html(
        openapi_url=f"{root}{request.app.openapi_url}",
        title=f"{request.app.title} API",
        redoc_js_url=f"{root}{ASSETS_PATH}/redoc/redoc.standalone.js",
        redoc_favicon_url=f"{root}{ASSETS_PATH}/swagger-ui/favicon-32x32.png",
        with_google_fonts=False,
    )
