"""load_plugins: tasks from named modules and `tickgate.tasks` entry points, and the
example plugin's own tasks. No database, no pip: throwaway modules and hand-written
dist-info directories (exactly what importlib.metadata reads from an installed package)."""

import logging
import sys
import textwrap
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError

from service.config import split_names
from service.tasks import SqlOutcome, TaskContext, TaskRegistry, builtin_registry
from service.tasks.plugins import PluginError, load_plugins

EXAMPLE_SOURCE = Path(__file__).parents[2] / "examples" / "tickgate-example-tasks" / "src"

GREET_AND_WAVE = """
    from pydantic import BaseModel, JsonValue

    from service.tasks import TaskContext, task


    class Args(BaseModel):
        who: str


    @task("{prefix}greet", args=Args)
    async def greet(args: Args, context: TaskContext) -> JsonValue:
        '''Say hello.'''
        return "hello " + args.who


    @task("{prefix}wave", args=Args, description="Wave at someone.")
    async def wave(args: Args, context: TaskContext) -> JsonValue:
        return None


    NOT_A_TASK = "greet"
"""

ONE_TASK = """
    from pydantic import BaseModel, JsonValue

    from service.tasks import TaskContext, task


    class Args(BaseModel):
        pass


    @task("{name}", args=Args)
    async def run(args: Args, context: TaskContext) -> JsonValue:
        return None
"""


@dataclass
class Modules:
    """Throwaway top-level modules on sys.path, with unique names, forgotten afterwards."""

    root: Path
    names: list[str] = field(default_factory=list)

    def write(self, source: str, **fill: str) -> str:
        name = f"tg_plugin_{uuid.uuid4().hex[:10]}"
        text = textwrap.dedent(source)
        for key, value in fill.items():
            text = text.replace("{" + key + "}", value)
        (self.root / f"{name}.py").write_text(text)
        self.names.append(name)
        return name

    def distribution(self, name: str, entry_points: dict[str, str]) -> None:
        """An installed distribution as importlib.metadata sees it: a dist-info folder."""
        info = self.root / f"{name.replace('-', '_')}-1.0.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n")
        lines = [f"{key} = {value}" for key, value in entry_points.items()]
        (info / "entry_points.txt").write_text("[tickgate.tasks]\n" + "\n".join(lines) + "\n")


@pytest.fixture
def modules(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Modules]:
    monkeypatch.syspath_prepend(str(tmp_path))
    made = Modules(tmp_path)
    yield made
    for name in made.names:
        sys.modules.pop(name, None)


