"""Where the `http` task may connect: an SSRF guard.

Link-local and cloud metadata addresses are always refused. Loopback, private and other
non-global addresses are refused unless the operator allowlists them
(TICKGATE_HTTP_ALLOW: CIDRs or host names). A host is resolved once, every address it
resolves to is judged, and the connection then goes to a vetted address (see `http.py`),
so a DNS answer that changes between the check and the connect cannot swap the target.

Only `vet` touches the network (a DNS lookup, never a connection); the rest is pure.
"""

import asyncio
import enum
import ipaddress
import re
import socket
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

import httpx

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
Resolver = Callable[[str, int], Awaitable[list[IPAddress]]]

ALLOW_SETTING = "TICKGATE_HTTP_ALLOW"
DEFAULT_PORTS = {"http": 80, "https": 443}


class Verdict(enum.Enum):
    """How an address is judged. Order matters: a later member is the stricter."""

    PUBLIC = "public"
    PRIVATE = "private"  # loopback, RFC 1918, CGNAT, ULA, reserved...: allowlistable
    ALWAYS_DENIED = "always_denied"  # link-local and metadata: never allowed


_RANK = {Verdict.PUBLIC: 0, Verdict.PRIVATE: 1, Verdict.ALWAYS_DENIED: 2}


def _stricter(first: Verdict, second: Verdict) -> Verdict:
    return first if _RANK[first] >= _RANK[second] else second


def _networks(*cidrs: str) -> tuple[IPNetwork, ...]:
    return tuple(ipaddress.ip_network(cidr) for cidr in cidrs)


ALWAYS_DENIED_V4 = _networks(
    "169.254.0.0/16",  # link-local; 169.254.169.254 is AWS/GCP/Azure/OCI metadata
    "100.100.100.200/32",  # Alibaba Cloud metadata (inside CGNAT space)
    "168.63.129.16/32",  # Azure WireServer / host platform endpoint (a public address)
)
ALWAYS_DENIED_V6 = _networks(
    "fe80::/10",  # link-local
    "fd00:ec2::254/128",  # AWS metadata over IPv6 (inside fc00::/7)
)
# IANA special-purpose addresses not globally reachable (RFC 6890 and successors),
# kept explicit so the verdict does not depend on the Python version's `is_global`.
PRIVATE_V4 = _networks(
    "0.0.0.0/8",  # "this network", 0.0.0.0 included
    "10.0.0.0/8",
    "100.64.0.0/10",  # carrier-grade NAT
    "127.0.0.0/8",  # loopback
    "172.16.0.0/12",
    "192.0.0.0/24",  # IETF protocol assignments
    "192.0.2.0/24",  # TEST-NET-1
    "192.88.99.0/24",  # 6to4 relay anycast (deprecated)
    "192.168.0.0/16",
    "198.18.0.0/15",  # benchmarking
    "198.51.100.0/24",  # TEST-NET-2
    "203.0.113.0/24",  # TEST-NET-3
    "224.0.0.0/4",  # multicast
    "240.0.0.0/4",  # reserved, 255.255.255.255 included
)
PRIVATE_V6 = _networks(
    "::/96",  # unspecified, loopback, deprecated IPv4-compatible (judged below too)
    "100::/64",  # discard
    "64:ff9b:1::/48",  # local-use NAT64
    "2001::/23",  # IETF protocol assignments (Teredo, ORCHID, ...)
    "2001:db8::/32",  # documentation
    "3fff::/20",  # documentation
    "5f00::/16",  # SRv6 SIDs
    "fc00::/7",  # unique local
    "fec0::/10",  # site-local (deprecated)
    "ff00::/8",  # multicast
)
GLOBAL_UNICAST_V6 = ipaddress.IPv6Network("2000::/3")
NAT64_V6 = ipaddress.IPv6Network("64:ff9b::/96")
SIX_TO_FOUR_V6 = ipaddress.IPv6Network("2002::/16")
TEREDO_V6 = ipaddress.IPv6Network("2001::/32")
IPV4_COMPATIBLE_V6 = ipaddress.IPv6Network("::/96")

METADATA_NAMES = frozenset({"metadata.google.internal", "metadata", "metadata.goog"})


def _in(address: IPAddress, networks: Iterable[IPNetwork]) -> bool:
    return any(address in network for network in networks)


