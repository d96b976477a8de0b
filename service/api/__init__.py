"""HTTP routers. They validate, call the domain and the store, and hold no SQL."""

from fastapi import FastAPI

from service.api import bulk, cluster, health, hooks, jobs, runs, schedules, tasks, whoami
from service.api.errors import install_error_handlers
from service.api.methods import install_method_semantics


def install_routes(app: FastAPI, *, api: bool = True) -> None:
    """The API's routes and the probes; the probes and metrics alone when `api` is off
    (a scheduler-only process).

    Each router's routes join the app's own list: `include_router` would keep each
    router as a level the app's matching walks on every request (FastAPI 0.165 checks
    every included router's routes for changes per request), about 20 µs a request."""
    install_error_handlers(app)
    install_method_semantics(app)
    for module in (
        *((jobs, bulk, runs, hooks, schedules, tasks, whoami, cluster) if api else ()),
        health,
    ):
        app.router.routes.extend(module.router.routes)
