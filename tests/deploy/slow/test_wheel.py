"""The image's install replayed without Docker: the Dockerfile's own pip commands, run on a
copy of its build context into a fresh venv, give a Tickgate that serves.

No Docker engine runs here, so this is the build check: it fails when the wheel leaves out
a file `tickgate serve` needs (a template, a static asset, a migration), when the runtime
lock misses a module it imports, or when the COPY lines miss a file the build reads.
"""

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from harness.replicas import START_DEADLINE_SECONDS, free_port
from harness.waiting import eventually
from tests.deploy import DOCKERFILE, ROOT, Stage, final_stage, stages
from tests.deploy.test_dockerfile import healthcheck_command

PACKAGE = "service"
# What .dockerignore keeps out of the build context inside the copied folders.
NOT_SENT = shutil.ignore_patterns("__pycache__", "*.pyc", "*.pyo", "*.egg-info")
INSTALL_DEADLINE_SECONDS = 600


def _copy_context(builder: Stage, context: Path) -> None:
    """Every `COPY` of the builder stage, from the repository into `context`."""
    for copy in builder.all("COPY"):
        *sources, target = [word for word in copy.args.split() if not word.startswith("--")]
        destination = context / target
        for source in sources:
            origin = ROOT / source
            if origin.is_dir():
                shutil.copytree(origin, destination, ignore=NOT_SENT, dirs_exist_ok=True)
            else:
                directory = destination if target.endswith("/") else destination.parent
                directory.mkdir(parents=True, exist_ok=True)
                shutil.copy2(origin, directory)


def _install_commands(wheels: Path) -> list[str]:
    """The builder's `pip wheel` commands, then the runtime's `pip install`, with the
    wheel folder moved from /wheels to `wheels`."""
    builder = stages(DOCKERFILE.read_text())[0]
    commands = [run.args for run in builder.all("RUN") if "pip wheel" in run.args]
    for run in final_stage().all("RUN"):
        commands += [part.strip() for part in run.args.split("&&") if "pip install" in part]
    commands[-1] = commands[-1][commands[-1].index("pip install") :]
    return [re.sub(r"(?<![\w/])/wheels\b", str(wheels), command) for command in commands]


@pytest.fixture(scope="module")
def image(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The bin folder of a fresh venv holding what the image would."""
    work = tmp_path_factory.mktemp("image")
    context, venv = work / "context", work / "venv"
    _copy_context(stages(DOCKERFILE.read_text())[0], context)
    subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    path = f"{venv / 'bin'}{os.pathsep}{os.environ['PATH']}"
    for command in _install_commands(work / "wheels"):
        subprocess.run(
            command,
            shell=True,
            cwd=context,
            env=os.environ | {"PATH": path, "VIRTUAL_ENV": str(venv)},
            check=True,
            capture_output=True,
            timeout=INSTALL_DEADLINE_SECONDS,
        )
    return venv / "bin"


def _image_environment(**extra: str) -> dict[str, str]:
    """The environment of the image's final stage, on top of a clean one of ours."""
    ours = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith("TICKGATE_") and key not in {"DATABASE_URL", "PYTHONPATH"}
    }
    return ours | final_stage().env() | extra


