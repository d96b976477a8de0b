"""What machine a run was on (for the report), and a scratch directory for it."""

import contextlib
import os
import platform
import socket
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import psutil

from harness.replicas import SERVED


def _cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def _git(*args: str) -> str:
    try:
        done = subprocess.run(  # noqa: S603
            ["git", *args],  # noqa: S607 - git from PATH, as a developer runs it
            cwd=SERVED,
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return ""
    return done.stdout.strip()


def machine_info() -> dict[str, Any]:
    memory = psutil.virtual_memory().total
    return {
        "cpu_model": _cpu_model(),
        "logical_cpus": psutil.cpu_count(logical=True),
        "physical_cpus": psutil.cpu_count(logical=False),
        "memory_gib": round(memory / 2**30, 1),
        "os": platform.platform(),
        "python": platform.python_version(),
        "hostname": socket.gethostname(),
        "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
        "git_commit": _git("rev-parse", "--short", "HEAD"),
        "git_dirty": bool(_git("status", "--porcelain", "--untracked-files=no")),
    }


def temp_workdir() -> Path:
    return Path(tempfile.mkdtemp(prefix="tickgate-bench-"))
