"""Optimistic concurrency on jobs: an ETag on every answer carrying a job, and If-Match
on PUT, PATCH and DELETE (412, and nothing changed, on a mismatch)."""

import asyncio
import json
from pathlib import Path
from typing import Any

import httpx

DOCUMENT: dict[str, Any] = json.loads(
    (Path(__file__).parents[2] / "openapi" / "openapi.json").read_text()
)
JOB: dict[str, Any] = {
    "name": "etagged",
    "schedule": {"kind": "cron", "expression": "0 3 1 1 *"},
    "task": "log",
    "args": {"message": "hello"},
}
URL = "/v1/jobs/etagged"


async def current_etag(client: httpx.AsyncClient) -> str:
    shown = await client.get(URL)
    assert shown.status_code == 200, shown.text
    return shown.headers["etag"]


def assert_refused(answer: httpx.Response) -> None:
    assert answer.status_code == 412, answer.text
    assert answer.headers["content-type"] == "application/problem+json"
    assert "If-Match" in answer.json()["detail"]


async def test_every_answer_with_a_job_carries_its_current_etag(
    client: httpx.AsyncClient,
) -> None:
    created = await client.post("/v1/jobs", json=JOB)
    assert created.headers["etag"] == await current_etag(client)
    changes = [
        client.patch(URL, json={"description": "changed"}),
        client.put(URL, json=JOB),
        client.post(f"{URL}/pause"),
        client.post(f"{URL}/resume"),
    ]
    etags = [created.headers["etag"]]
    for change in changes:
        answer = await change
        assert answer.status_code == 200, answer.text
        assert answer.headers["etag"] == await current_etag(client)
        etags.append(answer.headers["etag"])
    assert len(set(etags)) == len(etags)  # every change is a new revision
    unchanged = await client.put(URL, json=JOB)
    assert unchanged.headers["etag"] == etags[-1]  # an unchanged apply keeps it
    assert etags[0].startswith('"1-')


async def test_a_stale_if_match_changes_nothing(client: httpx.AsyncClient) -> None:
    read = (await client.post("/v1/jobs", json=JOB)).headers["etag"]
    assert (await client.patch(URL, json={"description": "theirs"})).status_code == 200
    mine = {"if-match": read}
    assert_refused(await client.patch(URL, json={"description": "mine"}, headers=mine))
    assert_refused(await client.put(URL, json=JOB | {"description": "mine"}, headers=mine))
    assert_refused(await client.delete(URL, headers=mine))
    weak = {"if-match": f"W/{await current_etag(client)}"}  # If-Match compares strongly
    assert_refused(await client.delete(URL, headers=weak))
    shown = (await client.get(URL)).json()
    assert (shown["description"], shown["version"]) == ("theirs", 2)


async def test_a_current_if_match_changes_the_job(client: httpx.AsyncClient) -> None:
    await client.post("/v1/jobs", json=JOB)
    listed = {"if-match": f'"0-x", {await current_etag(client)}'}
    patched = await client.patch(URL, json={"description": "mine"}, headers=listed)
    assert patched.status_code == 200, patched.text
    replaced = await client.put(URL, json=JOB, headers={"if-match": patched.headers["etag"]})
    assert replaced.status_code == 200, replaced.text
    assert (await client.put(URL, json=JOB, headers={"if-match": "*"})).status_code == 200
    deleted = await client.delete(URL, headers={"if-match": replaced.headers["etag"]})
    assert deleted.status_code == 204


async def test_if_match_never_creates_and_a_recreated_job_has_a_new_etag(
    client: httpx.AsyncClient,
) -> None:
    assert_refused(await client.put(URL, json=JOB, headers={"if-match": "*"}))
    assert (await client.get(URL)).status_code == 404
    first = (await client.post("/v1/jobs", json=JOB)).headers["etag"]
    assert (await client.delete(URL)).status_code == 204
    assert (await client.delete(URL, headers={"if-match": first})).status_code == 404
    again = (await client.post("/v1/jobs", json=JOB)).headers["etag"]
    assert again != first  # version 1 both times, but another incarnation
    assert_refused(await client.patch(URL, json={"description": "x"}, headers={"if-match": first}))


async def test_of_two_writers_holding_the_same_etag_one_wins(client: httpx.AsyncClient) -> None:
    read = {"if-match": (await client.post("/v1/jobs", json=JOB)).headers["etag"]}
    answers = await asyncio.gather(
        *(client.patch(URL, json={"description": f"writer {i}"}, headers=read) for i in range(4))
    )
    assert sorted(answer.status_code for answer in answers) == [200, 412, 412, 412]
    assert (await client.get(URL)).json()["version"] == 2


def test_the_document_declares_etag_and_if_match() -> None:
    item = DOCUMENT["paths"]["/v1/jobs/{name}"]
    for method in ("get", "put", "patch"):
        assert "ETag" in item[method]["responses"]["200"]["headers"], method
    assert "ETag" in item["put"]["responses"]["201"]["headers"]
    assert "ETag" in DOCUMENT["paths"]["/v1/jobs"]["post"]["responses"]["201"]["headers"]
    for method in ("put", "patch", "delete"):
        assert "412" in item[method]["responses"], method
        headers = [p["name"] for p in item[method]["parameters"] if p["in"] == "header"]
        assert headers == ["if-match"], method
