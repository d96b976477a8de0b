"""Tokens for the target: the http task's OAuth 2.0 client-credentials grant (RFC 6749,
section 4.4).

A job names the token endpoint, its client id, the scope or audience, and the name of
the client secret, which the operator keeps in a file (a mounted Secret,
`TICKGATE_OAUTH_SECRETS_FILE`: `{"name": {"secret": "...", "token_url": "https://..."}}`):
a job never holds the secret, and the secret goes to the token URL the operator bound it
to, never to one a job names. A token
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

from pydantic import BaseModel, ConfigDict, Field, HttpUrl, ValidationError, field_validator

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


class OperatorClient(BaseModel):
    """One entry of the operator's file: the secret, and where it may go. A secret is
    sent to its `token_url` only (the job's author chooses the token URL; were it free, a
    job could have the secret sent to a host of its own), and asks only for the scopes
    and audiences listed, when listed."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    secret: str = Field(min_length=1, repr=False)
    token_url: HttpUrl
    scopes: frozenset[str] | None = None
    audiences: frozenset[str] | None = None

    def refusal(self, client: OAuthClient) -> tuple[str, str] | None:
        """The field of `client` this entry refuses and why, or None."""
        if str(client.token_url) != str(self.token_url):
            return "token_url", "this client secret may be sent to another token URL only"
        asked = set((client.scope or "").split())
        if self.scopes is not None and not asked <= self.scopes:
            return "scope", "this client secret may not ask for this scope"
        if self.audiences is not None and client.audience not in self.audiences | {None}:
            return "audience", "this client secret may not ask for this audience"
        return None


UPGRADE = (
    'each entry names the token URL its secret may be sent to: {"<name>": {"secret": '
    '"<secret>", "token_url": "https://<issuer>/token"}}, optionally with "scopes" and '
    '"audiences" (lists of what it may ask for)'
)


@dataclass(frozen=True)
class OAuthSecrets:
    """Client secrets by the name a job gives (from `TICKGATE_OAUTH_SECRETS_FILE`), each
    bound to its token URL."""

    clients: Mapping[str, OperatorClient] = field(default_factory=dict, repr=False)

    @classmethod
    def load(cls, path: Path | None) -> "OAuthSecrets":
        if path is None:
            return cls()
        try:
            document = json.loads(path.read_text())
        except (OSError, ValueError) as error:
            name = type(error).__name__
            raise OAuthSecretsError(f"cannot read the OAuth secrets file {path}: {name}") from None
        if not isinstance(document, dict):
            raise OAuthSecretsError(f"{path}: expected a JSON object of names; {UPGRADE}")
        return cls({str(name): _entry(path, str(name), v) for name, v in document.items()})

    def refusal(self, client: OAuthClient) -> tuple[str, str] | None:
        """The field of a job's `client` the operator's file refuses and why (an unknown
        name says nothing of the names there are), or None."""
        entry = self.clients.get(client.client_secret)
        if entry is None:
            return "client_secret", "no client secret of this name is configured"
        return entry.refusal(client)

    def secret_for(self, client: OAuthClient) -> str:
        """The secret to send for `client`; OAuthRefused unless the file allows it (a job
        written before the file changed is refused when it runs)."""
        refused = self.refusal(client)
        if refused is not None:
            raise OAuthRefused(f"oauth.{refused[0]}: {refused[1]}")
        return self.clients[client.client_secret].secret


class OAuthRefused(Exception):
    """The operator's file does not allow a job's client (any more)."""


def _entry(path: Path, name: str, value: object) -> OperatorClient:
    if isinstance(value, str):
        raise OAuthSecretsError(f"{path}: {name!r} is a bare secret; {UPGRADE}")
    try:
        return OperatorClient.model_validate(value)
    except ValidationError as error:
        fields = ", ".join(".".join(map(str, e["loc"])) or "entry" for e in error.errors())
        raise OAuthSecretsError(f"{path}: {name!r} is malformed ({fields}); {UPGRADE}") from None


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
        value, lifetime = await self._fetch(client, self._secrets.secret_for(client))
        return Token(value, time.monotonic() + (lifetime or DEFAULT_TOKEN_SECONDS))
