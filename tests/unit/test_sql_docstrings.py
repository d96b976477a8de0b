"""The statements' docstrings and comments name their arguments, never their numbers
(#43): `$11` says nothing to a reader, and goes stale when a column is added before it."""

import ast
import io
import re
import tokenize
from pathlib import Path

STORE = Path(__file__).resolve().parents[2] / "service" / "store"
NUMBERED = re.compile(r"\$\d")


def _modules() -> list[Path]:
    modules = sorted(STORE.glob("*_sql.py"))
    assert modules, STORE
    return modules


def _docstrings(path: Path) -> list[tuple[str, str]]:
    tree = ast.parse(path.read_text())
    nodes = [tree, *(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.ClassDef))]
    named = [(getattr(node, "name", path.stem), ast.get_docstring(node)) for node in nodes]
    return [(name, text) for name, text in named if text]


def _comments(source: str) -> list[tuple[int, str]]:
    tokens = tokenize.generate_tokens(io.StringIO(source).readline)
    return [(token.start[0], token.string) for token in tokens if token.type == tokenize.COMMENT]


def test_no_docstring_of_a_statement_module_numbers_an_argument() -> None:
    numbered = [
        f"{path.name}: {name}"
        for path in _modules()
        for name, text in _docstrings(path)
        if NUMBERED.search(text)
    ]
    assert numbered == []


def test_no_comment_of_a_statement_module_numbers_an_argument() -> None:
    numbered = [
        f"{path.name}:{line}: {text}"
        for path in _modules()
        for line, text in _comments(path.read_text())
        if NUMBERED.search(text)
    ]
    assert numbered == []


def test_the_comment_scan_finds_a_numbered_argument() -> None:
    """The scan reads comments, and only comments: `$1` in a statement's text is no
    comment, and passes."""
    source = 'A = "SELECT $1"  # the job\n# takes $2, the tick\nB = 1\n'
    assert [text for _, text in _comments(source) if NUMBERED.search(text)] == [
        "# takes $2, the tick"
    ]
