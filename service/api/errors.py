"""Domain errors become HTTP answers here, and only here."""

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

from service.domain.errors import Conflict, InvalidInput, NotFound


async def _not_found(_: Request, error: Exception) -> JSONResponse:
    return JSONResponse({"detail": str(error)}, status_code=404)


async def _conflict(_: Request, error: Exception) -> JSONResponse:
    return JSONResponse({"detail": str(error)}, status_code=409)


async def _invalid(_: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, InvalidInput)
    detail = [
        {"type": p.type, "loc": list(p.loc), "msg": p.msg, "input": p.input} for p in error.problems
    ]
    return JSONResponse({"detail": detail}, status_code=422)


def install_error_handlers(app: FastAPI) -> None:
    app.add_exception_handler(NotFound, _not_found)
    app.add_exception_handler(Conflict, _conflict)
    app.add_exception_handler(InvalidInput, _invalid)
