"""The chart's documentation: the chart README generated from values.yaml's comments,
docs/kubernetes.md, and the metadata Helm shows."""

import json
import re
from collections.abc import Callable
from typing import Any

import pytest
import yaml

from tests.deploy import ROOT
from tests.deploy.chart import DSN, Manifests
from tools import chartgen, gendocs

KUBERNETES_DOC = ROOT / "docs" / "kubernetes.md"
YAML_BLOCK = re.compile(r"^```yaml\n(?P<body>.*?)^```", re.MULTILINE | re.DOTALL)


def test_the_chart_readme_is_generated_from_values_yaml() -> None:
    assert chartgen.CHART_README.read_text() == chartgen.readme_text(), (
        "helm/tickgate/README.md is stale: run `make docs`"
    )
    assert gendocs.stale_pages() == []


def test_every_value_has_a_description() -> None:
    rows = chartgen.documented_values(chartgen.VALUES.read_text())
    assert [row.path for row in rows if not row.comment] == []
    paths = [row.path for row in rows]
    for key in ("replicaCount", "auth.existingSecret", "tasks.http.allow", "networkPolicy"):
        assert key in paths


def test_every_row_of_the_table_is_a_key_of_the_schema(values: dict[str, Any]) -> None:
    schema = json.loads(chartgen.SCHEMA.read_text())
    for row in chartgen.documented_values(chartgen.VALUES.read_text()):
        node = schema
        for key in row.path.split("."):
            assert key in node.get("properties", {}), f"{row.path}: not in values.schema.json"
            node = node["properties"][key]


def test_the_values_table_shows_the_defaults() -> None:
    rows = {row.path: row for row in chartgen.documented_values(chartgen.VALUES.read_text())}
    assert rows["replicaCount"].default == "3"
    assert rows["auth.tokens"].default == "{}"
    assert rows["tasks.sql.existingSecretKey"].default == '"TICKGATE_SQL_TARGETS"'
    assert json.loads(rows["resources"].default)["limits"]["memory"] == "512Mi"
    assert "TICKGATE_HTTP_ALLOW" in rows["tasks.http.allow"].comment


def test_the_kubernetes_doc_holds_the_generated_values_table() -> None:
    page = KUBERNETES_DOC.read_text()
    assert page == chartgen.kubernetes_page(), "docs/kubernetes.md is stale: run `make docs`"
    section = page.split("## Values", 1)[1].split("\n## ", 1)[0]
    assert chartgen.values_table() in section


def test_the_kubernetes_doc_exists_and_is_linked() -> None:
    """values.yaml has pointed at docs/kubernetes.md since the chart was written."""
    assert KUBERNETES_DOC.is_file()
    assert "docs/kubernetes.md" in chartgen.VALUES.read_text()
    assert "(docs/kubernetes.md" in (ROOT / "README.md").read_text()
    assert "(../../docs/kubernetes.md)" in chartgen.CHART_README.read_text()
    text = KUBERNETES_DOC.read_text()
    for topic in (
        "## Installing",
        "## API tokens",
        "GitOps",
        "existingSecret",
        "## Exposing the API",
        "## Network policy",
        "## Metrics and alerts",
        "## helm test",
        "(../helm/tickgate/README.md)",
    ):
        assert topic in text, topic


@pytest.mark.parametrize(
    "block", [m["body"] for m in YAML_BLOCK.finditer(KUBERNETES_DOC.read_text())]
)
def test_each_values_example_of_the_kubernetes_doc_renders(
    render: Callable[[dict[str, Any]], Manifests], block: str
) -> None:
    """The doc's values snippets pass the schema and render as they are."""
    values = yaml.safe_load(block)
    assert render({"database": {"url": DSN}} | values)


def test_chart_metadata(chart: Any) -> None:
    metadata = chart.metadata
    assert metadata["home"].startswith("https://")
    assert metadata["sources"]
    assert all(source.startswith("https://") for source in metadata["sources"])
    assert [maintainer["name"] for maintainer in metadata["maintainers"]]