def _python(image: Path, code: str, cwd: Path) -> str:
    done = subprocess.run(
        [image / "python", "-c", code],
        cwd=cwd,
        env=_image_environment(),
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


LIST_PACKAGE = """
import importlib.metadata, importlib.resources, json, pathlib, service
root = importlib.resources.files("service")
files = [str(p.relative_to(root)) for p in pathlib.Path(str(root)).rglob("*")
         if p.is_file() and "__pycache__" not in p.parts]
licenses = [f.name for f in importlib.metadata.distribution("tickgate").files
            if "licenses" in f.parts]
print(json.dumps({"where": service.__file__, "files": files, "licenses": licenses}))
"""


def test_the_installed_package_holds_every_file_of_the_sources(image: Path, tmp_path: Path) -> None:
    installed = json.loads(_python(image, LIST_PACKAGE, tmp_path))
    assert installed["where"].startswith(str(image.parent)), "imported from the sources"
    sources = {
        str(path.relative_to(ROOT / PACKAGE))
        for path in (ROOT / PACKAGE).rglob("*")
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc"
    }
    missing = sorted(sources - set(installed["files"]))
    assert missing == [], "left out of the wheel (pyproject package-data?)"
    for needed in ("store/migrations", "ui/templates", "ui/static", "api/static"):
        assert any(name.startswith(needed + "/") for name in installed["files"]), needed
    assert installed["licenses"] == ["LICENSE"], "MIT: the notice goes with every copy"


IMPORT_ALL = """
import importlib, pkgutil, service
names = [m.name for m in pkgutil.walk_packages(service.__path__, "service.")
         if not m.name.endswith(".__main__")]  # `python -m service` runs the CLI
for name in names:
    importlib.import_module(name)
print(len(names))
"""


def test_every_module_imports_with_the_runtime_lock_alone(image: Path, tmp_path: Path) -> None:
    assert int(_python(image, IMPORT_ALL, tmp_path)) > 50


LIBRARY_FACE = """
import tickgate, tickgate.gate
try:
    import tickgate.apscheduler
except ImportError as error:
    print(error)
"""


def test_the_library_face_imports_and_names_its_extra(image: Path, tmp_path: Path) -> None:
    """`tickgate` and `tickgate.gate` come with the wheel; `tickgate.apscheduler` without
    its extra says how to get it."""
    said = _python(image, LIBRARY_FACE, tmp_path)
    assert said.strip() == (
        "tickgate.apscheduler needs APScheduler 3: pip install 'tickgate[apscheduler]'"
    )


def test_the_image_has_no_embedded_postgresql_and_says_so(image: Path, tmp_path: Path) -> None:
    def serve(**extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [image / "tickgate", "serve"],
            cwd=tmp_path,
            env=_image_environment(**extra),
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

    required = serve()
    assert required.returncode == 2
    assert "DATABASE_URL is required" in required.stderr
    without_the_extra = serve(TICKGATE_REQUIRE_DATABASE_URL="0")
    assert without_the_extra.returncode == 2
    assert "pip install 'tickgate[embedded]'" in without_the_extra.stderr


def test_the_installed_image_serves_its_pages_and_passes_its_healthcheck(
    image: Path, tmp_path: Path, database_url: str
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log = tmp_path / "serve.log"
    with log.open("wb") as output:
        process = subprocess.Popen(
            [image / "tickgate", "serve", "--host", "127.0.0.1", "--port", str(port)],
            cwd=tmp_path,
            env=_image_environment(DATABASE_URL=database_url),
            stdout=output,
            stderr=subprocess.STDOUT,
        )
    try:
        eventually(lambda: _answers(f"{url}/readyz", process, log), START_DEADLINE_SECONDS, url)
        for page in ("/healthz", "/ui/", "/docs", "/v1/jobs", "/metrics"):
            assert httpx.get(url + page, timeout=10).status_code == 200, page
        assets = re.findall(r'(?:src|href)="(/[^"]+\.(?:js|css))"', httpx.get(f"{url}/docs").text)
        assets += re.findall(r'(?:src|href)="(/[^"]+\.(?:js|css))"', httpx.get(f"{url}/ui/").text)
        assert assets, "the pages load no script or style"
        for asset in assets:
            assert httpx.get(url + asset, timeout=10).status_code == 200, asset
        check = healthcheck_command(port)
        healthy = subprocess.run([image / check[0], *check[1:]], timeout=60, check=False)
        assert healthy.returncode == 0
    finally:
        process.terminate()
        process.wait(40)
    assert "Traceback" not in log.read_text(errors="replace")


def _answers(url: str, process: subprocess.Popen[bytes], log: Path) -> bool:
    assert process.poll() is None, f"tickgate serve exited early:\n{log.read_text()}"
    try:
        return httpx.get(url, timeout=2).status_code == 200
    except httpx.TransportError:
        return False
