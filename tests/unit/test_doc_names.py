"""No page names a module or a file of the tree that does not exist.

Pages that say what is true now (the README, the docs, the reliability, security and
benchmark pages, the bench and soak guides and the profiling notes) are read for paths such as
`service/store/fire_sql.py` and dotted modules such as `service.scheduler.runner`; so is
the benchmarks' history, whose figures are of their day but whose names lead to today's
code. The CHANGELOG keeps the names of its day, and is not read.
"""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [
    "README.md",
    "RELIABILITY.md",
    "SECURITY.md",
    "BENCHMARKS.md",
    "bench/README.md",
    "reliability/README.md",
    "bench/PROFILING.md",
    "bench/results/HISTORY.md",
    *sorted(str(p.relative_to(ROOT)) for p in (ROOT / "docs").rglob("*.md")),
]
TOP = r"(?:service|harness|bench|reliability|tests|tools)"
# A path, and what follows it: `-<date>`, `.*` or `*` make it a pattern of names.
PATH = re.compile(rf"(?<![\w./-])({TOP}/[\w/.-]*\w)(-<|\.\*|\*)?")
MODULE = re.compile(rf"(?<![\w./-]){TOP}(?:\.[A-Za-z_][A-Za-z0-9_]*)+")
# Words of the same shape that name no file of the tree.
NOT_OURS = {
    "service/tickgate",  # a Kubernetes Service, as kubectl names it
    "service.instance.id",  # an OpenTelemetry resource attribute
}


def _exists(path: str, pattern: str) -> bool:
    """The file, or with a pattern (`-<date>`) or a placeholder (`NNNN`) some file it
    stands for."""
    if pattern or "NNNN" in path:
        stem = path.split("NNNN", maxsplit=1)[0]
        return any(ROOT.glob(f"{stem}*"))
    return (ROOT / path).exists()


def _module_exists(dotted: str) -> bool:
    """A module, a package, or an attribute of one (`service.app.create_app`)."""
    parts = dotted.split(".")
    for end in range(len(parts), 0, -1):
        base = ROOT.joinpath(*parts[:end])
        if base.with_suffix(".py").exists() or (base / "__init__.py").exists():
            return end >= len(parts) - 1  # at most one attribute after the module
    return False


def test_every_page_names_only_files_and_modules_that_exist() -> None:
    stale = []
    for page in PAGES:
        text = (ROOT / page).read_text(encoding="utf-8")
        paths = {(p, pattern) for p, pattern in PATH.findall(text) if p not in NOT_OURS}
        stale += [f"{page}: {p}" for p, pattern in paths if not _exists(p, pattern)]
        modules = set(MODULE.findall(text)) - NOT_OURS
        stale += [f"{page}: {m}" for m in modules if not _module_exists(m)]
    assert sorted(stale) == []
