"""HTTP routers. They validate, call the domain and the store, and hold no SQL."""

from fastapi import FastAPI

from service.api import bulk, health, jobs, runs, schedules, tasks
from service.api.errors import install_error_handlers


def install_routes(app: FastAPI) -> None:
    install_error_handlers(app)
    for module in (jobs, bulk, runs, schedules, tasks, health):
        app.include_router(module.router)
