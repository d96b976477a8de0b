"""API tokens in the chart: always provided, read from a mounted file, rolled into the pods
when they change, and printed by NOTES.txt in a curl that works."""

import base64
import hashlib
import json
import re
from collections.abc import Callable
from typing import Any

from tests.deploy.chart import (
    DSN,
    NAMESPACE,
    RELEASE,
    Manifests,
    container,
    env_of,
    only,
    pod_annotations,
)

DEFAULTS = {"database": {"url": DSN}}
GIVEN = {"ci": ["read", "write"], "dashboard": ["read"]}
TOKENS_FILE = "/var/run/secrets/tickgate/api-tokens.json"


def tokens_in(manifests: Manifests, secret: str = f"{RELEASE}-auth") -> dict[str, Any]:
    data = manifests[("Secret", secret)]["data"]
    tokens: dict[str, Any] = json.loads(base64.b64decode(data["TICKGATE_API_TOKENS"]))
    return tokens


def tokens_volume(manifests: Manifests) -> dict[str, Any]:
    """The volume mounted where TICKGATE_API_TOKENS_FILE points."""
    return file_volume(manifests, "TICKGATE_API_TOKENS_FILE")


def file_volume(manifests: Manifests, setting: str) -> dict[str, Any]:
    """The Secret volume mounted, read-only, where the file setting `setting` points,
    holding that one file."""
    main = container(manifests)
    path = env_of(main)[setting]["value"]
    directory, _, filename = path.rpartition("/")
    (mount,) = [m for m in main["volumeMounts"] if m["mountPath"] == directory]
    assert mount["readOnly"] is True
    pod = only(manifests, "Deployment")["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    (item,) = volume["secret"]["items"]
    assert item["path"] == filename
    return volume


def test_the_chart_always_provides_api_tokens(
    render: Callable[[dict[str, Any]], Manifests],
) -> None:
    """Pods listen on 0.0.0.0 and Tickgate refuses that without tokens."""
    manifests = render(DEFAULTS)
    [(token, scopes)] = tokens_in(manifests).items()
    assert len(token) >= 32
    assert scopes == ["read", "write"]


def test_tokens_are_a_mounted_file_not_an_env_var(
    render: Callable[[dict[str, Any]], Manifests],
) -> None:
    manifests = render(DEFAULTS)
    env = env_of(container(manifests))
    assert "TICKGATE_API_TOKENS" not in env
    assert env["TICKGATE_API_TOKENS_FILE"]["value"] == TOKENS_FILE
    volume = tokens_volume(manifests)["secret"]
    assert volume["secretName"] == f"{RELEASE}-auth"
    assert volume["items"][0]["key"] == "TICKGATE_API_TOKENS"
    # Readable by the pod's group (fsGroup), by nobody else.
    assert volume["defaultMode"] == 0o440
    pod = only(manifests, "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"]["fsGroup"] == 10001


def test_given_tokens_or_an_existing_secret_are_used(
    render: Callable[[dict[str, Any]], Manifests],
) -> None:
    given = render(DEFAULTS | {"auth": {"tokens": GIVEN}})
    assert tokens_in(given) == GIVEN
    assert "token" not in given[("Secret", f"{RELEASE}-auth")]["data"]
    external = render(DEFAULTS | {"auth": {"existingSecret": "api-tokens"}})
    assert ("Secret", f"{RELEASE}-auth") not in external
    volume = tokens_volume(external)["secret"]
    assert volume["secretName"] == "api-tokens"
    assert volume["items"][0]["key"] == "TICKGATE_API_TOKENS"


def test_changed_tokens_roll_the_pods(render: Callable[[dict[str, Any]], Manifests]) -> None:
    def checksum(tokens: dict[str, list[str]]) -> str:
        return pod_annotations(render(DEFAULTS | {"auth": {"tokens": tokens}}))["checksum/auth"]

    assert checksum(GIVEN) == checksum(dict(GIVEN))
    assert checksum(GIVEN) != checksum(GIVEN | {"ci": ["read"]})
    assert checksum(GIVEN) != checksum({"rotated": ["read", "write"]})


def test_a_generated_token_and_its_checksum_agree(
    render: Callable[[dict[str, Any]], Manifests],
) -> None:
    """One render makes one token: the Secret and the pods' checksum are of the same one
    (else the first `helm upgrade` would roll the pods for nothing)."""
    manifests = render(DEFAULTS)
    tokens = base64.b64decode(
        manifests[("Secret", f"{RELEASE}-auth")]["data"]["TICKGATE_API_TOKENS"]
    )
    assert pod_annotations(manifests)["checksum/auth"] == hashlib.sha256(tokens).hexdigest()
    # Without a cluster to look the Secret up in, every render makes a new token.
    assert tokens_in(render(DEFAULTS)) != tokens_in(manifests)


def test_an_existing_secret_has_no_checksum(
    render: Callable[[dict[str, Any]], Manifests],
) -> None:
    manifests = render(DEFAULTS | {"auth": {"existingSecret": "api-tokens"}})
    assert "checksum/auth" not in pod_annotations(manifests)


def test_notes_print_a_curl_with_the_token(notes: Callable[[dict[str, Any]], str]) -> None:
    generated = notes(DEFAULTS)
    assert 'curl -s -H "Authorization: Bearer $TOKEN" localhost:8080/v1/jobs' in generated
    assert (
        f"TOKEN=$(kubectl --namespace {NAMESPACE} get secret {RELEASE}-auth "
        "-o jsonpath='{.data.token}' | base64 -d)"
    ) in generated
    assert "auth.existingSecret" in generated  # the GitOps advice
    for values, secret in (
        ({"auth": {"tokens": GIVEN}}, None),
        ({"auth": {"existingSecret": "api-tokens"}}, "api-tokens"),
    ):
        text = notes(DEFAULTS | values)
        assert 'curl -s -H "Authorization: Bearer $TOKEN"' in text
        assert "jsonpath='{.data.token}'" not in text
        if secret:
            assert f"get secret {secret} -o jsonpath='{{.data.TICKGATE_API_TOKENS}}'" in text


def test_the_printed_token_is_a_read_token(
    render: Callable[[dict[str, Any]], Manifests], notes: Callable[[dict[str, Any]], str]
) -> None:
    """What `kubectl get secret ... jsonpath='{.data.token}' | base64 -d` prints is a token
    the API accepts for GET /v1/jobs."""
    manifests = render(DEFAULTS)
    data = manifests[("Secret", f"{RELEASE}-auth")]["data"]
    (key,) = re.findall(r"jsonpath='\{\.data\.(\w+)\}'", notes(DEFAULTS))
    token = base64.b64decode(data[key]).decode()
    assert "read" in tokens_in(manifests)[token]


def test_webhook_signing_keys_are_mounted_from_the_named_secret(
    render: Callable[[dict[str, Any]], Manifests],
) -> None:
    """`tasks.http.signing`: the keys Secret is a read-only file the pods are pointed at
    (never an env var), and the default key id is passed on; unset, neither appears."""
    signing = {"existingSecret": "tickgate-webhook-keys", "defaultKey": "billing"}
    manifests = render(DEFAULTS | {"tasks": {"http": {"signing": signing}}})
    assert env_of(container(manifests))["TICKGATE_WEBHOOK_SIGNING_KEY"]["value"] == "billing"
    volume = file_volume(manifests, "TICKGATE_WEBHOOK_KEYS_FILE")
    assert volume["secret"]["secretName"] == "tickgate-webhook-keys"
    assert volume["secret"]["items"][0]["key"] == "webhook-keys.json"
    plain = env_of(container(render(DEFAULTS)))
    assert "TICKGATE_WEBHOOK_KEYS_FILE" not in plain
    assert "TICKGATE_WEBHOOK_SIGNING_KEY" not in plain


def test_oauth_client_secrets_are_mounted_from_the_named_secret(
    render: Callable[[dict[str, Any]], Manifests],
) -> None:
    manifests = render(DEFAULTS | {"tasks": {"http": {"oauth": {"existingSecret": "oauth"}}}})
    volume = file_volume(manifests, "TICKGATE_OAUTH_SECRETS_FILE")
    assert volume["secret"]["secretName"] == "oauth"
    assert volume["secret"]["items"][0]["key"] == "oauth-secrets.json"
    assert "TICKGATE_OAUTH_SECRETS_FILE" not in env_of(container(render(DEFAULTS)))
