"""Generated documentation pages stay in step with their sources (`make docs`)."""

import json
from pathlib import Path

from service.config import Settings
from tools import figures
from tools.gendocs import ROOT, configuration_page, stale_pages, variable_of


def test_no_generated_page_is_stale() -> None:
    assert stale_pages() == [], "run `make docs` and commit the result"


def test_the_configuration_page_names_every_setting_with_its_meaning() -> None:
    page = configuration_page()
    for name, field in Settings.model_fields.items():
        variable = variable_of(name, field)  # DATABASE_URL, DATABASE_URL_FILE: their aliases
        row = next(line for line in page.splitlines() if line.startswith(f"| `{variable}` |"))
        assert field.description, f"{variable} has no description to document"
        assert field.description.split("`")[0][:40] in row


def test_readme_links_the_generated_configuration_page() -> None:
    assert "docs/configuration.md" in (ROOT / "README.md").read_text()


def _run(date: str, *, smoke: bool, crowd_seconds: float) -> dict[str, object]:
    level = {"rate": 1000, "lateness": {"p99_ms": 87.4}, "duplicates": 0, "misses": 0}
    crowd = {"jobs": 1000, "delivered": 990, "drain_s": 1.5, "duplicates": 0}
    return {
        "meta": {"smoke": smoke, "machine": {"git_commit": "abc1234", "logical_cpus": 2}},
        "scenarios": {
            "steady": {"levels": [level]},
            "burst": {"sizes": [crowd], "log_sizes": [{"jobs": 5000, "drain_s": crowd_seconds}]},
            "scale": {"jobs": 100, "solo_ready_s": 1.25, "solo_rss_peak_mib": 99.0},
        },
    }


def test_quoted_figures_come_from_the_newest_full_benchmark_run(tmp_path: Path) -> None:
    runs = {
        "2026-01-01.json": _run("old", smoke=False, crowd_seconds=9.0),
        "2026-02-01.json": _run("new", smoke=False, crowd_seconds=0.42),
        "2026-03-01.json": _run("smoke", smoke=True, crowd_seconds=0.01),
        "2026-04-01-reduced.json": _run("reduced", smoke=False, crowd_seconds=0.02),
    }
    for name, results in runs.items():
        (tmp_path / name).write_text(json.dumps(results))
    latest = figures.latest_results(tmp_path)
    assert latest[0] == "2026-02-01.json"
    page = figures.with_figures(
        "a <!-- figures:crowd -->stale<!-- /figures:crowd --> b\n"
        "<!-- figures:headline -->old<!-- /figures:headline -->",
        latest,
    )
    assert "stale" not in page
    assert "old" not in page
    assert "5,000 jobs due at one instant all started in 0.42 s" in page
    assert "1,000/s 87 ms (0 duplicates, 0 missed)" in page
    assert "990 of 1,000 delivered in 1.50 s" in page
    assert page.startswith("a <!-- figures:crowd -->A crowd")
    assert "<!-- /figures:crowd --> b\n" in page
