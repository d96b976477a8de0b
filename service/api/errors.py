"""Domain errors become HTTP answers here, and only here: each an RFC 9457 problem
(`application/problem+json`) with `type`, `title`, `status` and `detail`, and for a 422
every bad value in `errors`, each named by `loc`."""

from collections.abc import Mapping, Sequence
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field, JsonValue
from starlette.exceptions import HTTPException

from service.api.methods import allowed_methods
from service.domain.errors import (
    Conflict,
    FieldProblem,
    InvalidInput,
    NotFound,
    PreconditionFailed,
)
from service.store.errors import UNAVAILABLE

PROBLEM_JSON = "application/problem+json"
# RFC 9457: no type of our own; the title is then the status's phrase.
NO_TYPE = "about:blank"
# Where a value may hold a secret (a task's or a hook's args, header values, credentials,
# URLs with a password in them), a 422 names the field and the rule but never echoes what
# was sent: stored secrets are merged in before validation, so an echo would show them to
# any write token. A whole object or list is never echoed either: it may hold such a part.
SECRET_BEARING = frozenset(
    {"args", "hooks", "headers", "secret_headers", "oauth", "url", "token_url", "signing_key"}
)


def problem_document(
    status: int, detail: str, errors: Sequence[FieldProblem] | None = None
) -> dict[str, object]:
    """The body of an error answer; shared with the ASGI guards, which answer before any
    route does."""
    document: dict[str, object] = {
        "type": NO_TYPE,
        "title": HTTPStatus(status).phrase,
        "status": status,
        "detail": detail,
    }
    if errors is not None:
        document["errors"] = [_entry(problem) for problem in errors]
    return document


def _entry(problem: FieldProblem) -> dict[str, JsonValue]:
    """One entry of a 422's `errors`, with `input` only where the value is safe to echo
    (see SECRET_BEARING): the only place a 422 renders what was sent, whatever the route."""
    entry: dict[str, JsonValue] = {"type": problem.type, "loc": list(problem.loc)}
    entry["msg"] = problem.msg
    named = {part.lower() for part in problem.loc if isinstance(part, str)}
    if not (isinstance(problem.input, dict | list) or named & SECRET_BEARING):
        entry["input"] = problem.input
    return entry


