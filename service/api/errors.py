"""Domain errors become HTTP answers here, and only here."""

from collections.abc import Sequence
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, JsonValue

from service.domain.errors import Conflict, FieldProblem, InvalidInput, NotFound
from service.store.errors import UNAVAILABLE


async def _not_found(_: Request, error: Exception) -> JSONResponse:
    return JSONResponse({"detail": str(error)}, status_code=404)


async def _conflict(_: Request, error: Exception) -> JSONResponse:
    return JSONResponse({"detail": str(error)}, status_code=409)


async def _invalid(_: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, InvalidInput)
    return _problems(error.problems)


async def _unparsed(_: Request, error: Exception) -> JSONResponse:
    """FastAPI's own 422s (bad JSON, a wrong type) in the shape of every other 422: its
    default adds a `ctx` whose keys vary by error type, which no schema could declare."""
    assert isinstance(error, RequestValidationError)
    return _problems(
        [
            FieldProblem(tuple(e["loc"]), e["msg"], jsonable_encoder(e.get("input")), e["type"])
            for e in error.errors()
        ]
    )


def _problems(problems: Sequence[FieldProblem]) -> JSONResponse:
    detail = [
        {"type": p.type, "loc": list(p.loc), "msg": p.msg, "input": p.input} for p in problems
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
    app.add_exception_handler(RequestValidationError, _unparsed)


class ErrorMessage(BaseModel):
    """A 404, 409 or 503 answer: what went wrong, in words."""

    detail: str


class Problem(BaseModel):
    """One bad value: where it is (`loc`), what is wrong (`msg`) and what was sent."""

    model_config = ConfigDict(extra="forbid")

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


# Each operation declares the answers it can give, and no other: INVALID where it takes
# parameters or a body, TOO_LARGE where BodyLimits reads a body (any method but GET),
# UNAVAILABLE where it reads the database, GUARDED everywhere BearerAuth may stand.
INVALID = documented(422, Problems, "Invalid input; each problem names the field and value.")
UNAVAILABLE_DOC = documented(503, ErrorMessage, "The database is unavailable; retry later.")
NOT_FOUND = documented(404, ErrorMessage, "No such job or run.")
CONFLICT = documented(409, ErrorMessage, "Conflicts with the current state.")
TOO_LARGE = documented(413, ErrorMessage, "The body is larger than TICKGATE_MAX_BODY_BYTES.")
UNAUTHENTICATED = documented(
    401,
    ErrorMessage,
    "No known bearer token (servers with tokens, on paths not in TICKGATE_OPEN_PATHS).",
)
FORBIDDEN = documented(403, ErrorMessage, "The token lacks the scope (servers with tokens).")
GUARDED = UNAUTHENTICATED | FORBIDDEN
READ = GUARDED | INVALID | UNAVAILABLE_DOC
WRITE = READ | TOO_LARGE
