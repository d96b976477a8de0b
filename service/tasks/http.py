"""The `http` task: one request per run, carrying headers the target can dedupe on.

Every target passes the SSRF guard (`netguard`) first: the host is resolved once, each
address is judged, and the TCP connection goes to a vetted address while the request
keeps its Host header and (for https) SNI and certificate checks against the host name.
Redirects are followed by hand, each Location vetted before anything connects to it.
Connections are kept alive and reused per origin: a reused connection goes to an
address that was vetted when it opened, and every request is vetted again anyway.

The client is aiohttp, on its public extension points only: a resolver that answers a
name with its vetted addresses and never looks anything up (`PinnedResolver`), and a
socket factory that opens no socket toward an address the exchange did not vet
(`PinnedSockets`, which also covers IP literals, for which aiohttp asks no resolver).
It costs about a quarter of httpx's CPU per request (bench/PROFILING.md).
"""

import asyncio
import base64
import json
import re
import socket
import ssl
import time
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib.metadata import version
from typing import Annotated, Any, Literal
from urllib.parse import quote_plus, unquote

import aiohttp
import httpx
import yarl
from aiohappyeyeballs import AddrInfoType, SocketFactoryType
from aiohttp.abc import AbstractResolver, ResolveResult
from pydantic import (
    AfterValidator,
    AnyHttpUrl,
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    UrlConstraints,
    field_validator,
    model_validator,
)

from service.domain.errors import InvalidInput
from service.tasks.answers import (
    DEFAULT_OUTPUT_BYTES,
    MAX_OUTPUT_BYTES,
    Answer,
    answer_output,
    read_answer,
)
from service.tasks.base import TaskContext, TaskDefinition
from service.tasks.hosts import HostLimits, HostTally
from service.tasks.masking import Masker
from service.tasks.netguard import (
    Allowlist,
    IPAddress,
    Resolver,
    TargetDenied,
    TargetUnresolved,
    Verdict,
    VettedTarget,
    classify,
    parse_host,
    refuse_never_called,
    resolve_host,
    vet,
)
from service.tasks.oauth import OAuthClient, OAuthSecrets, TokenCache
from service.tasks.signing import SigningKeys

VERSION = version("tickgate")

MAX_URL_LENGTH = 2048
MAX_HEADERS = 100
MAX_HEADER_NAME_LENGTH = 256
MAX_HEADER_VALUE_LENGTH = 8 * 1024
MAX_RESPONSE_BYTES = 1024 * 1024
MAX_REDIRECTS = 5
KEEPALIVE_SECONDS = 15.0
ALLOW = "TICKGATE_HTTP_ALLOW"
# What is read of a token endpoint's answer, at most.
TOKEN_BODY_BYTES = 64 * 1024
# How long a connect may take (TICKGATE_HTTP_CONNECT_TIMEOUT_SECONDS), apart from the
# run's own timeout, which also bounds the wait for a free connection (the connections
# per host and replica: hosts.HostLimits).
CONNECT_TIMEOUT_SECONDS = 10.0
# A response's status line and each of its headers may be this long: the bound the
# client before aiohttp (httpcore) set on a whole response head; aiohttp's default is 8 KiB.
MAX_RESPONSE_HEADER_BYTES = 100 * 1024
SECRET_MASK = "***"  # noqa: S105 - the mask shown instead of a secret
DEFAULT_PORTS = {"http": 80, "https": 443}
REDIRECT_STATUSES = frozenset({301, 302, 303, 307, 308})
# Framing and routing are the client's business: a header could smuggle a second
# request or aim the request at another virtual host than the vetted URL names.
RESERVED_HEADERS = frozenset(
    {
        "host",
        "content-length",
        "transfer-encoding",
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "upgrade",
    }
)
# Never carried to another origin by a redirect (besides the job's secret headers).
CREDENTIAL_HEADERS = frozenset({"authorization", "proxy-authorization", "cookie"})

_TOKEN = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
_FIELD_VALUE = re.compile(r"^[\t\x20-\x7e]*$")


def _check_header_name(name: str) -> str:
    if not _TOKEN.match(name):
        raise ValueError(
            f"header name {name[:40]!r} is not an HTTP token (letters, digits, !#$%&'*+-.^_`|~)"
        )
    return name


def _check_header_value(value: str) -> str:
    if not _FIELD_VALUE.match(value):
        raise ValueError(
            "header values must be printable ASCII (tabs allowed): no CR, LF or other "
            "control characters"
        )
    return value


