"""Tokens for the target: the http task's OAuth 2.0 client-credentials grant end to end,
against a loopback token endpoint that counts its requests and the loopback receiver."""

import base64
import json
import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs

import httpx
import pytest
from aiohttp import web

from harness.receiver import Receiver
from service.config import Settings
from service.tasks.oauth import OAuthSecrets, OAuthSecretsError
from tests.support.inprocess import served, triggered_run

NEVER = {"kind": "cron", "expression": "0 0 1 1 *"}
SECRET = "s3cr3t-client-secret"


@dataclass
class TokenEndpoint:
    """Answers each client-credentials grant with a new token, `tok-<n>`, or with
    `status` and `body`; keeps every grant's form and Authorization."""

    status: int = 200
    body: str | None = None
    grants: list[dict[str, Any]] = field(default_factory=list)
    url: str = ""

    async def handle(self, request: web.Request) -> web.Response:
        form = parse_qs((await request.read()).decode())
        self.grants.append({"form": form, "authorization": request.headers.get("Authorization")})
        if self.status != 200:
            return web.Response(status=self.status, text=self.body or "")
        token = f"tok-{len(self.grants)}"
        return web.json_response(
            {"access_token": token, "token_type": "Bearer", "expires_in": 3600}
        )


@asynccontextmanager
async def token_endpoint(**kwargs: Any) -> AsyncIterator[TokenEndpoint]:
    endpoint = TokenEndpoint(**kwargs)
    app = web.Application()
    app.router.add_post("/token", endpoint.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    endpoint.url = f"http://127.0.0.1:{port}/token"
    try:
        yield endpoint
    finally:
        await runner.cleanup()


@pytest.fixture
def secrets_for(tmp_path: Path) -> Callable[[str], Path]:
    """The operator's file, its one client secret bound to `token_url`."""

    def written(token_url: str) -> Path:
        path = tmp_path / "oauth-secrets.json"
        entry = {"secret": SECRET, "token_url": token_url}
        path.write_text(json.dumps({"reports-client": entry}))
        return path

    return written


def oauth(token_url: str, **extra: str) -> dict[str, str]:
    return {
        "token_url": token_url,
        "client_id": "tickgate reports",
        "client_secret": "reports-client",
        "scope": "reports.write",
    } | extra


async def create(client: httpx.AsyncClient, name: str, url: str, **args: Any) -> httpx.Response:
    job = {"name": name, "schedule": NEVER, "task": "http", "args": {"url": url, **args}}
    return await client.post("/v1/jobs", json=job)


async def test_one_token_serves_many_runs_and_a_401_fetches_one_anew(
    settings: Settings,
    receiver: Receiver,
    secrets_for: Callable[[str], Path],
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Three runs share one grant (client id and secret as HTTP Basic, the scope in the
    form); the target sees `Bearer tok-1`. The target then refuses a run with 401: the
    run fetches one new token and succeeds with it, and later runs keep the new one.
    No answer of the API and no log line shows the secret or a token."""
    caplog.set_level(logging.DEBUG)
    async with (
        token_endpoint() as endpoint,
        served(configured(settings, secrets_for, endpoint)) as client,
    ):
        made = await create(client, "reports", f"{receiver.url}/reports", oauth=oauth(endpoint.url))
        assert made.status_code == 201, made.text
        runs = [await triggered_run(client, "reports") for _ in range(3)]
        receiver.fail_first("/reports", 1, status=401)
        runs += [await triggered_run(client, "reports") for _ in range(2)]
        shown = (await client.get("/v1/jobs/reports")).text + json.dumps(runs)
    assert [run["status"] for run in runs] == ["succeeded"] * 5
    assert len(endpoint.grants) == 2
    basic = base64.b64encode(b"tickgate+reports:" + SECRET.encode()).decode()
    for grant in endpoint.grants:
        assert grant["authorization"] == f"Basic {basic}"
        assert grant["form"] == {
            "grant_type": ["client_credentials"],
            "scope": ["reports.write"],
        }
    bearers = [receipt.headers["authorization"] for receipt in receiver.receipts()]
    assert bearers == ["Bearer tok-1"] * 4 + ["Bearer tok-2"] * 2  # the 401, then again
    for secret in (SECRET, "tok-1", "tok-2"):
        assert secret not in shown
        assert secret not in caplog.text


async def test_a_refusing_token_endpoint_fails_the_attempt_with_its_status_and_body(
    settings: Settings, receiver: Receiver, secrets_for: Callable[[str], Path]
) -> None:
    body = '{"error": "invalid_client"}' + " " * 2000
    async with (
        token_endpoint(status=400, body=body) as endpoint,
        served(configured(settings, secrets_for, endpoint)) as client,
    ):
        made = await create(client, "denied", f"{receiver.url}/denied", oauth=oauth(endpoint.url))
        assert made.status_code == 201, made.text
        run = await triggered_run(client, "denied")
    assert run["status"] == "failed"
    said = f'token endpoint {endpoint.url} answered HTTP 400: {{"error": "invalid_client"}}'
    assert run["error"].startswith(f"HttpTaskError: {said}"), run["error"]
    assert len(run["error"]) < 700  # the body is capped
    assert receiver.receipts() == []  # the target was never called without a token


async def test_what_a_job_names_is_checked_when_it_is_written(
    settings: Settings, secrets_for: Callable[[str], Path]
) -> None:
    """An unknown client secret name, a token URL other than the one the operator bound
    the secret to, and a token endpoint at a private address the allowlist does not open,
    are 422s naming the field; a metadata address is refused by the args model itself.
    None lists the names the operator configured."""
    bound = "http://10.1.2.3/token"
    path = secrets_for(bound)
    cases = [
        (oauth(bound, client_secret="nope"), "client_secret"),
        (oauth("https://auth.example.test/token"), "token_url"),
        (oauth(bound), "token_url"),
        (oauth("http://169.254.169.254/token"), "token_url"),
    ]
    async with served(settings.model_copy(update={"oauth_secrets_file": path})) as client:
        for index, (grant, named) in enumerate(cases):
            refused = await create(client, f"bad-{index}", "https://example.test/x", oauth=grant)
            assert refused.status_code == 422, refused.text
            [problem] = refused.json()["errors"]
            assert problem["loc"][:4] == ["body", "args", "oauth", named], problem
            assert "reports-client" not in refused.text or "reports-client" in json.dumps(grant)


def configured(
    settings: Settings, secrets_for: Callable[[str], Path], endpoint: TokenEndpoint
) -> Settings:
    return settings.model_copy(update={"oauth_secrets_file": secrets_for(endpoint.url)})


@pytest.mark.parametrize(
    ("document", "said"),
    [
        ({"reports-client": "a-bare-secret"}, "is a bare secret"),
        ({"reports-client": {"secret": "s"}}, "is malformed (token_url)"),
        (["not", "an", "object"], "expected a JSON object"),
    ],
)
def test_a_secrets_file_of_the_old_form_stops_startup_saying_what_to_add(
    tmp_path: Path, document: object, said: str
) -> None:
    """Since #42 each client secret names the token URL it may be sent to: a file
    without them is refused, saying what to write, and never showing a secret."""
    path = tmp_path / "oauth.json"
    path.write_text(json.dumps(document))
    with pytest.raises(OAuthSecretsError) as refused:
        OAuthSecrets.load(path)
    assert said in str(refused.value)
    assert '"token_url": "https://<issuer>/token"' in str(refused.value)
    assert "a-bare-secret" not in str(refused.value)
