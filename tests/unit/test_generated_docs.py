"""Generated documentation pages stay in step with their sources (`make docs`)."""

from service.config import Settings
from tools.gendocs import ROOT, configuration_page, stale_pages


def test_no_generated_page_is_stale() -> None:
    assert stale_pages() == [], "run `make docs` and commit the result"


def test_the_configuration_page_names_every_setting_with_its_meaning() -> None:
    page = configuration_page()
    for name, field in Settings.model_fields.items():
        variable = "DATABASE_URL" if name == "database_url" else f"TICKGATE_{name.upper()}"
        row = next(line for line in page.splitlines() if line.startswith(f"| `{variable}` |"))
        assert field.description, f"{variable} has no description to document"
        assert field.description.split("`")[0][:40] in row


def test_readme_links_the_generated_configuration_page() -> None:
    assert "docs/configuration.md" in (ROOT / "README.md").read_text()
