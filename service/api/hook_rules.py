"""Hooks at write time: each http action's args checked as the http task's are (so a
host outside the allowlist is a 422 naming the hook's index), secret header values
shown as "***" and kept when sent back so, and trigger actions naming jobs that exist,
in no cycle."""

from collections.abc import Mapping, Sequence
from functools import partial

from pydantic import JsonValue

from service.api.deps import Services
from service.api.models import with_args
from service.domain.errors import InvalidInput
from service.domain.hooks import Hook, HttpAction, TriggerAction, chain_targets, find_cycle
from service.tasks import TaskRegistry
from service.tasks.http import merge_secret_headers, redact_args

Loc = tuple[str | int, ...]


def check_hooks(tasks: TaskRegistry, hooks: Sequence[Hook], where: Loc) -> None:
    """Raise InvalidInput naming `where`.<index>.action.args.<field> for every http
    action whose args the http task refuses (a host outside the allowlist among them)."""
    problems = []
    for index, hook in enumerate(hooks):
        if isinstance(hook.action, HttpAction):
            try:
                tasks.check_args("http", hook.action.args, reach=True)
            except InvalidInput as error:
                problems.append(error.within((*where, index, "action", "args"), f"hook {index}"))
    if problems:
        raise InvalidInput.joined(problems)


async def check_chains(services: Services, written: Mapping[str, Sequence[Hook]]) -> None:
    """Raise InvalidInput if a trigger hook of a job being written names a job that does
    not exist (nor is being written), or closes a cycle of trigger hooks (named, as
    `a → b → a`), with the jobs as stored and as being written. Two writes racing may
    still close one; a chain run's hooks then keep triggering, as written."""
    targets = {target for hooks in written.values() for target in chain_targets(hooks)}
    if not targets:
        return
    edges = await services.store.chain_edges()
    edges.update({name: chain_targets(hooks) for name, hooks in written.items()})
    known = {job.name for job in await services.store.get_jobs(sorted(targets))}
    problems = [
        _problem(name, hooks, known | set(written), edges) for name, hooks in written.items()
    ]
    found = [problem for problem in problems if problem is not None]
    if found:
        raise InvalidInput.joined(found)


def _problem(
    name: str, hooks: Sequence[Hook], known: set[str], edges: Mapping[str, set[str]]
) -> InvalidInput | None:
    for index, hook in enumerate(hooks):
        if isinstance(hook.action, TriggerAction) and hook.action.job not in known:
            loc: Loc = ("body", "hooks", index, "action", "job")
            return InvalidInput.one(loc, "no job of this name to trigger", hook.action.job)
    cycle = find_cycle(name, edges)
    if cycle is None:
        return None
    return InvalidInput.one(
        ("body", "hooks"), f"trigger hooks would form a cycle: {' → '.join(cycle)}", name
    )


def kept_secrets(hooks: Sequence[Hook], stored: Sequence[Hook]) -> list[Hook]:
    """Hooks sent back as shown: a secret header value "***" keeps the value stored for
    the hook it was read from, the stored http hook calling the same URL (the one at the
    same index if several do). So removing or reordering hooks never hands one hook's
    secret to another; a "***" with no such hook is refused, as with nothing stored."""
    return [
        with_args(hook, partial(_merged, stored_args=_read_from(hook, index, stored)))
        for index, hook in enumerate(hooks)
    ]


def _merged(
    args: dict[str, JsonValue], stored_args: Mapping[str, JsonValue] | None
) -> dict[str, JsonValue]:
    return merge_secret_headers(args, stored_args)


def _read_from(hook: Hook, index: int, stored: Sequence[Hook]) -> Mapping[str, JsonValue] | None:
    if not isinstance(hook.action, HttpAction):
        return None
    url = _shown_url(hook.action.args)
    same_url = {
        position: one.action.args
        for position, one in enumerate(stored)
        if isinstance(one.action, HttpAction) and _shown_url(one.action.args) == url
    }
    return same_url.get(index, next(iter(same_url.values()), None))


def _shown_url(args: Mapping[str, JsonValue]) -> JsonValue:
    """The URL as answers show it (a password as "***"), so a hook sent back as read
    matches the stored hook it was read from."""
    return redact_args(args).get("url")
