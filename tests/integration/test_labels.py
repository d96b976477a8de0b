"""Labels on jobs: stored and shown, listed by selector, and the scope of a pruning
bulk apply, against a real PostgreSQL."""

from typing import Any

import httpx

from tests.integration.test_bulk_apply import apply, counts, job, problems, stored


async def names(client: httpx.AsyncClient, *selectors: str, **params: str) -> list[str]:
    query = [("label", selector) for selector in selectors] + list(params.items())
    response = await client.get("/v1/jobs", params=query)
    assert response.status_code == 200, response.text
    return [item["name"] for item in response.json()["items"]]


async def test_labels_are_kept_shown_and_changed_like_any_declared_field(
    client: httpx.AsyncClient,
) -> None:
    made = await client.post("/v1/jobs", json=job("billing", labels={"team": "billing"}))
    assert made.status_code == 201, made.text
    assert made.json()["labels"] == {"team": "billing"}
    assert (await client.get("/v1/jobs/billing")).json()["labels"] == {"team": "billing"}

    patched = await client.patch("/v1/jobs/billing", json={"labels": {"tier": "gold"}})
    assert patched.json()["labels"] == {"team": "billing", "tier": "gold"}  # a merge patch
    assert patched.json()["version"] == 2
    removed = await client.patch("/v1/jobs/billing", json={"labels": {"team": None}})
    assert removed.json()["labels"] == {"tier": "gold"}
    replaced = await client.put("/v1/jobs/billing", json=job("billing"))
    assert replaced.json()["labels"] == {}  # PUT without them clears them


async def test_listing_by_labels_needs_every_one_and_pages(client: httpx.AsyncClient) -> None:
    await apply(
        client,
        job("a", labels={"team": "billing", "env": "prod"}),
        job("b", labels={"team": "billing", "env": "dev"}),
        job("c", labels={"team": "search", "env": "prod"}),
        job("d"),
    )
    assert await names(client, "team=billing") == ["a", "b"]
    assert await names(client, "team=billing", "env=prod") == ["a"]
    assert await names(client, "env=prod", state="active") == ["a", "c"]
    assert await names(client, "team=nobody") == []
    assert await names(client) == ["a", "b", "c", "d"]

    first = (await client.get("/v1/jobs", params={"label": "env=prod", "limit": 1})).json()
    assert [item["name"] for item in first["items"]] == ["a"]
    params = {"label": "env=prod", "limit": "1", "cursor": first["next_cursor"]}
    second = (await client.get("/v1/jobs", params=params)).json()
    assert [item["name"] for item in second["items"]] == ["c"]
    assert second["next_cursor"] is None


async def test_bad_labels_and_selectors_are_422s_naming_them(client: httpx.AsyncClient) -> None:
    bad: list[dict[str, Any]] = [
        {"bad key": "x"},
        {"team": "has space"},
        {"k": "v" * 64},
        {f"k{n}": "v" for n in range(65)},
    ]
    for labels in bad:
        answer = await client.post("/v1/jobs", json=job("x", labels=labels))
        assert answer.status_code == 422, labels
        assert answer.json()["detail"][0]["loc"][:2] == ["body", "labels"], answer.text
    for selector in ("team", "=billing", "team=bill ing"):
        answer = await client.get("/v1/jobs", params={"label": selector})
        assert answer.status_code == 422, selector
        assert answer.json()["detail"][0]["loc"][:2] == ["query", "label"], answer.text
    twice = await client.get("/v1/jobs", params=[("label", "team=a"), ("label", "team=b")])
    assert twice.status_code == 422
    assert "two values" in twice.json()["detail"][0]["msg"]


async def test_a_prune_scoped_by_a_label_deletes_only_the_labelled_jobs_it_omits(
    client: httpx.AsyncClient,
) -> None:
    billing = {"team": "billing"}
    await apply(
        client,
        job("keep", labels=billing),
        job("drop", labels=billing),
        job("other-team", labels={"team": "search"}),
        job("no-labels"),
    )
    result = await apply(client, job("keep", labels=billing), label="team=billing", prune="true")
    assert counts(result) == (0, 0, 1, 1)
    assert result["outcomes"] == {"keep": "unchanged", "drop": "deleted"}
    assert sorted(await stored(client)) == ["keep", "no-labels", "other-team"]


async def test_a_manager_and_a_label_together_narrow_the_prune(client: httpx.AsyncClient) -> None:
    await apply(client, job("ops-prod", labels={"env": "prod"}), managed_by="ops")
    await apply(client, job("ops-dev", labels={"env": "dev"}), managed_by="ops")
    await apply(client, job("web-prod", labels={"env": "prod"}), managed_by="web")

    result = await apply(client, managed_by="ops", label="env=prod", prune="true")
    assert result["outcomes"] == {"ops-prod": "deleted"}
    assert sorted(await stored(client)) == ["ops-dev", "web-prod"]


async def test_a_prune_with_neither_manager_nor_label_is_still_refused(
    client: httpx.AsyncClient,
) -> None:
    await apply(client, job("x", labels={"team": "a"}))
    detail = await problems(client, prune="true")
    assert [p["loc"] for p in detail] == [["query", "prune"]]
    assert "a label" in detail[0]["msg"]
    assert sorted(await stored(client)) == ["x"]
