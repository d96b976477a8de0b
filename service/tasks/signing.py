"""Signed deliveries: the http task's requests signed as Standard Webhooks
(https://www.standardwebhooks.com), so a target can tell Tickgate sent them.

The operator mounts the keys (a file, say from a Secret) and names them by key id
(`TICKGATE_WEBHOOK_KEYS_FILE`), each with the hosts it may sign for; a job names a key id
(`signing_key`), or every job signs with `TICKGATE_WEBHOOK_SIGNING_KEY`, and a request is
signed only when it goes to one of its key's hosts. A job never holds a key, and no answer
or log line shows one. Each attempt sends:
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
class SigningKey:
    """One key id's secrets (the first is the newest) and the hosts it may sign for: a
    signature says "Tickgate sent this to you", so a key signs only for the consumers the
    operator named, whatever body or URL a job chooses."""

    secrets: tuple[bytes, ...] = field(repr=False)
    hosts: frozenset[str]

    def signs_for(self, host: str) -> bool:
        """Whether requests to `host` are signed: a listed name, or a name under a listed
        `*.suffix` (names ignore case)."""
        name = host.lower().rstrip(".")
        return name in self.hosts or any(
            pattern.startswith("*.") and name.endswith(pattern[1:]) for pattern in self.hosts
        )


UPGRADE = (
    'each key id names the hosts it may sign for: {"<id>": {"secrets": ["whsec_..."], '
    '"hosts": ["hooks.example.com", "*.example.net"]}} (two secrets while rotating)'
)


@dataclass(frozen=True)
class SigningKeys:
    """Keys by id, and the id every job signs with unless it names its own (None: jobs
    sign only when they name one)."""

    keys: Mapping[str, SigningKey] = field(default_factory=dict, repr=False)
    default: str | None = None

    @classmethod
    def load(cls, path: Path | None, default: str | None = None) -> "SigningKeys":
        """The keys of the JSON file at `path` (see UPGRADE). SigningKeysError if it
        cannot be used."""
        keys = _read(path) if path is not None else {}
        if default is not None and default not in keys:
            raise SigningKeysError(f"the default signing key {default!r} is not in the keys file")
        return cls(keys, default)

    def key_for(self, named: str | None, host: str) -> str | None:
        """The key id a request to `host` is signed with: the job's own, else the
        default; None if that key may not sign for `host` (or there is none)."""
        key_id = named or self.default
        if key_id is None or key_id not in self.keys:
            return None
        return key_id if self.keys[key_id].signs_for(host) else None

    def refusal(self, named: str, host: str) -> str | None:
        """Why a job may not name key `named` for a target at `host`, or None; an unknown
        id says nothing of the ids there are."""
        if named not in self.keys:
            return "no signing key of this id is configured"
        if not self.keys[named].signs_for(host):
            return "this signing key may not sign requests to this host"
        return None

    def signed(self, key_id: str, message_id: str, timestamp: int, body: bytes) -> dict[str, str]:
        """The three Standard Webhooks headers for one request."""
        content = f"{message_id}.{timestamp}.".encode() + body
        signatures = [
            "v1," + base64.b64encode(hmac.digest(secret, content, hashlib.sha256)).decode()
            for secret in self.keys[key_id].secrets
        ]
        return {
            "webhook-id": message_id,
            "webhook-timestamp": str(timestamp),
            "webhook-signature": " ".join(signatures),
        }


def _read(path: Path) -> dict[str, SigningKey]:
    try:
        document = json.loads(path.read_text())
    except (OSError, ValueError) as error:
        raise SigningKeysError(
            f"cannot read the keys file {path}: {type(error).__name__}"
        ) from None
    if not isinstance(document, dict) or not document:
        raise SigningKeysError(f"{path}: expected a JSON object of key ids; {UPGRADE}")
    return {str(key_id): _key(path, str(key_id), value) for key_id, value in document.items()}


def _key(path: Path, key_id: str, value: object) -> SigningKey:
    if not isinstance(value, dict):
        raise SigningKeysError(f"{path}: key {key_id!r} names no hosts; {UPGRADE}")
    hosts = value.get("hosts")
    if set(value) != {"secrets", "hosts"} or not isinstance(hosts, list) or not _names(hosts):
        raise SigningKeysError(f"{path}: key {key_id!r} needs secrets and hosts; {UPGRADE}")
    secrets = _secrets(path, key_id, value["secrets"])
    return SigningKey(secrets, frozenset(str(host).lower() for host in hosts))


def _names(hosts: list[object]) -> bool:
    return bool(hosts) and all(isinstance(h, str) and h for h in hosts)


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