def embedded_ipv4(address: IPAddress) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 address carries and traffic may end up at: IPv4-mapped
    (::ffff:a.b.c.d), IPv4-compatible (::a.b.c.d), NAT64 (64:ff9b::a.b.c.d), 6to4
    (2002:AABB:CCDD::) and Teredo (its client). None for IPv4 or a plain IPv6 address."""
    if isinstance(address, ipaddress.IPv4Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address in NAT64_V6 or address in IPV4_COMPATIBLE_V6:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]
    return None


def _classify_v4(address: ipaddress.IPv4Address) -> Verdict:
    if _in(address, ALWAYS_DENIED_V4):
        return Verdict.ALWAYS_DENIED
    if _in(address, PRIVATE_V4):
        return Verdict.PRIVATE
    return Verdict.PUBLIC


def classify(address: IPAddress) -> Verdict:
    """PUBLIC, PRIVATE (allowlistable) or ALWAYS_DENIED; never touches the network.

    IPv6 forms that carry an IPv4 address are judged by it as well: IPv4-mapped and NAT64
    addresses by the embedded address alone (::ffff:8.8.8.8 is public), the others by
    the stricter of the two verdicts.
    """
    if isinstance(address, ipaddress.IPv4Address):
        return _classify_v4(address)
    plain = ipaddress.IPv6Address(int(address))  # drops a %scope
    if _in(plain, ALWAYS_DENIED_V6):
        return Verdict.ALWAYS_DENIED
    embedded = embedded_ipv4(plain)
    if embedded is not None and (plain.ipv4_mapped is not None or plain in NAT64_V6):
        return classify(embedded)
    own = Verdict.PUBLIC
    if _in(plain, PRIVATE_V6) or plain not in GLOBAL_UNICAST_V6:
        own = Verdict.PRIVATE
    if embedded is not None:
        return _stricter(own, classify(embedded))
    return own


_IPV4_LEGACY = re.compile(r"^(?:0[xX][0-9a-fA-F]*|[0-9]+)(?:\.(?:0[xX][0-9a-fA-F]*|[0-9]+)){0,3}$")


def parse_host(text: str) -> IPAddress | None:
    """The address a host string denotes when it is an IP literal, however spelled, as
    the OS's resolver would read it: dotted quads, `[v6]` with brackets, and the legacy
    inet_aton forms (decimal `2130706433`, hex `0x7f000001`, octal `0177.0.0.1`, short
    `127.1`), with one trailing dot allowed. None for a host name; never does DNS."""
    host = text.strip()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if host.endswith(".") and not host.endswith(".."):
        host = host[:-1]
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        pass
    if not _IPV4_LEGACY.match(host):
        return None
    try:
        packed = socket.inet_aton(host)
    except OSError:
        return None
    return ipaddress.IPv4Address(packed)


def normalize_name(host: str) -> str:
    """A host name as compared here: lower case, without brackets or a trailing dot."""
    name = host.strip().lower()
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]
    return name.removesuffix(".")


_HOST_NAME = re.compile(
    r"^(?=.{1,253}$)[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?"
    r"(?:\.[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?)*$"
)


class _HasHost(Protocol):
    @property
    def host(self) -> str | None: ...


U = TypeVar("U", bound=_HasHost)


def refuse_never_called(url: U) -> U:
    """A URL field validator: ValueError for a host the http task never calls (a
    link-local or metadata address or name), whatever the allowlist."""
    reason = static_denial(url.host or "")
    if reason is not None:
        raise ValueError(f"{reason}; the http task never calls it")
    return url


def static_denial(host: str) -> str | None:
    """Why `host` can never be called, judged without DNS or settings (a metadata name,
    or an IP literal in an always-denied range); None when only a run can tell."""
    if normalize_name(host) in METADATA_NAMES:
        return f"{host} is a cloud metadata host name"
    address = parse_host(host)
    if address is not None and classify(address) is Verdict.ALWAYS_DENIED:
        return f"{host} is a link-local or cloud metadata address"
    return None


@dataclass(frozen=True)
class Allowlist:
    """Loopback/private targets the operator lets the http task reach.

    Networks match an address (or the IPv4 address it embeds); a host name matches
    exactly, case-insensitively, and then allows whatever private addresses it resolves
    to. Nothing here ever allows an ALWAYS_DENIED address or a metadata name.
    """

    networks: tuple[IPNetwork, ...] = ()
    names: frozenset[str] = field(default_factory=frozenset)

    @classmethod
    def from_setting(cls, text: str) -> "Allowlist":
        """Parse the comma-separated setting; ValueError names a malformed entry."""
        networks: list[IPNetwork] = []
        names: set[str] = set()
        for raw in (part.strip() for part in text.split(",")):
            if not raw:
                continue
            entry = raw[1:-1] if raw.startswith("[") and raw.endswith("]") else raw
            try:
                networks.append(ipaddress.ip_network(entry, strict=False))
                continue
            except ValueError:
                pass
            literal = parse_host(entry)
            if literal is not None:
                networks.append(ipaddress.ip_network(literal))
                continue
            name = normalize_name(entry)
            if not _HOST_NAME.match(name):
                raise ValueError(f"{ALLOW_SETTING}: {raw!r} is neither a CIDR nor a host name")
            names.add(name)
        return cls(tuple(networks), frozenset(names))

    def permits(self, address: IPAddress, host: str) -> bool:
        """Whether a PRIVATE `address`, reached through `host`, is allowlisted."""
        if normalize_name(host) in self.names:
            return True
        candidates: list[IPAddress] = [address]
        if isinstance(address, ipaddress.IPv6Address):
            candidates.append(ipaddress.IPv6Address(int(address)))
            # Only the IPv4-mapped form is the same host: 6to4, Teredo and NAT64 forms
            # reach a relay or a translator, which an IPv4 entry never allowed.
            if address.ipv4_mapped is not None:
                candidates.append(address.ipv4_mapped)
        return any(a in network for a in candidates for network in self.networks)


class TargetDenied(Exception):
    """The http task refuses to connect to this target (it never tried)."""


class TargetUnresolved(Exception):
    """The target's host name does not resolve (nothing was tried either)."""


