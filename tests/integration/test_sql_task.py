"""The built-in `sql` task against real PostgreSQL: a second database is the target."""

import asyncio
import logging
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import uuid4

import asyncpg
import httpx
import pytest
from pydantic import ValidationError

from harness.postgres import with_database
from harness.waiting import eventually_async
from service.app import create_app
from service.config import Settings
from service.store.targets import APPLICATION_NAME, PrivilegedTarget, SqlTargetConnections
from service.tasks import TaskContext
from service.tasks.sql import SqlArgs, SqlTargetError, run_sql, sql_task
from tests.support.db import TemplateDatabases, role_url

EVENTS = """
CREATE TABLE events (id int PRIMARY KEY, kind text NOT NULL);
INSERT INTO events SELECT n, CASE WHEN n <= 3 THEN 'stale' ELSE 'fresh' END
FROM generate_series(1, 10) AS n;
"""
DELETE_STALE = "DELETE FROM events WHERE kind = 'stale'"


@pytest.fixture
async def reports_url(templates: TemplateDatabases) -> AsyncIterator[str]:
    """A second database on the same server, with ten events (three stale), reached as
    the role `reports`, which owns them and nothing else (the sql task refuses a
    superuser, and a role with rights on Tickgate's tables)."""
    name = await templates.clone()
    url = with_database(templates.server_url, name)
    try:
        connection = await asyncpg.connect(url)
        try:
            await connection.execute(EVENTS)
            await role_url(url, "reports")
            await connection.execute("ALTER TABLE events OWNER TO reports")
            await connection.execute(f'GRANT CREATE ON DATABASE "{name}" TO reports')
            await connection.execute("GRANT CREATE ON SCHEMA public TO reports")
        finally:
            await connection.close()
        yield await role_url(url, "reports")
    finally:
        await templates.drop(name)


@pytest.fixture
def targets(reports_url: str) -> SqlTargetConnections:
    return SqlTargetConnections({"reports": reports_url})


@pytest.fixture
async def http() -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient() as client:
        yield client


def context_of(
    sql: SqlTargetConnections, http: httpx.AsyncClient, seconds_left: float = 30
) -> TaskContext:
    return TaskContext(
        job="maintenance",
        run_id=uuid4(),
        scheduled_for=datetime.now(UTC),
        attempt=1,
        logger=logging.LoggerAdapter(logging.getLogger("t"), {}),
        deadline=datetime.now(UTC) + timedelta(seconds=seconds_left),
        http=http,
        sql=sql,
    )


def args_of(**fields: Any) -> SqlArgs:
    return sql_task(frozenset({"reports"})).parse_args({"target": "reports", **fields})


async def scalar(url: str, query: str) -> Any:
    connection = await asyncpg.connect(url)
    try:
        return await connection.fetchval(query)
    finally:
        await connection.close()


async def sessions_of_others(watcher: asyncpg.Connection) -> int:
    """Sessions on the watcher's database other than the watcher itself."""
    count: int = await watcher.fetchval(
        "SELECT count(*) FROM pg_stat_activity"
        " WHERE datname = current_database() AND pid <> pg_backend_pid()"
    )
    return count


async def expect_no_sessions_left(url: str) -> None:
    watcher = await asyncpg.connect(url)
    try:

        async def gone() -> bool:
            return await sessions_of_others(watcher) == 0

        await eventually_async(gone, 10, "the sql task's session to end")
    finally:
        await watcher.close()


# --- the args model -----------------------------------------------------------------------


def test_target_is_an_enum_of_the_configured_names() -> None:
    schema = sql_task(frozenset({"self", "reports"})).args_model.model_json_schema()
    assert schema["properties"]["target"]["enum"] == ["reports", "self"]
    assert schema["required"] == ["target", "statement"]
    assert schema["additionalProperties"] is False


