"""The Dockerfile, read statically: no Docker engine is needed."""

import contextlib
import fnmatch
import http.server
import importlib
import os
import re
import shlex
import subprocess
import sys
import threading
import tomllib
from collections.abc import Iterator

import pytest
import yaml

from tests.deploy import (
    CHART_DIR,
    DOCKERFILE,
    DOCKERIGNORE,
    ROOT,
    Instruction,
    exec_form,
    exposed_ports,
    final_stage,
    stages,
    user_ids,
)
from tests.deploy.test_lock import read_lock

BASE_IMAGE = re.compile(r"^python:3\.12-slim@sha256:[0-9a-f]{64}$")
BUILD_TOOLS = re.compile(
    r"\b(gcc|g\+\+|clang|cc|make|build-essential|python3?-dev|libpq-dev|cargo|rustc)\b"
)


@pytest.fixture(scope="module")
def pyproject() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_multi_stage_on_python_slim() -> None:
    all_stages = stages(DOCKERFILE.read_text())
    assert len(all_stages) >= 2, "expected a builder stage and a runtime stage"
    for stage in all_stages:
        assert BASE_IMAGE.match(stage.base), f"stage base {stage.base!r} is not python:3.12-slim"
    # by digest, the same in every stage: the builder's wheels are for the runtime's Python
    assert len({stage.base for stage in all_stages}) == 1


def test_builder_makes_wheels_and_runtime_installs_only_them() -> None:
    builder, *_, runtime = stages(DOCKERFILE.read_text())
    assert builder.name, "the builder stage needs a name to copy or mount from"
    assert any("pip wheel" in run.args for run in builder.all("RUN"))
    installs = [run.args for run in runtime.all("RUN") if "pip install" in run.args]
    assert installs, "the runtime stage installs nothing"
    for install in installs:
        assert "--no-index" in install, "the runtime must install from the built wheels only"
        assert f"from={builder.name}" in install or f"--from={builder.name}" in install


def test_final_stage_has_no_build_tools() -> None:
    runtime = final_stage()
    for run in runtime.all("RUN"):
        assert not BUILD_TOOLS.search(run.args), f"build tooling in the final stage: {run.args}"
    for copy in runtime.all("COPY"):
        assert "--from=" in copy.args, f"sources copied into the final stage: {copy.args}"


def test_final_stage_runs_as_a_numeric_non_root_user() -> None:
    uid, gid = user_ids(final_stage())
    assert uid != 0
    assert gid != 0


def test_exposes_the_charts_container_port() -> None:
    values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    assert exposed_ports(final_stage()) == {values["containerPort"]}


def test_entrypoint_is_the_tickgate_console_script(pyproject: dict) -> None:
    runtime = final_stage()
    entrypoint = runtime.last("ENTRYPOINT")
    assert entrypoint is not None
    assert exec_form(entrypoint) == ["tickgate"]
    target = pyproject["project"]["scripts"]["tickgate"]
    module_name, _, attribute = target.partition(":")
    function = getattr(importlib.import_module(module_name), attribute)
    assert callable(function)


def test_cmd_serves_on_all_interfaces_on_the_exposed_port() -> None:
    runtime = final_stage()
    cmd = runtime.last("CMD")
    assert cmd is not None
    words = exec_form(cmd)
    assert words[0] == "serve"
    assert words[words.index("--host") + 1] == "0.0.0.0"
    assert {int(words[words.index("--port") + 1])} == exposed_ports(runtime)


def test_image_requires_a_database_url_and_logs_json() -> None:
    env = final_stage().env()
    assert env.get("TICKGATE_REQUIRE_DATABASE_URL") == "1"
    assert env.get("TICKGATE_LOG_FORMAT") == "json"
    assert "DATABASE_URL" not in env


def test_copied_sources_exist() -> None:
    for stage in stages(DOCKERFILE.read_text()):
        for copy in stage.all("COPY"):
            words = [w for w in copy.args.split() if not w.startswith("--")]
            if any(w.startswith("--from=") for w in copy.args.split()):
                continue
            for source in words[:-1]:
                assert (ROOT / source).exists(), f"COPY {source}: no such path"


def _ignored(path: str, patterns: list[str]) -> bool:
    """Docker's rule: the last matching pattern wins; `!` re-includes."""
    ignored = False
    for line in patterns:
        negated = line.startswith("!")
        pattern = line.removeprefix("!").strip("/")
        candidates = [pattern, pattern.removeprefix("**/")]
        if any(fnmatch.fnmatch(path, p) or path.startswith(p + "/") for p in candidates):
            ignored = not negated
    return ignored


def test_dockerignore_keeps_the_context_small_but_buildable() -> None:
    patterns = [
        line.strip()
        for line in DOCKERIGNORE.read_text().splitlines()
        if line.strip() and not line.lstrip().startswith("#")
    ]
    for unwanted in (".venv", ".git", ".tickgate", "tests", ".mypy_cache", "service/__pycache__"):
        assert _ignored(unwanted, patterns), f"{unwanted} is sent to the Docker daemon"
    build_inputs = (
        "pyproject.toml",
        "README.md",
        "LICENSE",
        "service",
        "service/cli.py",
        "tickgate",
        "tickgate/gate.py",
    )
    for needed in (*build_inputs, "requirements/runtime.lock"):
        assert not _ignored(needed, patterns), f"{needed} is needed by the build"


