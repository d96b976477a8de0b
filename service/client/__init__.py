"""A client of a running Tickgate server: `http` (the REST API), `commands` (the CLI, with
`inputs`, `render`, `export` and `completion`)."""

from service.client.http import (
    ApiError,
    Applied,
    ClientError,
    JobFilter,
    JsonObject,
    Page,
    Problem,
    TickgateClient,
    Unreachable,
)

__all__ = [
    "ApiError",
    "Applied",
    "ClientError",
    "JobFilter",
    "JsonObject",
    "Page",
    "Problem",
    "TickgateClient",
    "Unreachable",
]