HeaderName = Annotated[
    str,
    Field(min_length=1, max_length=MAX_HEADER_NAME_LENGTH),
    AfterValidator(_check_header_name),
]
HeaderValue = Annotated[
    str, Field(max_length=MAX_HEADER_VALUE_LENGTH), AfterValidator(_check_header_value)
]
HttpUrl = Annotated[AnyHttpUrl, UrlConstraints(max_length=MAX_URL_LENGTH)]


class HttpArgs(BaseModel):
    model_config = ConfigDict(extra="forbid")

    url: HttpUrl = Field(
        description=f"http(s) URL to call, at most {MAX_URL_LENGTH} characters. Link-local "
        "and metadata addresses are refused; loopback and private ones unless the operator "
        "allowlists them (TICKGATE_HTTP_ALLOW)."
    )
    method: Literal["GET", "POST", "PUT", "PATCH", "DELETE", "HEAD", "OPTIONS"] = "POST"
    headers: dict[HeaderName, HeaderValue] = Field(
        default_factory=dict,
        max_length=MAX_HEADERS,
        description=f"Request headers: at most {MAX_HEADERS}; names are HTTP tokens of at "
        f"most {MAX_HEADER_NAME_LENGTH} characters, values printable ASCII of at most "
        f"{MAX_HEADER_VALUE_LENGTH}.",
        json_schema_extra={"x-secret-names": "secret_headers"},  # the dashboard masks them
    )
    secret_headers: list[HeaderName] = Field(
        default_factory=list,
        max_length=MAX_HEADERS,
        description=f"Names of `headers` whose values are secret: stored, but shown as "
        f'"{SECRET_MASK}"; sending "{SECRET_MASK}" back keeps the stored value.',
    )
    body: JsonValue = Field(
        default=None,
        description="JSON body; when absent, {job, run_id, scheduled_for} is sent.",
    )
    timeout_seconds: float = Field(
        30, gt=0, le=3600, description="Bound on the whole exchange, redirects included."
    )
    success_status: list[int] | None = Field(
        default=None,
        min_length=1,
        max_length=100,
        description="Statuses that count as success; default any 2xx. A redirect status "
        "listed here is not followed.",
    )
    signing_key: str | None = Field(
        default=None,
        min_length=1,
        max_length=128,
        description="Sign each request as Standard Webhooks (webhook-id: the run id, the same "
        "for every attempt; webhook-timestamp; webhook-signature) with the operator's key of "
        "this id (TICKGATE_WEBHOOK_KEYS_FILE); unknown ids are refused. Default: the "
        "operator's TICKGATE_WEBHOOK_SIGNING_KEY, if set. The key itself is never shown.",
    )
    output_bytes: int = Field(
        default=DEFAULT_OUTPUT_BYTES,
        ge=0,
        le=MAX_OUTPUT_BYTES,
        description="How much of the response body a run keeps as its output (GET "
        "/v1/runs/{id}); the status and chosen headers are kept whatever this is.",
    )
    oauth: OAuthClient | None = Field(
        default=None,
        description="Send `Authorization: Bearer <token>` from an OAuth 2.0 client-credentials "
        "grant; the token is cached until shortly before it expires and fetched anew once "
        "if the target answers 401.",
    )

    _not_always_denied = field_validator("url")(refuse_never_called)

    @field_validator("url")
    @classmethod
    def _no_masked_password(cls, url: AnyHttpUrl) -> AnyHttpUrl:
        if url.password == SECRET_MASK:
            raise ValueError(
                f"the URL's password is {SECRET_MASK!r}, which keeps the password stored for "
                "this origin and user, and there is none: send the password itself"
            )
        return url

    @field_validator("headers")
    @classmethod
    def _plain_headers(cls, headers: dict[str, str]) -> dict[str, str]:
        seen: set[str] = set()
        for name in headers:
            folded = name.lower()
            if folded in RESERVED_HEADERS:
                raise ValueError(f"header {name!r} is set by the http client, not by a job")
            if folded in seen:
                raise ValueError(f"header {name!r} is given twice (names ignore case)")
            seen.add(folded)
        return headers

    @model_validator(mode="after")
    def _secrets_name_headers(self) -> "HttpArgs":
        present = {name.lower(): value for name, value in self.headers.items()}
        for name in self.secret_headers:
            if name.lower() not in present:
                raise ValueError(f"secret header {name!r} is not one of `headers`")
            if present[name.lower()] == SECRET_MASK:
                raise ValueError(
                    f"secret header {name!r} is {SECRET_MASK!r}, which keeps the value stored "
                    "for this URL's origin (scheme, host and port), and there is none: send "
                    "the value itself"
                )
        return self

    def succeeded(self, status: int) -> bool:
        if self.success_status is None:
            return 200 <= status < 300
        return status in self.success_status

    def secret_names(self) -> frozenset[str]:
        return frozenset(name.lower() for name in self.secret_headers)

    def secret_values(self) -> list[str]:
        """The secret header values, and the URL's password (sent as Basic credentials)."""
        secret = self.secret_names()
        values = [value for name, value in self.headers.items() if name.lower() in secret]
        # As sent (decoded: the Basic credentials carry it so), and as the URL spells it.
        password = self.url.password
        return values + ([unquote(password), password] if password else [])


