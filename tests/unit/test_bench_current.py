"""BENCHMARKS.md's current table: each target's newest figure in bench/results/, with the
commit and date of the run that measured it, and the page says what the results give."""

import json
import re
from pathlib import Path
from typing import Any

from bench import current
from bench.plots import PLOTS
from bench.reading import replaced

BULK = "bulk `PUT /v1/jobs` of 10,000 jobs"
STEADY = "steady 1,000 fires/s `http`: p99 lateness, dup, miss"


def test_benchmarks_md_says_what_the_results_give() -> None:
    assert not current.stale(), "run `python -m bench.current` and commit BENCHMARKS.md"


def _run(date: str, commit: str, **scenarios: dict[str, Any]) -> dict[str, Any]:
    meta = {"date": f"{date}T12:00:00+0000", "smoke": False, "machine": {"git_commit": commit}}
    results = {name: {"status": "ok", **result} for name, result in scenarios.items()}
    return {"meta": meta, "scenarios": results}


def _bulk(created_s: float) -> dict[str, Any]:
    return {"jobs": 10_000, "created_s": created_s, "unchanged_s": 0.4, "repeats": 3}


def _steady(p99_ms: float) -> dict[str, Any]:
    level = {"rate": 1000, "lateness": {"p99_ms": p99_ms}, "duplicates": 0, "misses": 0}
    return {"levels": [level], "max_achieved_fires_per_s": 1000.0}


def _row(lines: list[str], measure: str) -> str:
    [row] = [line for line in lines if line.startswith(f"| {measure} |")]
    return row


def _write(folder: Path, name: str, document: dict[str, Any]) -> None:
    (folder / name).write_text(json.dumps(document))


def test_each_row_is_the_newest_run_that_measured_it(tmp_path: Path) -> None:
    _write(tmp_path, "2026-01-01.json", _run("2026-01-01", "aaaaaaa", bulk=_bulk(0.7)))
    # A side-by-side run: only the side measured on its own commit counts.
    versus = {
        "before": _run("2026-02-02", "bbbbbbb", bulk=_bulk(9.1), steady=_steady(700.0)),
        "after": _run("2026-02-01", "ccccccc", steady=_steady(512.5)),
    }
    _write(tmp_path, "versus-2026-02-01.json", versus)
    smoke = _run("2026-03-01", "ddddddd", bulk=_bulk(0.01), steady=_steady(1.0))
    _write(tmp_path, "smoke-2026-03-01.json", smoke | {"meta": smoke["meta"] | {"smoke": True}})
    _write(tmp_path, "partial-2026-03-01.json", _run("2026-03-01", "eeeeeee", bulk=_bulk(0.02)))
    lines = current.section(current.runs(tmp_path))
    bulk, steady = _row(lines, BULK), _row(lines, STEADY)
    assert "0.70 s created" in bulk
    assert "`aaaaaaa` | [2026-01-01](bench/results/2026-01-01.json)" in bulk
    assert "512.5 ms, 0, 0 | ❌ not met | `ccccccc` | [2026-02-01]" in steady
    assert "limit: " in steady


def test_a_row_no_run_measured_says_so(tmp_path: Path) -> None:
    _write(tmp_path, "2026-01-01.json", _run("2026-01-01", "aaaaaaa"))
    assert "| not measured |" in _row(current.section(current.runs(tmp_path)), BULK)


def test_a_run_rewrites_only_the_generated_sections(tmp_path: Path) -> None:
    _write(tmp_path, "2026-01-01.json", _run("2026-01-01", "aaaaaaa", bulk=_bulk(0.7)))
    page = tmp_path / "BENCHMARKS.md"
    text = replaced("# B\n\nby hand\n\n## Scenarios\n", current.MARKERS, ["| old |"])
    page.write_text(replaced(text, current.PLOT_MARKERS, []))
    assert current.stale(page, tmp_path)
    current.refresh(page, tmp_path)
    assert not current.stale(page, tmp_path)
    rewritten = page.read_text()
    assert "| old |" not in rewritten
    assert rewritten.startswith("# B\n\nby hand\n")
    assert "## Scenarios" in rewritten
    assert "0.70 s created" in _row(rewritten.splitlines(), BULK)


ROOT = Path(__file__).resolve().parents[2]
PAGES = [
    *("README.md", "RELIABILITY.md", "SECURITY.md", "BENCHMARKS.md"),
    *("bench/README.md", "bench/PROFILING.md", "bench/results/HISTORY.md"),
    *(str(path.relative_to(ROOT)) for path in (ROOT / "docs").rglob("*.md")),
]


def _run_stem(name: str) -> str:
    """The run a results file belongs to: its JSON, its report and its plots share it."""
    stem = name.partition(".")[0]
    return next((stem.removesuffix(f"-{plot}") for plot in PLOTS if stem.endswith(plot)), stem)


def test_bench_results_keeps_only_the_runs_a_page_cites() -> None:
    text = "\n".join((ROOT / page).read_text(encoding="utf-8") for page in PAGES)
    names = [path.name for path in current.RESULTS.iterdir() if path.name != "HISTORY.md"]
    ignored = (".", "smoke-", "partial-")  # .gitignore, and what it ignores
    kept = sorted({_run_stem(name) for name in names if not name.startswith(ignored)})
    cited = [rf"(?<![\w-]){re.escape(run)}\.(?:json|md|png|\*)" for run in kept]
    assert [run for run, name in zip(kept, cited, strict=True) if not re.search(name, text)] == []
