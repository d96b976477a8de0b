"""The parts of the stateful test of the seams (tests/integration/test_seams_stateful.py):
replicas in-process on an event loop of their own thread (so that they go on firing
between steps), a task that says which definition each attempt ran, and the record of
which definition was stored when, against which each attempt is judged."""

import asyncio
import os
import threading
import time
from collections.abc import Coroutine
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from typing import Any, TypeVar
from uuid import UUID

import httpx
from pydantic import BaseModel, JsonValue

from service.app import create_app
from service.config import Settings
from service.tasks import TaskContext, TaskDefinition, builtin_registry

# How long after an edit's answer an attempt may still start with the old definition:
# the attempt re-reads its job before it starts, and then starts in the same turn of the
# loop; on a loaded machine that turn may take this long. A retry's backoff is longer.
SLACK_SECONDS = 0.5
T = TypeVar("T")


class LoopThread:
    """An event loop running on a thread of its own until closed."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="seams", daemon=True)
        self.thread.start()

    def run(self, work: Coroutine[Any, Any, T], timeout: float = 60) -> T:
        return asyncio.run_coroutine_threadsafe(work, self.loop).result(timeout)

    def stall(self, seconds: float) -> None:
        """Block the loop, every replica on it, as a long pause of the process would."""
        self.loop.call_soon_threadsafe(time.sleep, seconds)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


class ProbeArgs(BaseModel):
    tag: str  # which definition this is: unique per stored version of a job
    sleep: float = 0
    fail: int = 0  # the attempts that fail, the first `fail` of each run
    pad: int = 0  # characters of output each attempt keeps: outputs to trim


@dataclass(frozen=True)
class Attempt:
    job: str
    run_id: UUID
    tag: str
    attempt: int
    started: float  # time.time()


@dataclass
class Probe:
    """The `probe` task: records each attempt, sleeps, and fails the first `fail`."""

    attempts: list[Attempt] = field(default_factory=list)

    async def __call__(self, args: ProbeArgs, context: TaskContext) -> JsonValue:
        seen = Attempt(context.job, context.run_id, args.tag, context.attempt, time.time())
        self.attempts.append(seen)  # from the loop's thread; a list append is atomic
        if args.pad:  # random, so that PostgreSQL's compression leaves it its size
            context.output.keep({"pad": os.urandom(args.pad // 2).hex()})
        await asyncio.sleep(args.sleep)
        if context.attempt <= args.fail:
            raise RuntimeError(f"attempt {context.attempt} of {args.tag} fails on purpose")
        return {"tag": args.tag}


@dataclass
class Replica:
    """One app with its scheduler, started and stopped on the loop's thread."""

    settings: Settings
    probe: Probe
    http: httpx.AsyncClient | None = None
    stack: AsyncExitStack | None = None

    async def start(self) -> None:
        registry = builtin_registry(http_allow=self.settings.http_allow)
        registry.register(TaskDefinition("probe", "says what it ran", ProbeArgs, self.probe))
        app = create_app(self.settings, registry)
        self.stack = AsyncExitStack()
        await self.stack.enter_async_context(app.router.lifespan_context(app))
        # An exception in the app is a 500 to the caller, as it is over a socket (the
        # test's check of the answers says so; its log has the traceback).
        transport = httpx.ASGITransport(app, raise_app_exceptions=False)
        self.http = await self.stack.enter_async_context(
            httpx.AsyncClient(transport=transport, base_url="http://localhost", timeout=30)
        )

    async def stop(self) -> None:
        stack, self.stack, self.http = self.stack, None, None
        if stack is not None:
            await stack.aclose()


@dataclass
class Stint:
    """A time a definition was stored: from when its write was sent until the answer of
    the write that replaced it (None: still stored). A manual run's args are a stint of
    their own, as long as the definition it was triggered on."""

    name: str
    tag: str
    overlap: str
    since: float
    until: float | None = None
    run: bool = False  # a manual run's own args: they stay with the run through edits

    def holds(self, moment: float, slack: float = 0) -> bool:
        return self.since - slack <= moment and (self.until is None or moment <= self.until + slack)


@dataclass
class Definitions:
    """Which definition each name had when; each attempt is judged against it."""

    stints: list[Stint] = field(default_factory=list)
    current: dict[str, list[Stint]] = field(default_factory=dict)

    def store(self, name: str, tag: str, overlap: str, sent: float, answered: float) -> None:
        """A write of `name` answered: the definition `tag` replaces what was stored. A
        run triggered with args of its own keeps them: its retries run the definition
        stored then, with the run's args (docs/concepts.md)."""
        self.end(name, answered, runs_too=False)
        self._add(Stint(name, tag, overlap, sent))

    def add_run(self, name: str, tag: str, overlap: str, sent: float) -> None:
        """Args of a run on demand, good until its job is deleted or paused."""
        self._add(Stint(name, tag, overlap, sent, run=True))

    def _add(self, stint: Stint) -> None:
        self.stints.append(stint)
        self.current.setdefault(stint.name, []).append(stint)

    def end(self, name: str, answered: float, *, runs_too: bool = True) -> None:
        """A delete or a pause of `name` answered (or, `runs_too` False, a change):
        nothing of before may start."""
        for stint in self.current.pop(name, []):
            if stint.run and not runs_too:
                self.current.setdefault(name, []).append(stint)
            else:
                stint.until = answered

    def problems(self, attempts: list[Attempt]) -> list[str]:
        """Each attempt that started when its definition was not stored: after its job was
        deleted or paused, or with a version older than the one stored then."""
        return [
            f"attempt {a.attempt} of run {a.run_id} ran {a.tag} at {a.started:.3f},"
            f" when it was not stored: {self._of(a.tag)}"
            for a in attempts
            if not any(s.holds(a.started, SLACK_SECONDS) for s in self._of(a.tag))
        ]

    def _of(self, tag: str) -> list[Stint]:
        return [stint for stint in self.stints if stint.tag == tag]

    def queue_one(self, name: str, moment: float) -> bool:
        """Whether `name` was a `queue_one` job from a second before `moment` to one after."""
        return any(
            s.name == name
            and not s.run
            and s.overlap == "queue_one"
            and s.holds(moment - 1)
            and s.holds(moment + 1)
            for s in self.stints
        )
