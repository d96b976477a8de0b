"""ASGI guards in front of every route: bearer-token auth with scopes (or, on a server
without tokens, requests meant for it only), and request-body limits (size and JSON
nesting). They answer with the same problem documents as routes."""

import hashlib
import hmac
import ipaddress
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

from starlette.requests import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.errors import PROBLEM_JSON, problem_document
from service.domain.errors import FieldProblem

READ_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
# Where BearerAuth leaves the presented token's scopes for GET /v1/whoami (request.state).
TOKEN_SCOPES_STATE = "token_scopes"  # noqa: S105 (a key, not a secret)
Route = tuple[str, str]  # method, path
MAX_JSON_DEPTH = 32


@dataclass(frozen=True)
class Tokens:
    """Bearer tokens and their scopes (`read`, `write`)."""

    scopes_by_token: Mapping[str, frozenset[str]]

    def scopes_of(self, presented: str) -> frozenset[str] | None:
        """Compare against every token in constant time, so timing reveals nothing."""
        found: frozenset[str] | None = None
        for token, scopes in self.scopes_by_token.items():
            if hmac.compare_digest(token.encode(), presented.encode()):
                found = scopes
        return found


class BearerAuth:
    """401 without a known token, 403 without the scope the method needs (GET/HEAD:
    read, anything else: write). `open_paths` (probes, metrics, the API docs) need no
    token; one ending in "/" opens every path under it, except "/" itself, which opens
    only the root (the redirect to the dashboard)."""

    def __init__(self, app: ASGIApp, tokens: Tokens, open_paths: frozenset[str]) -> None:
        self._app = app
        self._tokens = tokens
        self._open_paths = open_paths
        self._open_prefixes = tuple(p for p in open_paths if p.endswith("/") and p != "/")

    def _is_open(self, path: str) -> bool:
        if path in self._open_paths:
            return True
        # A dot-dot segment could climb out of an open folder to a guarded route.
        return path.startswith(self._open_prefixes) and ".." not in path

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        scopes = self._tokens.scopes_of(_bearer(scope) or "")
        scope.setdefault("state", {})[TOKEN_SCOPES_STATE] = scopes or frozenset()
        if self._is_open(scope["path"]):
            await self._app(scope, receive, send)
            return
        needed = "read" if scope["method"] in READ_METHODS else "write"
        if scopes is None:
            await _answer(send, 401, "a bearer token is required", {"www-authenticate": "Bearer"})
        elif needed not in scopes:
            await _answer(send, 403, f"this token lacks the {needed!r} scope")
        else:
            await self._app(scope, receive, send)


class LocalOnly:
    """A server without tokens answers only requests meant for it (#42). A web page can
    rebind its own name to 127.0.0.1 and call a developer's server: its requests then
    carry that name as `Host`, so only loopback names and `hosts` are served (403
    otherwise). A page can also post a plain form to it, or `fetch` it cross-site: a
    request that changes anything is refused when the browser says it comes from
    another site (`Sec-Fetch-Site`) or another origin (`Origin`). A CLI, a script or a
    generated client sends neither header, and the dashboard is same-origin."""

    def __init__(self, app: ASGIApp, hosts: frozenset[str]) -> None:
        self._app = app
        self._hosts = frozenset(host.lower() for host in hosts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self._app(scope, receive, send)
            return
        host = _header(scope, b"host") or ""
        if not self._serves(host):
            await _answer(send, 403, _FOREIGN_HOST.format(host=host[:100]))
        elif scope["method"] not in READ_METHODS and _cross_site(scope, host):
            await _answer(send, 403, _CROSS_SITE)
        else:
            await self._app(scope, receive, send)

    def _serves(self, host: str) -> bool:
        name = host_name(host)
        return "*" in self._hosts or name in self._hosts or is_loopback_name(name)


_FOREIGN_HOST = (
    "Host {host!r} is not served: a server without tokens answers loopback names and "
    "TICKGATE_ALLOWED_HOSTS only"
)
_CROSS_SITE = (
    "a request from another site may not change anything on a server without tokens "
    "(Sec-Fetch-Site or Origin names another origin)"
)


def host_name(host: str) -> str:
    """The name of a `Host` header, without its port and brackets, lower-cased."""
    name = host.strip().lower()
    if name.startswith("["):
        return name[1 : name.find("]")] if "]" in name else name
    return name.rsplit(":", 1)[0] if name.count(":") == 1 else name


def is_loopback_name(name: str) -> bool:
    """`localhost` (and names under it, which browsers never resolve elsewhere) or a
    loopback address."""
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _cross_site(scope: Scope, host: str) -> bool:
    fetch_site = _header(scope, b"sec-fetch-site")
    if fetch_site is not None and fetch_site.lower() not in {"same-origin", "none"}:
        return True
    origin = _header(scope, b"origin")
    if origin is None:
        return False
    return urlsplit(origin).netloc.lower() != host.lower()


class BodyLimits:
    """413 for bodies over `max_bytes` (declared or streamed), or over the limit of their
    route in `larger`; 422 for JSON nested deeper than MAX_JSON_DEPTH, before any parser
    recurses into it, for a body that is not UTF-8 (which FastAPI would answer with a
    400 of its own, unlike every other unparseable body) and for strings PostgreSQL
    cannot store (`_unstorable_text`); 415 for a body sent as something
    else than JSON."""

    def __init__(
        self, app: ASGIApp, max_bytes: int, larger: Mapping[Route, int] | None = None
    ) -> None:
        self._app = app
        self._max_bytes = max_bytes
        self._larger = dict(larger or {})

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] in READ_METHODS:
            await self._app(scope, receive, send)
            return
        limit = self._larger.get((scope["method"], scope["path"]), self._max_bytes)
        declared = _header(scope, b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await _answer(send, 413, f"the body is larger than {limit} bytes")
            return
        body = await _read_body(receive, limit)
        if body is None:
            await _answer(send, 413, f"the body is larger than {limit} bytes")
        elif json_depth(body) > MAX_JSON_DEPTH:
            await _answer_invalid(send, f"JSON nested deeper than {MAX_JSON_DEPTH} levels")
        elif not _is_utf8(body):
            await _answer_invalid(send, "not UTF-8 text, as JSON must be", "json_invalid")
        elif _unstorable_text(body):
            await _answer_invalid(send, _UNSTORABLE)
        elif not _json_or_nothing(body, _header(scope, b"content-type")):
            await _answer(send, 415, _NOT_JSON)
        else:
            await self._app(scope, _replay(body), send)


_NOT_JSON = (
    "the body must be JSON: send Content-Type: application/json (or, for PATCH, "
    "application/merge-patch+json)"
)


_UNSTORABLE = (
    "a string holds a NUL character (\\u0000) or half of a UTF-16 surrogate pair, "
    "which is no text PostgreSQL can store"
)


def _unstorable_text(body: bytes) -> bool:
    """Whether a JSON string of the body escapes a NUL or a lone surrogate: valid JSON,
    but neither is text PostgreSQL stores, and the write that meets one fails with a 500.
    Only an escape (`\\u`) can write either in UTF-8 JSON, so most bodies are not parsed."""
    if b"\\u" not in body:
        return False
    try:
        document = json.loads(body)
    except ValueError:  # not JSON: the route's parser answers that
        return False
    return any("\x00" in text or not _encodable(text) for text in _strings(document))


def _strings(document: object) -> Iterator[str]:
    """Every string of a parsed JSON document, its keys included (no recursion: the
    depth was checked, yet a loop costs no stack at all)."""
    stack = [document]
    while stack:
        value = stack.pop()
        if isinstance(value, str):
            yield value
        elif isinstance(value, dict):
            stack.extend(value)
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)