def test_image_computes_ticks_with_the_pinned_tzdata_package() -> None:
    """With PYTHONTZPATH empty, zoneinfo reads the `tzdata` package installed with the
    image, not whatever zoneinfo the base image carries."""
    env = final_stage().env()
    assert env.get("PYTHONTZPATH") == ""
    probe = "from service.tzdb import tz_database; print(tz_database().source)"
    answer = subprocess.run(
        [sys.executable, "-c", probe],
        env=os.environ | {"PYTHONTZPATH": env["PYTHONTZPATH"]},
        capture_output=True,
        text=True,
        check=True,
    )
    assert answer.stdout.strip() == "tzdata package"


def test_image_pins_one_tzdata_release(pyproject: dict) -> None:
    """Images built at different times compute the same ticks: the image's tzdata is the
    one pinned, with its hashes, in the lock it builds from."""
    pinned = read_lock("runtime.lock").get("tzdata")
    assert pinned is not None, "requirements/runtime.lock pins no tzdata release"
    assert re.fullmatch(r"\d{4}\.\d+", pinned.version)
    assert pinned.hashes
    assert any(dep.startswith("tzdata") for dep in pyproject["project"]["dependencies"])
    assert "TZDATA_VERSION" not in DOCKERFILE.read_text(), "a second pin would disagree"


def _healthcheck() -> tuple[str, list[str]]:
    """The final stage's HEALTHCHECK: its options and its exec-form command."""
    healthcheck = final_stage().last("HEALTHCHECK")
    assert healthcheck is not None, "the image declares no HEALTHCHECK"
    options, _, command = healthcheck.args.partition("CMD ")
    words = exec_form(Instruction("CMD", command))
    return options, words


def test_healthcheck_asks_healthz_on_the_served_port_with_python_alone() -> None:
    options, words = _healthcheck()
    assert words[:2] == ["python", "-c"], "no curl or wget in the image: python's urllib"
    assert not re.search(r"\b(curl|wget)\b", " ".join(words))
    url = re.search(r"'(http://[^']+)'", words[2])
    assert url, words[2]
    port = int(url[1].split(":")[2].split("/")[0])
    assert url[1] == f"http://127.0.0.1:{port}/healthz"
    assert {port} == exposed_ports(final_stage())
    assert "--timeout=" in options
    assert "--start-period=" in options


class _Probe(http.server.BaseHTTPRequestHandler):
    status = 200

    def do_GET(self) -> None:
        self.send_response(self.status if self.path == "/healthz" else 404)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def _answering(status: int) -> Iterator[int]:
    handler = type("Handler", (_Probe,), {"status": status})
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler) as server:
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield server.server_address[1]
        finally:
            server.shutdown()
            thread.join()


def healthcheck_command(port: int) -> list[str]:
    """The HEALTHCHECK's own command, aimed at `port` instead of the image's."""
    _, words = _healthcheck()
    return [*words[:2], words[2].replace(":8080/", f":{port}/")]


def _run_healthcheck(port: int) -> int:
    """With a proxy in the environment that the check must not use (a container given
    HTTP_PROXY for its jobs' calls)."""
    dead_proxy = {"http_proxy": "http://127.0.0.1:9", "HTTP_PROXY": "http://127.0.0.1:9"}
    return subprocess.run(
        [sys.executable, *healthcheck_command(port)[1:]],
        env=os.environ | dead_proxy,
        capture_output=True,
        timeout=60,
        check=False,
    ).returncode


def test_healthcheck_is_healthy_only_while_healthz_answers_200() -> None:
    with _answering(200) as port:
        assert _run_healthcheck(port) == 0
    with _answering(503) as port:
        assert _run_healthcheck(port) == 1
    assert _run_healthcheck(port) == 1, "nothing listening is unhealthy"


def _labels() -> dict[str, str]:
    labels: dict[str, str] = {}
    for label in final_stage().all("LABEL"):
        for word in shlex.split(label.args):
            key, _, value = word.partition("=")
            labels[key] = value
    return labels


def _build_args() -> dict[str, str]:
    found = re.findall(r"^ARG (\w+)(?:=(.*))?$", DOCKERFILE.read_text(), re.MULTILINE)
    return {name: default.strip('"') for name, default in found}


def test_oci_labels_describe_the_image(pyproject: dict) -> None:
    labels = _labels()
    oci = "org.opencontainers.image."
    assert labels[oci + "title"] == pyproject["project"]["name"]
    assert labels[oci + "description"]
    assert labels[oci + "licenses"] == pyproject["project"]["license"]
    assert labels[oci + "version"] == "${VERSION}"
    assert labels[oci + "source"] == "${SOURCE_URL}"
    assert labels[oci + "revision"] == "${REVISION}"
    assert _build_args()["VERSION"] == pyproject["project"]["version"]
