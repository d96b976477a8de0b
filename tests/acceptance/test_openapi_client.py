"""A client generated from the committed OpenAPI document drives a live server."""

import importlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from harness.cluster import serve
from harness.waiting import eventually

DOCUMENT = Path(__file__).parents[2] / "openapi" / "openapi.json"
GENERATOR = str(Path(sys.executable).with_name("openapi-python-client"))


@pytest.fixture
def generated(tmp_path: Path) -> Iterator[str]:
    """Generate `tickgate_client` into tmp_path and make it importable."""
    config = tmp_path / "generator.yaml"
    config.write_text("post_hooks: []\n")
    subprocess.run(
        [
            GENERATOR,
            "generate",
            "--path",
            str(DOCUMENT),
            "--meta",
            "none",
            "--config",
            str(config),
            "--output-path",
            str(tmp_path / "tickgate_client"),
        ],
        check=True,
        capture_output=True,
    )
    sys.path.insert(0, str(tmp_path))
    try:
        yield "tickgate_client"
    finally:
        sys.path.remove(str(tmp_path))
        for name in [m for m in sys.modules if m.startswith("tickgate_client")]:
            del sys.modules[name]


def module(name: str) -> ModuleType:
    return importlib.import_module(f"tickgate_client.{name}")


def test_generated_client_creates_lists_triggers_and_deletes(
    generated: str, database_url: str, tmp_path: Path
) -> None:
    client_module = module("client")
    jobs = {op: module(f"api.jobs.{op}") for op in ("create_job", "list_jobs", "delete_job")}
    runs = {op: module(f"api.runs.{op}") for op in ("trigger_job", "get_run", "cancel_run")}
    job_create = module("models").JobCreate
    body: dict[str, Any] = {
        "name": "generated",
        "schedule": {"kind": "cron", "expression": "0 0 1 1 *"},
        "task": "log",
        "args": {"message": "from a generated client"},
    }
    with (
        serve(tmp_path, database_url=database_url) as replica,
        client_module.Client(base_url=replica.url, raise_on_unexpected_status=True) as client,
    ):
        created = jobs["create_job"].sync_detailed(client=client, body=job_create.from_dict(body))
        assert created.status_code == 201
        assert created.parsed.name == "generated"
        assert created.parsed.state.value == "active"
        duplicate = jobs["create_job"].sync_detailed(client=client, body=job_create.from_dict(body))
        assert duplicate.status_code == 409
        assert "already exists" in duplicate.parsed.detail
        page = jobs["list_jobs"].sync(client=client)
        assert [job.name for job in page.items] == ["generated"]
        run = runs["trigger_job"].sync("generated", client=client)
        assert run.job == "generated"
        assert run.trigger.value == "manual"
        eventually(  # overlap "skip": a second manual run waits for the first to end
            lambda: runs["get_run"].sync(run.id, client=client).status.value != "running",
            30,
            "the first run to end",
        )
        override = {"args": {"message": "louder", "level": "warning"}, "note": "generated"}
        request = module("models").TriggerRequest.from_dict(override)
        with_args = runs["trigger_job"].sync("generated", client=client, body=request)
        assert (with_args.to_dict()["args"], with_args.note) == (override["args"], "generated")
        eventually(
            lambda: runs["get_run"].sync(with_args.id, client=client).status.value != "running",
            30,
            "the run with args to end",
        )
        reason = module("models").CancelBody.from_dict({"reason": "too late", "by": "py"})
        late = runs["cancel_run"].sync_detailed(with_args.id, client=client, body=reason)
        assert late.status_code == 409
        assert late.parsed.detail == "the run has ended already: succeeded"
        assert runs["get_run"].sync(run.id, client=client).id == run.id
        deleted = jobs["delete_job"].sync_detailed("generated", client=client)
        assert deleted.status_code == 204
        assert jobs["list_jobs"].sync(client=client).items == []
