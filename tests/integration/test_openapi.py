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