@pytest.mark.parametrize(
    ("args", "field", "message"),
    [
        ({"target": "nope", "statement": "SELECT 1"}, "target", "configured targets: a, b"),
        ({"target": "postgresql://u:p@h/db", "statement": "SELECT 1"}, "target", "unknown"),
        ({"target": 7, "statement": "SELECT 1"}, "target", "unknown SQL target"),
        ({"target": "a"}, "statement", "required"),
        ({"target": "a", "statement": ""}, "statement", "at least 1"),
        ({"target": "a", "statement": " \n"}, "statement", "blank"),
        ({"target": "a", "statement": "SELECT '\x00'"}, "statement", "NUL"),
        ({"target": "a", "statement": "é" * 40_000}, "statement", "bytes"),
        ({"target": "a", "statement": "x" * 65_537}, "statement", "at most"),
        (
            {"target": "a", "statement": "SELECT 1", "timeout_seconds": 0},
            "timeout_seconds",
            "greater than 0",
        ),
        ({"target": "a", "statement": "S", "timeout_seconds": 86_401}, "timeout_seconds", "86400"),
        ({"target": "a", "statement": "SELECT 1", "dsn": "x"}, "dsn", "not permitted"),
    ],
)
def test_bad_args_are_refused(args: dict[str, Any], field: str, message: str) -> None:
    with pytest.raises(ValidationError) as refused:
        sql_task(frozenset({"a", "b"})).parse_args(args)
    (problem,) = refused.value.errors()
    assert problem["loc"] == (field,)
    assert message in problem["msg"]


def test_without_targets_every_target_is_refused() -> None:
    definition = sql_task(frozenset())
    with pytest.raises(ValidationError, match="no SQL targets are configured"):
        definition.parse_args({"target": "reports", "statement": "SELECT 1"})
    assert "enum" not in definition.args_model.model_json_schema()["properties"]["target"]


# --- running statements directly ----------------------------------------------------------


async def test_delete_reports_rows_affected(
    targets: SqlTargetConnections, http: httpx.AsyncClient, reports_url: str
) -> None:
    result = await run_sql(args_of(statement=DELETE_STALE), context_of(targets, http))
    assert result == {"target": "reports", "command": "DELETE 3", "rows_affected": 3}
    assert await scalar(reports_url, "SELECT count(*) FROM events") == 7


async def test_insert_and_update_report_their_rows(
    targets: SqlTargetConnections, http: httpx.AsyncClient
) -> None:
    context = context_of(targets, http)
    inserted = await run_sql(
        args_of(statement="INSERT INTO events VALUES (11, 'new'), (12, 'new')"), context
    )
    assert inserted == {"target": "reports", "command": "INSERT 0 2", "rows_affected": 2}
    updated = await run_sql(args_of(statement="UPDATE events SET kind = 'old'"), context)
    assert updated == {"target": "reports", "command": "UPDATE 12", "rows_affected": 12}


async def test_maintenance_that_refuses_transactions_works(
    targets: SqlTargetConnections, http: httpx.AsyncClient, reports_url: str
) -> None:
    context = context_of(targets, http)
    vacuumed = await run_sql(args_of(statement="VACUUM (ANALYZE) events"), context)
    assert vacuumed == {"target": "reports", "command": "VACUUM", "rows_affected": 0}
    analyzed = "SELECT last_vacuum IS NOT NULL FROM pg_stat_user_tables WHERE relname = 'events'"
    assert await scalar(reports_url, analyzed) is True
    indexed = await run_sql(
        args_of(statement="CREATE INDEX CONCURRENTLY events_kind ON events (kind)"), context
    )
    assert indexed == {"target": "reports", "command": "CREATE INDEX", "rows_affected": 0}
    await expect_no_sessions_left(reports_url)


async def test_slow_statement_is_canceled_and_its_session_closed(
    targets: SqlTargetConnections, http: httpx.AsyncClient, reports_url: str
) -> None:
    slow = args_of(statement="SELECT pg_sleep(5)", timeout_seconds=0.5)
    started = time.monotonic()
    with pytest.raises(asyncpg.exceptions.QueryCanceledError, match="statement timeout"):
        await run_sql(slow, context_of(targets, http))
    assert time.monotonic() - started < 4
    await expect_no_sessions_left(reports_url)


@pytest.mark.parametrize("timeout_seconds", [None, 60])
async def test_statement_timeout_never_outlasts_the_attempt(
    targets: SqlTargetConnections, http: httpx.AsyncClient, timeout_seconds: float | None
) -> None:
    fields = {} if timeout_seconds is None else {"timeout_seconds": timeout_seconds}
    slow = args_of(statement="SELECT pg_sleep(10)", **fields)
    started = time.monotonic()
    with pytest.raises(asyncpg.exceptions.QueryCanceledError, match="statement timeout"):
        await run_sql(slow, context_of(targets, http, seconds_left=0.5))
    assert time.monotonic() - started < 5


