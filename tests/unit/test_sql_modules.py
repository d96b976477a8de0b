"""The store's statements live in its `*_sql` modules, each batch's columns written
once (#43): a column list written twice drifts apart, SQL strewn among the adapters is
not found where a reader looks for it, and a statement module that works out the
domain's answers hides logic among the SQL."""

import ast
import importlib
import inspect
import re
from pathlib import Path

import service.domain

STORE = Path(__file__).resolve().parents[2] / "service" / "store"
DOMAIN = Path(service.domain.__file__).parent
# A statement: an SQL keyword and more; a write's command tag (`UPDATE 1`, `INSERT 0 1`),
# which an adapter compares a status with, is none.
STATEMENT = re.compile(
    r"^\s*(?:(?:SELECT|WITH|SET|LISTEN|NOTIFY)\s+\S|(?:INSERT|UPDATE|DELETE)\s+(?!\d)\S)"
)
# The statement builder writes the fragments of `unnest` itself.
BUILDER = "columns.py"


def _statement_modules() -> list[Path]:
    modules = sorted(STORE.glob("*_sql.py"))
    assert modules, STORE
    return modules


def _adapters() -> list[Path]:
    names = {path.name for path in _statement_modules()} | {BUILDER}
    return [path for path in sorted(STORE.glob("*.py")) if path.name not in names]


def _unnests(source: str) -> list[int]:
    """The lines of the string literals (f-strings' text included) that write an
    `unnest(`."""
    return [
        node.lineno
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and re.search(r"\bunnest\s*\(", node.value, re.IGNORECASE)
    ]


def test_no_statement_module_writes_an_unnest_by_hand() -> None:
    """Every `unnest` comes from a column table (`columns.Rows.unnest`), which writes
    the arrays and the names from one list."""
    by_hand = [
        f"{path.name}:{line}"
        for path in _statement_modules()
        for line in _unnests(path.read_text())
    ]
    assert by_hand == []


def test_the_unnest_scan_finds_one_written_by_hand() -> None:
    source = 'A = f"""SELECT * FROM {rows.unnest("t")}"""\nB = "FROM unnest($1::text[])"\n'
    assert _unnests(source) == [2]


def _docstrings(tree: ast.Module) -> set[int]:
    owners = [tree, *(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef | ast.ClassDef))]
    return {
        id(owner.body[0].value)
        for owner in owners
        if owner.body
        and isinstance(owner.body[0], ast.Expr)
        and isinstance(owner.body[0].value, ast.Constant)
    }


def _sql_literals(source: str) -> list[tuple[int, str]]:
    tree = ast.parse(source)
    docstrings = _docstrings(tree)
    return [
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and id(node) not in docstrings
        and STATEMENT.match(node.value)
    ]


def test_no_adapter_of_the_store_holds_a_statement() -> None:
    strewn = [
        f"{path.name}:{line}: {text[:40]!r}"
        for path in _adapters()
        for line, text in _sql_literals(path.read_text())
    ]
    assert strewn == []


def test_the_statement_scan_tells_a_statement_from_a_tag_and_a_docstring() -> None:
    source = '"""SELECT the jobs."""\nA = "SELECT 1"\nB = "UPDATE 1"\nC = f"SET {k} = 1"\n'
    assert [text for _, text in _sql_literals(source)] == ["SELECT 1"]


def _domain_methods() -> set[str]:
    """The names of the methods the domain's classes define (not their dunders)."""
    return {
        method.name
        for path in DOMAIN.glob("*.py")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.ClassDef)
        for method in node.body
        if isinstance(method, ast.FunctionDef) and not method.name.startswith("__")
    }


def _domain_functions(tree: ast.Module) -> set[str]:
    """The names this module imports from the domain that are functions (a class,
    a value type, may be named and built; its logic may not run here)."""
    imported = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("service.domain"):
            module = importlib.import_module(node.module or "")
            for alias in node.names:
                if inspect.isfunction(getattr(module, alias.name)):
                    imported.add(alias.asname or alias.name)
    return imported


def _domain_calls(source: str, methods: set[str]) -> list[str]:
    tree = ast.parse(source)
    functions = _domain_functions(tree)
    calls = [node.func for node in ast.walk(tree) if isinstance(node, ast.Call)]
    return [
        ast.unparse(func)
        for func in calls
        if (isinstance(func, ast.Name) and func.id in functions)
        or (isinstance(func, ast.Attribute) and func.attr in methods)
    ]


def test_no_statement_module_calls_the_domain() -> None:
    """A statement module may carry the domain's values (a job, a run, an enum) into
    its arguments; where a cursor moves, which hooks fire, is worked out by the adapter
    that runs the statement."""
    methods = _domain_methods()
    calling = [
        f"{path.name}: {call}"
        for path in _statement_modules()
        for call in _domain_calls(path.read_text(), methods)
    ]
    assert calling == []


def test_the_call_scan_finds_a_domain_function_and_a_domain_method() -> None:
    source = (
        "from service.domain.hooks import HookPlan, events_of_skip\n"
        "a = events_of_skip(reason)\nb = job.tick_after(at)\nc = HookPlan()\n"
    )
    assert _domain_calls(source, _domain_methods()) == ["events_of_skip", "job.tick_after"]
