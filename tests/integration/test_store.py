"""Store-level behaviour: migrations and concurrent writes, on real PostgreSQL."""

import asyncio
from datetime import UTC, datetime, timedelta

import asyncpg

from harness.postgres import with_database
from service.domain.jobs import Job, JobSpec, complete_job, create_job, replace_job
from service.domain.schedules import CronSchedule, IntervalSchedule, OnceSchedule
from service.store import Store
from service.store.jobs import JobChangeFn
from service.store.migrate import available_migrations, head_version, migrate
from tests.support.db import TemplateDatabases


async def test_concurrent_migrations_apply_once(templates: TemplateDatabases) -> None:
    name = f"{templates.template}_empty"
    admin = await asyncpg.connect(templates.server_url)
    await admin.execute(f'CREATE DATABASE "{name}"')
    url = with_database(templates.server_url, name)
    connections = [await asyncpg.connect(url) for _ in range(3)]
    try:
        applied = await asyncio.gather(*(migrate(c) for c in connections))
        every = [migration.version for migration in available_migrations()]
        assert sorted(len(a) for a in applied) == [0, 0, len(every)]
        versions = await connections[0].fetch(
            "SELECT version FROM tickgate_schema_migrations ORDER BY version"
        )
        assert [r["version"] for r in versions] == every
        assert every[-1] == head_version()
    finally:
        for connection in connections:
            await connection.close()
        await admin.execute(f'DROP DATABASE "{name}" WITH (FORCE)')
        await admin.close()


async def test_migrate_again_is_a_no_op(store: Store) -> None:
    assert await store.migrate() == 0
    assert max(await store.schema_versions()) == head_version()


async def test_concurrent_applies_of_one_job_end_consistent(store: Store) -> None:
    now = datetime.now(UTC)
    specs = [
        JobSpec(
            schedule=CronSchedule(kind="cron", expression="* * * * *"),
            task="log",
            args={"message": f"m{i % 5}"},
        )
        for i in range(30)
    ]

    def apply(spec: JobSpec) -> JobChangeFn:
        def change(current: Job | None) -> Job:
            return replace_job(current, spec, now) if current else create_job("c", spec, now)

        return change

    results = await asyncio.gather(*(store.mutate_job("c", apply(spec)) for spec in specs))
    writes = [r.after for r in results if r.after != r.before]
    assert sum(r.created for r in results) == 1
    # Every write saw the one before it: versions run 1..n with no gap and no repeat.
    assert sorted(job.version for job in writes if job) == list(range(1, len(writes) + 1))
    stored = await store.get_job("c")
    assert stored is not None
    assert stored.version == len(writes)


async def test_update_jobs_changes_many_in_one_go_and_notifies_each(
    store: Store, database_url: str
) -> None:
    """Each job changed is notified, but a one-time job completed: no window has a tick
    of it left to hear about (a crowd's completions would have its owners read it all
    back)."""
    now = datetime.now(UTC)
    spec = JobSpec(schedule=CronSchedule(kind="cron", expression="* * * * *"), task="log")
    for name in ("u1", "u2", "u3"):
        await store.mutate_job(name, lambda _, name=name: create_job(name, spec, now))
    once = spec.model_copy(
        update={"schedule": OnceSchedule(kind="once", at=now + timedelta(hours=1))}
    )
    await store.mutate_job("o1", lambda _: create_job("o1", once, now))
    heard: asyncio.Queue[str] = asyncio.Queue()
    listener = await asyncpg.connect(database_url)
    try:
        await listener.add_listener("tickgate_jobs", lambda *args: heard.put_nowait(args[3]))
        clocks: list[datetime] = []

        def completed(current: Job, db_now: datetime) -> Job:
            clocks.append(db_now)
            return complete_job(current, db_now)

        # u2 is left as it is; "gone" does not exist and is skipped.
        await store.update_jobs(
            {
                "u1": completed,
                "u2": lambda job, _: job,
                "u3": completed,
                "o1": completed,
                "gone": completed,
            }
        )
        await listener.execute("SELECT pg_notify('tickgate_jobs', 'after')")
        names = set()
        while (name := await asyncio.wait_for(heard.get(), 30)) != "after":
            names.add(name)
    finally:
        await listener.close()
    assert names == {"u1", "u3"}
    states = {name: (await store.get_job(name)) for name in ("u1", "u2", "u3", "o1")}
    assert {n: j.state.value for n, j in states.items() if j} == {
        "u1": "completed",
        "u2": "active",
        "u3": "completed",
        "o1": "completed",
    }
    assert len(set(clocks)) == 1  # one database clock reading for the whole batch


async def test_mirrored_jobs_hold_their_common_parts_once(store: Store) -> None:
    now = datetime.now(UTC)
    spec = JobSpec(
        schedule=CronSchedule(kind="cron", expression="0 3 * * *"),
        task="log",
        args={"message": "same"},
        timezone="Europe/Berlin",
    )
    for name in ("s1", "s2"):
        await store.mutate_job(name, lambda _, name=name: create_job(name, spec, now))
    first, second = sorted(await store.get_jobs(["s1", "s2"]), key=lambda job: job.name)
    assert [first, second] == [await store.get_job("s1"), await store.get_job("s2")]
    for part in ("schedule", "retry", "timezone", "task", "args"):
        assert getattr(first, part) is getattr(second, part), part


async def test_jobs_read_back_equal_and_in_utc_whatever_the_session_zone(
    database_url: str,
) -> None:
    """Jobs are read as one JSON text each: every value, instants included, must come
    back as it was written, also where the database's TimeZone is not UTC."""
    admin = await asyncpg.connect(database_url)
    try:
        database = await admin.fetchval("SELECT current_database()")
        await admin.execute(f"ALTER DATABASE \"{database}\" SET timezone = 'Pacific/Chatham'")
    finally:
        await admin.close()
    zoned = await Store.open(database_url, max_size=1)
    try:
        spec = JobSpec(
            schedule=IntervalSchedule(kind="interval", every_seconds=90),
            timezone="Europe/Kyiv",
            task="log",
            args={"message": "é", "nested": {"n": [1, 2.5, None, True]}},
            start_at=datetime(2030, 1, 2, 3, 4, 5, 678901, tzinfo=UTC),
            max_runs=7,
            managed_by="team/a",
        )
        written = create_job("zoned", spec, datetime.now(UTC))
        await zoned.insert_job(written)
        read = await zoned.get_job("zoned")
        assert read == written
        assert read is not None
        assert read.created_at.utcoffset() == timedelta(0)
        assert read.start_at is not None
        assert read.start_at.isoformat() == "2030-01-02T03:04:05.678901+00:00"
    finally:
        await zoned.close()
