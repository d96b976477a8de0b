"""The httpx client a plugin task gets (`TaskContext.http`) is guarded as the http task is
(#42): the same allowlist, metadata and link-local addresses never, and no proxy from the
environment."""

import pytest
from pydantic import BaseModel, JsonValue

from harness.receiver import Receiver
from service.config import Settings
from service.tasks import TaskRegistry, builtin_registry
from service.tasks.base import TaskContext, TaskDefinition
from tests.support.inprocess import served, triggered_run

NEVER = {"kind": "cron", "expression": "0 0 1 1 *"}


class FetchArgs(BaseModel):
    url: str


async def fetch(args: FetchArgs, context: TaskContext) -> JsonValue:
    answer = await context.http.post(args.url, json={"from": "plugin"})
    return {"status": answer.status_code}


def registry(settings: Settings) -> TaskRegistry:
    tasks = builtin_registry(http_allow=settings.http_allow)
    tasks.register(TaskDefinition("fetch", "posts to a URL", FetchArgs, fetch))
    return tasks


async def test_a_plugin_reaches_what_the_allowlist_opens_and_nothing_else(
    settings: Settings, receiver: Receiver, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With 127.0.0.1 allowlisted (and a proxy in the environment, which is ignored) the
    plugin reaches the loopback receiver; a metadata address and another loopback
    address fail the run, naming the refusal; nothing but the allowed call arrives."""
    monkeypatch.setenv("HTTP_PROXY", "http://127.0.0.1:9")  # would refuse every call
    cases = {
        "allowed": (f"{receiver.url}/plugin", "succeeded"),
        "metadata": ("http://169.254.169.254/latest/meta-data/", "failed"),
        "other-loopback": (receiver.url.replace("127.0.0.1", "127.0.0.2"), "failed"),
    }
    runs = {}
    async with served(settings, registry(settings)) as client:
        for name, (url, _) in cases.items():
            job = {"name": name, "schedule": NEVER, "task": "fetch", "args": {"url": url}}
            assert (await client.post("/v1/jobs", json=job)).status_code == 201
            runs[name] = await triggered_run(client, name)
    assert {name: run["status"] for name, run in runs.items()} == {
        name: status for name, (_, status) in cases.items()
    }
    assert "TargetDenied" in runs["metadata"]["error"], runs["metadata"]
    assert "TargetDenied" in runs["other-loopback"]["error"], runs["other-loopback"]
    assert [receipt.path for receipt in receiver.receipts()] == ["/plugin"]
