"""The fire path in process on real PostgreSQL: a Runner with gate-blocked test tasks,
and the helpers its tests share."""

import asyncio
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
from pydantic import BaseModel, JsonValue

from harness.waiting import eventually_async
from service.domain.jobs import Job, JobSpec, create_job
from service.domain.runs import Run, RunStatus
from service.domain.schedules import CronSchedule
from service.metrics import Metrics
from service.scheduler import Runner
from service.store import Store
from service.store.link import Link
from service.store.ports import Ledger, LockPool
from service.store.sessions import LockSessions
from service.store.targets import SqlTargetConnections
from service.tasks import TaskContext, TaskDefinition, builtin_registry

EVERY_SECOND = CronSchedule(kind="cron", expression="* * * * * *")


class GateArgs(BaseModel):
    gate: str = "default"


@dataclass
class Gates:
    """Test tasks block on these until the test opens them."""

    events: dict[str, asyncio.Event] = field(default_factory=dict)
    started: list[str] = field(default_factory=list)

    def __getitem__(self, name: str) -> asyncio.Event:
        return self.events.setdefault(name, asyncio.Event())

    async def wait(self, args: GateArgs, context: TaskContext) -> JsonValue:
        self.started.append(args.gate)
        await self[args.gate].wait()
        return {"gate": args.gate}


async def explode(args: GateArgs, context: TaskContext) -> JsonValue:
    raise RuntimeError(f"boom at {args.gate}")


@asynccontextmanager
async def lock_pool(
    database_url: str, size: int, link: Link | None = None
) -> AsyncIterator[LockSessions]:
    pool = await LockSessions.open(database_url, size=size, link=link)
    try:
        yield pool
    finally:
        await pool.close()


@pytest.fixture
async def sessions(database_url: str) -> AsyncIterator[LockSessions]:
    async with lock_pool(database_url, 4) as pool:
        yield pool


@pytest.fixture
def gates() -> Gates:
    return Gates()


@pytest.fixture
def metrics() -> Metrics:
    return Metrics()


def skipped(metrics: Metrics, reason: str) -> float:
    value = metrics.registry.get_sample_value("tickgate_ticks_skipped_total", {"reason": reason})
    return value or 0.0


@pytest.fixture
async def runner(
    store: Store, sessions: LockSessions, gates: Gates, metrics: Metrics
) -> AsyncIterator[Runner]:
    async with running(store, sessions, gates, metrics) as runner:
        yield runner


@asynccontextmanager
async def running(
    store: Ledger,
    sessions: LockPool,
    gates: Gates,
    metrics: Metrics,
    room: int = 32,
    tasks: Sequence[TaskDefinition[Any]] = (),
    runner_id: str = "test-runner",
    takeover_seconds: float = 3.0,
    side_sessions: LockPool | None = None,
) -> AsyncIterator[Runner]:
    """A Runner (a replica's fire path) with the gate tasks, plus `tasks`, over any
    implementation of the fire path's ports. Manual runs and backfills share
    `sessions` unless given `side_sessions` of their own."""
    registry = builtin_registry(http_allow="127.0.0.1")
    registry.register(TaskDefinition("wait", "blocks on a gate", GateArgs, gates.wait))
    registry.register(TaskDefinition("explode", "always fails", GateArgs, explode))
    for task in tasks:
        registry.register(task)
    async with httpx.AsyncClient() as http:
        runner = Runner(
            sessions=sessions,
            side_sessions=side_sessions or sessions,
            store=store,
            tasks=registry,
            http=http,
            runner_id=runner_id,
            metrics=metrics,
            sql=SqlTargetConnections({}),
            room=room,
            takeover_seconds=takeover_seconds,
        )
        yield runner
        await runner.shutdown(grace_seconds=0)
        await registry.aclose()


async def add_job(store: Store, name: str, **spec: Any) -> Job:
    fields: dict[str, Any] = {"schedule": EVERY_SECOND, "task": "wait", "args": {}} | spec
    now = datetime.now(UTC) - timedelta(hours=1)
    change = await store.mutate_job(name, lambda _: create_job(name, JobSpec(**fields), now))
    assert change.after is not None
    return change.after


async def runs_of(store: Store, job: str) -> list[Run]:
    return await store.list_runs(job, 100, None, None)


async def finished_runs(store: Store, job: str, count: int) -> list[Run]:
    async def done() -> bool:
        runs = await runs_of(store, job)
        return len(runs) >= count and all(r.status is not RunStatus.RUNNING for r in runs)

    await eventually_async(done, 30, f"{count} finished runs of {job}")
    return await runs_of(store, job)


def tick_now() -> datetime:
    return datetime.now(UTC).replace(microsecond=0)
