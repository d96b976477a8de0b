"""HTTP routers. They validate, call the domain and the store, and hold no SQL."""

from fastapi import FastAPI

from service.api import bulk, health, jobs, runs, schedules, tasks
from service.api.errors import install_error_handlers


def install_routes(app: FastAPI, *, api: bool = True) -> None:
    """The API's routers and the probes; the probes and metrics alone when `api` is off
    (a scheduler-only process)."""
    install_error_handlers(app)
    for module in (jobs, bulk, runs, schedules, tasks) if api else ():
        app.include_router(module.router)
    app.include_router(health.router)
