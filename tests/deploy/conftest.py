"""Real Helm (helm_python, Helm v4 in a wheel) for the chart tests, in a temporary home."""

import fcntl
import importlib
import json
import shutil
import subprocess
from collections.abc import Callable, Iterator
from types import ModuleType
from typing import Any

import pytest
import yaml

from tests.deploy import CHART_DIR, ROOT
from tests.deploy.chart import NAMESPACE, RELEASE, Manifests

NOTES = "tickgate/templates/NOTES.txt"
NODE_CHECKS = ROOT / "tests" / "deploy" / "node"

NodeCheck = Callable[[str, object], dict[str, Any]]


@pytest.fixture(scope="session")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ModuleType]:
    """helm_python, loaded with every Helm/XDG directory pointing into a temporary home.

    Offline render and lint write nothing, but Helm resolves its cache, config and data
    directories from the environment, so nothing here may touch the real ones."""
    home = tmp_path_factory.mktemp("helm-home")
    with pytest.MonkeyPatch.context() as env:
        env.setenv("HOME", str(home))
        for variable, directory in {
            "XDG_CACHE_HOME": "cache",
            "XDG_CONFIG_HOME": "config",
            "XDG_DATA_HOME": "data",
            "HELM_CACHE_HOME": "cache/helm",
            "HELM_CONFIG_HOME": "config/helm",
            "HELM_DATA_HOME": "data/helm",
        }.items():
            env.setenv(variable, str(home / directory))
        yield importlib.import_module("helm_python")


@pytest.fixture(scope="session")
def chart(helm: ModuleType) -> Iterator[Any]:
    with helm.Chart.load(CHART_DIR) as loaded:
        yield loaded


@pytest.fixture(scope="session")
def render(chart: Any) -> Callable[[dict[str, Any]], Manifests]:
    """Render values into {(kind, name): object}; NOTES.txt is left out."""

    def rendered(values: dict[str, Any]) -> Manifests:
        files = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
        manifests: Manifests = {}
        for path, text in files.items():
            if not path.endswith((".yaml", ".yml")):
                continue
            for document in yaml.safe_load_all(text):
                if document:
                    key = (document["kind"], document["metadata"]["name"])
                    assert key not in manifests, f"{key} rendered twice"
                    manifests[key] = document
        return manifests

    return rendered


@pytest.fixture(scope="session")
def notes(chart: Any) -> Callable[[dict[str, Any]], str]:
    """The NOTES.txt `helm install` prints for these values."""

    def rendered(values: dict[str, Any]) -> str:
        files = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
        text: str = files[NOTES]
        return text

    return rendered


@pytest.fixture(scope="session")
def values(chart: Any) -> dict[str, Any]:
    """The chart's default values."""
    chart_values: dict[str, Any] = chart.values
    return chart_values


@pytest.fixture(scope="session")
def node_check() -> NodeCheck:
    """Runs a script of tests/deploy/node (`promql.mjs`, `crd.mjs`) on a JSON payload and
    returns the problems it found, {key: problem}. Its npm packages, pinned in the
    package-lock.json there, are installed with `npm ci` on first use."""
    # One `npm ci` at a time: pytest-xdist workers share the folder.
    with (NODE_CHECKS / ".npm-ci.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (NODE_CHECKS / "node_modules").is_dir():
            npm = shutil.which("npm")
            assert npm, "the chart's CRD and PromQL checks need Node.js 20 and npm"
            subprocess.run(
                [npm, "ci", "--prefix", str(NODE_CHECKS), "--no-audit", "--no-fund", "--silent"],
                check=True,
                timeout=300,
            )

    def check(script: str, payload: object) -> dict[str, Any]:
        done = subprocess.run(
            ["node", str(NODE_CHECKS / script)],
            input=json.dumps(payload),
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        )
        problems: dict[str, Any] = json.loads(done.stdout)
        return problems

    return check
