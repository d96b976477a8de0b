"""The `http` task: one request per run, carrying headers the target can dedupe on."""

from datetime import UTC, datetime
from importlib.metadata import version
from typing import Literal

import httpx
from pydantic import AnyHttpUrl, BaseModel, ConfigDict, Field, JsonValue

from service.tasks.base import TaskContext, TaskDefinition

VERSION = version("tickgate")


class HttpArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: AnyHttpUrl = Field(description="http(s) URL to call.")
    method: Literal["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"] = "POST"
    headers: dict[str, str] = Field(default_factory=dict, max_length=100)
    body: JsonValue = Field(
        default=None,
        description="JSON body; when absent, {job, run_id, scheduled_for} is sent.",
    )
    timeout_seconds: float = Field(30, gt=0, le=3600)
    success_status: list[int] | None = Field(
        default=None,
        min_length=1,
        max_length=100,
        description="Statuses that count as success; default any 2xx.",
    )

    def succeeded(self, status: int) -> bool:
        if self.success_status is None:
            return 200 <= status < 300
        return status in self.success_status


class HttpTaskError(Exception):
    """The request went out but did not succeed, or could not be sent."""


def rfc3339_utc(moment: datetime) -> str:
    """`2026-11-29T19:00:05Z`; a manual run's sub-second tick keeps its fraction."""
    text = moment.astimezone(UTC).replace(tzinfo=None).isoformat()
    return f"{text}Z"


def request_headers(args: HttpArgs, context: TaskContext) -> dict[str, str]:
    scheduled_for = rfc3339_utc(context.scheduled_for)
    return {
        "User-Agent": f"tickgate/{VERSION}",
        **args.headers,
        "Idempotency-Key": str(context.run_id),
        "X-Tickgate-Job": context.job,
        "X-Tickgate-Run-Id": str(context.run_id),
        "X-Tickgate-Scheduled-For": scheduled_for,
    }


def request_body(args: HttpArgs, context: TaskContext) -> JsonValue:
    if "body" in args.model_fields_set:
        return args.body
    return {
        "job": context.job,
        "run_id": str(context.run_id),
        "scheduled_for": rfc3339_utc(context.scheduled_for),
    }


async def run_http(args: HttpArgs, context: TaskContext) -> JsonValue:
    try:
        response = await context.http.request(
            args.method,
            str(args.url),
            headers=request_headers(args, context),
            json=request_body(args, context),
            timeout=args.timeout_seconds,
        )
    except httpx.HTTPError as error:
        raise HttpTaskError(f"{args.method} {args.url} failed: {error!r}") from error
    if not args.succeeded(response.status_code):
        raise HttpTaskError(f"{args.method} {args.url} answered HTTP {response.status_code}")
    return {"status": response.status_code}


HTTP_TASK = TaskDefinition(
    name="http",
    description="Send one HTTP request per run; headers carry the run id as Idempotency-Key.",
    args_model=HttpArgs,
    run=run_http,
)
