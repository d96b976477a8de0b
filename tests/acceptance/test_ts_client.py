"""A TypeScript client, typed by openapi-typescript 7 from the committed OpenAPI document,
type-checked with `tsc --strict` and run by node against a live server
(tests/ts-client/main.ts): what a browser or Node.js user of the API gets."""

import json
import subprocess
from pathlib import Path

import httpx

from harness.cluster import serve
from harness.waiting import eventually
from service.domain.names import lock_key
from tests.support.npm import TS_CLIENT, run_tool

DOCUMENT = TS_CLIENT.parents[1] / "openapi" / "openapi.json"
JOB = "from-typescript"


def compiled(workdir: Path) -> Path:
    """main.ts and freshly generated types, compiled in `workdir`; returns main.js.

    `--default-non-nullable=false`: openapi-typescript 7 otherwise makes every request
    field with a default required (openapi-ts/openapi-typescript#2012); responses, whose
    fields are all `required`, are typed the same either way."""
    for name in ("main.ts", "tsconfig.json", "package.json"):
        (workdir / name).write_text((TS_CLIENT / name).read_text())
    (workdir / "node_modules").symlink_to(TS_CLIENT / "node_modules")
    types = workdir / "tickgate.d.ts"
    generated = run_tool(
        "openapi-typescript", str(DOCUMENT), "--default-non-nullable=false", "-o", str(types)
    )
    assert generated.returncode == 0, generated.stderr
    checked = run_tool("tsc", "-p", str(workdir), cwd=workdir)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    return workdir / "out" / "main.js"


def ready(url: str) -> bool:
    return httpx.get(f"{url}/readyz", timeout=10).status_code == 200


def test_a_generated_typescript_client_drives_a_live_server(
    database_url: str, tmp_path: Path
) -> None:
    workdir = tmp_path / "ts"
    workdir.mkdir()
    program = compiled(workdir)
    with serve(tmp_path, database_url=database_url) as replica:
        eventually(lambda: ready(replica.url), 60, "readiness")
        ran = subprocess.run(
            ["node", str(program), replica.url, JOB],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    assert ran.returncode == 0, ran.stderr
    seen = json.loads(ran.stdout)
    expected_key = str(lock_key(JOB))
    assert seen["lockKey"] == expected_key
    assert seen["lockKeyAsNumber"] != expected_key  # what a JSON number would have become
    assert seen["created"] == 201
    assert seen["location"] == f"/v1/jobs/{JOB}"
    assert seen["problemLocs"] == ["body.schedule.cron.expression"]
    assert seen["contentType"] == "application/problem+json"
    assert seen["listed"] == [[JOB, expected_key]]
    assert seen["shownLockKey"] == expected_key
    assert seen["nextRuns"] == 10
    assert seen["versions"] == [1, 2]  # the stale If-Match changed nothing
    louder = {"message": "louder, from TypeScript", "level": "warning"}
    assert seen["triggered"] == [202, louder, "typed"]
    assert seen["lateCancel"] == [409, "the run has ended already: succeeded"]
    assert seen["argProblemLocs"] == ["body.args.level"]
    assert (seen["deleted"], seen["afterDelete"]) == (204, 404)
    assert seen["headHealthz"] == 200