async def test_a_cancelled_run_leaves_no_statement_running(
    targets: SqlTargetConnections, http: httpx.AsyncClient, reports_url: str
) -> None:
    """The runner cancels a task at its deadline: the statement must stop with it."""
    running = asyncio.create_task(
        run_sql(args_of(statement="SELECT pg_sleep(60)"), context_of(targets, http, 120))
    )
    sleeping = (
        "SELECT count(*) FROM pg_stat_activity WHERE state = 'active'"
        f" AND application_name = '{APPLICATION_NAME}' AND query LIKE '%pg_sleep%'"
    )

    async def started() -> bool:
        return bool(await scalar(reports_url, sleeping) == 1)

    await eventually_async(started, 10, "the statement to start")
    running.cancel()
    with pytest.raises(asyncio.CancelledError):
        await running
    await expect_no_sessions_left(reports_url)


async def test_unknown_target_raises(
    targets: SqlTargetConnections, http: httpx.AsyncClient
) -> None:
    assert targets.names() == frozenset({"reports"})
    with pytest.raises(KeyError):
        await targets.execute("nope", "SELECT 1", 5)
    elsewhere = SqlArgs(target="nope", statement="SELECT 1")  # accepted by another replica
    with pytest.raises(SqlTargetError, match="no SQL target 'nope' here; configured: reports"):
        await run_sql(elsewhere, context_of(targets, http))


# --- through the API ----------------------------------------------------------------------


@pytest.fixture
async def client(database_url: str, reports_url: str) -> AsyncIterator[httpx.AsyncClient]:
    """The app in-process with one SQL target, `reports`."""
    settings = Settings(
        database_url=database_url,
        scheduler=False,
        runner_id="test-runner",
        sql_targets={"reports": reports_url},
    )
    app = create_app(settings)
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://localhost") as api,
    ):
        yield api


def sql_job(name: str, **args: Any) -> dict[str, Any]:
    return {
        "name": name,
        "schedule": {"kind": "cron", "expression": "0 0 1 1 *"},
        "task": "sql",
        "args": {"target": "reports", **args},
    }


async def finished(client: httpx.AsyncClient, run_id: str) -> dict[str, Any]:
    async def done() -> bool:
        run = (await client.get(f"/v1/runs/{run_id}")).json()
        return bool(run["status"] != "running")

    await eventually_async(done, 30, f"run {run_id} to finish")
    run: dict[str, Any] = (await client.get(f"/v1/runs/{run_id}")).json()
    return run


async def run_job(client: httpx.AsyncClient, job: dict[str, Any]) -> dict[str, Any]:
    created = await client.post("/v1/jobs", json=job)
    assert created.status_code == 201, created.text
    triggered = await client.post(f"/v1/jobs/{job['name']}/trigger")
    assert triggered.status_code == 202, triggered.text
    return await finished(client, triggered.json()["id"])


async def test_bad_sql_args_are_422_naming_field_and_value(
    client: httpx.AsyncClient, reports_url: str
) -> None:
    cases: list[tuple[dict[str, Any], list[str | int], Any]] = [
        ({"target": "nope", "statement": "SELECT 1"}, ["body", "args", "target"], "nope"),
        ({"target": reports_url, "statement": "SELECT 1"}, ["body", "args", "target"], reports_url),
        ({"target": "reports"}, ["body", "args", "statement"], {"target": "reports"}),
        (
            {"target": "reports", "statement": "SELECT 1", "dsn": reports_url},
            ["body", "args", "dsn"],
            reports_url,
        ),
        (
            {"target": "reports", "statement": "SELECT 1", "timeout_seconds": -1},
            ["body", "args", "timeout_seconds"],
            -1,
        ),
    ]
    for args, loc, bad in cases:
        job = sql_job("bad") | {"args": args}
        response = await client.post("/v1/jobs", json=job)
        assert response.status_code == 422, (args, response.text)
        (problem,) = response.json()["errors"]
        # Never the value: args may hold a secret (here a DSN with its password).
        assert problem["loc"] == loc, (problem, bad)
        assert "input" not in problem, problem
    unknown = await client.post("/v1/jobs", json=sql_job("bad", target="nope", statement="S"))
    assert "configured targets: reports" in unknown.json()["errors"][0]["msg"]
    assert (await client.get("/v1/jobs")).json()["items"] == []


async def test_tasks_list_sql_with_its_targets_and_never_a_dsn(
    client: httpx.AsyncClient, reports_url: str
) -> None:
    response = await client.get("/v1/tasks")
    assert response.status_code == 200
    tasks = {item["name"]: item for item in response.json()["items"]}
    schema = tasks["sql"]["args_schema"]
    assert schema["properties"]["target"]["enum"] == ["reports"]
    assert reports_url not in response.text
    assert reports_url not in (await client.get("/openapi.json")).text


