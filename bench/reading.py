"""Reading a results document (`bench/results/<stem>.json`), for the report and the plots:
the scenarios that ran, the `limit` ceiling, and how numbers and tables are written."""

from collections.abc import Sequence
from typing import Any


def scenario(document: dict[str, Any], name: str) -> dict[str, Any] | None:
    """A scenario's result if it ran to the end (`status: ok`), else None."""
    result = document["scenarios"].get(name)
    return result if result and result.get("status") == "ok" else None


def fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    if isinstance(value, int):
        return f"{value:,}"
    return str(value)


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(fmt(cell) for cell in row) + " |" for row in rows]
    return [*lines, ""]


def ratio(value: float | None, ceiling: float | None) -> str:
    if not value or not ceiling:
        return "-"
    return f"{value / ceiling:.2f}"


def ceiling(document: dict[str, Any]) -> float | None:
    """The best gated fires/s pgbench reached (scenario limit): every rate's yardstick."""
    limit = scenario(document, "limit")
    return limit["ceiling_fires_per_s"] if limit else None


def mark(met: bool | None) -> str:
    return {True: "✅ met", False: "❌ not met", None: "n/a"}[met]


def smoke(document: dict[str, Any]) -> bool:
    """A smoke run (tiny sizes): its figures are judged against no target."""
    return bool(document["meta"].get("smoke"))


def best_p99(steady: dict[str, Any] | None) -> Any:
    """The p99 lateness at the steady level that achieved the most fires/s."""
    levels = (steady or {}).get("levels", [])
    best = max(levels, key=lambda level: level.get("achieved_fires_per_s") or 0, default=None)
    return best.get("lateness", {}).get("p99_ms") if best else None


def largest_burst(burst: dict[str, Any] | None) -> str:
    """The largest crowd's drain, size and misses."""
    sizes = (burst or {}).get("sizes", [])
    if not sizes:
        return "-"
    size = max(sizes, key=lambda s: s["jobs"])
    return f"{fmt(size.get('drain_s'), 2)} ({size['jobs']:,} jobs, {size.get('misses')} miss)"


Markers = tuple[str, str]


def replaced(markdown: str, markers: Markers, lines: list[str]) -> str:
    """`markdown` with the section between `markers` replaced by `lines` (inserted before
    the first `## ` heading after the title when it has none yet)."""
    begin, end = markers
    block = "\n".join([begin, *lines, end])
    if begin in markdown and end in markdown:
        head, _, rest = markdown.partition(begin)
        return head + block + rest.partition(end)[2]
    head, heading, rest = markdown.partition("\n## ")
    return f"{head}\n{block}\n{heading}{rest}" if heading else f"{markdown}\n{block}\n"
