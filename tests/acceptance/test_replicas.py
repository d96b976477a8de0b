"""Real `tickgate serve` processes sharing one database."""

import http.client
import time
from pathlib import Path

import httpx

from harness.cluster import serve
from harness.waiting import eventually

IDLE_SECONDS = 6  # past uvicorn's default keep-alive (5 s), well within the replica's

JOB = {
    "schedule": {"kind": "cron", "expression": "*/5 * * * *"},
    "task": "log",
    "args": {"message": "hello"},
}


def test_two_replicas_see_each_others_jobs(database_url: str, tmp_path: Path) -> None:
    with (
        serve(tmp_path, database_url=database_url) as a,
        serve(tmp_path, database_url=database_url) as b,
    ):
        created = httpx.post(f"{a.url}/v1/jobs", json=JOB | {"name": "from-a"}, timeout=10)
        assert created.status_code == 201, created.text
        assert httpx.put(f"{b.url}/v1/jobs/from-b", json=JOB, timeout=10).status_code == 201
        for replica in (a, b):
            names = [
                j["name"] for j in httpx.get(f"{replica.url}/v1/jobs", timeout=10).json()["items"]
            ]
            assert names == ["from-a", "from-b"]
        assert httpx.delete(f"{b.url}/v1/jobs/from-a", timeout=10).status_code == 204
        assert httpx.get(f"{a.url}/v1/jobs/from-a", timeout=10).status_code == 404


def test_embedded_postgres_is_shared_by_replicas_in_one_directory(tmp_path: Path) -> None:
    """`make run` twice in one folder: the second replica reuses the first one's server."""
    with serve(tmp_path, database_url=None) as a:
        assert httpx.put(f"{a.url}/v1/jobs/shared", json=JOB, timeout=10).status_code == 201
        with serve(tmp_path, database_url=None) as b:
            assert httpx.get(f"{b.url}/v1/jobs/shared", timeout=10).status_code == 200
        # b exiting must not stop the server a still uses.
        assert httpx.get(f"{a.url}/v1/jobs/shared", timeout=10).status_code == 200
    # Data outlives the processes: a fresh replica finds the job again.
    with serve(tmp_path, database_url=None) as c:
        assert httpx.get(f"{c.url}/v1/jobs/shared", timeout=10).status_code == 200
    assert c.process.returncode == 0, c.log()
    postmaster = tmp_path / "data" / "pgdata" / "postmaster.pid"
    eventually(lambda: not postmaster.exists(), 30, "the last replica to stop the embedded server")


def test_an_idle_kept_alive_connection_is_still_served(database_url: str, tmp_path: Path) -> None:
    """A client's pool (httpx: 5 s), or a load balancer's (60 s on AWS), reuses a
    connection after it idled: the replica must not close it first, or a request sent
    as it closes is lost ("Server disconnected without sending a response", seen in CI
    after a 5 s pause). The replica keeps an idle one for 65 s (service/server.py)."""
    with serve(tmp_path, database_url=database_url) as replica:
        host, port = replica.url.removeprefix("http://").split(":")
        connection = http.client.HTTPConnection(host, int(port), timeout=10)
        try:
            for pause in (0, IDLE_SECONDS):  # the idle time is what is tested
                time.sleep(pause)
                connection.request("GET", "/healthz")
                answer = connection.getresponse()  # RemoteDisconnected if it was closed
                assert (answer.status, answer.read()) == (200, b'{"status":"ok"}')
        finally:
            connection.close()