async def test_triggered_sql_job_records_rows_affected(
    client: httpx.AsyncClient, reports_url: str
) -> None:
    run = await run_job(client, sql_job("purge", statement=DELETE_STALE))
    assert run["status"] == "succeeded", run
    assert run["result"] == {"target": "reports", "command": "DELETE 3", "rows_affected": 3}
    assert await scalar(reports_url, "SELECT count(*) FROM events") == 7


async def test_too_slow_sql_job_fails_on_its_statement_timeout(
    client: httpx.AsyncClient, reports_url: str
) -> None:
    job = sql_job("slow", statement="SELECT pg_sleep(10)", timeout_seconds=0.5)
    started = time.monotonic()
    run = await run_job(client, job)
    assert time.monotonic() - started < 8
    assert run["status"] == "failed", run
    assert run["error"].startswith("QueryCanceledError: "), run
    assert "statement timeout" in run["error"]
    assert run["result"] is None
    await expect_no_sessions_left(reports_url)


# --- output you can read (#24) ------------------------------------------------------------


async def test_a_query_s_first_rows_are_its_output_and_all_are_counted(
    client: httpx.AsyncClient,
) -> None:
    statement = "SELECT id, kind, now() - now() AS age, 1.50::numeric AS price FROM events"
    run = await run_job(client, sql_job("report", statement=statement, output_rows=3))
    assert run["status"] == "succeeded", run
    assert run["result"] == {"target": "reports", "command": "SELECT 10", "rows_affected": 10}
    output = (await client.get(f"/v1/runs/{run['id']}")).json()["output"]
    assert output["columns"] == ["id", "kind", "age", "price"]
    assert output["rows"] == [[n, "stale", "PT0S", "1.50"] for n in (1, 2, 3)]
    assert (output["command"], output["rows_affected"], output["truncated"]) == (
        "SELECT 10",
        10,
        True,
    )


async def test_returning_rows_are_kept_and_statements_without_rows_keep_the_tag(
    client: httpx.AsyncClient, reports_url: str
) -> None:
    deleted = await run_job(client, sql_job("purge", statement=f"{DELETE_STALE} RETURNING id"))
    output = (await client.get(f"/v1/runs/{deleted['id']}")).json()["output"]
    assert (output["command"], output["rows"], output["truncated"]) == (
        "DELETE 3",
        [[1], [2], [3]],
        False,
    )
    assert deleted["result"]["rows_affected"] == 3
    script = "UPDATE events SET kind = 'old'; ANALYZE events"
    analyzed = await run_job(client, sql_job("script", statement=script))
    output = (await client.get(f"/v1/runs/{analyzed['id']}")).json()["output"]
    assert (output["command"], output["columns"], output["rows"]) == ("ANALYZE", [], [])
    assert await scalar(reports_url, "SELECT count(*) FROM events WHERE kind = 'old'") == 7


async def test_wide_rows_stop_at_the_output_cap(
    targets: SqlTargetConnections, http: httpx.AsyncClient
) -> None:
    context = context_of(targets, http)
    wide = "SELECT n, repeat('x', 10000) FROM generate_series(1, 50) AS n"
    await run_sql(args_of(statement=wide, output_rows=50), context)
    output = context.output.kept
    assert isinstance(output, dict)
    assert isinstance(output["rows"], list)
    assert 1 < len(output["rows"]) < 10, len(output["rows"])
    assert (output["rows_affected"], output["truncated"]) == (50, True)


async def test_a_superuser_or_a_role_with_rights_on_tickgate_tables_runs_nothing(
    templates: TemplateDatabases,
) -> None:
    """#42: as a superuser a statement could run commands on the host (COPY ... TO
    PROGRAM); as a role that may read tickgate_jobs, read every job's secret headers.
    Either is refused before the statement runs."""
    name = await templates.clone()
    url = with_database(templates.server_url, name)  # the server's superuser
    try:
        reader = await role_url(url, "jobs_reader")
        connection = await asyncpg.connect(url)
        try:
            await connection.execute("GRANT SELECT ON tickgate_jobs TO jobs_reader")
            await connection.execute("GRANT CREATE ON SCHEMA public TO jobs_reader")
        finally:
            await connection.close()
        for dsn, said in ((url, "superuser"), (reader, "rights on Tickgate's tables")):
            targets = SqlTargetConnections({"t": dsn})
            with pytest.raises(PrivilegedTarget, match=said):
                await targets.execute("t", "CREATE TABLE pwned (x int)", 10)
        assert await scalar(url, "SELECT to_regclass('pwned') IS NULL")
    finally:
        await templates.drop(name)