class HttpTaskError(Exception):
    """The request went out but did not succeed, or could not be sent."""


class HttpStatusError(HttpTaskError):
    """The target answered with a status the job does not count as success."""

    def __init__(self, message: str, status: int) -> None:
        super().__init__(message)
        self.status = status


# Secrets in args ---------------------------------------------------------------------


def _secret_names(args: Mapping[str, Any]) -> frozenset[str]:
    names = args.get("secret_headers")
    if not isinstance(names, list):
        return frozenset()
    return frozenset(name.lower() for name in names if isinstance(name, str))


def redact_args(args: Mapping[str, JsonValue]) -> dict[str, JsonValue]:
    """A copy of http `args` with every secret header's value replaced by "***".

    Works on stored (or any) JSON args without validating them; `args` is not changed.
    """
    copy = dict(args)
    headers = args.get("headers")
    secret = _secret_names(args)
    if isinstance(headers, dict) and secret:
        copy["headers"] = {
            name: SECRET_MASK if name.lower() in secret else value
            for name, value in headers.items()
        }
    if isinstance(url := args.get("url"), str):
        copy["url"] = _with_password(url, SECRET_MASK)
    return copy


def _with_password(url: str, password: str) -> str:
    """`url` with the password of its user:password@ (if it has one) replaced."""
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL:
        return url
    if not parsed.password:
        return url
    return str(parsed.copy_with(username=parsed.username, password=password))


def merge_secret_headers(
    new_args: Mapping[str, JsonValue], stored_args: Mapping[str, JsonValue] | None
) -> dict[str, JsonValue]:
    """A copy of `new_args` where a secret header (one named in the new args'
    `secret_headers`) whose value is "***" takes the stored value of that header (names
    ignore case), if the new `url` has the stored one's origin (scheme, host and port): a
    secret is bound to where it was stored for. Without a stored value for that origin the
    "***" stays, and validation refuses it, naming the header.

    Call it before validating and saving a PUT or PATCH, so that a body read back from
    GET (secrets shown as "***") keeps the stored secrets and changes nothing.
    """
    copy = dict(new_args)
    stored_url = (stored_args or {}).get("url")
    if not same_origin(new_args.get("url"), stored_url):
        return copy
    copy["url"] = _kept_password(new_args.get("url"), stored_url)
    headers = new_args.get("headers")
    stored_headers = (stored_args or {}).get("headers")
    secret = _secret_names(new_args)
    if not (isinstance(headers, dict) and isinstance(stored_headers, dict) and secret):
        return copy
    stored = {
        name.lower(): value for name, value in stored_headers.items() if isinstance(value, str)
    }
    copy["headers"] = {
        name: stored.get(name.lower(), value)
        if value == SECRET_MASK and name.lower() in secret
        else value
        for name, value in headers.items()
    }
    return copy


def _kept_password(url: JsonValue, stored_url: JsonValue) -> JsonValue:
    """A URL whose password is "***" (as shown) takes the stored URL's password, for the
    same origin and user only."""
    if not (isinstance(url, str) and isinstance(stored_url, str)):
        return url
    new, stored = httpx.URL(url), httpx.URL(stored_url)
    if new.password != SECRET_MASK or new.username != stored.username or not stored.password:
        return url
    return _with_password(url, stored.password)


