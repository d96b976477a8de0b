"""A signed delivery verified as a TypeScript target would: with the npm
`standardwebhooks` package (tests/ts-client/webhook.ts, type-checked by `tsc --strict`
and run by node), during a key rotation, and refused once its body is tampered with."""

import base64
import json
import subprocess
from pathlib import Path

from harness.receiver import Receipt, receiving
from harness.waiting import eventually_async
from service.config import Settings
from tests.support.inprocess import served
from tests.support.npm import TS_CLIENT, run_tool

NEW = "whsec_" + base64.b64encode(b"N" * 32).decode()
OLD = "whsec_" + base64.b64encode(b"O" * 32).decode()
OTHER = "whsec_" + base64.b64encode(b"X" * 32).decode()


def compiled(workdir: Path) -> Path:
    (workdir / "webhook.ts").write_text((TS_CLIENT / "webhook.ts").read_text())
    (workdir / "package.json").write_text((TS_CLIENT / "package.json").read_text())
    config = json.loads((TS_CLIENT / "tsconfig.json").read_text()) | {"files": ["webhook.ts"]}
    (workdir / "tsconfig.json").write_text(json.dumps(config))
    (workdir / "node_modules").symlink_to(TS_CLIENT / "node_modules")
    checked = run_tool("tsc", "-p", str(workdir), cwd=workdir)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    return workdir / "out" / "webhook.js"


def verified(program: Path, receipt: Receipt, body: bytes) -> list[bool]:
    delivery = {"secrets": [NEW, OLD, OTHER], "body": body.decode(), "headers": receipt.headers}
    ran = subprocess.run(
        ["node", str(program)],
        input=json.dumps(delivery),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert ran.returncode == 0, ran.stderr
    answer: list[bool] = json.loads(ran.stdout)
    return answer


async def test_typescript_verifies_a_signed_delivery_with_either_rotated_key(
    database_url: str, tmp_path: Path
) -> None:
    keys = tmp_path / "keys.json"
    keys.write_text(json.dumps({"billing": {"secrets": [NEW, OLD], "hosts": ["127.0.0.1"]}}))
    settings = Settings(
        database_url=database_url,
        scheduler=False,
        http_allow="127.0.0.1",
        webhook_keys_file=keys,
    )
    workdir = tmp_path / "ts"
    workdir.mkdir()
    program = compiled(workdir)
    with receiving() as target:
        async with served(settings) as client:
            args = {"url": f"{target.url}/signed", "signing_key": "billing"}
            job = {"name": "signed", "schedule": {"kind": "cron", "expression": "0 0 1 1 *"}}
            made = await client.post("/v1/jobs", json=job | {"task": "http", "args": args})
            assert made.status_code == 201, made.text
            assert (await client.post("/v1/jobs/signed/trigger")).status_code == 202
            await eventually_async(lambda: bool(target.receipts()), 30, "the delivery")
        [receipt] = target.receipts()
    assert verified(program, receipt, receipt.body) == [True, True, False]
    tampered = receipt.body.replace(b"signed", b"sigmed")
    assert tampered != receipt.body
    assert verified(program, receipt, tampered) == [False, False, False]