@pytest.fixture
def example_on_path(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """The example plugin importable by module name (not installed: no entry points)."""
    monkeypatch.syspath_prepend(str(EXAMPLE_SOURCE))
    yield
    for name in [name for name in sys.modules if name.startswith("tickgate_example_tasks")]:
        del sys.modules[name]


def names(registry: TaskRegistry) -> list[str]:
    return [definition.name for definition in registry]


def test_every_task_of_a_named_module_is_registered(modules: Modules) -> None:
    module = modules.write(GREET_AND_WAVE, prefix="")
    registry = builtin_registry()

    added = load_plugins(registry, [module], entry_points=False)

    assert added == ["greet", "wave"]
    assert names(registry) == ["greet", "http", "log", "wave"]
    greet, wave = registry.get("greet"), registry.get("wave")
    assert greet is not None
    assert wave is not None
    assert greet.description == "Say hello."
    assert wave.description == "Wave at someone."


def test_module_names_come_from_the_comma_separated_setting(modules: Modules) -> None:
    first = modules.write(GREET_AND_WAVE, prefix="a_")
    second = modules.write(ONE_TASK, name="b_task")
    setting = f" {first}, ,{second} "

    added = load_plugins(TaskRegistry(), split_names(setting), entry_points=False)

    assert added == ["a_greet", "a_wave", "b_task"]


def test_the_example_plugin_loads_by_module_name(example_on_path: None) -> None:
    registry = builtin_registry()
    modules = ["tickgate_example_tasks.greet", "tickgate_example_tasks.maintenance"]

    assert load_plugins(registry, modules, entry_points=False) == ["greet", "analyze"]
    greet = registry.get("greet")
    assert greet is not None
    schema = greet.args_model.model_json_schema()
    assert schema["properties"]["times"]["maximum"] == 10
    assert schema["required"] == ["greeting"]


def test_a_plugin_task_named_like_a_built_in_is_refused(modules: Modules) -> None:
    module = modules.write(ONE_TASK, name="http")

    with pytest.raises(PluginError) as raised:
        load_plugins(builtin_registry(), [module], entry_points=False)

    message = str(raised.value)
    assert "task 'http' is defined twice" in message
    assert "built-in" in message
    assert f"module {module!r} (TICKGATE_TASK_MODULES)" in message


def test_one_name_in_two_modules_is_refused_naming_both(modules: Modules) -> None:
    first = modules.write(ONE_TASK, name="nightly")
    second = modules.write(ONE_TASK, name="nightly")

    with pytest.raises(PluginError, match="'nightly' is defined twice") as raised:
        load_plugins(TaskRegistry(), [first, second], entry_points=False)

    message = str(raised.value)
    assert message.index(first) < message.index(second)


def test_the_same_definition_reached_twice_counts_once(modules: Modules) -> None:
    original = modules.write(ONE_TASK, name="shared")
    reexporting = modules.write(f"from {original} import run as shared\n")

    added = load_plugins(TaskRegistry(), [original, reexporting, original], entry_points=False)

    assert added == ["shared"]


def test_a_module_that_does_not_exist_is_named(modules: Modules) -> None:
    with pytest.raises(PluginError) as raised:
        load_plugins(TaskRegistry(), ["tg_no_such_plugin"], entry_points=False)

    message = str(raised.value)
    assert "cannot import task module 'tg_no_such_plugin' (TICKGATE_TASK_MODULES)" in message
    assert "ModuleNotFoundError" in message


def test_a_module_failing_at_import_is_named_with_its_error(modules: Modules) -> None:
    module = modules.write("raise RuntimeError('missing API key')\n")

    with pytest.raises(PluginError, match=rf"'{module}'.*RuntimeError: missing API key"):
        load_plugins(TaskRegistry(), [module], entry_points=False)


def test_a_named_module_without_tasks_is_refused(modules: Modules) -> None:
    module = modules.write("VALUE = 1\n")

    with pytest.raises(PluginError, match=rf"module '{module}'.* defines no tasks"):
        load_plugins(TaskRegistry(), [module], entry_points=False)


def test_entry_points_name_modules_or_single_tasks(modules: Modules) -> None:
    whole = modules.write(GREET_AND_WAVE, prefix="ep_")
    single = modules.write(ONE_TASK, name="ep_single")
    modules.distribution("tg-fake-plugin", {"whole": whole, "single": f"{single}:run"})
    registry = builtin_registry()

    added = load_plugins(registry, [])

    assert sorted(added) == ["ep_greet", "ep_single", "ep_wave"]
    assert names(registry) == ["ep_greet", "ep_single", "ep_wave", "http", "log"]


def test_entry_points_can_be_turned_off(modules: Modules) -> None:
    modules.distribution("tg-fake-plugin", {"whole": modules.write(GREET_AND_WAVE, prefix="")})

    assert load_plugins(TaskRegistry(), [], entry_points=False) == []


def test_a_module_named_both_ways_registers_once(modules: Modules) -> None:
    module = modules.write(GREET_AND_WAVE, prefix="")
    modules.distribution("tg-fake-plugin", {"tasks": module})

    assert load_plugins(TaskRegistry(), [module]) == ["greet", "wave"]


def test_a_clash_between_an_entry_point_and_a_module_names_both(modules: Modules) -> None:
    module = modules.write(ONE_TASK, name="clash")
    other = modules.write(ONE_TASK, name="clash")
    modules.distribution("tg-fake-plugin", {"tasks": other})

    with pytest.raises(PluginError) as raised:
        load_plugins(TaskRegistry(), [module])

    message = str(raised.value)
    assert f"module {module!r} (TICKGATE_TASK_MODULES)" in message
    assert f"entry point 'tasks' = {other!r} (tickgate.tasks, from tg-fake-plugin 1.0)" in message


@pytest.mark.parametrize(
    ("target", "expected"),
    [
        ("{module}:NOT_A_TASK", "names a str, not a module or a @task definition"),
        ("{module}:missing", "cannot load entry point 'bad'.*AttributeError"),
        ("tg_no_such_plugin", "cannot load entry point 'bad'.*ModuleNotFoundError"),
    ],
)
def test_a_bad_entry_point_is_named(modules: Modules, target: str, expected: str) -> None:
    module = modules.write(GREET_AND_WAVE, prefix="")
    modules.distribution("tg-broken-plugin", {"bad": target.replace("{module}", module)})

    with pytest.raises(PluginError, match=expected) as raised:
        load_plugins(TaskRegistry(), [])

    assert "tg-broken-plugin 1.0" in str(raised.value)


# --- the example plugin's tasks ---------------------------------------------------------


@dataclass
class RecordingSql:
    statements: list[tuple[str, str, float]] = field(default_factory=list)

    def names(self) -> frozenset[str]:
        return frozenset({"self"})

    async def execute(
        self, target: str, statement: str, timeout_seconds: float, keep_rows: int = 0
    ) -> SqlOutcome:
        self.statements.append((target, statement, timeout_seconds))
        return SqlOutcome(command="ANALYZE", rows_affected=0)


@pytest.fixture
def sql() -> RecordingSql:
    return RecordingSql()


@pytest.fixture
async def context_for(sql: RecordingSql) -> AsyncIterator[Callable[..., TaskContext]]:
    async with httpx.AsyncClient() as http:

        def make(attempt: int = 1) -> TaskContext:
            now = datetime.now(UTC)
            return TaskContext(
                job="example",
                run_id=uuid.uuid4(),
                scheduled_for=now,
                attempt=attempt,
                logger=logging.LoggerAdapter(logging.getLogger("tickgate.run"), {}),
                deadline=now + timedelta(seconds=60),
                http=http,
                sql=sql,
            )

        yield make


async def test_greet_logs_and_returns_what_it_said(
    example_on_path: None,
    context_for: Callable[..., TaskContext],
    caplog: pytest.LogCaptureFixture,
) -> None:
    from tickgate_example_tasks.greet import greet

    caplog.set_level(logging.INFO, logger="tickgate.run")
    args = greet.parse_args({"greeting": "hello", "times": 3})

    result = await greet.run(args, context_for(attempt=2))

    assert result == {"said": "hello", "times": 3, "attempt": 2}
    assert [record.getMessage() for record in caplog.records] == ["hello"] * 3


@pytest.mark.parametrize(
    "args",
    [{"greeting": "hi", "times": 0}, {"greeting": "hi", "times": 11}, {"greeting": ""}, {}],
)
def test_greet_refuses_args_out_of_bounds(example_on_path: None, args: dict[str, Any]) -> None:
    from tickgate_example_tasks.greet import greet

    with pytest.raises(ValidationError):
        greet.parse_args(args)


async def test_analyze_quotes_the_table_and_passes_the_time_left(
    example_on_path: None, context_for: Callable[..., TaskContext], sql: RecordingSql
) -> None:
    from tickgate_example_tasks.maintenance import analyze

    args = analyze.parse_args({"table": "public.Orders"})

    result = await analyze.run(args, context_for())

    statement = 'ANALYZE "public"."Orders"'
    assert result == {"statement": statement, "target": "self", "command": "ANALYZE"}
    [(target, sent, timeout)] = sql.statements
    assert (target, sent) == ("self", statement)
    assert 0 < timeout <= 60


@pytest.mark.parametrize(
    "table",
    [
        "orders; DROP TABLE jobs",
        'orders"',
        "a.b.c",
        "1orders",
        "orders ",
        "",
        "x" * 64,
        "schema.",
        "orders\n",
    ],
)
def test_analyze_refuses_anything_but_a_plain_table_name(example_on_path: None, table: str) -> None:
    from tickgate_example_tasks.maintenance import analyze, analyze_statement

    with pytest.raises(ValidationError):
        analyze.parse_args({"table": table})
    with pytest.raises(ValueError, match="not a table name"):
        analyze_statement(table)