def _encodable(text: str) -> bool:
    try:
        text.encode()
    except UnicodeEncodeError:  # a lone surrogate
        return False
    return True


def _json_or_nothing(body: bytes, content_type: str | None) -> bool:
    """A JSON body, or none sent as anything but JSON: an empty form post (the kind a
    page on another site can send) declares a type of its own, and is refused too."""
    if content_type is None:
        return not body.strip()
    return _is_json(content_type) or (not body.strip() and not content_type.strip())


def _is_json(content_type: str | None) -> bool:
    """application/json or any application/*+json. FastAPI reads anything else (a form,
    text, no type at all) as a string, and answers a puzzling 422 about a dict."""
    media = (content_type or "").split(";", 1)[0].strip().lower()
    return media == "application/json" or (
        media.startswith("application/") and media.endswith("+json")
    )


# A JSON string token: its opening quote, then anything but a quote or a backslash, or a
# backslash and the character it escapes, then its closing quote. A string left open runs
# to the end of the body, so every opening quote matches: the scan stays linear.
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*(?:"|\\?\Z)', re.DOTALL)
_ALL_BUT_BRACKETS = bytes(byte for byte in range(256) if byte not in b"[]{}")


def json_depth(body: bytes) -> int:
    """The deepest nesting of [ and { outside strings; never recursive. The strings and
    everything but brackets are dropped in C first, so a large body costs little."""
    depth = deepest = 0
    for byte in _JSON_STRING.sub(b"", body).translate(None, _ALL_BUT_BRACKETS):
        if byte in b"[{":
            depth += 1
            deepest = max(deepest, depth)
        else:
            depth -= 1
    return deepest


async def _read_body(receive: Receive, max_bytes: int) -> bytes | None:
    chunks, size = [], 0
    while True:
        message = await receive()
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > max_bytes:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


def _is_utf8(body: bytes) -> bool:
    try:
        body.decode()
    except UnicodeDecodeError:
        return False
    return True


def _replay(body: bytes) -> Receive:
    sent = False

    async def receive() -> Message:
        nonlocal sent
        if sent:
            return {"type": "http.disconnect"}
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return receive


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value).decode("latin-1")
    return None


def caller(request: Request, said: str | None) -> str:
    """Who makes a request, for the record: what they say, then what the API saw (their
    address, and their token's fingerprint: a hash prefix that names it and gives
    nothing of it away)."""
    seen = request.client.host if request.client else "unknown"
    token = _bearer(request.scope)
    if token:
        seen += f", token {hashlib.sha256(token.encode()).hexdigest()[:8]}"
    return f"{said} ({seen})" if said else seen


def _bearer(scope: Scope) -> str | None:
    value = _header(scope, b"authorization")
    if value is None or not value.lower().startswith("bearer "):
        return None
    return value[7:].strip()


async def _answer(
    send: Send, status: int, detail: str, headers: dict[str, str] | None = None
) -> None:
    await _send_json(send, status, problem_document(status, detail), headers or {})


async def _answer_invalid(send: Send, message: str, kind: str = "value_error") -> None:
    problem = FieldProblem(("body",), message, None, kind)
    await _send_json(send, 422, problem_document(422, f"body: {message}", [problem]), {})


async def _send_json(send: Send, status: int, body: object, headers: dict[str, str]) -> None:
    payload = json.dumps(body).encode()
    raw = [
        (b"content-type", PROBLEM_JSON.encode()),
        (b"content-length", str(len(payload)).encode()),
    ]
    raw += [(k.encode(), v.encode()) for k, v in headers.items()]
    await send({"type": "http.response.start", "status": status, "headers": raw})
    await send({"type": "http.response.body", "body": payload})
