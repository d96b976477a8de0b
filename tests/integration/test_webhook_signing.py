"""Signed deliveries (Standard Webhooks) end to end: the API, the runner, the http task
and the loopback receiver, verified as a target would, with the `standardwebhooks`
package from PyPI."""

import base64
import json
import logging
from pathlib import Path
from typing import Any

import httpx
import pytest
from standardwebhooks.webhooks import Webhook, WebhookVerificationError

from harness.receiver import Receipt, Receiver
from service.config import Settings
from service.tasks.signing import SigningKeys, SigningKeysError
from tests.support.inprocess import served, triggered_run

NEVER = {"kind": "cron", "expression": "0 0 1 1 *"}
NEW = "whsec_" + base64.b64encode(b"n" * 32).decode()
OLD = "whsec_" + base64.b64encode(b"o" * 32).decode()
OTHER = "whsec_" + base64.b64encode(b"x" * 32).decode()


@pytest.fixture
def keys_file(tmp_path: Path) -> Path:
    path = tmp_path / "webhook-keys.json"
    keys = {
        "billing": {"secrets": [NEW, OLD], "hosts": ["127.0.0.1"]},
        "reports": {"secrets": [OTHER], "hosts": ["127.0.0.1", "*.example.test"]},
    }
    path.write_text(json.dumps(keys))
    return path


async def create(client: httpx.AsyncClient, name: str, **extra: Any) -> httpx.Response:
    args = {"url": extra.pop("url"), **extra.pop("args", {})}
    job = {"name": name, "schedule": NEVER, "task": "http", "args": args, **extra}
    return await client.post("/v1/jobs", json=job)


def verify(secret: str, receipt: Receipt) -> Any:
    return Webhook(secret).verify(receipt.body, receipt.headers)


