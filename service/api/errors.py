"""Domain errors become HTTP answers here, and only here."""

from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, JsonValue

from service.domain.errors import Conflict, InvalidInput, NotFound
from service.store.errors import UNAVAILABLE


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


async def _unavailable(_: Request, error: Exception) -> JSONResponse:
    return JSONResponse(
        {"detail": f"the database is unavailable: {type(error).__name__}"},
        status_code=503,
        headers={"Retry-After": "5"},
    )


def install_error_handlers(app: FastAPI) -> None:
    for unavailable in UNAVAILABLE:
        app.add_exception_handler(unavailable, _unavailable)
    app.add_exception_handler(NotFound, _not_found)
    app.add_exception_handler(Conflict, _conflict)
    app.add_exception_handler(InvalidInput, _invalid)


class ErrorMessage(BaseModel):
    """A 404, 409 or 503 answer: what went wrong, in words."""

    detail: str


class Problem(BaseModel):
    """One bad value: where it is (`loc`), what is wrong (`msg`) and what was sent."""

    type: str
    loc: list[str | int]
    msg: str
    input: JsonValue = None


class Problems(BaseModel):
    """A 422 answer: every bad value in the request. Nothing was changed."""

    detail: list[Problem]


ResponseDoc = dict[int | str, dict[str, Any]]


def documented(status: int, model: type[BaseModel], description: str) -> ResponseDoc:
    return {status: {"model": model, "description": description}}


INVALID = documented(422, Problems, "Invalid input; each problem names the field and value.")
UNAVAILABLE_DOC = documented(503, ErrorMessage, "The database is unavailable; retry later.")
NOT_FOUND = documented(404, ErrorMessage, "No such job or run.")
CONFLICT = documented(409, ErrorMessage, "Conflicts with the current state.")
MALFORMED = documented(400, ErrorMessage, "The body is not parseable JSON.")
TOO_LARGE = documented(413, ErrorMessage, "The body is larger than TICKGATE_MAX_BODY_BYTES.")
UNAUTHENTICATED = documented(401, ErrorMessage, "No known bearer token (servers with tokens).")
FORBIDDEN = documented(403, ErrorMessage, "The token lacks the scope (servers with tokens).")
COMMON = INVALID | UNAVAILABLE_DOC | MALFORMED | TOO_LARGE | UNAUTHENTICATED | FORBIDDEN
