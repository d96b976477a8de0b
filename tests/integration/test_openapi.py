"""The committed OpenAPI document is what the app serves."""

import json
from pathlib import Path

import httpx

DOCUMENT = Path(__file__).parents[2] / "openapi" / "openapi.json"


async def test_committed_openapi_matches_the_app(client: httpx.AsyncClient) -> None:
    served = (await client.get("/openapi.json")).json()
    assert served == json.loads(DOCUMENT.read_text()), (
        "openapi/openapi.json is stale: run `.venv/bin/tickgate openapi > openapi/openapi.json`"
    )


def test_every_schema_and_operation_is_described_for_generators() -> None:
    document = json.loads(DOCUMENT.read_text())
    undescribed = [
        n for n, s in document["components"]["schemas"].items() if not s.get("description")
    ]
    assert undescribed == []
    operations = [op for path in document["paths"].values() for op in path.values()]
    assert all(op.get("description") and op.get("operationId") for op in operations)
    ids = {op["operationId"] for op in operations}
    assert {
        "create_job",
        "list_jobs",
        "get_job",
        "apply_job",
        "patch_job",
        "delete_job",
        "pause_job",
        "resume_job",
        "trigger_job",
        "list_runs",
        "get_run",
        "preview_schedule",
        "list_tasks",
        "get_health",
        "get_readiness",
    } <= ids
    create = document["paths"]["/v1/jobs"]["post"]["responses"]
    assert {"201", "409", "422", "503"} <= set(create)
    assert {"404", "409"} <= set(document["paths"]["/v1/jobs/{name}/trigger"]["post"]["responses"])
