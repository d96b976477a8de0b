"""The development guide's diagram of one tick's path stays short and true: it names at
most ten files (or folders) along the path, and each of them exists."""

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
