"""GET /v1/cluster: the live replicas (membership rows whose lock is held) and the overdue
count of the last check, against real PostgreSQL with real memberships."""

from datetime import UTC, datetime, timedelta

import httpx

from service.domain.ownership import Heartbeat
from service.store import Store
from service.store.members import MemberSession
from tests.integration.test_all_runs_api import add_jobs


async def test_the_cluster_lists_the_live_replicas_and_the_overdue_count(
    client: httpx.AsyncClient, store: Store, database_url: str
) -> None:
    first = await MemberSession.join(database_url, "replica-a", "1.2.3", "2025b")
    second = await MemberSession.join(database_url, "replica-b", "1.2.4", "2025c")
    gone = await MemberSession.join(database_url, "replica-gone", "1.2.3", "2025b")
    try:
        await gone.close()  # its row stays, but its lock went with the connection
        synced = datetime.now(UTC) - timedelta(seconds=30)
        await second.heartbeat(Heartbeat(runs_in_flight=3, last_sync=synced))
        await add_jobs(client, "late-one", "late-two")
        await store.file_overdue([("late-one", synced), ("late-two", synced)])

        answer = await client.get("/v1/cluster")
        assert answer.status_code == 200, answer.text
        cluster = answer.json()
        members = cluster["members"]
        assert [m["runner_id"] for m in members] == ["replica-a", "replica-b"]
        a, b = members
        assert (a["version"], a["tzdata"], a["runs_in_flight"]) == ("1.2.3", "2025b", 0)
        assert (a["last_sync"], a["last_sync_age_seconds"]) == (None, None)
        assert (b["version"], b["tzdata"], b["runs_in_flight"]) == ("1.2.4", "2025c", 3)
        assert datetime.fromisoformat(b["last_sync"]) == synced
        assert 29 <= b["last_sync_age_seconds"] < 600
        for member in members:
            assert 0 <= member["heartbeat_age_seconds"] < 600
            assert datetime.fromisoformat(member["started_at"]) <= datetime.fromisoformat(
                cluster["as_of"]
            )
        assert cluster["overdue"]["count"] == 2
        assert cluster["overdue"]["checked_at"] is not None
    finally:
        await first.close()
        await second.close()


async def test_a_cluster_never_checked_says_so(client: httpx.AsyncClient) -> None:
    cluster = (await client.get("/v1/cluster")).json()
    assert cluster["members"] == []  # the in-process app runs no scheduler
    assert cluster["overdue"] == {"count": 0, "checked_at": None}
