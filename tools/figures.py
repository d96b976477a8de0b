"""Benchmark figures quoted in the docs, generated from the latest full run.

A page quotes a figure only between `<!-- figures:NAME -->` and `<!-- /figures:NAME -->`;
`python -m tools.gendocs` rewrites what stands there from the newest
`bench/results/YYYY-MM-DD.json` that is not a smoke run, so no page quotes a figure that
no run produced (tests fail while a page is stale)."""

import json
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent.parent / "bench" / "results"
_FULL_RUN = re.compile(r"\d{4}-\d{2}-\d{2}\.json")

Results = Mapping[str, Any]


def latest_results(folder: Path = RESULTS) -> tuple[str, Results]:
    """The newest full run's file name and its figures."""
    for path in sorted(folder.glob("*.json"), reverse=True):
        if _FULL_RUN.fullmatch(path.name):
            results: Results = json.loads(path.read_text(encoding="utf-8"))
            if not results["meta"]["smoke"]:
                return path.name, results
    raise FileNotFoundError(f"no full benchmark run in {folder}")


def crowd(name: str, results: Results) -> str:
    """The README's line: how soon the biggest `log` crowd all started."""
    size = results["scenarios"]["burst"]["log_sizes"][-1]
    return (
        f"A crowd of {size['jobs']:,} jobs due at one instant all started in "
        f"{size['drain_s']:.2f} s in the [latest benchmark](BENCHMARKS.md) ({_run(results)})."
    )


def headline(name: str, results: Results) -> str:
    """docs/development.md's summary of the full run."""
    scenarios = results["scenarios"]
    return " ".join(
        [
            f"The latest full run (`bench/results/{name}`, {_run(results)}):",
            _listed(
                "steady `http` ticks, lateness p99 by rate", scenarios["steady"]["levels"], _level
            ),
            _listed(
                "crowds of one-time `http` jobs due at one instant",
                scenarios["burst"]["sizes"],
                _crowd,
            ),
            _scale(scenarios["scale"]),
        ]
    )


def _run(results: Results) -> str:
    machine = results["meta"]["machine"]
    return f"commit {machine['git_commit']}, {machine['logical_cpus']} cores, all on one box"


def _listed(what: str, items: list[Results], figure: Callable[[Results], str]) -> str:
    return f"{what}: {', '.join(figure(item) for item in items)};"


def _level(level: Results) -> str:
    p99 = level["lateness"]["p99_ms"]
    return f"{level['rate']:,}/s {p99:.0f} ms ({_lost(level)})"


def _crowd(size: Results) -> str:
    delivered = f"{size['delivered']:,} of {size['jobs']:,} delivered in {size['drain_s']:.2f} s"
    return f"{delivered} ({size['duplicates']:,} duplicates)"


def _lost(figures: Results) -> str:
    return f"{figures['duplicates']:,} duplicates, {figures['misses']:,} missed"


def _scale(scale: Results) -> str:
    return (
        f"{scale['jobs']:,} jobs: a lone replica ready in {scale['solo_ready_s']:.1f} s, "
        f"{scale['solo_rss_peak_mib']:.0f} MiB peak RSS. Every figure and the targets are in "
        "[BENCHMARKS.md](../BENCHMARKS.md)."
    )


BLOCKS: Mapping[str, Callable[[str, Results], str]] = {"crowd": crowd, "headline": headline}


def with_figures(text: str, results: tuple[str, Results] | None = None) -> str:
    """`text` with every figures block rewritten from the latest full run."""
    name, figures = results or latest_results()
    for block, make in BLOCKS.items():
        text = _rewrite(text, block, make(name, figures))
    return text


def _rewrite(text: str, block: str, figure: str) -> str:
    pattern = re.compile(rf"(<!-- figures:{block} -->).*?(<!-- /figures:{block} -->)", re.S)
    return pattern.sub(lambda found: found[1] + figure + found[2], text)
