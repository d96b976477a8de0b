"""A run's log (#24): what a task writes to `context.logger` (and the run's retry lines)
is kept with the run, INFO and up whatever the replica's log level, bounded, and shown
by `GET /v1/runs/{id}/log`."""

import logging
from typing import Any

import httpx
from pydantic import BaseModel

from harness.receiver import Receiver
from service.config import Settings
from service.tasks import TaskContext, TaskRegistry, builtin_registry, task
from tests.support.inprocess import served, triggered_run

NEVER = {"kind": "cron", "expression": "0 0 1 1 *"}


class ChattyArgs(BaseModel):
    lines: int


@task("chatty", args=ChattyArgs)
async def chatty(args: ChattyArgs, context: TaskContext) -> None:
    """Logs `lines` lines, one of them at DEBUG."""
    context.logger.debug("not kept")
    for index in range(args.lines):
        context.logger.info("line %d of %s", index, context.job)


def registry() -> TaskRegistry:
    tasks = builtin_registry("127.0.0.1")
    tasks.register(chatty)
    return tasks


async def log_of(client: httpx.AsyncClient, job: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    made = await client.post("/v1/jobs", json={"schedule": NEVER, **job})
    assert made.status_code == 201, made.text
    run = await triggered_run(client, job["name"])
    shown = await client.get(f"/v1/runs/{run['id']}/log")
    assert shown.status_code == 200, shown.text
    return run, shown.json()


async def test_a_task_s_lines_are_the_run_s_log_whatever_the_log_level(
    settings: Settings, receiver: Receiver
) -> None:
    logging.getLogger("tickgate.run").setLevel(logging.ERROR)  # the replica logs no INFO
    try:
        async with served(settings, registry()) as client:
            said = await log_of(
                client, {"name": "say", "task": "log", "args": {"message": "hello there"}}
            )
            receiver.fail_first("/flaky", 1)
            retried = await log_of(
                client,
                {
                    "name": "flaky",
                    "task": "http",
                    "args": {"url": f"{receiver.url}/flaky"},
                    "retry": {"max_attempts": 2, "min_backoff_seconds": 0.1},
                },
            )
            missing = await client.get("/v1/runs/00000000-0000-0000-0000-000000000000/log")
    finally:
        logging.getLogger("tickgate.run").setLevel(logging.NOTSET)
    run, log = said
    assert log["run_id"] == run["id"]
    assert [(line["level"], line["message"]) for line in log["lines"]] == [("INFO", "hello there")]
    assert log["dropped"] == 0
    run, log = retried
    assert run["status"] == "succeeded"
    [line] = log["lines"]
    assert line["level"] == "WARNING"
    assert line["message"].startswith("attempt 1 failed; retrying in")
    assert missing.status_code == 404


async def test_a_run_s_log_is_bounded_and_says_how_much_it_dropped(settings: Settings) -> None:
    async with served(settings, registry()) as client:
        _, log = await log_of(client, {"name": "chatty", "task": "chatty", "args": {"lines": 1200}})
        quiet_run, quiet = await log_of(
            client, {"name": "quiet", "task": "chatty", "args": {"lines": 0}}
        )
    assert len(log["lines"]) == 1000
    assert log["lines"][0]["message"] == "line 0 of chatty"
    assert log["dropped"] == 200
    assert (quiet["lines"], quiet["dropped"], quiet_run["status"]) == ([], 0, "succeeded")
