"""The npm tools of tests/ts-client (openapi-typescript, TypeScript, @redocly/cli), pinned
in its package-lock.json and installed there by `make test` (`npm ci`)."""

import shutil
import subprocess
from pathlib import Path

TS_CLIENT = Path(__file__).parents[1] / "ts-client"
INSTALL = "make test, or: npm ci --prefix tests/ts-client (needs Node.js 20 and npm)"


def npm_tool(name: str) -> str:
    """The path of an installed tool; a failure saying how to install it, never a skip."""
    tool = TS_CLIENT / "node_modules" / ".bin" / name
    assert tool.exists(), f"{tool} is missing: run {INSTALL}"
    assert shutil.which("node"), f"node is not on PATH: {INSTALL}"
    return str(tool)


def run_tool(name: str, *args: str, cwd: Path = TS_CLIENT) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [npm_tool(name), *args], cwd=cwd, capture_output=True, text=True, timeout=300, check=False
    )
