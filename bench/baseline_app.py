"""The bare baseline for the api scenario: FastAPI + asyncpg, nothing else.

`python -m bench.baseline_app --host 127.0.0.1 --port P` with `DATABASE_URL` set serves:

- `POST /v1/jobs`: one `INSERT` of the JSON body (its `name` is the key), 201 or 409;
- `GET /v1/jobs/{name}`: one `SELECT` by key, 200 or 404;
- `GET /v1/jobs?limit=100`: one `SELECT ... ORDER BY name LIMIT n` (so each of Tickgate's
  three measured endpoints has a bare counterpart).

Same server settings as `tickgate serve`: one uvicorn process with its defaults (uvloop
and httptools from uvicorn[standard]), `log_config=None`, an asyncpg pool of 10 (Tickgate's
`TICKGATE_API_POOL_SIZE` default). What Tickgate adds on top (validation, schedule math,
the NOTIFY to the replicas, the run summary on reads) is the difference measured.
"""

import argparse
import json
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Annotated, Any

import asyncpg
import uvicorn
from fastapi import FastAPI, HTTPException, Query, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

POOL_SIZE = 10
_SCHEMA = """
CREATE TABLE IF NOT EXISTS baseline_jobs (
    name       text COLLATE "C" PRIMARY KEY,
    body       jsonb NOT NULL,
    created_at timestamptz NOT NULL DEFAULT now()
)
"""


class JobIn(BaseModel):
    model_config = ConfigDict(extra="allow")

    name: str = Field(min_length=1, max_length=128)


def _row(record: asyncpg.Record) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(record["body"])
    return {"name": record["name"], **body, "created_at": record["created_at"].isoformat()}


def create_app(dsn: str) -> FastAPI:
    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        pool = await asyncpg.create_pool(dsn, min_size=1, max_size=POOL_SIZE)
        await pool.execute(_SCHEMA)
        app.state.pool = pool
        yield
        await pool.close()

    app = FastAPI(title="baseline", lifespan=lifespan)

    @app.post("/v1/jobs", status_code=201)
    async def create(job: JobIn, request: Request) -> dict[str, Any]:
        body = json.dumps(job.model_dump(exclude={"name"}))
        record = await request.app.state.pool.fetchrow(
            "INSERT INTO baseline_jobs (name, body) VALUES ($1, $2) "
            "ON CONFLICT DO NOTHING RETURNING name, body::text AS body, created_at",
            job.name,
            body,
        )
        if record is None:
            raise HTTPException(409, f"{job.name!r} exists")
        return _row(record)

    @app.get("/v1/jobs/{name}")
    async def read(name: str, request: Request) -> dict[str, Any]:
        record = await request.app.state.pool.fetchrow(
            "SELECT name, body::text AS body, created_at FROM baseline_jobs WHERE name = $1", name
        )
        if record is None:
            raise HTTPException(404, f"no job named {name!r}")
        return _row(record)

    @app.get("/v1/jobs")
    async def listing(
        request: Request, limit: Annotated[int, Query(ge=1, le=1000)] = 100
    ) -> JSONResponse:
        records = await request.app.state.pool.fetch(
            "SELECT name, body::text AS body, created_at FROM baseline_jobs ORDER BY name LIMIT $1",
            limit,
        )
        return JSONResponse({"items": [_row(r) for r in records], "next_cursor": None})

    @app.get("/readyz")
    async def ready(request: Request) -> dict[str, str]:
        await request.app.state.pool.fetchval("SELECT 1")
        return {"status": "ready"}

    return app


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.baseline_app", description=__doc__)
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8090)
    args = parser.parse_args(argv)
    app = create_app(os.environ["DATABASE_URL"])
    level = os.environ.get("TICKGATE_LOG_LEVEL", "WARNING").lower()
    config = uvicorn.Config(app, host=args.host, port=args.port, log_level=level, log_config=None)
    uvicorn.Server(config).run()


if __name__ == "__main__":
    main()