def same_origin(url: JsonValue, stored_url: JsonValue) -> bool:
    """Whether two URLs (as sent, not yet validated) name one origin: scheme, host and
    default-filled port; anything unparsable names none."""
    origins = {_origin_of(url), _origin_of(stored_url)}
    return len(origins) == 1 and None not in origins


def _origin_of(url: JsonValue) -> tuple[str, str, int | None] | None:
    if not isinstance(url, str):
        return None
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL:
        return None
    return (parsed.scheme, parsed.host, parsed.port or DEFAULT_PORTS.get(parsed.scheme))


# The request ---------------------------------------------------------------------------


def rfc3339_utc(moment: datetime) -> str:
    """`2026-11-29T19:00:05Z`; a manual run's sub-second tick keeps its fraction."""
    text = moment.astimezone(UTC).replace(tzinfo=None).isoformat()
    return f"{text}Z"


def request_headers(
    args: HttpArgs, context: TaskContext, drop: Iterable[str] = ()
) -> dict[str, str]:
    """The job's headers (less those named in `drop`, any case) and Tickgate's own."""
    dropped = {name.lower() for name in drop}
    scheduled_for = rfc3339_utc(context.scheduled_for)
    return {
        "User-Agent": f"tickgate/{VERSION}",
        **{name: value for name, value in args.headers.items() if name.lower() not in dropped},
        "Idempotency-Key": str(context.run_id),
        "X-Tickgate-Job": context.job,
        "X-Tickgate-Run-Id": str(context.run_id),
        "X-Tickgate-Scheduled-For": scheduled_for,
        **context.trace_headers,
    }


def request_body(args: HttpArgs, context: TaskContext) -> JsonValue:
    if "body" in args.model_fields_set:
        return args.body
    return {
        "job": context.job,
        "run_id": str(context.run_id),
        "scheduled_for": rfc3339_utc(context.scheduled_for),
    }


def shown(url: httpx.URL) -> str:
    """The URL for messages, without any user:password@."""
    return str(url.copy_with(userinfo=b"")) if url.userinfo else str(url)


def origin(url: httpx.URL) -> tuple[str, bytes, int | None]:
    return url.scheme, url.raw_host.lower(), url.port


def redirect_method(method: str, status: int) -> str:
    """The method after a redirect, as browsers (and httpx) do it."""
    if status == 303 and method != "HEAD":
        return "GET"
    if status == 302 and method not in ("GET", "HEAD"):
        return "GET"
    if status == 301 and method == "POST":
        return "GET"
    return method


def encode_json(body: JsonValue) -> bytes | None:
    """The body as sent: compact UTF-8 JSON (as httpx's `json=` wrote it); None when
    there is no body to send."""
    if body is None:
        return None
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()


def basic_credentials(url: httpx.URL) -> str:
    """The Authorization value for a URL's user:password@ (sent instead of the URL's)."""
    pair = f"{url.username}:{url.password}".encode()
    return f"Basic {base64.b64encode(pair).decode('ascii')}"


def wire_headers(url: httpx.URL, headers: dict[str, str], body: bytes | None) -> dict[str, str]:
    """`headers` and what the client adds: Host spelled as the URL spells it, credentials
    from the URL's userinfo (replacing a job's Authorization), and the JSON content type
    unless the job set one."""
    sent = {"Host": url.netloc.decode("ascii"), **headers}
    if url.username or url.password:
        sent = {name: value for name, value in sent.items() if name.lower() != "authorization"}
        sent["Authorization"] = basic_credentials(url)
    if body is not None and not any(name.lower() == "content-type" for name in sent):
        sent["Content-Type"] = "application/json"
    return sent


def connect_url(url: httpx.URL) -> yarl.URL:
    """The URL the client is handed: no userinfo (sent as a header by `wire_headers`), and
    an IP literal in its standard spelling, since aiohttp refuses the legacy forms
    (`2130706433`, `127.1`) that the guard reads as the OS does. The Host header keeps
    the URL's own spelling; a host name is passed on as the guard vetted it."""
    host = url.raw_host.decode("ascii")
    address = parse_host(host)
    standard = host if address is None else str(address)
    if standard == host and not url.userinfo:
        return yarl.URL(str(url), encoded=True)
    return yarl.URL(str(url.copy_with(host=standard, userinfo=b"")), encoded=True)


# The hosts the current exchange vetted, and where each may be reached. aiohttp resolves
# and connects in the task whose request needs it, so both see their own vetting.
_PINS: ContextVar[dict[str, VettedTarget]] = ContextVar("tickgate_http_pins")


