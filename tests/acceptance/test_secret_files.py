"""The DSNs a replica needs (its database, the sql task's targets, `self`) may come from
mounted files, as the chart mounts them from Secrets (#42): the replica serves and runs
sql jobs, and no process of it holds a DSN in its environment, where /proc/<pid>/environ,
a crash dump or a child process would show it."""

import asyncio
import json
import uuid
from pathlib import Path

import httpx
import psutil

from harness.cluster import serve
from harness.replicas import Replica
from tests.support.cluster import triggered_run
from tests.support.db import role_url

NEVER = {"kind": "cron", "expression": "0 0 1 1 *"}


def environments(replica: Replica) -> dict[str, str]:
    """Every variable of the replica's supervisor and its two children, with the values
    each process has, as one text. (The children are forked: /proc shows each the
    environment the supervisor started with; what they add in memory is checked in
    tests/unit/test_secret_files.py.)"""
    processes = [psutil.Process(replica.pid), *replica.children().values()]
    assert len(processes) == 3, processes
    seen: dict[str, str] = {}
    for process in processes:
        for key, value in process.environ().items():
            seen[key] = f"{seen.get(key, '')}\n{value}"
    return seen


def test_dsns_from_files_serve_and_stay_out_of_every_environment(
    tmp_path: Path, database_url: str
) -> None:
    role = f"tg_files_{uuid.uuid4().hex[:10]}"
    target = asyncio.run(role_url(database_url, role))
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    (secrets / "database-url").write_text(database_url + "\n")  # as `--from-file` leaves it
    (secrets / "targets.json").write_text(json.dumps({"app": target}))
    (secrets / "self-url").write_text(target)
    files = {
        "DATABASE_URL_FILE": str(secrets / "database-url"),
        "TICKGATE_SQL_TARGETS_FILE": str(secrets / "targets.json"),
        "TICKGATE_SQL_ALLOW_SELF": "1",
        "TICKGATE_SQL_SELF_URL_FILE": str(secrets / "self-url"),
    }
    with serve(tmp_path, database_url=None, **files) as replica:
        for target_name in ("app", "self"):
            job = {
                "name": f"who-{target_name}",
                "schedule": NEVER,
                "task": "sql",
                "args": {"target": target_name, "statement": "SELECT current_user"},
            }
            made = httpx.post(f"{replica.url}/v1/jobs", json=job, timeout=10)
            assert made.status_code == 201, made.text
        runs = [triggered_run(replica, f"who-{name}") for name in ("app", "self")]
        environment = environments(replica)
    for run in runs:
        assert run["status"] == "succeeded", run
        assert run["output"]["rows"] == [[role]], run  # type: ignore[index]
    assert not {"DATABASE_URL", "TICKGATE_SQL_TARGETS", "TICKGATE_SQL_SELF_URL"} & set(environment)
    values = "\n".join(environment.values())
    assert database_url not in values
    assert f"{role}:{role}@" not in values
