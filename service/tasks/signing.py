"""Signed deliveries: the http task's requests signed as Standard Webhooks
(https://www.standardwebhooks.com), so a target can tell Tickgate sent them.

The operator mounts the keys (a file, say from a Secret) and names them by key id
(`TICKGATE_WEBHOOK_KEYS_FILE`); a job names a key id (`signing_key`), or every job signs
with `TICKGATE_WEBHOOK_SIGNING_KEY`. A job never holds a key, and no answer or log line
shows one. Each attempt sends:
- `webhook-id`: the run's id, the same for every attempt of the run (the target dedupes);
- `webhook-timestamp`: the attempt's Unix time;
- `webhook-signature`: `v1,<base64 HMAC-SHA256 of "id.timestamp.body">` per key of the id,
  space-separated: during a rotation both keys sign, and either verifies.
"""

import base64
import hashlib
import hmac
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

SECRET_PREFIX = "whsec_"  # noqa: S105 - the prefix Standard Webhooks secrets carry, no secret


class SigningKeysError(ValueError):
    """The keys file is unreadable or malformed; says where, never what a key is."""


@dataclass(frozen=True)
class SigningKeys:
    """Key ids to their secrets (the first is the newest), and the id every job signs
    with unless it names its own (None: jobs sign only when they name one)."""

    secrets: Mapping[str, tuple[bytes, ...]] = field(default_factory=dict, repr=False)
    default: str | None = None

    @classmethod
    def load(cls, path: Path | None, default: str | None = None) -> "SigningKeys":
        """The keys of the JSON file at `path`: `{"id": "whsec_..."}`, or a list of
        secrets for an id being rotated. SigningKeysError if it cannot be used."""
        secrets = _read(path) if path is not None else {}
        if default is not None and default not in secrets:
            raise SigningKeysError(f"the default signing key {default!r} is not in the keys file")
        return cls(secrets, default)

    def ids(self) -> list[str]:
        return sorted(self.secrets)

    def key_for(self, named: str | None) -> str | None:
        """The key id a job signs with: its own, else the default."""
        return named or self.default

    def signed(self, key_id: str, message_id: str, timestamp: int, body: bytes) -> dict[str, str]:
        """The three Standard Webhooks headers for one request."""
        content = f"{message_id}.{timestamp}.".encode() + body
        signatures = [
            "v1," + base64.b64encode(hmac.digest(secret, content, hashlib.sha256)).decode()
            for secret in self.secrets[key_id]
        ]
        return {
            "webhook-id": message_id,
            "webhook-timestamp": str(timestamp),
            "webhook-signature": " ".join(signatures),
        }


def _read(path: Path) -> dict[str, tuple[bytes, ...]]:
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise SigningKeysError(
            f"cannot read the keys file {path}: {type(error).__name__}"
        ) from None
    if not isinstance(document, dict) or not document:
        raise SigningKeysError(f"{path}: expected a JSON object of key ids to secrets")
    return {str(key_id): _secrets(path, str(key_id), value) for key_id, value in document.items()}


def _secrets(path: Path, key_id: str, value: object) -> tuple[bytes, ...]:
    listed = value if isinstance(value, list) else [value]
    if not listed or len(listed) > 2 or not all(isinstance(v, str) for v in listed):
        raise SigningKeysError(f"{path}: key {key_id!r} needs one secret, or two while rotating")
    return tuple(_decoded(path, key_id, str(v)) for v in listed)


def _decoded(path: Path, key_id: str, secret: str) -> bytes:
    try:
        raw = base64.b64decode(secret.removeprefix(SECRET_PREFIX), validate=True)
    except ValueError:
        raise SigningKeysError(f"{path}: a secret of key {key_id!r} is not base64") from None
    if len(raw) < 24:
        raise SigningKeysError(f"{path}: a secret of key {key_id!r} is shorter than 24 bytes")
    return raw