@dataclass(frozen=True)
class VettedTarget:
    """A host and the addresses it may be reached at, all checked, in resolver order.

    `host` is spelled as httpx/httpcore hand it to the network backend (the URL's raw,
    IDNA-encoded host without brackets), so a connect can be matched to its vetting.
    """

    host: str
    port: int
    addresses: tuple[IPAddress, ...]

    @property
    def key(self) -> str:
        """`host:port`: what the http task's connections are counted by."""
        return f"{self.host}:{self.port}"


async def resolve_host(host: str, port: int) -> list[IPAddress]:
    """Every address the system resolver gives for `host` (A and AAAA), in its order."""
    loop = asyncio.get_running_loop()
    infos = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    addresses: list[IPAddress] = []
    for _family, _type, _proto, _name, sockaddr in infos:
        address = ipaddress.ip_address(str(sockaddr[0]))
        if address not in addresses:
            addresses.append(address)
    return addresses


def _denial(host: str, address: IPAddress, verdict: Verdict) -> str:
    shown = host if host == str(address) else f"{host} ({address})"
    if verdict is Verdict.ALWAYS_DENIED:
        return f"http target {shown} is a link-local or cloud metadata address; never allowed"
    return f"http target {shown} is a loopback/private address; allow it with {ALLOW_SETTING}"


async def vet(url: httpx.URL, allow: Allowlist, resolve: Resolver = resolve_host) -> VettedTarget:
    """Check where `url` would lead, resolving its host once; TargetDenied if any
    address it resolves to is denied, or the name is a metadata name; TargetUnresolved
    if it resolves to nothing. Never connects."""
    scheme = url.scheme.lower()
    if scheme not in DEFAULT_PORTS:
        raise TargetDenied(f"http target {url.host or url}: scheme {scheme!r} is not http(s)")
    host = url.raw_host.decode("ascii")
    if not host:
        raise TargetDenied("http target has no host")
    port = url.port or DEFAULT_PORTS[scheme]
    if normalize_name(host) in METADATA_NAMES:
        raise TargetDenied(f"http target {host} is a cloud metadata host name; never allowed")
    literal = parse_host(host)
    if literal is not None:
        addresses = [literal]
    else:
        try:
            addresses = await resolve(host, port)
        except (OSError, UnicodeError) as error:
            raise TargetUnresolved(f"http target {host} does not resolve: {error}") from error
        if not addresses:
            raise TargetUnresolved(f"http target {host} resolves to no address")
    for address in addresses:
        verdict = classify(address)
        if verdict is Verdict.ALWAYS_DENIED or (
            verdict is Verdict.PRIVATE and not allow.permits(address, host)
        ):
            raise TargetDenied(_denial(host, address, verdict))
    return VettedTarget(host, port, tuple(dict.fromkeys(addresses)))


class GuardedTransport(httpx.AsyncBaseTransport):
    """The httpx transport of the client a plugin task gets (`TaskContext.http`): every
    request is vetted as the http task's are (`vet`, the same allowlist), then sent to
    the address vetted, not to whatever the name resolves to a moment later (the Host
    header and, for https, the TLS server name stay the URL's). Proxies from the
    environment are never used: a proxy would make the vetting moot."""

    def __init__(self, allow: Allowlist, resolve: Resolver = resolve_host) -> None:
        self._allow = allow
        self._resolve = resolve
        self._inner = httpx.AsyncHTTPTransport(trust_env=False)

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        target = await vet(request.url, self._allow, self._resolve)
        address = target.addresses[0]
        request.url = request.url.copy_with(host=str(address))
        if request.url.scheme == "https":
            request.extensions = {**request.extensions, "sni_hostname": target.host}
        return await self._inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self._inner.aclose()
