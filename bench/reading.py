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
