"""LICENSE and CHANGELOG.md say what pyproject.toml says."""

import re
import tomllib

from tests.deploy import ROOT

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_the_license_file_is_the_license_pyproject_declares() -> None:
    text = (ROOT / "LICENSE").read_text()
    assert PROJECT["license"] == "MIT"
    assert text.startswith("MIT License\n")
    assert "Copyright (c) 2026 The Tickgate authors" in text
    assert PROJECT["license-files"] == ["LICENSE"]


def test_the_changelog_has_an_unreleased_section_and_the_current_version() -> None:
    headings = re.findall(r"^## \[([^\]]+)\]", (ROOT / "CHANGELOG.md").read_text(), re.M)
    assert headings[0] == "Unreleased"
    assert PROJECT["version"] in headings, "a release without its changelog entry"
