"""Bearer tokens with scopes, and request-body limits."""

import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from uuid import uuid4

import httpx
import pytest

from service.app import create_app
from service.config import Settings, TokenFileError

TOKENS = {"s3cret-w": ["read", "write"], "s3cret-r": ["read"]}
JOB = {
    "name": "guarded",
    "schedule": {"kind": "cron", "expression": "0 0 1 1 *"},
    "task": "log",
    "args": {"message": "x"},
}


@pytest.fixture
async def guarded(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    app = create_app(settings.model_copy(update={"api_tokens": TOKENS}))
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://localhost") as http,
    ):
        yield http


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


async def test_requests_without_a_known_token_are_401(guarded: httpx.AsyncClient) -> None:
    for headers in ({}, bearer("wrong"), {"authorization": "Basic czNjcmV0LXc="}):
        response = await guarded.get("/v1/jobs", headers=headers)
        assert response.status_code == 401
        assert response.headers["www-authenticate"] == "Bearer"
        assert response.headers["content-type"] == "application/problem+json"
        assert response.json() == {
            "type": "about:blank",
            "title": "Unauthorized",
            "status": 401,
            "detail": "a bearer token is required",
        }


async def test_scopes_decide_what_a_token_may_do(guarded: httpx.AsyncClient) -> None:
    assert (await guarded.get("/v1/jobs", headers=bearer("s3cret-r"))).status_code == 200
    denied = await guarded.post("/v1/jobs", json=JOB, headers=bearer("s3cret-r"))
    assert denied.status_code == 403
    assert "write" in denied.json()["detail"]
    assert (await guarded.get("/v1/jobs/guarded", headers=bearer("s3cret-r"))).status_code == 404
    created = await guarded.post("/v1/jobs", json=JOB, headers=bearer("s3cret-w"))
    assert created.status_code == 201
    assert (await guarded.get("/v1/jobs/guarded", headers=bearer("s3cret-r"))).status_code == 200


async def test_probes_and_metrics_stay_open(guarded: httpx.AsyncClient) -> None:
    for path in ("/healthz", "/readyz", "/metrics"):
        assert (await guarded.get(path)).status_code == 200, path


async def test_tokens_come_from_a_mounted_file(settings: Settings, tmp_path: Path) -> None:
    mounted = tmp_path / "tokens.json"
    mounted.write_text(json.dumps({"from-file": ["read"]}))
    app = create_app(settings.model_copy(update={"api_tokens_file": mounted}))
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://localhost") as http,
    ):
        assert (await http.get("/v1/jobs", headers=bearer("from-file"))).status_code == 200
        assert (await http.get("/v1/jobs")).status_code == 401
    mounted.write_text(json.dumps({"bad": ["admin"]}))
    with pytest.raises(TokenFileError):
        create_app(settings.model_copy(update={"api_tokens_file": mounted}))


async def test_bodies_over_the_limit_are_413(client: httpx.AsyncClient) -> None:
    big = JOB | {"description": "x" * (1024 * 1024)}
    response = await client.post("/v1/jobs", json=big)
    assert response.status_code == 413

    async def streamed() -> AsyncIterator[bytes]:
        for _ in range(20):
            yield b" " * 65536  # no content-length: counted while it arrives

    chunked = await client.post(
        "/v1/jobs", content=streamed(), headers={"content-type": "application/json"}
    )
    assert chunked.status_code == 413
    assert (await client.get("/v1/jobs")).json()["items"] == []


