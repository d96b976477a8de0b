"""The `http` task: one request per run, carrying headers the target can dedupe on.

Every target passes the SSRF guard (`netguard`) first: the host is resolved once, each
address is judged, and the TCP connection goes to a vetted address while the request
keeps its Host header and (for https) SNI and certificate checks against the host name.
Redirects are followed by hand, each Location vetted before anything connects to it.
Connections are kept alive and reused per origin: a reused connection goes to an
address that was vetted when it opened, and every request is vetted again anyway.
"""

import asyncio
import re
import ssl
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib.metadata import version
from typing import Annotated, Any, Literal

import httpcore
import httpx
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

from service.tasks.base import TaskContext, TaskDefinition
from service.tasks.netguard import (
    Allowlist,
    Resolver,
    TargetDenied,
    TargetUnresolved,
    VettedTarget,
    resolve_host,
    static_denial,
    vet,
)

VERSION = version("tickgate")

MAX_URL_LENGTH = 2048
MAX_HEADERS = 100
MAX_HEADER_NAME_LENGTH = 256
MAX_HEADER_VALUE_LENGTH = 8 * 1024
MAX_RESPONSE_BYTES = 1024 * 1024
MAX_REDIRECTS = 5
# httpcore's pool walks all its connections on every request and every answer, so
# many runs in flight share several small pools (shards) rather than one big one. A
# job always uses the same shard: its next run finds its kept-alive connection.
POOL_SHARDS = 16
KEEPALIVE_CONNECTIONS = 4  # per shard
KEEPALIVE_SECONDS = 15.0
SECRET_MASK = "***"  # noqa: S105 - the mask shown instead of a secret
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

    @field_validator("url")
    @classmethod
    def _not_always_denied(cls, url: AnyHttpUrl) -> AnyHttpUrl:
        reason = static_denial(url.host or "")
        if reason is not None:
            raise ValueError(f"{reason}; the http task never calls it")
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
                    f"secret header {name!r} is {SECRET_MASK!r}, which keeps a stored value, "
                    "but there is none"
                )
        return self

    def succeeded(self, status: int) -> bool:
        if self.success_status is None:
            return 200 <= status < 300
        return status in self.success_status

    def secret_names(self) -> frozenset[str]:
        return frozenset(name.lower() for name in self.secret_headers)


class HttpTaskError(Exception):
    """The request went out but did not succeed, or could not be sent."""


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
    return copy


def merge_secret_headers(
    new_args: Mapping[str, JsonValue], stored_args: Mapping[str, JsonValue] | None
) -> dict[str, JsonValue]:
    """A copy of `new_args` where a secret header (one named in the new args'
    `secret_headers`) whose value is "***" takes the stored value of that header (names
    ignore case). Without a stored value the "***" stays, and validation refuses it.

    Call it before validating and saving a PUT or PATCH, so that a body read back from
    GET (secrets shown as "***") keeps the stored secrets and changes nothing.
    """
    copy = dict(new_args)
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


async def read_capped(response: httpx.Response, limit: int) -> tuple[int, bool]:
    """Bytes of the body as received (never decoded), reading at most `limit` of them;
    whether the body was longer."""
    size = 0
    async for chunk in response.aiter_raw():
        size += len(chunk)
        if size > limit:
            return limit, True
    return size, False


# The hosts the current exchange vetted, and where each may be reached. httpcore opens
# a connection in the task whose request needs it, so a connect sees its own vetting.
_PINS: ContextVar[dict[str, VettedTarget]] = ContextVar("tickgate_http_pins")


@contextmanager
def pinning() -> Iterator[dict[str, VettedTarget]]:
    """Within the block, connects go only to the targets put in the dict it yields."""
    token = _PINS.set({})
    try:
        yield _PINS.get()
    finally:
        _PINS.reset(token)


