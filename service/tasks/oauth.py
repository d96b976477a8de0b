"""Tokens for the target: the http task's OAuth 2.0 client-credentials grant (RFC 6749,
section 4.4).

A job names the token endpoint, its client id, the scope or audience, and the name of
the client secret, which the operator keeps in a file (a mounted Secret,
`TICKGATE_OAUTH_SECRETS_FILE`: `{"name": "secret"}`): a job never holds the secret. A token
is cached per (token URL, client, scope, audience) until shortly before it expires, and
fetched anew once when the target answers a run 401. The token endpoint is reached
through the same SSRF guard as any target (`HttpSender`).
"""

import asyncio
import json
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, HttpUrl, field_validator

from service.tasks.netguard import refuse_never_called

# A token is used until this long before it expires (a run may outlast its last moments).
EXPIRY_MARGIN_SECONDS = 30.0
# How long a token without `expires_in` is used.
DEFAULT_TOKEN_SECONDS = 300.0


class OAuthClient(BaseModel):
    """What a job says of its client-credentials grant."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    token_url: HttpUrl = Field(
        description="The token endpoint; the same SSRF guard and allowlist as the target."
    )
    client_id: str = Field(min_length=1, max_length=256)
    client_secret: str = Field(
        min_length=1,
        max_length=128,
        description="The NAME of the client secret in the operator's "
        "TICKGATE_OAUTH_SECRETS_FILE, never the secret itself.",
    )
    scope: str | None = Field(default=None, max_length=1024)
    audience: str | None = Field(default=None, max_length=1024)

    _not_always_denied = field_validator("token_url")(refuse_never_called)

    @property
    def cache_key(self) -> "CacheKey":
        return (str(self.token_url), self.client_id, self.scope, self.audience)


class OAuthSecretsError(ValueError):
    """The secrets file is unreadable or malformed; says where, never a secret."""


@dataclass(frozen=True)
class OAuthSecrets:
    """Client secrets by the name a job gives (from `TICKGATE_OAUTH_SECRETS_FILE`)."""

    secrets: Mapping[str, str] = field(default_factory=dict, repr=False)

    @classmethod
    def load(cls, path: Path | None) -> "OAuthSecrets":
        if path is None:
            return cls()
        try:
            document = json.loads(path.read_text())
        except (OSError, ValueError) as error:
            name = type(error).__name__
            raise OAuthSecretsError(f"cannot read the OAuth secrets file {path}: {name}") from None
        if not isinstance(document, dict) or not all(
            isinstance(v, str) and v for v in document.values()
        ):
            raise OAuthSecretsError(f"{path}: expected a JSON object of names to secrets")
        return cls({str(name): value for name, value in document.items()})

    def names(self) -> list[str]:
        return sorted(self.secrets)


@dataclass(frozen=True)
class Token:
    value: str
    expires_at: float  # time.monotonic()

    def fresh(self) -> bool:
        return time.monotonic() < self.expires_at - EXPIRY_MARGIN_SECONDS


CacheKey = tuple[str, str, str | None, str | None]
Fetch = Callable[[OAuthClient, str], Awaitable[tuple[str, float | None]]]


class TokenCache:
    """Tokens by `OAuthClient.cache_key`, fetched with `fetch(client, secret)` (the
    token and its lifetime in seconds, None if unsaid). Runs asking at once for the
    same client wait for one fetch."""

    def __init__(self, secrets: OAuthSecrets, fetch: Fetch) -> None:
        self._secrets = secrets
        self._fetch = fetch
        self._tokens: dict[CacheKey, Token] = {}
        self._locks: dict[CacheKey, asyncio.Lock] = {}

    async def token(self, client: OAuthClient, *, refused: str | None = None) -> str:
        """A token for `client`: the cached one unless it is near its expiry or is the
        token `refused` (the target answered it 401), which is fetched anew once."""
        key = client.cache_key
        async with self._locks.setdefault(key, asyncio.Lock()):
            held = self._tokens.get(key)
            if held is None or not held.fresh() or held.value == refused:
                held = await self._fetched(client)
                self._tokens[key] = held
            return held.value

    async def _fetched(self, client: OAuthClient) -> Token:
        value, lifetime = await self._fetch(client, self._secrets.secrets[client.client_secret])
        return Token(value, time.monotonic() + (lifetime or DEFAULT_TOKEN_SECONDS))
