"""What the chart renders, used against a real `tickgate serve`: the tokens file the auth
Secret becomes, the token NOTES.txt tells users to read, and the helm test Pod's script."""

import asyncio
import base64
import json
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from harness.postgres import with_database
from harness.replicas import Replica, start_replica
from harness.waiting import eventually
from tests.deploy.chart import DSN, RELEASE, Manifests, env_of
from tests.support.db import TemplateDatabases

VALUES = {"database": {"url": DSN}, "helmTest": {"enabled": True}}


@pytest.fixture(scope="module")
def rendered(render: Callable[[dict[str, Any]], Manifests]) -> Manifests:
    return render(VALUES)


@pytest.fixture(scope="module")
def tokens_file(rendered: Manifests, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The file the pods read: the auth Secret's TICKGATE_API_TOKENS, as mounted."""
    secret = rendered[("Secret", f"{RELEASE}-auth")]["data"]
    path = tmp_path_factory.mktemp("secrets") / "api-tokens.json"
    path.write_bytes(base64.b64decode(secret["TICKGATE_API_TOKENS"]))
    return path


def ready(replica: Replica) -> bool:
    if not replica.alive:
        raise AssertionError(f"replica exited early:\n{replica.log()}")
    try:
        return httpx.get(f"{replica.url}/readyz", timeout=2).status_code == 200
    except httpx.TransportError:
        return False


@pytest.fixture(scope="module")
def server(
    rendered: Manifests,
    tokens_file: Path,
    templates: TemplateDatabases,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Replica]:
    """`tickgate serve` configured as the chart configures a pod's tokens."""
    pod_env = env_of(rendered[("Deployment", RELEASE)]["spec"]["template"]["spec"]["containers"][0])
    assert "TICKGATE_API_TOKENS" not in pod_env
    assert "TICKGATE_API_TOKENS_FILE" in pod_env
    database = asyncio.run(templates.clone())
    replica = start_replica(
        tmp_path_factory.mktemp("chart-live"),
        database_url=with_database(templates.server_url, database),
        TICKGATE_API_TOKENS_FILE=str(tokens_file),
    )
    try:
        eventually(lambda: ready(replica), 60, "the replica to be ready")
        yield replica
    finally:
        replica.stop()
        asyncio.run(templates.drop(database))


def test_the_token_notes_prints_is_accepted(rendered: Manifests, server: Replica) -> None:
    """NOTES.txt: TOKEN=$(kubectl get secret ... jsonpath='{.data.token}' | base64 -d)."""
    token = base64.b64decode(rendered[("Secret", f"{RELEASE}-auth")]["data"]["token"]).decode()
    url = f"{server.url}/v1/jobs"
    assert httpx.get(url, timeout=10).status_code == 401
    answer = httpx.get(url, headers={"Authorization": f"Bearer {token}"}, timeout=10)
    assert answer.status_code == 200
    assert answer.json()["items"] == []


def run_test_pod(rendered: Manifests, url: str, tokens: Path) -> subprocess.CompletedProcess[str]:
    """The helm test Pod's container command, with its Service URL pointed at `url`."""
    (pod,) = [obj for (kind, _), obj in rendered.items() if kind == "Pod"]
    (test,) = pod["spec"]["containers"]
    assert test["command"] == ["python", "-c"]
    env = {entry["name"]: entry["value"] for entry in test["env"]}
    assert env["TICKGATE_API_TOKENS_FILE"].endswith("/" + tokens.name)
    env |= {"TICKGATE_URL": url, "TICKGATE_API_TOKENS_FILE": str(tokens)}
    return subprocess.run(
        [sys.executable, "-c", *test["args"]],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_helm_test_pod_passes_against_a_ready_server(
    rendered: Manifests, server: Replica, tokens_file: Path
) -> None:
    done = run_test_pod(rendered, server.url, tokens_file)
    assert done.returncode == 0, done.stderr
    assert "GET /readyz: 200 ready" in done.stdout
    assert "GET /v1/jobs: 200" in done.stdout


def test_the_helm_test_pod_fails_with_a_token_the_server_does_not_know(
    rendered: Manifests, server: Replica, tmp_path: Path
) -> None:
    unknown = tmp_path / "api-tokens.json"
    unknown.write_text(json.dumps({"not-a-token-of-this-release": ["read"]}))
    done = run_test_pod(rendered, server.url, unknown)
    assert done.returncode != 0
    assert "401" in done.stderr
