"""The OpenAPI document's request examples work as sent, PATCH declares RFC 7396's media
type, and each operation names the token scope it needs."""

import json
from pathlib import Path
from typing import Any

import httpx

DOCUMENT: dict[str, Any] = json.loads(
    (Path(__file__).parents[2] / "openapi" / "openapi.json").read_text()
)
MERGE_PATCH = "application/merge-patch+json"


def resolved(schema: dict[str, Any]) -> dict[str, Any]:
    """The schema a body's `$ref` names, also inside an optional body's anyOf."""
    refs = [s for s in schema.get("anyOf", []) if "$ref" in s]
    schema = refs[0] if refs else schema
    if "$ref" not in schema:
        return schema
    found: dict[str, Any] = DOCUMENT["components"]["schemas"][schema["$ref"].split("/")[-1]]
    return found


def example(path: str, method: str, media: str = "application/json") -> Any:
    body = DOCUMENT["paths"][path][method]["requestBody"]["content"][media]
    return resolved(body["schema"])["examples"][0]


def test_every_request_body_has_an_example() -> None:
    for path, item in DOCUMENT["paths"].items():
        for method, operation in item.items():
            for media, content in operation.get("requestBody", {}).get("content", {}).items():
                assert resolved(content["schema"]).get("examples"), (method, path, media)


async def test_every_request_example_is_accepted(client: httpx.AsyncClient) -> None:
    job = example("/v1/jobs", "post")
    url = f"/v1/jobs/{job['name']}"
    sent = [
        ("PUT", "/v1/jobs", example("/v1/jobs", "put"), 200),
        ("PUT", url, example("/v1/jobs/{name}", "put"), 200),
        ("PATCH", url, example("/v1/jobs/{name}", "patch"), 200),
        ("POST", f"{url}/pause", example("/v1/jobs/{name}/pause", "post"), 200),
        ("POST", f"{url}/resume", None, 200),
        ("POST", f"{url}/backfill", example("/v1/jobs/{name}/backfill", "post"), 200),
        ("POST", "/v1/schedules/preview", example("/v1/schedules/preview", "post"), 200),
        ("DELETE", url, None, 204),
        ("POST", "/v1/jobs", job, 201),
    ]
    for method, target, body, status in sent:
        answer = await client.request(method, target, json=body)
        assert answer.status_code == status, (method, target, answer.text)


async def test_patch_takes_application_merge_patch_json(client: httpx.AsyncClient) -> None:
    content = DOCUMENT["paths"]["/v1/jobs/{name}"]["patch"]["requestBody"]["content"]
    assert content[MERGE_PATCH]["schema"]["type"] == "object"
    assert (
        content[MERGE_PATCH]["schema"]["examples"]
        == content["application/json"]["schema"]["examples"]
    )
    job = example("/v1/jobs", "post")
    assert (await client.post("/v1/jobs", json=job)).status_code == 201
    patch = json.dumps(example("/v1/jobs/{name}", "patch", MERGE_PATCH)).encode()
    answer = await client.patch(
        f"/v1/jobs/{job['name']}", content=patch, headers={"content-type": MERGE_PATCH}
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["timeout_seconds"] == 120


def test_each_operation_names_the_scope_it_needs() -> None:
    assert DOCUMENT["components"]["securitySchemes"]["bearer"]["scheme"] == "bearer"
    for path, item in DOCUMENT["paths"].items():
        for method, operation in item.items():
            scope = "read" if method == "get" else "write"
            assert operation["security"] == [{"bearer": [scope]}, {}], (method, path)
