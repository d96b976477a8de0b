"""Schemathesis against a live server, driven by the app's own OpenAPI document: no 5xx
and no response that breaks the schema, over 1000+ generated requests, dates at the edges
of what a datetime holds among them (tests/fuzz/edge_dates.py). A fixed seed by
default; TICKGATE_FUZZ_SEED=random (or another number) explores further."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from harness.cluster import serve

SCHEMATHESIS = str(Path(sys.executable).with_name("st"))
ROOT = Path(__file__).parents[2]
SEED = os.environ.get("TICKGATE_FUZZ_SEED", "20261129")
CHECKS = "not_a_server_error,status_code_conformance,response_schema_conformance"


def fuzz(url: str, report: Path) -> subprocess.CompletedProcess[str]:
    seed = [] if SEED == "random" else ["--seed", SEED]
    command = [
        SCHEMATHESIS,
        "run",
        f"{url}/openapi.json",
        "--checks",
        CHECKS,
        "--max-examples",
        "75",
        "--phases",
        "examples,coverage,fuzzing",
        "--no-color",
        "--report",
        "ndjson",
        "--report-ndjson-path",
        str(report),
        *seed,
    ]
    # Edge dates (year 1 and 9999, far offsets) in generated bodies: tests/fuzz/edge_dates.py.
    env = os.environ | {"SCHEMATHESIS_HOOKS": "tests.fuzz.edge_dates", "PYTHONPATH": str(ROOT)}
    return subprocess.run(
        command, capture_output=True, text=True, timeout=600, check=False, env=env, cwd=ROOT
    )


def record(cases: int, server_errors: int) -> None:
    log = os.environ.get("TICKGATE_RELIABILITY_LOG")
    if log:
        entry = {"kind": "fuzz", "seed": SEED, "cases": cases, "server_errors": server_errors}
        with Path(log).open("a") as out:
            out.write(json.dumps(entry) + "\n")


def test_generated_requests_find_no_5xx_and_no_schema_violation(
    database_url: str, tmp_path: Path
) -> None:
    with serve(tmp_path, database_url=database_url, TICKGATE_SCHEDULER="off") as replica:
        result = fuzz(replica.url, tmp_path / "events.ndjson")
    generated = re.search(r"(\d+) generated", result.stdout)
    cases = int(generated[1]) if generated else 0
    server_errors = result.stdout.count("Server error")
    record(cases, server_errors)
    assert result.returncode == 0, result.stdout[-6000:]
    assert cases >= 1000, result.stdout[-2000:]
    assert server_errors == 0
