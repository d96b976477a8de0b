"""Creating the benchmarks' jobs: through the API (one by one or in bulk), or cloned in SQL."""

import asyncio
import json
import time
from collections.abc import Mapping, Sequence
from typing import Any

import asyncpg
import httpx


async def _put_all(
    urls: Sequence[str], jobs: Sequence[Mapping[str, Any]], concurrency: int
) -> None:
    queue: asyncio.Queue[tuple[int, Mapping[str, Any]]] = asyncio.Queue()
    for item in enumerate(jobs):
        queue.put_nowait(item)
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)

    async def worker(client: httpx.AsyncClient) -> None:
        while not queue.empty():
            index, job = queue.get_nowait()
            url = f"{urls[index % len(urls)]}/v1/jobs/{job['name']}"
            response = await client.put(url, json=job)
            if response.status_code not in (200, 201):
                raise RuntimeError(f"PUT {url}: {response.status_code} {response.text[:300]}")

    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        await asyncio.gather(*(worker(client) for _ in range(concurrency)))


def put_jobs(
    urls: Sequence[str], jobs: Sequence[Mapping[str, Any]], concurrency: int = 32
) -> float:
    """PUT every job (round-robin over `urls`), `concurrency` at a time; the seconds taken."""
    began = time.monotonic()
    asyncio.run(_put_all(urls, jobs, concurrency))
    return time.monotonic() - began


def apply_jobs(url: str, jobs: Sequence[Mapping[str, Any]]) -> tuple[float, dict[str, Any]]:
    """One bulk `PUT /v1/jobs` of the whole set (one transaction): the seconds from
    sending (the JSON body encoded beforehand) to the whole answer, and the answer
    (`created`, `updated`, `unchanged`...)."""
    body = json.dumps({"jobs": list(jobs)}).encode()
    headers = {"content-type": "application/json"}
    with httpx.Client(timeout=300) as client:
        began = time.monotonic()
        response = client.put(f"{url}/v1/jobs", content=body, headers=headers)
        seconds = time.monotonic() - began
    if response.status_code != 200:
        raise RuntimeError(f"PUT {url}/v1/jobs: {response.status_code} {response.text[:300]}")
    answer: dict[str, Any] = response.json()
    return seconds, answer


def lock_key(name: str) -> int:
    """FNV-1a 64 of the UTF-8 name as a signed int64 (Tickgate's documented lock key)."""
    digest = 0xCBF29CE484222325
    for byte in name.encode():
        digest = ((digest ^ byte) * 0x100000001B3) % (1 << 64)
    return digest - (1 << 64) if digest >= 1 << 63 else digest


_CLONE = """
INSERT INTO tickgate_jobs
SELECT copied.*
FROM tickgate_jobs AS template,
     unnest($2::text[], $3::bigint[]) AS copy(name, key),
     LATERAL jsonb_populate_record(
         NULL::tickgate_jobs,
         to_jsonb(template) || jsonb_build_object('name', copy.name, 'lock_key', copy.key)
     ) AS copied
WHERE template.name = $1
"""
# The clones' cursors as the API's write leaves a job's (opened at its first tick): the
# template's, since the schedule and threshold are the same (migration 0016).
_CLONE_CURSORS = """
UPDATE tickgate_cursors AS k SET tick = template.tick, due_at = template.due_at
FROM tickgate_cursors AS template
WHERE template.job = $1 AND k.job = ANY($2::text[])
"""


async def _clone(database_url: str, template: str, names: Sequence[str]) -> None:
    connection = await asyncpg.connect(database_url, timeout=10)
    try:
        # releases before the tick cursor (migration 0014) have none to copy
        cursors = await connection.fetchval("SELECT to_regclass('tickgate_cursors') IS NOT NULL")
        for start in range(0, len(names), 20_000):
            chunk = list(names[start : start + 20_000])
            await connection.execute(_CLONE, template, chunk, [lock_key(n) for n in chunk])
            if cursors:
                await connection.execute(_CLONE_CURSORS, template, chunk)
    finally:
        await connection.close()


def clone_jobs(database_url: str, template: str, names: Sequence[str]) -> float:
    """Copy job `template`'s row (made through the API) under each of `names`, with each
    name's own lock key; every other column is the template's. The seconds taken.

    10^5 jobs through the API would take minutes on two cores; the rows are the same,
    their tick cursors too. Replicas started afterwards read them at their first sync.
    """
    began = time.monotonic()
    asyncio.run(_clone(database_url, template, names))
    return time.monotonic() - began