@contextmanager
def pinning() -> Iterator[dict[str, VettedTarget]]:
    """Within the block, connects go only to the targets put in the dict it yields."""
    token = _PINS.set({})
    try:
        yield _PINS.get()
    finally:
        _PINS.reset(token)


def _not_vetted(host: str, port: int) -> OSError:
    return OSError(f"{host}:{port} was not vetted; refusing to connect")


class PinnedResolver(AbstractResolver):
    """Answers a host name with the addresses the current exchange's vetting chose for
    it, in the resolver's order; refuses any other name or port. It never looks a name
    up itself: the guard did, once.

    aiohttp still knows the host name, so TLS sends it as SNI and checks the certificate
    against it, and pooled connections stay keyed by it."""

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        target = _PINS.get({}).get(host)
        if target is None or port != target.port:
            raise _not_vetted(host, port)
        return [_resolved(host, address, port) for address in target.addresses]

    async def close(self) -> None:
        """Nothing to release: it holds no resolver of its own."""


def _resolved(host: str, address: IPAddress, port: int) -> ResolveResult:
    family = socket.AF_INET if address.version == 4 else socket.AF_INET6
    return ResolveResult(
        hostname=host,
        host=str(address),
        port=port,
        family=family,
        proto=0,
        flags=socket.AI_NUMERICHOST,
    )


def plain_socket(addr_info: AddrInfoType) -> socket.socket:
    """A new socket for `addr_info`, as aiohttp opens one by default."""
    family, kind, proto, _, _ = addr_info
    return socket.socket(family, kind, proto)


@dataclass(frozen=True)
class PinnedSockets:
    """Opens a socket (through `inner`) only toward an address and port the current
    exchange vetted: the check under the resolver, which aiohttp skips for IP literals.
    Each is counted open for its host in `hosts` until it closes."""

    inner: SocketFactoryType = plain_socket
    hosts: HostTally = field(default_factory=HostTally)

    def __call__(self, addr_info: AddrInfoType) -> socket.socket:
        host, port = str(addr_info[4][0]), int(addr_info[4][1])
        address = parse_host(host)
        vetted = _PINS.get({}).values()
        target = next((t for t in vetted if port == t.port and address in t.addresses), None)
        if target is None:
            raise _not_vetted(host, port)
        return self.hosts.opened(target.key, self.inner(addr_info))


@dataclass(frozen=True)
class Redirect:
    """An answer that sends the request on to `location`."""

    status: int
    location: str


