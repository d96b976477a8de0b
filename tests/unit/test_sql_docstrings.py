"""The statements' docstrings name their arguments, never their numbers (#43): `$11`
says nothing to a reader, and goes stale when a column is added before it."""

import ast
import re
from pathlib import Path

STORE = Path(__file__).resolve().parents[2] / "service" / "store"
NUMBERED = re.compile(r"\$\d")


def _docstrings(path: Path) -> list[tuple[str, str]]:
    tree = ast.parse(path.read_text())
    nodes = [tree, *(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.ClassDef))]
    named = [(getattr(node, "name", path.stem), ast.get_docstring(node)) for node in nodes]
    return [(name, text) for name, text in named if text]


def test_no_docstring_of_a_statement_module_numbers_an_argument() -> None:
    modules = sorted(STORE.glob("*_sql.py"))
    assert modules, STORE
    numbered = [
        f"{path.name}: {name}"
        for path in modules
        for name, text in _docstrings(path)
        if NUMBERED.search(text)
    ]
    assert numbered == []
