"""What `make run` serves runs as roles of its own (#42): the service is not a superuser,
and the sql task's `self` statements run as a role with no rights on Tickgate's tables,
where the jobs' secret headers are. A data directory of an earlier release, whose tables
the superuser made, is given to the service's role on the next start."""

import asyncio
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import asyncpg
import httpx

from harness.cluster import serve
from service.embedded import SELF_ROLE, SERVICE_ROLE, start_embedded
from service.store import Store
from tests.support.cluster import triggered_run
from tests.support.fire import add_job

NEVER = {"kind": "cron", "expression": "0 0 1 1 *"}
LOG_ARGS = {"message": "tick"}
SECRET = "Bearer never-read-by-sql"


def sql_job(name: str, statement: str) -> dict[str, Any]:
    args = {"target": "self", "statement": statement, "output_rows": 5}
    return {"name": name, "schedule": NEVER, "task": "sql", "args": args}


async def roles_of_sessions(superuser_url: str) -> dict[str, bool]:
    """Each role with a session from a `tickgate serve` process, and whether it is a
    superuser."""
    connection = await asyncpg.connect(superuser_url)
    try:
        rows = await connection.fetch(
            """SELECT DISTINCT a.usename, r.rolsuper FROM pg_stat_activity a
               JOIN pg_roles r ON r.rolname = a.usename
               WHERE a.pid <> pg_backend_pid() AND a.backend_type = 'client backend'"""
        )
    finally:
        await connection.close()
    return {row["usename"]: row["rolsuper"] for row in rows}


def test_the_service_and_self_statements_run_as_roles_of_their_own(tmp_path: Path) -> None:
    """No superuser session but ours; a `self` statement is not a superuser, cannot read
    tickgate_jobs (the secret header is in it), and COPY ... TO PROGRAM is refused."""
    # Where the server's account could write (it runs as its own user), named per run.
    pwned = Path(tempfile.gettempdir()) / f"tickgate-pwned-{uuid.uuid4().hex}"
    with serve(tmp_path, database_url=None, TICKGATE_SQL_ALLOW_SELF="1") as replica:
        secret = {
            "name": "holds-a-secret",
            "schedule": NEVER,
            "task": "http",
            "args": {
                "url": "http://127.0.0.1:9/x",
                "headers": {"Authorization": SECRET},
                "secret_headers": ["Authorization"],
            },
        }
        jobs = [
            secret,
            sql_job("who", "SELECT current_user, current_setting('is_superuser') AS su"),
            sql_job("steal", "SELECT * FROM tickgate_jobs"),
            sql_job("shell", f"COPY (SELECT 1) TO PROGRAM 'touch {pwned}'"),
        ]
        for job in jobs:
            made = httpx.post(f"{replica.url}/v1/jobs", json=job, timeout=10)
            assert made.status_code == 201, made.text
        runs = {name: triggered_run(replica, name) for name in ("who", "steal", "shell")}
        embedded = start_embedded(tmp_path / "data")
        try:
            sessions = asyncio.run(roles_of_sessions(embedded.url))
        finally:
            embedded.stop()
    assert runs["who"]["status"] == "succeeded", runs["who"]
    assert runs["who"]["output"]["rows"] == [[SELF_ROLE, "off"]], runs["who"]
    assert runs["steal"]["status"] == "failed", runs["steal"]
    assert "permission denied" in runs["steal"]["error"], runs["steal"]
    assert SECRET not in str(runs)
    assert runs["shell"]["status"] == "failed", runs["shell"]
    assert not pwned.exists()
    assert sessions.get(SERVICE_ROLE) is False, sessions
    assert not any(sessions.values()), sessions


def test_a_data_directory_of_an_earlier_release_is_given_to_the_service_role(
    tmp_path: Path,
) -> None:
    """Tables the superuser made (as every release before the roles did) are the
    service role's after the next start: its jobs read back and new ones are made."""
    embedded = start_embedded(tmp_path / "data")
    try:
        asyncio.run(_migrate_and_add_a_job(embedded.url))
    finally:
        embedded.stop()
    time.sleep(0.5)  # the server stops with its last claim; the replica starts it again
    with serve(tmp_path, database_url=None) as replica:
        old = httpx.get(f"{replica.url}/v1/jobs/from-before", timeout=10)
        new = httpx.post(
            f"{replica.url}/v1/jobs",
            json={"name": "after", "schedule": NEVER, "task": "log", "args": LOG_ARGS},
            timeout=10,
        )
    assert old.status_code == 200, old.text
    assert new.status_code == 201, new.text


async def _migrate_and_add_a_job(superuser_url: str) -> None:
    """As a replica of an earlier release would: migrated, and a job made, by the
    server's superuser."""
    store = await Store.open(superuser_url, max_size=1)
    try:
        await store.migrate()
        await add_job(store, "from-before", schedule=NEVER, task="log", args={"message": "hi"})
    finally:
        await store.close()