@dataclass
class HttpSender:
    """Runs the http task for one allowlist. `resolve`, `network` (what opens the
    sockets that really connect) and `trust` (the TLS context servers are verified with)
    are seams for tests; the defaults are the system's resolver and sockets, and
    httpx's verifying context (certifi's authorities)."""

    allow: Allowlist
    resolve: Resolver = resolve_host
    network: SocketFactoryType = plain_socket
    trust: ssl.SSLContext | None = None
    max_response_bytes: int = MAX_RESPONSE_BYTES
    limits: HostLimits = field(default_factory=HostLimits)
    connect_timeout_seconds: float = CONNECT_TIMEOUT_SECONDS
    hosts: HostTally = field(default_factory=HostTally)
    signing: SigningKeys = field(default_factory=SigningKeys)
    oauth: OAuthSecrets = field(default_factory=OAuthSecrets)
    _session: aiohttp.ClientSession | None = field(default=None, init=False, repr=False)
    _tokens: TokenCache = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._tokens = TokenCache(self.oauth, self._fetch_token)
        self.hosts.limits = self.limits

    def ssl_context(self) -> ssl.SSLContext:
        if self.trust is None:
            self.trust = httpx.create_ssl_context()
        return self.trust

    def warm(self) -> None:
        """Load the certificates and open the (empty) pool now, not in a first run.
        Call it with the event loop running (aiohttp binds its pool to it)."""
        self._pooled()

    def _pooled(self) -> aiohttp.ClientSession:
        """The client and its pool, opened on first use, so a registry that never sends
        holds no sockets. No proxies (one would resolve the host itself, after our
        check), no cookies (a cookie set by one job's target is no other run's business),
        no decoding; `run` bounds the whole exchange, the wait for a free connection
        included, and a connect alone gets `connect_timeout_seconds`."""
        if self._session is None:
            self._session = aiohttp.ClientSession(
                connector=self._connector(),
                cookie_jar=aiohttp.DummyCookieJar(),
                trust_env=False,
                auto_decompress=False,
                timeout=aiohttp.ClientTimeout(
                    total=None, sock_connect=self.connect_timeout_seconds
                ),
                trace_configs=[self.hosts.trace_config()],
                max_line_size=MAX_RESPONSE_HEADER_BYTES,
                max_field_size=MAX_RESPONSE_HEADER_BYTES,
            )
        return self._session

    def _connector(self) -> aiohttp.TCPConnector:
        """At most `limits.connections` connections to a host (a crowd of runs to one target
        takes turns on them rather than flooding it), none overall; idle ones are kept a
        short while and reused first. A name's vetted addresses are tried one after the
        other, in order."""
        return aiohttp.TCPConnector(
            resolver=PinnedResolver(),
            use_dns_cache=False,
            socket_factory=PinnedSockets(self.network, self.hosts),
            happy_eyeballs_delay=None,
            ssl=self.ssl_context(),
            limit=0,
            limit_per_host=self.limits.connections,
            keepalive_timeout=KEEPALIVE_SECONDS,
        )

    async def aclose(self) -> None:
        """Close the kept-alive connections; the next run opens a fresh pool."""
        session, self._session = self._session, None
        if session is not None:
            await session.close()

    async def run(self, args: HttpArgs, context: TaskContext) -> JsonValue:
        url = httpx.URL(str(args.url))
        try:
            async with asyncio.timeout(args.timeout_seconds):
                return await self._exchange(args, context, url)
        except TimeoutError:
            raise HttpTaskError(
                f"{args.method} {shown(url)} timed out after {args.timeout_seconds:g}s"
            ) from None

    async def _exchange(self, args: HttpArgs, context: TaskContext, url: httpx.URL) -> JsonValue:
        with pinning() as pins:
            return await self._follow(args, context, url, pins)

    async def _follow(
        self,
        args: HttpArgs,
        context: TaskContext,
        url: httpx.URL,
        pins: dict[str, VettedTarget],
    ) -> JsonValue:
        method: str = args.method
        body = encode_json(request_body(args, context))
        dropped: set[str] = set()
        token = await self._tokens.token(args.oauth) if args.oauth else None
        renewed = False
        for hop in range(MAX_REDIRECTS + 1):
            target = await self._vet(url, hop)
            pins[target.host] = target
            headers = wire_headers(url, request_headers(args, context, dropped), body)
            headers |= self._signature(args, context, url, body)
            if token is not None and "authorization" not in dropped:
                headers["Authorization"] = f"Bearer {token}"
            masker = Masker([*args.secret_values(), *([token] if token else [])])
            answer = await self._send(
                args, method, url, headers, body, host=target.key, masker=masker
            )
            if isinstance(answer, Answer):
                context.output.keep(answer_output(answer))
                refused = answer.status == 401 and not args.succeeded(401)
                if refused and token is not None and not renewed and args.oauth is not None:
                    # The token may have been revoked: one new one, one more try.
                    token, renewed = await self._tokens.token(args.oauth, refused=token), True
                    continue
                return self._outcome(args, f"{method} {shown(url)}", answer)
            status = answer.status
            following = self._next_url(url, answer.location)
            if origin(following) != origin(url):
                dropped |= args.secret_names() | CREDENTIAL_HEADERS
            next_method = redirect_method(method, status)
            if next_method != method and next_method == "GET":
                body = None
            context.logger.info(
                "%s %s answered %d; following to %s", method, shown(url), status, shown(following)
            )
            method, url = next_method, following
        raise HttpTaskError(
            f"{args.method} {shown(httpx.URL(str(args.url)))}: more than {MAX_REDIRECTS} redirects"
        )

    async def _send(
        self,
        args: HttpArgs,
        method: str,
        url: httpx.URL,
        headers: dict[str, str],
        body: bytes | None,
        *,
        host: str,
        masker: Masker,
    ) -> Answer | Redirect:
        """One request to `host` (`host:port`, as vetted): the answer (what it echoes of
        `masker`'s secrets masked), or the redirect to follow."""
        waiting = self.hosts.waiting(host)
        try:
            async with (
                self.hosts.turn(host) as turn,
                self._pooled().request(
                    method,
                    connect_url(url),
                    headers=headers,
                    data=body,
                    allow_redirects=False,
                    trace_request_ctx=waiting,
                ) as response,
            ):
                turn.answered()
                location = self._location(args, response)
                if location is not None:
                    return Redirect(response.status, location)
                return await read_answer(
                    response, self.max_response_bytes, args.output_bytes, masker
                )
        except aiohttp.ClientError as error:  # its repr would spell out the pool's key
            raise self._failed(method, url, host, error) from error
        finally:
            waiting.over()  # a run cancelled while it waited waits no more

    def _signature(
        self, args: HttpArgs, context: TaskContext, url: httpx.URL, body: bytes | None
    ) -> dict[str, str]:
        """The Standard Webhooks headers of one request (none if the job's key, or the
        default, may not sign for this hop's host): the run id signs every attempt alike,
        the timestamp is this request's."""
        key_id = self.signing.key_for(args.signing_key, url.host)
        if key_id is None:
            return {}
        return self.signing.signed(key_id, str(context.run_id), int(time.time()), body or b"")

    def check_reach(self, args: HttpArgs) -> None:
        """At write time, where asked (a hook's webhook): a target at an address (not a
        name, resolved only when called) must be one the guard lets through. A job's
        target is refused when it runs, in its run's error."""
        self.check(args)
        host = args.url.host or ""
        address = parse_host(host)
        if address is not None and not self._permitted(address, host):
            message = f"{host} is a loopback, private or reserved address; allow it with {ALLOW}"
            raise InvalidInput.one(("body", "args", "url"), message, str(args.url))

    def check(self, args: HttpArgs) -> None:
        """At write time: the signing key and the OAuth client secret a job names must
        be ones the operator configured, and a token endpoint at an address (not a
        name, resolved only when called) must be one the guard lets through."""
        if args.signing_key is not None:
            refused = self.signing.refusal(args.signing_key, args.url.host or "")
            if refused is not None:
                raise InvalidInput.one(("body", "args", "signing_key"), refused, None)
        if args.oauth is not None:
            self._check_oauth(args.oauth)

    def _check_oauth(self, client: OAuthClient) -> None:
        where = ("body", "args", "oauth")
        refused = self.oauth.refusal(client)
        if refused is not None:
            raise InvalidInput.one((*where, refused[0]), refused[1], None)
        host = client.token_url.host or ""
        address = parse_host(host)
        if address is not None and not self._permitted(address, host):
            message = f"token endpoint {host} is a loopback/private address; allow it with {ALLOW}"
            raise InvalidInput.one((*where, "token_url"), message, str(client.token_url))

    def _permitted(self, address: IPAddress, host: str) -> bool:
        verdict = classify(address)
        return verdict is Verdict.PUBLIC or (
            verdict is Verdict.PRIVATE and self.allow.permits(address, host)
        )

    async def _fetch_token(self, client: OAuthClient, secret: str) -> tuple[str, float | None]:
        """One client-credentials grant at the token endpoint, through the guard: the
        token and its lifetime; HttpTaskError with the endpoint's status and (capped)
        body if it refuses."""
        url = httpx.URL(str(client.token_url))
        target = await self._vet(url, 0)
        form = {"grant_type": "client_credentials"}
        form |= {k: v for k, v in (("scope", client.scope), ("audience", client.audience)) if v}
        pair = f"{quote_plus(client.client_id)}:{quote_plus(secret)}".encode()
        headers = {
            "Authorization": f"Basic {base64.b64encode(pair).decode('ascii')}",
            "Accept": "application/json",
            "User-Agent": f"tickgate/{VERSION}",
        }
        with pinning() as pins:
            pins[target.host] = target
            request = self._pooled().request(
                "POST", connect_url(url), data=form, headers=headers, allow_redirects=False
            )
            try:
                async with request as response:
                    status, body = response.status, await read_upto(response, TOKEN_BODY_BYTES)
            except aiohttp.ClientError as error:
                raise self._failed("POST", url, target.key, error) from error
        # An endpoint refusing a grant may quote what it was sent.
        return token_of(shown(url), status, Masker([secret]).masked(body))

    def _failed(
        self, method: str, url: httpx.URL, host: str, error: aiohttp.ClientError
    ) -> HttpTaskError:
        """The run's error for a failed exchange; a connect that failed is counted."""
        if isinstance(error, aiohttp.ConnectionTimeoutError | aiohttp.ClientConnectorError):
            self.hosts.of(host).connect_failures += 1
        if isinstance(error, aiohttp.ConnectionTimeoutError):
            timeout = f"{self.connect_timeout_seconds:g}s"
            return HttpTaskError(
                f"{method} {shown(url)}: connect to {host} timed out after {timeout}"
            )
        failure = f"{type(error).__name__}: {error}".removesuffix(": ")
        return HttpTaskError(f"{method} {shown(url)} failed: {failure}")

    async def _vet(self, url: httpx.URL, hop: int) -> VettedTarget:
        try:
            return await vet(url, self.allow, self.resolve)
        except (TargetDenied, TargetUnresolved) as error:
            if hop == 0:
                raise
            raise type(error)(f"redirect to {shown(url)} refused: {error}") from None

    @staticmethod
    def _location(args: HttpArgs, response: aiohttp.ClientResponse) -> str | None:
        """The Location to follow, or None when this response is the answer."""
        status = response.status
        if status not in REDIRECT_STATUSES or status in (args.success_status or ()):
            return None
        return response.headers.get("Location")

    @staticmethod
    def _next_url(url: httpx.URL, location: str) -> httpx.URL:
        try:
            following = url.join(location)
        except httpx.InvalidURL as error:
            raise HttpTaskError(f"{shown(url)} redirected to an invalid URL: {error}") from None
        if following.scheme not in ("http", "https"):
            raise TargetDenied(f"redirect to {shown(following)} refused: not http(s)")
        return following

    @staticmethod
    def _outcome(args: HttpArgs, request: str, answer: Answer) -> JsonValue:
        """The run's result; a status the job does not count as success fails it."""
        if not args.succeeded(answer.status):
            raise HttpStatusError(f"{request} answered HTTP {answer.status}", answer.status)
        result: dict[str, JsonValue] = {"status": answer.status, "bytes": answer.size}
        if answer.capped:
            result["truncated"] = True
        return result