async def test_a_body_sent_as_something_else_than_json_is_415_naming_the_fix(
    client: httpx.AsyncClient,
) -> None:
    body = json.dumps(JOB).encode()
    for media in ("application/x-www-form-urlencoded", "text/plain", "application/xml", None):
        headers = {"content-type": media} if media else {}
        answer = await client.post("/v1/jobs", content=body, headers=headers)
        assert answer.status_code == 415, media
        assert answer.headers["content-type"] == "application/problem+json"
        assert "application/json" in answer.json()["detail"]
    assert (await client.get("/v1/jobs")).json()["items"] == []

    for media in ("application/json; charset=utf-8", "Application/JSON"):
        headers = {"content-type": media}
        made = await client.put(f"/v1/jobs/{JOB['name']}", content=body, headers=headers)
        assert made.status_code in {200, 201}, (media, made.text)
    merge = {"content-type": "application/merge-patch+json"}
    patched = await client.patch(
        f"/v1/jobs/{JOB['name']}", content=b'{"description": "m"}', headers=merge
    )
    assert patched.json()["description"] == "m"
    # A write with no body needs no type; one that declares a type other than JSON is a
    # 415 even without a body: a plain cross-site form post (#42) changes nothing.
    form = {"content-type": "application/x-www-form-urlencoded"}
    refused = await client.post(f"/v1/jobs/{JOB['name']}/pause", headers=form)
    assert refused.status_code == 415, refused.text
    assert (await client.get(f"/v1/jobs/{JOB['name']}")).json()["state"] == "active"
    paused = await client.post(f"/v1/jobs/{JOB['name']}/pause")
    assert paused.status_code == 200, paused.text


async def test_deeply_nested_json_is_422_not_a_crash(client: httpx.AsyncClient) -> None:
    deep = JOB | {"args": {"message": "x", "nest": json.loads("[" * 40 + "]" * 40)}}
    response = await client.post("/v1/jobs", json=deep)
    assert response.status_code == 422
    assert "nested" in response.json()["errors"][0]["msg"]
    hostile = b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    crash = await client.post(
        "/v1/jobs", content=hostile, headers={"content-type": "application/json"}
    )
    assert crash.status_code == 422


def test_serve_refuses_a_public_address_without_tokens(tmp_path: Path) -> None:
    tickgate = str(Path(sys.executable).with_name("tickgate"))
    result = subprocess.run(
        [tickgate, "serve", "--host", "0.0.0.0", "--port", "1"],
        env={
            "DATABASE_URL": "postgresql://unused@127.0.0.1:1/x",
            "PATH": "/usr/bin:/bin",
            "TICKGATE_LOG_FORMAT": "text",
        },
        capture_output=True,
        text=True,
        timeout=60,
        cwd=tmp_path,
        check=False,
    )
    assert result.returncode == 2
    assert "refusing to serve on 0.0.0.0 without API tokens" in result.stderr


@pytest.mark.parametrize("escaped", ["\\u0000", "\\udb68", "\\ude01x", "\\udb68\\udb68"], ids=repr)
async def test_a_string_postgresql_cannot_store_is_422_and_changes_nothing(
    client: httpx.AsyncClient, escaped: str
) -> None:
    """A NUL or half a surrogate pair is valid JSON but no text PostgreSQL stores: the
    write that met one failed with a 500 (the fuzzer's cancel `reason`). Anywhere in a
    body, a key included, it is a 422 that names it; a whole pair is text like any."""
    created = await client.post("/v1/jobs", json=JOB)
    assert created.status_code == 201, created.text
    version = created.json()["version"]
    bodies = [
        ("POST", f"/v1/jobs/{JOB['name']}/pause", '{"note": "%s"}'),
        ("PATCH", f"/v1/jobs/{JOB['name']}", '{"description": "%s"}'),
        ("POST", "/v1/jobs", '{"name": "other", "labels": {"%s": "x"}}'),
        ("POST", f"/v1/runs/{uuid4()}/cancel", '{"reason": "%s", "by": "me"}'),
    ]
    for method, path, body in bodies:
        answer = await client.request(
            method, path, content=body % escaped, headers={"content-type": "application/json"}
        )
        assert answer.status_code == 422, (path, answer.text)
        assert "NUL character" in answer.json()["errors"][0]["msg"], answer.text
    stored = (await client.get(f"/v1/jobs/{JOB['name']}")).json()
    assert (stored["version"], stored["state"]) == (version, "active")
    pair = await client.patch(
        f"/v1/jobs/{JOB['name']}",
        content='{"description": "\\ud83d\\ude00"}',
        headers={"content-type": "application/merge-patch+json"},
    )
    assert pair.status_code == 200, pair.text
    assert pair.json()["description"] == "\U0001f600"
