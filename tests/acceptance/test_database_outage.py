"""PostgreSQL goes away and comes back: the replica stays up and recovers by itself."""

import time
from datetime import UTC, datetime
from pathlib import Path

import httpx

from harness.cluster import serve
from harness.replicas import Replica
from harness.waiting import eventually
from service.embedded import start_embedded

EVERY_SECOND = {
    "name": "heartbeat",
    "schedule": {"kind": "cron", "expression": "* * * * * *"},
    "task": "log",
    "args": {"message": "beat"},
}


def status(replica: Replica, path: str) -> int:
    try:
        return httpx.get(f"{replica.url}{path}", timeout=5).status_code
    except httpx.TransportError:
        return 0


def runs_after(replica: Replica, moment: datetime) -> bool:
    response = httpx.get(f"{replica.url}/v1/jobs/heartbeat/runs?limit=5", timeout=5)
    if response.status_code != 200:
        return False
    items = response.json()["items"]
    return any(datetime.fromisoformat(run["scheduled_for"]) > moment for run in items)


def test_readiness_follows_the_database_and_scheduling_resumes(tmp_path: Path) -> None:
    data = tmp_path / "outage-pg"
    database = start_embedded(data)
    try:
        with serve(tmp_path, database_url=database.url, TICKGATE_RECONCILE_SECONDS="2") as replica:
            assert httpx.post(f"{replica.url}/v1/jobs", json=EVERY_SECOND).status_code == 201
            eventually(lambda: status(replica, "/readyz") == 200, 30, "readiness before the outage")
            eventually(lambda: runs_after(replica, datetime.now(UTC)), 30, "runs before the outage")

            database.stop()
            eventually(lambda: status(replica, "/readyz") == 503, 10, "readiness to fail")
            body = httpx.get(f"{replica.url}/readyz", timeout=5).json()
            # The kind of failure, never its text, which can name the address (#42).
            assert body["checks"]["database"].startswith("unreachable: "), body
            assert str(data) not in str(body), body
            assert status(replica, "/healthz") == 200
            assert status(replica, "/v1/jobs") == 503

            # Down, it neither crashes nor spins: over a few seconds it mostly sleeps.
            before = replica.cpu_seconds()
            time.sleep(4)  # the outage window is what is observed here
            assert replica.alive, replica.log_tail()
            assert replica.cpu_seconds() - before < 2.0, "the replica spins while down"

            database = start_embedded(data)
            back = datetime.now(UTC)
            eventually(lambda: status(replica, "/readyz") == 200, 60, "readiness after the outage")
            eventually(lambda: runs_after(replica, back), 60, "scheduling to resume")
            assert replica.alive
    finally:
        database.stop()
