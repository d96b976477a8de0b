"""The dashboard's pages and assets: served from the package, open without a token,
under a same-origin Content-Security-Policy; and the API fields it relies on
(GET /v1/whoami, schedule_text)."""

import re
from collections.abc import AsyncIterator

import httpx
import pytest

from service.config import Settings
from tests.integration.test_api_docs import referenced, served_with

READ, WRITE = "s3cret-r", "s3cret-rw"
TOKENS = {READ: ["read"], WRITE: ["read", "write"]}


@pytest.fixture
async def guarded(settings: Settings) -> AsyncIterator[httpx.AsyncClient]:
    async for http in served_with(settings, api_tokens=TOKENS):
        yield http


async def test_root_redirects_to_the_dashboard_without_a_token(
    guarded: httpx.AsyncClient,
) -> None:
    for path in ("/", "/ui"):
        response = await guarded.get(path)
        assert response.status_code == 307, path
        assert response.headers["location"] == "/ui/"


async def test_pages_and_their_assets_load_without_a_token_from_this_origin_only(
    guarded: httpx.AsyncClient,
) -> None:
    for path in ("/ui/", "/ui/jobs/some-job", "/ui/runs", "/ui/cluster"):
        page = await guarded.get(path)
        assert page.status_code == 200, path
        policy = page.headers["content-security-policy"]
        assert "default-src 'self'" in policy
        assert "script-src 'self'" in policy
        assert "unsafe-inline" not in policy
        assert re.search("https?://", page.text) is None
        assert "<script>" not in page.text  # the policy forbids inline scripts
        urls = referenced(page.text)
        assert any(url.endswith(".js") for url in urls), urls
        for url in urls:
            assert re.match("/[^/]", url), url
            asset = await guarded.get(url)
            assert asset.status_code == 200, url
            if url.startswith("/ui/"):
                assert asset.headers["content-security-policy"] == policy
    assert "some-job" in (await guarded.get("/ui/jobs/some-job")).text


async def test_an_open_root_opens_only_itself(guarded: httpx.AsyncClient) -> None:
    assert (await guarded.get("/v1/jobs")).status_code == 401
    assert (await guarded.get("/v1/whoami")).status_code == 401
    assert (await guarded.get("/ui/../v1/jobs")).status_code in (401, 404)


async def test_whoami_answers_the_tokens_scopes(guarded: httpx.AsyncClient) -> None:
    read = await guarded.get("/v1/whoami", headers={"Authorization": f"Bearer {READ}"})
    assert read.json() == {"scopes": ["read"], "tokens_required": True}
    write = await guarded.get("/v1/whoami", headers={"Authorization": f"Bearer {WRITE}"})
    assert write.json() == {"scopes": ["read", "write"], "tokens_required": True}


async def test_whoami_without_tokens_configured_grants_both(client: httpx.AsyncClient) -> None:
    answer = await client.get("/v1/whoami")
    assert answer.json() == {"scopes": ["read", "write"], "tokens_required": False}


@pytest.mark.parametrize(
    ("schedule", "text"),
    [
        ({"kind": "cron", "expression": "*/5 * * * *"}, "Every 5 minutes"),
        ({"kind": "cron", "expression": "@hourly"}, "Every hour"),
        ({"kind": "interval", "every_seconds": 90}, "Every 90 seconds"),
        ({"kind": "interval", "every_seconds": 7200}, "Every 2 hours"),
        ({"kind": "daily", "at": ["09:30", "18:00"]}, "Every day at 09:30, 18:00"),
        ({"kind": "daily", "every_days": 2, "at": ["06:00:15"]}, "Every 2 days at 06:00:15"),
    ],
)
async def test_jobs_say_their_schedule_in_words(
    client: httpx.AsyncClient, schedule: dict[str, object], text: str
) -> None:
    job = {"name": "worded", "schedule": schedule, "task": "log", "args": {"message": "x"}}
    created = await client.post("/v1/jobs", json=job)
    assert created.status_code == 201, created.text
    assert created.json()["schedule_text"] == text
    listed = (await client.get("/v1/jobs", params={"prefix": "worded"})).json()["items"]
    assert [item["schedule_text"] for item in listed] == [text]
