"""Secret http headers: stored, sent, but answered as "***" and kept when sent back so."""

from typing import Any

import httpx

from harness.receiver import receiving
from harness.waiting import eventually_async


async def test_secret_headers_are_redacted_and_kept(client: httpx.AsyncClient) -> None:
    with receiving() as receiver:
        job: dict[str, Any] = {
            "name": "secretive",
            "schedule": {"kind": "cron", "expression": "0 0 1 1 *"},
            "task": "http",
            "args": {
                "url": f"{receiver.url}/hook",
                "headers": {"Authorization": "Bearer hunter2", "X-Plain": "visible"},
                "secret_headers": ["authorization"],
            },
        }
        created = (await client.post("/v1/jobs", json=job)).json()
        assert created["args"]["headers"] == {"Authorization": "***", "X-Plain": "visible"}
        shown = (await client.get("/v1/jobs/secretive")).json()
        assert "hunter2" not in str(shown)

        # A body copied from a GET changes nothing, version included.
        echoed = {key: shown[key] for key in ("schedule", "task", "args")}
        again = await client.put("/v1/jobs/secretive", json=echoed)
        assert (again.status_code, again.json()["version"]) == (200, 1)
        patched = await client.patch("/v1/jobs/secretive", json={"description": "still secret"})
        assert patched.json()["version"] == 2

        run = (await client.post("/v1/jobs/secretive/trigger")).json()

        async def delivered() -> bool:
            return bool(receiver.receipts("secretive"))

        await eventually_async(delivered, 30, "the triggered request")
        [receipt] = receiver.receipts("secretive")
        assert receipt.headers["authorization"] == "Bearer hunter2"
        final = (await client.get(f"/v1/runs/{run['id']}")).json()
        assert "hunter2" not in str(final)
