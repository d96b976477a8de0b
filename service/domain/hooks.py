"""Outcome hooks: what a job asks to happen when one of its runs ends or a tick is skipped.

A hook is `{on, action}`. When a run ends (or a tick is skipped) with an event a hook is
on, a delivery of that hook is written to the outbox in the same statement as the end:
it cannot be lost with the replica that recorded it, and any replica sends it.
"""

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Literal
from uuid import UUID, uuid4

from pydantic import BaseModel, ConfigDict, Field, JsonValue, TypeAdapter

from service.domain.names import JOB_NAME_PATTERN
from service.domain.retry import RetryPolicy
from service.domain.runs import RunStatus, SkipReason

MAX_HOOKS = 10


class HookEvent(StrEnum):
    """failure: a run ended failed, timed_out or abandoned; success: it succeeded;
    recovery: it succeeded and the job's run before it had failed; misfire: a tick was
    skipped as a misfire; skip: a tick was skipped, for any reason."""

    FAILURE = "failure"
    SUCCESS = "success"
    RECOVERY = "recovery"
    MISFIRE = "misfire"
    SKIP = "skip"


FAILED = frozenset({RunStatus.FAILED, RunStatus.TIMED_OUT, RunStatus.ABANDONED})


class HttpAction(BaseModel):
    """Send a webhook: `args` are the `http` task's (url, method, headers, secret_headers,
    timeout_seconds, signing_key, oauth...), checked the same way; the body is the run
    (with the job's name and labels, and a dashboard link), unless `args.body` is set."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["http"]
    args: dict[str, JsonValue] = Field(description="The `http` task's args.")


class TriggerAction(BaseModel):
    """Run another job now (trigger `chain`), through the same gate as any run, with
    `args` instead of its own if given (checked against its task's schema)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    kind: Literal["trigger"]
    job: str = Field(pattern=JOB_NAME_PATTERN, max_length=128)
    args: dict[str, JsonValue] | None = None


Action = Annotated[HttpAction | TriggerAction, Field(discriminator="kind")]
DEFAULT_HOOK_RETRY = RetryPolicy(max_attempts=5, min_backoff_seconds=5, max_backoff_seconds=300)


class Hook(BaseModel):
    """What happens on which outcomes of the job's runs and ticks."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    on: list[HookEvent] = Field(min_length=1, max_length=5, description="The events it is on.")
    action: Action
    retry: RetryPolicy = Field(
        DEFAULT_HOOK_RETRY, description="How a delivery that fails is tried again."
    )


HOOKS = TypeAdapter(list[Hook])
ACTION: TypeAdapter[HttpAction | TriggerAction] = TypeAdapter(Action)


def events_of_end(status: RunStatus) -> frozenset[HookEvent]:
    """The events of a run that ended `status` (recovery, when the run before failed)."""
    if status is RunStatus.SUCCEEDED:
        return frozenset({HookEvent.SUCCESS, HookEvent.RECOVERY})
    return frozenset({HookEvent.FAILURE}) if status in FAILED else frozenset()


def events_of_skip(reason: SkipReason) -> frozenset[HookEvent]:
    """A `superseded` tick is none: the user's own edit replaced it, nothing to alert."""
    if reason is SkipReason.SUPERSEDED:
        return frozenset()
    if reason is SkipReason.MISFIRE:
        return frozenset({HookEvent.MISFIRE, HookEvent.SKIP})
    return frozenset({HookEvent.SKIP})


@dataclass(frozen=True)
class HookCall:
    """One delivery to write: of which hook (its index in the job's hooks, or among the
    defaults), for which event, doing what. A `recovery` is written only if the job's
    run before had failed (the statement looks)."""

    id: UUID
    hook: int
    default: bool
    event: HookEvent
    action: JsonValue
    retry: JsonValue

    def stored(self) -> dict[str, JsonValue]:
        return {
            "id": str(self.id),
            "hook": self.hook,
            "default": self.default,
            "event": self.event.value,
            "action": self.action,
            "retry": self.retry,
        }


@dataclass(frozen=True)
class HookPlan:
    """The cluster's default hooks (TICKGATE_DEFAULT_HOOKS), added to every job's own
    unless the job opts out (`default_hooks: false`)."""

    defaults: tuple[Hook, ...] = ()

    def calls(
        self, hooks: Sequence[Hook], use_defaults: bool, events: Iterable[HookEvent]
    ) -> tuple[HookCall, ...]:
        """One call per hook on one of `events`, and per such event."""
        happened = frozenset(events)
        if not happened:
            return ()
        own = [(index, False, hook) for index, hook in enumerate(hooks)]
        extra = [(index, True, hook) for index, hook in enumerate(self.defaults)]
        return tuple(
            HookCall(uuid4(), index, default, event, hook.action.model_dump(), _retry(hook))
            for index, default, hook in own + (extra if use_defaults else [])
            for event in hook.on
            if event in happened
        )


def _retry(hook: Hook) -> JsonValue:
    dumped: JsonValue = hook.retry.model_dump()
    return dumped


def chain_targets(hooks: Iterable[Hook]) -> set[str]:
    return {hook.action.job for hook in hooks if isinstance(hook.action, TriggerAction)}


def find_cycle(start: str, edges: Mapping[str, set[str]]) -> list[str] | None:
    """A path of trigger hooks from `start` back to it, as job names (`a, b, a`), if any:
    a search from `start` that remembers how it reached each job."""
    came_from: dict[str, str] = {}
    todo = [start]
    while todo:
        name = todo.pop()
        for target in sorted(edges.get(name, ())):
            if target == start:
                path = [name]
                while path[-1] != start:
                    path.append(came_from[path[-1]])
                return [start, *reversed(path[:-1]), start] if name != start else [start, start]
            if target not in came_from:
                came_from[target] = name
                todo.append(target)
    return None
