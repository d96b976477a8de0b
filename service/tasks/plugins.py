"""Tasks from outside Tickgate: modules named in TICKGATE_TASK_MODULES and the
`tickgate.tasks` entry-point group.

Every replica must run the same task set as its peers, so anything that goes wrong here
(a module that won't import, an entry point naming neither a module nor a task, a task
name taken twice) raises PluginError and stops startup, naming the sources involved.
"""

import importlib
from collections.abc import Iterable, Sequence
from importlib import metadata
from types import ModuleType
from typing import Any

from service.config import ConfigurationError
from service.tasks.base import TaskDefinition, TaskRegistry

ENTRY_POINT_GROUP = "tickgate.tasks"
BUILT_IN = "Tickgate's built-in tasks"


class PluginError(ConfigurationError):
    """A task module or entry point that cannot be loaded, or a task name taken twice."""


def load_plugins(
    registry: TaskRegistry, module_names: Sequence[str], *, entry_points: bool = True
) -> list[str]:
    """Register the tasks of `module_names`, then those of the installed `tickgate.tasks`
    entry points (unless `entry_points` is false); return the names registered, in order.

    A module contributes every module-level TaskDefinition (what `@task` returns); an
    entry point names a module (all its tasks) or one TaskDefinition. The same definition
    reached twice (a module named both ways, a task re-exported) counts once.
    """
    loading = _Loading(registry)
    for name in module_names:
        loading.add_module(_import(name), f"module {name!r} (TICKGATE_TASK_MODULES)")
    if entry_points:
        for entry_point in _installed_entry_points():
            loading.add_entry_point(entry_point)
    return loading.added


class _Loading:
    """One load_plugins call: the registry it fills and where each name came from."""

    def __init__(self, registry: TaskRegistry) -> None:
        self._registry = registry
        self._sources = {definition.name: BUILT_IN for definition in registry}
        self.added: list[str] = []

    def add_module(self, module: ModuleType, source: str) -> None:
        definitions = _definitions_in(module)
        if not definitions:
            raise PluginError(f"{source} defines no tasks (no module-level @task definitions)")
        for definition in definitions:
            self.add(definition, source)

    def add_entry_point(self, entry_point: metadata.EntryPoint) -> None:
        source = _describe(entry_point)
        try:
            loaded: object = entry_point.load()
        except Exception as error:
            raise PluginError(f"cannot load {source}: {type(error).__name__}: {error}") from error
        if isinstance(loaded, ModuleType):
            self.add_module(loaded, source)
        elif isinstance(loaded, TaskDefinition):
            self.add(loaded, source)
        else:
            kind = type(loaded).__name__
            raise PluginError(f"{source} names a {kind}, not a module or a @task definition")

    def add(self, definition: TaskDefinition[Any], source: str) -> None:
        existing = self._registry.get(definition.name)
        if existing is definition:
            return
        if existing is not None:
            first = self._sources.get(definition.name, "the registry")
            raise PluginError(
                f"task {definition.name!r} is defined twice: by {first} and by {source}; "
                "task names must be unique"
            )
        self._registry.register(definition)
        self._sources[definition.name] = source
        self.added.append(definition.name)


def _import(name: str) -> ModuleType:
    try:
        return importlib.import_module(name)
    except Exception as error:
        raise PluginError(
            f"cannot import task module {name!r} (TICKGATE_TASK_MODULES): "
            f"{type(error).__name__}: {error}"
        ) from error


def _definitions_in(module: ModuleType) -> list[TaskDefinition[Any]]:
    return [value for value in vars(module).values() if isinstance(value, TaskDefinition)]


def _installed_entry_points() -> Iterable[metadata.EntryPoint]:
    found = metadata.entry_points(group=ENTRY_POINT_GROUP)
    return sorted(found, key=lambda entry_point: (entry_point.name, entry_point.value))


def _describe(entry_point: metadata.EntryPoint) -> str:
    text = f"entry point {entry_point.name!r} = {entry_point.value!r} ({ENTRY_POINT_GROUP}"
    distribution = entry_point.dist
    if distribution is not None:
        text += f", from {distribution.name} {distribution.version}"
    return f"{text})"
