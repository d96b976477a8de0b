"""Render RELIABILITY.md from the figures the fault tests (and the API fuzzing) recorded.

The log is JSON lines (see `tests/faults/figures.py`): `{"kind": "fault", ...}` from each
fault test, and `{"kind": "fuzz", "cases": N, "server_errors": M}` from the fuzzing.
Usage: `python -m tests.faults.report LOG OUT`.

The soak run's section (`make soak`, between `<!-- soak:begin -->` and `<!-- soak:end -->`)
is not the test suite's: a rewrite keeps the one `OUT` has, at the end.
"""

import json
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

HEADER = """# Reliability

Figures measured by the test suite and written by `make reliability` (or by `make
reliability-from-log`, from what the last `make test` logged): the fault tests in
`tests/faults/` run real `tickgate serve` processes against a real PostgreSQL
and inject the faults below, while a loopback receiver counts every delivery on its own
(independently of Tickgate's run ledger). A *duplicate* is any delivery beyond the first
of a tick, a run id or an idempotency key; a *miss* is an expected tick that never
arrived. *Allowed* misses are the ticks the faulty replica had already claimed when it
was hit (the requirement tolerates losing those, never running anything twice), plus any
tick the ledger records as skipped by the default `skip` overlap policy (it came while
the job's previous run was still in progress: a 1 s job stalled on a loaded runner).
An *unaccounted* tick has no ledger row at all, neither a run nor a recorded skip: every
tick must have one, so any is out of bounds.
"""

SOAK_BEGIN = "<!-- soak:begin -->"
SOAK_END = "<!-- soak:end -->"

FAULT_COLUMNS = (
    "faults injected",
    "ticks expected",
    "duplicates",
    "misses",
    "misses allowed",
    "unaccounted",
    "within bounds",
    "seconds",
)


def write_reliability(log: Path, out: Path) -> None:
    """Render the records in `log` (JSON lines; missing means none) into `out`."""
    records = list(_read(log))
    faults = [r for r in records if r.get("kind") == "fault"]
    fuzz = [r for r in records if r.get("kind") == "fuzz"]
    sections = [HEADER, _totals(faults, fuzz)]
    for test, runs in _by_test(faults).items():
        sections.append(_fault_section(test, runs))
    if fuzz:
        sections.append(_fuzz_section(fuzz))
    if not records:
        sections.append("No figures were recorded by this run.\n")
    sections += _soak_section(out)
    out.write_text("\n".join(sections), encoding="utf-8")


def _soak_section(out: Path) -> list[str]:
    """The soak section `out` already has (written by `python -m reliability.soak`), if any."""
    text = out.read_text(encoding="utf-8") if out.exists() else ""
    begin, end = text.find(SOAK_BEGIN), text.find(SOAK_END)
    if begin < 0 or end < begin:
        return []
    return [text[begin : end + len(SOAK_END)] + "\n"]


def _read(log: Path) -> Iterable[dict[str, Any]]:
    if not log.exists():
        return
    for number, line in enumerate(log.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as error:
            raise ValueError(f"{log}:{number}: not a JSON record: {error}") from error
        if not isinstance(record, dict):
            raise ValueError(f"{log}:{number}: a record must be a JSON object")
        yield record


def _by_test(faults: Sequence[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    grouped: dict[str, list[dict[str, Any]]] = {}
    for record in faults:
        grouped.setdefault(str(record.get("test", "unnamed")), []).append(record)
    return grouped


def _number(record: Mapping[str, Any], key: str) -> int:
    value = record.get(key, 0)
    return int(value) if isinstance(value, int | float) else 0


def _within_bounds(record: Mapping[str, Any]) -> bool:
    return (
        _number(record, "duplicates") == 0
        and _number(record, "unaccounted") == 0
        and _number(record, "misses") <= _number(record, "misses_allowed")
    )


def _table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines) + "\n"


def _totals(faults: Sequence[dict[str, Any]], fuzz: Sequence[dict[str, Any]]) -> str:
    def total(records: Sequence[Mapping[str, Any]], key: str) -> int:
        return sum(_number(record, key) for record in records)

    row = (
        len(_by_test(faults)),
        total(faults, "faults_injected"),
        total(faults, "ticks_expected"),
        total(faults, "duplicates"),
        f"{total(faults, 'misses')} (of {total(faults, 'misses_allowed')} allowed)",
        total(faults, "unaccounted"),
        "yes" if all(_within_bounds(record) for record in faults) else "**no**",
        total(fuzz, "cases"),
        total(fuzz, "server_errors"),
    )
    header = (
        "fault tests",
        "faults injected",
        "ticks expected",
        "duplicates",
        "misses",
        "unaccounted",
        "all within bounds",
        "fuzz cases",
        "5xx",
    )
    return "## Totals\n\n" + _table(header, [row])


def _fault_section(test: str, runs: Sequence[dict[str, Any]]) -> str:
    title = str(runs[-1].get("title") or test)
    fault = str(runs[-1].get("fault") or "")
    rows = [
        (
            _number(run, "faults_injected"),
            _number(run, "ticks_expected"),
            _number(run, "duplicates"),
            _number(run, "misses"),
            _number(run, "misses_allowed"),
            _number(run, "unaccounted"),
            "yes" if _within_bounds(run) else "**no**",
            run.get("seconds", ""),
        )
        for run in runs
    ]
    text = f"## {title}\n\n`{test}`: {fault}\n\n" + _table(FAULT_COLUMNS, rows)
    notes = [run.get("notes") for run in runs if run.get("notes")]
    if notes:
        shown = "; ".join(
            ", ".join(f"{_words(key)} {_shown(value)}" for key, value in note.items())
            for note in notes
        )
        text += f"\nObserved: {shown}.\n"
    return text


def _words(key: object) -> str:
    return str(key).replace("_", " ")


def _shown(value: object) -> str:
    if isinstance(value, dict):
        return "(" + ", ".join(f"{_words(k)} {_shown(v)}" for k, v in value.items()) + ")"
    return str(value)


def _fuzz_section(fuzz: Sequence[dict[str, Any]]) -> str:
    rows = [
        (
            str(record.get("name") or record.get("test") or f"run {index}"),
            _number(record, "cases"),
            _number(record, "server_errors"),
        )
        for index, record in enumerate(fuzz, 1)
    ]
    return "## API fuzzing\n\n" + _table(("fuzzing", "cases", "5xx"), rows)


def main(argv: Sequence[str]) -> int:
    if len(argv) != 2:
        print("usage: python -m tests.faults.report LOG OUT", file=sys.stderr)
        return 2
    write_reliability(Path(argv[0]), Path(argv[1]))
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))


if __name__ == "__main__":
    import sys

    write_reliability(Path(sys.argv[1]), Path(sys.argv[2]))
