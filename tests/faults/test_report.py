"""RELIABILITY.md is rendered from the JSON lines the fault tests and the fuzzing append."""

import json
from pathlib import Path

import pytest

from tests.faults.figures import LOG_ENV, FaultFigures, record
from tests.faults.report import write_reliability


def test_figures_are_recorded_only_when_a_log_is_configured(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = tmp_path / "figures" / "reliability.jsonl"
    monkeypatch.delenv(LOG_ENV, raising=False)
    record(FaultFigures("t", "T", "nothing", faults_injected=1))
    assert not log.exists()

    monkeypatch.setenv(LOG_ENV, str(log))
    figures = FaultFigures("t", "T", "nothing", faults_injected=1, ticks_expected=10, misses=1)
    figures.misses_allowed = 2
    record(figures)
    [entry] = [json.loads(line) for line in log.read_text().splitlines()]
    assert entry["kind"] == "fault"
    assert (entry["test"], entry["ticks_expected"], entry["misses"]) == ("t", 10, 1)
    assert entry["seconds"] >= 0


def test_a_table_per_test_and_totals_with_fuzz_records(tmp_path: Path) -> None:
    log = tmp_path / "reliability.jsonl"
    records = [
        {
            "kind": "fault",
            "test": "crash",
            "title": "Replica crash",
            "fault": "kill -9",
            "faults_injected": 1,
            "ticks_expected": 100,
            "duplicates": 0,
            "misses": 2,
            "misses_allowed": 3,
            "seconds": 20.5,
            "notes": {"replicas": 3},
        },
        {
            "kind": "fault",
            "test": "restart",
            "title": "PostgreSQL restart",
            "fault": "stop",
            "faults_injected": 1,
            "ticks_expected": 50,
            "duplicates": 1,
            "misses": 0,
            "misses_allowed": 0,
            "seconds": 30.0,
            "notes": {},
        },
        {"kind": "fuzz", "cases": 2146, "server_errors": 0},
        {"kind": "fuzz", "cases": 54, "server_errors": 1, "name": "auth"},
    ]
    log.write_text("\n".join(json.dumps(r) for r in records) + "\n\n")
    out = tmp_path / "RELIABILITY.md"
    write_reliability(log, out)
    text = out.read_text()
    assert text.startswith("# Reliability")
    assert "| 2 | 2 | 150 | 1 | 2 (of 3 allowed) | 0 | **no** | 2200 | 1 |" in text
    assert "## Replica crash" in text
    assert "| 1 | 100 | 0 | 2 | 3 | 0 | yes | 20.5 |" in text
    assert "## PostgreSQL restart" in text
    assert "| 1 | 50 | 1 | 0 | 0 | 0 | **no** | 30.0 |" in text
    assert "Observed: replicas 3." in text
    assert "| run 1 | 2146 | 0 |" in text
    assert "| auth | 54 | 1 |" in text


def test_no_log_renders_an_empty_report_and_a_bad_line_fails(tmp_path: Path) -> None:
    out = tmp_path / "RELIABILITY.md"
    write_reliability(tmp_path / "missing.jsonl", out)
    assert "No figures were recorded" in out.read_text()
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"kind": "fuzz", "cases": 1}\n{oops\n')
    with pytest.raises(ValueError, match=r"bad\.jsonl:2"):
        write_reliability(bad, out)


def test_a_rewrite_keeps_the_soak_section(tmp_path: Path) -> None:
    out = tmp_path / "RELIABILITY.md"
    soak = "<!-- soak:begin -->\n## Soak run\n\n| check |\n<!-- soak:end -->"
    out.write_text(f"# Reliability\n\nold figures\n\n{soak}\n\nafter\n")
    write_reliability(tmp_path / "missing.jsonl", out)
    text = out.read_text()
    assert "old figures" not in text
    assert "No figures were recorded" in text
    assert text.count("<!-- soak:begin -->") == 1
    assert text.endswith(f"{soak}\n")