def token_of(endpoint: str, status: int, body: bytes) -> tuple[str, float | None]:
    """The access token and its lifetime from a token endpoint's answer."""
    text = body.decode("utf-8", "replace")
    if status != 200:
        raise HttpTaskError(f"token endpoint {endpoint} answered HTTP {status}: {text[:500]}")
    try:
        answer = json.loads(text)
        token, lifetime = answer["access_token"], answer.get("expires_in")
    except (ValueError, KeyError, TypeError, AttributeError):
        raise HttpTaskError(f"token endpoint {endpoint} answered no access_token") from None
    if not isinstance(token, str) or not token:
        raise HttpTaskError(f"token endpoint {endpoint} answered no access_token")
    return token, float(lifetime) if isinstance(lifetime, int | float) else None


async def read_upto(response: aiohttp.ClientResponse, limit: int) -> bytes:
    """At most `limit` bytes of the body."""
    chunks, size = [], 0
    async for chunk in response.content.iter_chunked(16 * 1024):
        chunks.append(chunk[: limit - size])
        size += len(chunks[-1])
        if size >= limit:
            break
    return b"".join(chunks)


def http_task(
    allow: Allowlist,
    *,
    resolve: Resolver = resolve_host,
    network: SocketFactoryType = plain_socket,
    trust: ssl.SSLContext | None = None,
    limits: HostLimits | None = None,
    connect_timeout_seconds: float = CONNECT_TIMEOUT_SECONDS,
    hosts: HostTally | None = None,
    signing: SigningKeys | None = None,
    oauth: OAuthSecrets | None = None,
) -> TaskDefinition[HttpArgs]:
    """The `http` task reaching loopback/private targets only as `allow` permits, with
    at most `limits.connections` connections to a host (`limits.new` of them new and not
    yet answered), counted in `hosts`."""
    sender = HttpSender(
        allow,
        resolve,
        network,
        trust,
        limits=limits or HostLimits(),
        connect_timeout_seconds=connect_timeout_seconds,
        hosts=hosts or HostTally(),
        signing=signing or SigningKeys(),
        oauth=oauth or OAuthSecrets(),
    )
    return TaskDefinition(
        name="http",
        description="Send one HTTP request per run; headers carry the run id as "
        "Idempotency-Key. Redirects are followed (at most 5); link-local, metadata and "
        "(unless allowlisted) loopback/private targets are refused.",
        args_model=HttpArgs,
        run=sender.run,
        close=sender.aclose,
        warm=sender.warm,
        check=sender.check,
        check_reach=sender.check_reach,
    )
