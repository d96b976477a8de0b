"""What generated clients, proxies and probes rely on beyond each route's own behaviour:
the OpenAPI document declares what the server answers, and the server answers as HTTP
says (HEAD, 405 with Allow, 64-bit integers a JavaScript client can read)."""

import json
from http import HTTPStatus
from pathlib import Path
from typing import Any

import httpx
import pytest

from service.domain.names import lock_key

DOCUMENT: dict[str, Any] = json.loads(
    (Path(__file__).parents[2] / "openapi" / "openapi.json").read_text()
)
METHODS = ("get", "post", "put", "patch", "delete")
JS_SAFE_INTEGER = 2**53 - 1


def job_body(name: str) -> dict[str, Any]:
    return {
        "name": name,
        "schedule": {"kind": "cron", "expression": "0 3 1 1 *"},
        "task": "log",
        "args": {"message": "hello"},
    }


def operations() -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (path, method, operation)
        for path, item in DOCUMENT["paths"].items()
        for method, operation in item.items()
    ]


def schema(name: str) -> dict[str, Any]:
    found: dict[str, Any] = DOCUMENT["components"]["schemas"][name]
    return found


async def test_lock_key_is_a_decimal_string_a_javascript_client_reads_unrounded(
    client: httpx.AsyncClient,
) -> None:
    name = "nightly-report"
    assert abs(lock_key(name)) > JS_SAFE_INTEGER  # a double would round it
    created = await client.post("/v1/jobs", json=job_body(name))
    assert created.status_code == 201, created.text
    listed = (await client.get("/v1/jobs")).json()["items"][0]
    shown = (await client.get(f"/v1/jobs/{name}")).json()
    for body in (created.json(), listed, shown):
        assert body["lock_key"] == str(lock_key(name))
    declared = schema("JobOut")["properties"]["lock_key"]
    assert (declared["type"], declared["format"]) == ("string", "int64")


def test_no_operation_declares_an_answer_it_never_gives() -> None:
    for path, method, operation in operations():
        responses = set(operation["responses"])
        takes_input = bool(operation.get("parameters") or operation.get("requestBody"))
        assert "400" not in responses, (method, path)  # bad JSON is a 422
        assert ("422" in responses) == takes_input, (method, path)
        assert ("413" in responses) == (method != "get"), (method, path)  # BodyLimits
        assert {"401", "403"} <= responses, (method, path)  # when TICKGATE_OPEN_PATHS closes it
        for status, response in operation["responses"].items():
            if status == "201":
                assert "Location" in response["headers"], (method, path)
            if status.startswith("2") and status != "204":
                assert response["content"]["application/json"]["schema"], (method, path)


def test_the_probes_declare_their_bodies() -> None:
    for path, model in (("/readyz", "Readiness"), ("/healthz", "Health")):
        ok = DOCUMENT["paths"][path]["get"]["responses"]["200"]
        assert ok["content"]["application/json"]["schema"] == {
            "$ref": f"#/components/schemas/{model}"
        }
    assert set(schema("Readiness")["properties"]) == {"status", "checks", "tzdata"}


def test_the_document_names_its_server_and_license() -> None:
    assert DOCUMENT["servers"] == [{"url": "/", "description": "This server."}]
    assert DOCUMENT["info"]["license"] == {"name": "MIT", "identifier": "MIT"}


@pytest.mark.parametrize(
    ("request_args", "loc"),
    [
        ({"method": "POST", "url": "/v1/jobs", "content": b"{"}, ["body", 1]),
        ({"method": "GET", "url": "/v1/jobs", "params": {"limit": 0}}, ["query", "limit"]),
        ({"method": "POST", "url": "/v1/jobs", "json": []}, ["body"]),
        ({"method": "POST", "url": "/v1/jobs", "content": b"[" * 40}, ["body"]),  # BodyLimits
        ({"method": "PATCH", "url": "/v1/jobs/x", "content": b'{"\xff": 1}'}, ["body"]),
    ],
)
async def test_every_422_has_the_declared_shape(
    client: httpx.AsyncClient, request_args: dict[str, Any], loc: list[str | int]
) -> None:
    headers = {"content-type": "application/json"}
    answer = await client.request(**request_args, headers=headers)
    assert answer.status_code == 422, answer.text
    assert answer.headers["content-type"] == "application/problem+json"
    declared, field = schema("ValidationProblem"), schema("FieldError")
    assert declared["additionalProperties"] is field["additionalProperties"] is False
    body = answer.json()
    assert set(body) == set(declared["required"]) == set(declared["properties"])
    assert (body["type"], body["status"]) == ("about:blank", 422)
    assert body["title"] == HTTPStatus(422).phrase
    [sent] = body["errors"]
    assert set(field["required"]) <= set(sent) <= set(field["properties"])
    assert sent["loc"] == loc
    assert body["detail"].startswith(".".join(map(str, loc)) + ": ")


async def test_every_error_is_a_problem_document(client: httpx.AsyncClient) -> None:
    """RFC 9457, as declared: 404, 405, 409 and 413 alike."""
    assert (await client.post("/v1/jobs", json=job_body("taken"))).status_code == 201
    answers = {
        404: await client.get("/v1/jobs/nobody"),
        405: await client.delete("/v1/jobs"),
        409: await client.post("/v1/jobs", json=job_body("taken")),
        413: await client.post("/v1/jobs", content=b" " * (2**20 + 1)),
    }
    for status, answer in answers.items():
        assert answer.status_code == status, answer.text
        assert answer.headers["content-type"] == "application/problem+json"
        body = answer.json()
        assert set(body) == set(schema("ProblemDetails")["required"])
        assert (body["type"], body["status"]) == ("about:blank", status)
        assert body["title"] == HTTPStatus(status).phrase
    assert "already exists" in answers[409].json()["detail"]
    for path, method, operation in operations():
        for status, response in operation["responses"].items():
            if int(status) >= 400:
                assert list(response["content"]) == ["application/problem+json"], (path, method)


def concrete(path: str) -> str:
    return path.replace("{name}", "some-job").replace(
        "{run_id}", "00000000-0000-4000-8000-000000000000"
    )


@pytest.mark.parametrize("path", sorted(DOCUMENT["paths"]))
async def test_a_405_allows_every_method_of_the_path(client: httpx.AsyncClient, path: str) -> None:
    served = {method.upper() for method in DOCUMENT["paths"][path]}
    unserved = next(m for m in METHODS if m.upper() not in served)
    answer = await client.request(unserved, concrete(path))
    assert answer.status_code == 405, answer.text
    expected = served | ({"HEAD"} if "GET" in served else set())
    assert set(answer.headers["allow"].split(", ")) == expected


@pytest.mark.parametrize("path", ["/healthz", "/readyz", "/metrics", "/v1/jobs"])
async def test_head_answers_as_get_without_a_body(client: httpx.AsyncClient, path: str) -> None:
    got = await client.get(path)
    head = await client.head(path)
    assert (head.status_code, head.content) == (got.status_code, b"")
    assert head.headers["content-type"] == got.headers["content-type"]


async def test_metrics_export_no_created_series(client: httpx.AsyncClient) -> None:
    created = await client.post("/v1/jobs", json=job_body("counted"))
    assert created.status_code == 201
    assert (await client.post("/v1/jobs/counted/trigger")).status_code == 202
    text = (await client.get("/metrics")).text
    assert "tickgate_runs_total" in text or "tickgate_ticks_skipped" in text
    assert "_created" not in text
