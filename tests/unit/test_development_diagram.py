"""The development guide's diagram of one tick's path stays short and true: it names at
most ten files (or folders) along the path, each of them exists, and every function,
method and statement it calls by name is defined in the code."""

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GUIDE = ROOT / "docs" / "development.md"
MOST_FILES = 10
# A path in the diagram: folders and a module (`store/cursors.py`), or a folder alone
# (`service/tasks/`); relative to `service/` unless it says otherwise.
PATH = re.compile(r"(?<![\w/.])((?:[a-z_]+/)+(?:[a-z_]+\.py)?)")


def diagram() -> str:
    text = GUIDE.read_text()
    section = text[text.index("## One tick's path, file by file") :]
    return section[section.index("```text") : section.index("```", section.index("```text") + 3)]


def named_paths(block: str) -> set[str]:
    return {match.group(1) for match in PATH.finditer(block)}


def test_the_paths_named_are_found_as_written() -> None:
    block = "gather scheduler/window.py -> store/cursors.py\n -> service/tasks/ (http, sql)"
    assert named_paths(block) == {"scheduler/window.py", "store/cursors.py", "service/tasks/"}


def test_the_tick_diagram_names_at_most_ten_files_each_of_which_exists() -> None:
    paths = named_paths(diagram())
    assert "scheduler/window.py" in paths  # the block was found, and read
    assert len(paths) <= MOST_FILES, sorted(paths)
    located = {
        path: ROOT / (path if path.startswith("service/") else f"service/{path}") for path in paths
    }
    assert [path for path, file in located.items() if not file.exists()] == []


# A name the diagram calls: `Window._fire_due`, `LockSession.claim`, `fire_sql.FINISH`.
CALLED = re.compile(r"\b([A-Za-z_]+)\.([A-Za-z_]+)\b")


def _defined(module: Path) -> set[tuple[str, str]]:
    """(class or module, name) of each function, method and constant of `module`."""
    tree = ast.parse(module.read_text())
    found = {(module.stem, node.name) for node in tree.body if isinstance(node, ast.FunctionDef)}
    found |= {
        (module.stem, target.id)
        for node in tree.body
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    for cls in (node for node in tree.body if isinstance(node, ast.ClassDef)):
        methods = (n for n in cls.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef))
        found |= {(cls.name, method.name) for method in methods}
    return found


def test_every_name_the_diagram_calls_is_defined_in_the_code() -> None:
    defined = set().union(*(_defined(path) for path in (ROOT / "service").rglob("*.py")))
    # A class's name is capitalised; a module's is a statement module's (`fire_sql`).
    called = {
        (owner, name)
        for owner, name in (match.groups() for match in CALLED.finditer(diagram()))
        if name != "py" and (owner[0].isupper() or owner.endswith("_sql"))
    }
    assert ("Window", "_fire_due") in called  # the block was read
    assert sorted(called - defined) == []
