"""A client of a running Tickgate server: `http` (the REST API) and `commands` (the CLI)."""

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