class PinnedBackend(httpcore.AsyncNetworkBackend):
    """Connects a host only to the addresses the current exchange's vetting chose;
    refuses any other host.

    httpcore still sees the host name, so TLS sends it as SNI and checks the certificate
    against it, and pooled connections stay keyed by it."""

    def __init__(self, inner: httpcore.AsyncNetworkBackend) -> None:
        self._inner = inner

    async def connect_tcp(
        self,
        host: str,
        port: int,
        timeout: float | None = None,  # noqa: ASYNC109 - httpcore's interface
        local_address: str | None = None,
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        target = _PINS.get({}).get(host)
        if target is None or port != target.port:
            raise httpcore.ConnectError(f"{host}:{port} was not vetted; refusing to connect")
        failure: Exception | None = None
        for address in target.addresses:
            try:
                return await self._inner.connect_tcp(
                    str(address), port, timeout, local_address, socket_options
                )
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as error:
                failure = error
        assert failure is not None  # a vetted target has at least one address
        raise failure

    async def connect_unix_socket(
        self,
        path: str,
        timeout: float | None = None,  # noqa: ASYNC109 - httpcore's interface
        socket_options: Iterable[Any] | None = None,
    ) -> httpcore.AsyncNetworkStream:
        raise httpcore.ConnectError("the http task connects over TCP only")

    async def sleep(self, seconds: float) -> None:
        await self._inner.sleep(seconds)


class PinnedTransport(httpx.AsyncHTTPTransport):
    """httpx's transport with a connection pool whose connects go through `backend`.
    No proxies: a proxy would resolve the host itself, after our check. No cap on
    connections (each run may need one at once); idle ones are kept a short while."""

    def __init__(self, backend: PinnedBackend, ssl_context: ssl.SSLContext) -> None:
        super().__init__(verify=ssl_context, trust_env=False)
        self._pool = httpcore.AsyncConnectionPool(
            ssl_context=ssl_context,
            network_backend=backend,
            max_connections=None,
            max_keepalive_connections=KEEPALIVE_CONNECTIONS,
            keepalive_expiry=KEEPALIVE_SECONDS,
        )


@dataclass
class HttpSender:
    """Runs the http task for one allowlist. `resolve` and `network` (the backend that
    really connects) are seams for tests; the defaults are the system's."""

    allow: Allowlist
    resolve: Resolver = resolve_host
    network: httpcore.AsyncNetworkBackend | None = None
    max_response_bytes: int = MAX_RESPONSE_BYTES
    _ssl: ssl.SSLContext | None = field(default=None, init=False, repr=False)
    _clients: list[httpx.AsyncClient] = field(default_factory=list, init=False, repr=False)

    def ssl_context(self) -> ssl.SSLContext:
        if self._ssl is None:
            self._ssl = httpx.create_ssl_context()
        return self._ssl

    def warm(self) -> None:
        """Load the certificates and open the (empty) pools now, not in a first run."""
        self._pooled("")

    def _pooled(self, job: str) -> httpx.AsyncClient:
        """The client whose pool `job`'s runs use; opened on first use, so a registry
        that never sends holds no sockets."""
        if not self._clients:
            backend = PinnedBackend(self.network or httpcore.AnyIOBackend())
            self._clients = [
                httpx.AsyncClient(
                    transport=PinnedTransport(backend, self.ssl_context()), trust_env=False
                )
                for _ in range(POOL_SHARDS)
            ]
        return self._clients[hash(job) % len(self._clients)]

    async def aclose(self) -> None:
        """Close the kept-alive connections; the next run opens a fresh pool."""
        clients, self._clients = self._clients, []
        for client in clients:
            await client.aclose()

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
        client = self._pooled(context.job)
        method: str = args.method
        body = request_body(args, context)
        dropped: set[str] = set()
        for hop in range(MAX_REDIRECTS + 1):
            target = await self._vet(url, hop)
            pins[target.host] = target
            request = client.build_request(
                method,
                url,
                headers=request_headers(args, context, dropped),
                json=body,
                timeout=args.timeout_seconds,
            )
            try:
                response = await client.send(request, stream=True)
                try:
                    location = self._location(args, response)
                    if location is None:
                        size, truncated = await read_capped(response, self.max_response_bytes)
                        return self._outcome(
                            args, f"{method} {shown(url)}", response, size, truncated
                        )
                finally:
                    await response.aclose()
            except httpx.HTTPError as error:
                raise HttpTaskError(f"{method} {shown(url)} failed: {error!r}") from error
            following = self._next_url(url, location)
            if origin(following) != origin(url):
                dropped |= args.secret_names() | CREDENTIAL_HEADERS
            next_method = redirect_method(method, response.status_code)
            if next_method != method and next_method == "GET":
                body = None
            context.logger.info(
                "%s %s answered %d; following to %s",
                method,
                shown(url),
                response.status_code,
                shown(following),
            )
            method, url = next_method, following
        raise HttpTaskError(
            f"{args.method} {shown(httpx.URL(str(args.url)))}: more than {MAX_REDIRECTS} redirects"
        )

    async def _vet(self, url: httpx.URL, hop: int) -> VettedTarget:
        try:
            return await vet(url, self.allow, self.resolve)
        except (TargetDenied, TargetUnresolved) as error:
            if hop == 0:
                raise
            raise type(error)(f"redirect to {shown(url)} refused: {error}") from None

    @staticmethod
    def _location(args: HttpArgs, response: httpx.Response) -> str | None:
        """The Location to follow, or None when this response is the answer."""
        status = response.status_code
        if status not in REDIRECT_STATUSES or status in (args.success_status or ()):
            return None
        location: str | None = response.headers.get("Location")
        return location

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
    def _outcome(
        args: HttpArgs, request: str, response: httpx.Response, size: int, truncated: bool
    ) -> JsonValue:
        status = response.status_code
        if not args.succeeded(status):
            raise HttpTaskError(f"{request} answered HTTP {status}")
        result: dict[str, JsonValue] = {"status": status, "bytes": size}
        if truncated:
            result["truncated"] = True
        return result


def http_task(
    allow: Allowlist,
    *,
    resolve: Resolver = resolve_host,
    network: httpcore.AsyncNetworkBackend | None = None,
) -> TaskDefinition[HttpArgs]:
    """The `http` task reaching loopback/private targets only as `allow` permits."""
    sender = HttpSender(allow, resolve, network)
    return TaskDefinition(
        name="http",
        description="Send one HTTP request per run; headers carry the run id as "
        "Idempotency-Key. Redirects are followed (at most 5); link-local, metadata and "
        "(unless allowlisted) loopback/private targets are refused.",
        args_model=HttpArgs,
        run=sender.run,
        close=sender.aclose,
        warm=sender.warm,
    )