async def test_a_signed_delivery_verifies_with_either_key_of_a_rotation(
    settings: Settings, receiver: Receiver, keys_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A job naming key `billing` (being rotated: two secrets) is delivered with both
    signatures, so a target holding either secret verifies it; `webhook-id` is the run id
    on every attempt of the run; a tampered body or another key fails; neither the API
    nor the logs show a secret."""
    caplog.set_level(logging.DEBUG)
    signed = settings.model_copy(update={"webhook_keys_file": keys_file})
    receiver.fail_first("/signed", 1)
    async with served(signed) as client:
        made = await create(
            client,
            "signed",
            url=f"{receiver.url}/signed",
            args={"signing_key": "billing"},
            retry={"max_attempts": 2, "min_backoff_seconds": 0.1},
        )
        assert made.status_code == 201, made.text
        run = await triggered_run(client, "signed")
        shown = (await client.get("/v1/jobs/signed")).text
    assert (run["status"], run["attempts"]) == ("succeeded", 2)
    first, second = receiver.receipts()
    for receipt in (first, second):
        assert receipt.headers["webhook-id"] == run["id"]
        assert len(receipt.headers["webhook-signature"].split(" ")) == 2
        for secret in (NEW, OLD):
            assert verify(secret, receipt) == json.loads(second.body)
    with pytest.raises(WebhookVerificationError):
        verify(OTHER, second)
    tampered = Receipt(**{**second.__dict__, "body": second.body.replace(b"signed", b"sigmed")})
    with pytest.raises(WebhookVerificationError):
        verify(NEW, tampered)
    for secret in (NEW, OLD, OTHER):
        raw = secret.removeprefix("whsec_")
        assert raw not in shown
        assert raw not in caplog.text
    assert '"signing_key":"billing"' in shown.replace(" ", "")


async def test_the_operator_s_default_key_signs_every_job_that_names_none(
    settings: Settings, receiver: Receiver, keys_file: Path
) -> None:
    defaulted = settings.model_copy(
        update={"webhook_keys_file": keys_file, "webhook_signing_key": "reports"}
    )
    async with served(defaulted) as client:
        assert (await create(client, "plain", url=f"{receiver.url}/plain")).status_code == 201
        assert (await triggered_run(client, "plain"))["status"] == "succeeded"
    [receipt] = receiver.receipts()
    verify(OTHER, receipt)


async def test_a_job_without_a_key_sends_no_signature(
    settings: Settings, receiver: Receiver, keys_file: Path
) -> None:
    async with served(settings.model_copy(update={"webhook_keys_file": keys_file})) as client:
        assert (await create(client, "bare", url=f"{receiver.url}/bare")).status_code == 201
        assert (await triggered_run(client, "bare"))["status"] == "succeeded"
    [receipt] = receiver.receipts()
    assert not any(name.startswith("webhook-") for name in receipt.headers)


async def test_an_unknown_key_id_or_a_host_the_key_is_not_for_is_refused_when_written(
    settings: Settings, keys_file: Path
) -> None:
    """A 422 naming `signing_key`, listing no configured id (#42): `billing` signs for
    127.0.0.1 only, `reports` for names under example.test too."""
    cases = [
        (keys_file, "https://example.test/x", "nope", "no signing key of this id"),
        (None, "https://example.test/x", "nope", "no signing key of this id"),
        (keys_file, "https://hooks.example.test/x", "billing", "may not sign"),
        (keys_file, "https://example.test.evil/x", "reports", "may not sign"),
    ]
    for index, (configured, url, key, said) in enumerate(cases):
        async with served(settings.model_copy(update={"webhook_keys_file": configured})) as client:
            refused = await create(client, f"unsigned-{index}", url=url, args={"signing_key": key})
            allowed = await create(
                client,
                f"ok-{index}",
                url="https://hooks.example.test/x",
                args={"signing_key": "reports"},
            )
        assert refused.status_code == 422, refused.text
        [problem] = refused.json()["errors"]
        assert problem["loc"] == ["body", "args", "signing_key"]
        assert said in problem["msg"]
        assert "billing" not in refused.text or key == "billing"
        assert "reports" not in refused.text or key == "reports"
        assert allowed.status_code == (201 if configured else 422), allowed.text


async def test_the_default_key_signs_only_requests_to_its_hosts(
    settings: Settings, receiver: Receiver, tmp_path: Path
) -> None:
    """The default key is bound like any: a job calling a host it is not for is sent
    unsigned (the operator's key signs nothing a job author aims elsewhere)."""
    path = tmp_path / "keys.json"
    path.write_text(json.dumps({"prod": {"secrets": [OTHER], "hosts": ["hooks.example.test"]}}))
    defaulted = settings.model_copy(
        update={"webhook_keys_file": path, "webhook_signing_key": "prod"}
    )
    async with served(defaulted) as client:
        assert (await create(client, "plain", url=f"{receiver.url}/plain")).status_code == 201
        assert (await triggered_run(client, "plain"))["status"] == "succeeded"
    [receipt] = receiver.receipts()
    assert not any(name.startswith("webhook-") for name in receipt.headers)


@pytest.mark.parametrize(
    ("content", "says"),
    [
        ("not json", "cannot read the keys file"),
        ('{"k": {"secrets": ["whsec_###"], "hosts": ["h"]}}', "is not base64"),
        (
            '{"k": {"secrets": ["whsec_' + base64.b64encode(b"short").decode() + '"], '
            '"hosts": ["h"]}}',
            "shorter than 24 bytes",
        ),
        ('{"k": {"secrets": ["a", "b", "c"], "hosts": ["h"]}}', "one secret, or two while"),
        ('{"k": "whsec_###"}', "names no hosts"),
        ('{"k": {"secrets": ["whsec_###"]}}', "needs secrets and hosts"),
    ],
)
def test_a_malformed_keys_file_stops_the_start_saying_what_is_wrong(
    tmp_path: Path, content: str, says: str
) -> None:
    path = tmp_path / "keys.json"
    path.write_text(content)
    with pytest.raises(SigningKeysError, match=says) as refused:
        SigningKeys.load(path)
    assert "###" not in str(refused.value)


def test_the_default_key_must_be_in_the_file(keys_file: Path) -> None:
    with pytest.raises(SigningKeysError, match="'missing' is not in the keys file"):
        SigningKeys.load(keys_file, "missing")
