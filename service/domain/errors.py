"""Errors the domain raises; the API layer maps each to one HTTP status."""

from collections.abc import Sequence
from dataclasses import dataclass, replace

from pydantic import JsonValue, ValidationError


class DomainError(Exception):
    """Base of every error a caller can fix by changing the request."""


class NotFound(DomainError):
    """The named object does not exist (HTTP 404)."""


class Conflict(DomainError):
    """The request clashes with the current state (HTTP 409)."""


class PreconditionFailed(DomainError):
    """The job is not in the state the request was conditioned on (HTTP 412)."""


@dataclass(frozen=True)
class FieldProblem:
    """One bad value: where it is, what is wrong, and what was given."""

    loc: tuple[str | int, ...]
    msg: str
    input: JsonValue
    type: str = "value_error"


class InvalidInput(DomainError):
    """Values that parse but break a rule (HTTP 422)."""

    def __init__(self, problems: Sequence[FieldProblem]) -> None:
        super().__init__("; ".join(f"{'.'.join(map(str, p.loc))}: {p.msg}" for p in problems))
        self.problems = tuple(problems)

    @classmethod
    def one(cls, loc: tuple[str | int, ...], msg: str, value: JsonValue) -> "InvalidInput":
        return cls([FieldProblem(loc, msg, value)])

    @classmethod
    def from_validation(
        cls, error: ValidationError, prefix: tuple[str | int, ...]
    ) -> "InvalidInput":
        """Re-root pydantic's errors under `prefix`, so the field path names the request."""
        return cls(
            [
                FieldProblem(
                    prefix + tuple(e["loc"]), e["msg"], _jsonable(e.get("input")), e["type"]
                )
                for e in error.errors(include_url=False)
            ]
        )

    @classmethod
    def joined(cls, errors: Sequence["InvalidInput"]) -> "InvalidInput":
        return cls([problem for error in errors for problem in error.problems])

    def within(self, prefix: tuple[str | int, ...], label: str | None) -> "InvalidInput":
        """These problems of one part of a larger request: each `loc` re-rooted from
        `body` to `prefix`, each message headed by `label` (which part, in words)."""
        return InvalidInput(
            [
                replace(
                    problem,
                    loc=prefix + problem.loc[1:] if problem.loc[:1] == ("body",) else problem.loc,
                    msg=f"{label}: {problem.msg}" if label else problem.msg,
                )
                for problem in self.problems
            ]
        )


def _jsonable(value: object) -> JsonValue:
    if value is None or isinstance(value, str | int | float | bool):
        return value
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_jsonable(v) for v in value]
    return str(value)
