"""`python -m bench.current`: BENCHMARKS.md's current table, from `bench/results/`.

Each target (`bench/targets.json`) is judged on the newest run that measured it, and its
row names that run's commit, date and results file: a row not measured since an older
commit says so. The peers' rows come from the newest run that measured them beside
Tickgate, and the plots (a section of their own) are the newest full run's. Every figure
comes from a results file, so both sections are regenerated, never edited: `make bench`
and `make bench-versus` rewrite them after their run, and a unit test fails while they
are stale.

A run is a results document in the folder: a `make bench` run, or the side of a
`make bench-versus` run measured on its own commit (`after`; `before` is its baseline).
Smoke and partial runs are git-ignored and never read; soak runs are not benchmarks.
"""

import json
import re
import sys
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any

from bench.plots import PLOTS
from bench.reading import best_p99, fmt, largest_burst, mark, replaced, scenario, table
from bench.targets import judged, load, why_not
from harness.replicas import REPO

RESULTS = REPO / "bench" / "results"
PAGE = REPO / "BENCHMARKS.md"
MARKERS = ("<!-- current:begin -->", "<!-- current:end -->")
PLOT_MARKERS = ("<!-- plots:begin -->", "<!-- plots:end -->")
NOT_RUNS = ("smoke-", "partial-", "soak-")
FULL_RUN = re.compile(r"\d{4}-\d{2}-\d{2}")  # the stem of a complete `make bench`
PEERS_AGAINST = "highest steady `http` fires/s, against the best peer"


@dataclass(frozen=True)
class Run:
    """One results document and the file it was read from."""

    path: Path
    document: dict[str, Any]

    @property
    def when(self) -> datetime:
        return datetime.strptime(self.document["meta"]["date"], "%Y-%m-%dT%H:%M:%S%z")

    def cells(self) -> tuple[str, str]:
        """Its commit (marked when the tree had changes) and its date, linked to its file."""
        machine = self.document["meta"]["machine"]
        dirty = " (uncommitted changes)" if machine.get("git_dirty") else ""
        link = f"[{self.when:%Y-%m-%d}](bench/results/{self.path.name})"
        return f"`{machine.get('git_commit')}`{dirty}", link


def runs(folder: Path = RESULTS) -> list[Run]:
    """The folder's runs, newest first."""
    found = []
    for path in folder.glob("*.json"):
        if path.name.startswith(NOT_RUNS):
            continue
        document = json.loads(path.read_text())
        document = document.get("after", document)
        if not document["meta"].get("smoke"):
            found.append(Run(path, document))
    return sorted(found, key=lambda run: run.when, reverse=True)


def _newest(row: dict[str, Any], found: list[Run]) -> tuple[Run, str, bool | None] | None:
    """The newest run that measured the row, its figure there and met or not."""
    for run in found:
        text, met = judged(run.document, row)
        if met is not None:
            return run, text, met
    return None


def _target_row(row: dict[str, Any], found: list[Run]) -> tuple[str, ...]:
    newest = _newest(row, found)
    if newest is None:
        return (row["measure"], row["target"], "not measured", "", "-", "-", "")
    run, text, met = newest
    return (row["measure"], row["target"], text, mark(met), *run.cells(), why_not(row, met))


def _peer_rows(found: list[Run]) -> list[tuple[str, ...]]:
    """One row a peer, from the newest run that put Tickgate against them."""
    [against] = [row for row in load()["rows"] if row["measure"] == PEERS_AGAINST]
    newest = _newest(against, found)
    if newest is None:
        return []
    run = newest[0]
    peers = scenario(run.document, "peers") or {}
    return [
        (f"peer: {name}", "-", _peer_figure(peer), "", *run.cells(), "")
        for name, peer in peers.get("peers", {}).items()
    ]


def _peer_figure(peer: dict[str, Any]) -> str:
    if peer.get("status") == "skipped":
        return f"skipped: {peer.get('reason')}"
    steady = peer.get("steady") or {}
    levels = steady.get("levels", [])
    return (
        f"{fmt(steady.get('max_achieved_fires_per_s'))} fires/s at most (p99 "
        f"{fmt(best_p99(steady))} ms there); over all rates "
        f"{sum(level.get('duplicates', 0) for level in levels):,} duplicates, "
        f"{sum(level.get('misses', 0) for level in levels):,} misses; largest crowd's drain, s: "
        f"{largest_burst(peer.get('burst'))}; {peer.get('version', '')}"
    )


def plots(found: list[Run]) -> list[str]:
    """The newest full run's plots."""
    full = [run for run in found if FULL_RUN.fullmatch(run.path.stem)]
    if not full:
        return []
    run, folder = full[0], full[0].path.parent
    pictures = [f"{run.path.stem}-{name}" for name in PLOTS]
    drawn = [f"![{p}](bench/results/{p}.png)" for p in pictures if (folder / f"{p}.png").exists()]
    commit, link = run.cells()
    return (
        [f"## Plots of the newest full run ({link}, commit {commit})", "", *drawn] if drawn else []
    )


def section(found: list[Run]) -> list[str]:
    """The current table."""
    targets = load()
    rows = [_target_row(row, found) for row in targets["rows"]] + _peer_rows(found)
    header = ["measure", "target", "newest figure", "", "commit", "run", "why not"]
    intro = [f"## {targets['title']}", "", targets["intro"], ""]
    return [*intro, *table(header, rows)]


def refreshed(markdown: str, folder: Path = RESULTS) -> str:
    """`markdown` with its current table and plots as the results give them."""
    found = runs(folder)
    return replaced(replaced(markdown, MARKERS, section(found)), PLOT_MARKERS, plots(found))


def stale(page: Path = PAGE, folder: Path = RESULTS) -> bool:
    """Whether the page's current table or plots differ from what the results give."""
    text = page.read_text()
    return refreshed(text, folder) != text


def refresh(page: Path = PAGE, folder: Path = RESULTS) -> Path:
    """Rewrite the page's current table and plots from the results."""
    page.write_text(refreshed(page.read_text(), folder))
    return page


def main(argv: list[str] | None = None) -> int:
    arguments = argv if argv is not None else sys.argv[1:]
    print(refresh(Path(arguments[0])) if arguments else refresh())
    return 0


if __name__ == "__main__":
    sys.exit(main())