def problem(
    status: int,
    detail: str,
    errors: Sequence[FieldProblem] | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    return JSONResponse(
        problem_document(status, detail, errors),
        status_code=status,
        headers=headers,
        media_type=PROBLEM_JSON,
    )


async def _not_found(_: Request, error: Exception) -> JSONResponse:
    return problem(404, str(error))


async def _conflict(_: Request, error: Exception) -> JSONResponse:
    return problem(409, str(error))


async def _precondition_failed(_: Request, error: Exception) -> JSONResponse:
    return problem(412, str(error))


async def _invalid(_: Request, error: Exception) -> JSONResponse:
    assert isinstance(error, InvalidInput)
    return problem(422, str(error), error.problems)


async def _unparsed(_: Request, error: Exception) -> JSONResponse:
    """FastAPI's own 422s (bad JSON, a wrong type) in the shape of every other 422: its
    default adds a `ctx` whose keys vary by error type, which no schema could declare."""
    assert isinstance(error, RequestValidationError)
    invalid = InvalidInput(
        [
            FieldProblem(tuple(e["loc"]), e["msg"], jsonable_encoder(e.get("input")), e["type"])
            for e in error.errors()
        ]
    )
    return await _invalid(_, invalid)


async def _unavailable(_: Request, error: Exception) -> JSONResponse:
    detail = f"the database is unavailable: {type(error).__name__}"
    return problem(503, detail, headers={"Retry-After": "5"})


async def _http_error(request: Request, error: Exception) -> JSONResponse:
    """Starlette's own answers (no such path, a method the path does not serve). A 405
    lists in `Allow` every method of the path, not only the first matched route's."""
    assert isinstance(error, HTTPException)
    headers = dict(error.headers or {})
    if error.status_code == 405:
        headers["Allow"] = ", ".join(allowed_methods(request.app, request.scope))
    return problem(error.status_code, str(error.detail), headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    for unavailable in UNAVAILABLE:
        app.add_exception_handler(unavailable, _unavailable)
    app.add_exception_handler(NotFound, _not_found)
    app.add_exception_handler(Conflict, _conflict)
    app.add_exception_handler(PreconditionFailed, _precondition_failed)
    app.add_exception_handler(InvalidInput, _invalid)
    app.add_exception_handler(RequestValidationError, _unparsed)
    app.add_exception_handler(HTTPException, _http_error)


class ProblemDetails(BaseModel):
    """An error answer (RFC 9457, `application/problem+json`): `detail` says what went
    wrong, in words."""

    type: str = Field(description="`about:blank`: the status says the kind of problem.")
    title: str = Field(description="The status's phrase, e.g. `Not Found`.")
    status: int = Field(description="The HTTP status code.")
    detail: str = Field(description="What went wrong with this request, in words.")


class FieldError(BaseModel):
    """One bad value: where it is (`loc`), what is wrong (`msg`) and what was sent
    (`input`), which is left out where it could hold a secret: anything under a task's or
    a hook's `args`, headers, URLs and credentials, and any object or list."""

    model_config = ConfigDict(extra="forbid")

    type: str = Field(description="The kind of error, e.g. `missing` or `value_error`.")
    loc: list[str | int] = Field(description="Where: `body`, `query` or `path`, then names.")
    msg: str
    input: JsonValue = Field(
        default=None,
        description="The value sent; absent where it could hold a secret, or is an object "
        "or a list.",
    )


class ValidationProblem(ProblemDetails):
    """A 422 answer: every bad value in the request in `errors`; `detail` lists them in
    one line. Nothing was changed."""

    model_config = ConfigDict(extra="forbid")

    errors: list[FieldError]


ResponseDoc = dict[int | str, dict[str, Any]]


def documented(status: int, model: type[BaseModel], description: str) -> ResponseDoc:
    return {status: {"model": model, "description": description}}


def declare_problem_media_type(document: dict[str, Any]) -> None:
    """Error answers are `application/problem+json`; FastAPI declares every response
    with the route's own media type (application/json)."""
    for item in document["paths"].values():
        for operation in item.values():
            for status, response in operation["responses"].items():
                content = response.get("content", {})
                if int(status) >= 400 and "application/json" in content:
                    content[PROBLEM_JSON] = content.pop("application/json")


# Each operation declares the answers it can give, and no other: INVALID where it takes
# parameters or a body, TOO_LARGE and UNSUPPORTED_MEDIA where BodyLimits reads a body
# (any method but GET),
# UNAVAILABLE where it reads the database, GUARDED everywhere BearerAuth may stand.
INVALID = documented(
    422, ValidationProblem, "Invalid input; each problem names the field and value."
)
UNAVAILABLE_DOC = documented(503, ProblemDetails, "The database is unavailable; retry later.")
NOT_FOUND = documented(404, ProblemDetails, "No such job or run.")
CONFLICT = documented(409, ProblemDetails, "Conflicts with the current state.")
PRECONDITION_FAILED = documented(
    412, ProblemDetails, "`If-Match` names no current ETag of the job; nothing changed."
)
TOO_LARGE = documented(413, ProblemDetails, "The body is larger than TICKGATE_MAX_BODY_BYTES.")
UNSUPPORTED_MEDIA = documented(
    415, ProblemDetails, "The body's Content-Type is not JSON (`application/json`, or `+json`)."
)
UNAUTHENTICATED = documented(
    401,
    ProblemDetails,
    "No known bearer token (servers with tokens, on paths not in TICKGATE_OPEN_PATHS).",
)
FORBIDDEN = documented(403, ProblemDetails, "The token lacks the scope (servers with tokens).")
GUARDED = UNAUTHENTICATED | FORBIDDEN
READ = GUARDED | INVALID | UNAVAILABLE_DOC
WRITE = READ | TOO_LARGE | UNSUPPORTED_MEDIA
