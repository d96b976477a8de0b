"""The SSRF guard's pure parts: classification, IP spellings, the allowlist, vetting with a
fake resolver, and the http args' limits and secrets. Nothing here opens a connection."""

import ipaddress
import socket
from typing import Any

import httpx
import pytest
from aiohappyeyeballs import AddrInfoType
from pydantic import ValidationError

from service.tasks.http import (
    MAX_HEADER_VALUE_LENGTH,
    HttpArgs,
    PinnedResolver,
    PinnedSockets,
    merge_secret_headers,
    pinning,
    redact_args,
)
from service.tasks.netguard import (
    Allowlist,
    IPAddress,
    TargetDenied,
    TargetUnresolved,
    Verdict,
    VettedTarget,
    classify,
    parse_host,
    static_denial,
    vet,
)

PUBLIC, PRIVATE, ALWAYS = Verdict.PUBLIC, Verdict.PRIVATE, Verdict.ALWAYS_DENIED


@pytest.mark.parametrize(
    ("text", "verdict"),
    [
        # metadata and link-local: never allowed
        ("169.254.169.254", ALWAYS),
        ("169.254.0.1", ALWAYS),
        ("169.254.255.255", ALWAYS),
        ("fd00:ec2::254", ALWAYS),
        ("fe80::1", ALWAYS),
        ("fe80::a9fe:a9fe", ALWAYS),
        ("febf:ffff::1", ALWAYS),
        ("100.100.100.200", ALWAYS),
        ("168.63.129.16", ALWAYS),
        # IPv6 forms carrying a metadata/link-local IPv4 address
        ("::ffff:169.254.169.254", ALWAYS),
        ("::ffff:a9fe:a9fe", ALWAYS),
        ("64:ff9b::169.254.169.254", ALWAYS),
        ("2002:a9fe:a9fe::1", ALWAYS),
        ("::169.254.169.254", ALWAYS),
        # loopback, private, shared, unspecified, multicast, reserved
        ("127.0.0.1", PRIVATE),
        ("127.255.255.254", PRIVATE),
        ("10.0.0.1", PRIVATE),
        ("10.255.255.255", PRIVATE),
        ("172.16.0.1", PRIVATE),
        ("172.31.255.255", PRIVATE),
        ("192.168.0.1", PRIVATE),
        ("192.168.255.255", PRIVATE),
        ("100.64.0.1", PRIVATE),
        ("100.127.255.255", PRIVATE),
        ("0.0.0.0", PRIVATE),
        ("0.1.2.3", PRIVATE),
        ("224.0.0.1", PRIVATE),
        ("239.255.255.250", PRIVATE),
        ("240.0.0.1", PRIVATE),
        ("255.255.255.255", PRIVATE),
        ("192.0.2.1", PRIVATE),
        ("198.18.0.1", PRIVATE),
        ("::1", PRIVATE),
        ("::", PRIVATE),
        ("fc00::1", PRIVATE),
        ("fd12:3456::1", PRIVATE),
        ("fec0::1", PRIVATE),
        ("ff02::1", PRIVATE),
        ("2001:db8::1", PRIVATE),
        ("100::1", PRIVATE),
        ("::ffff:127.0.0.1", PRIVATE),
        ("::ffff:10.0.0.1", PRIVATE),
        ("::ffff:7f00:1", PRIVATE),
        ("::127.0.0.1", PRIVATE),
        ("64:ff9b::127.0.0.1", PRIVATE),
        ("64:ff9b:1::8.8.8.8", PRIVATE),
        ("2002:7f00:1::1", PRIVATE),
        ("2002:0a00:0001::1", PRIVATE),
        ("2001:0:4136:e378:8000:63bf:3fff:fdd2", PRIVATE),  # Teredo
        ("4000::1", PRIVATE),  # outside 2000::/3: unassigned
        # public (classification only: never connected to)
        ("8.8.8.8", PUBLIC),
        ("1.1.1.1", PUBLIC),
        ("172.15.255.255", PUBLIC),
        ("172.32.0.1", PUBLIC),
        ("100.63.255.255", PUBLIC),
        ("100.128.0.1", PUBLIC),
        ("169.253.255.255", PUBLIC),
        ("169.255.0.1", PUBLIC),
        ("2001:4860:4860::8888", PUBLIC),
        ("2606:4700:4700::1111", PUBLIC),
        ("::ffff:8.8.8.8", PUBLIC),
        ("64:ff9b::8.8.8.8", PUBLIC),
        ("2002:0808:0808::1", PUBLIC),
    ],
)
def test_classify(text: str, verdict: Verdict) -> None:
    assert classify(ipaddress.ip_address(text)) is verdict


def test_classify_ignores_an_ipv6_scope() -> None:
    assert classify(ipaddress.ip_address("fe80::1%eth0")) is ALWAYS
    assert classify(ipaddress.ip_address("::1%1")) is PRIVATE


@pytest.mark.parametrize(
    ("text", "address"),
    [
        ("127.0.0.1", "127.0.0.1"),
        ("2130706433", "127.0.0.1"),
        ("0x7f000001", "127.0.0.1"),
        ("0X7F000001", "127.0.0.1"),
        ("0177.0.0.1", "127.0.0.1"),
        ("0177.0000.0000.0001", "127.0.0.1"),
        ("127.1", "127.0.0.1"),
        ("127.0.1", "127.0.0.1"),
        ("0x7f.1", "127.0.0.1"),
        ("0x7f.0.0.0x1", "127.0.0.1"),
        ("127.0.0.1.", "127.0.0.1"),
        ("169.254.169.254", "169.254.169.254"),
        ("2852039166", "169.254.169.254"),
        ("0xa9fea9fe", "169.254.169.254"),
        ("0xA9.0xFE.0xA9.0xFE", "169.254.169.254"),
        ("0251.0376.0251.0376", "169.254.169.254"),
        ("169.254.43518", "169.254.169.254"),
        ("0", "0.0.0.0"),
        ("[::1]", "::1"),
        ("::1", "::1"),
        ("[::ffff:127.0.0.1]", "::ffff:7f00:1"),
        ("[fd00:ec2::254]", "fd00:ec2::254"),
        ("[FE80::1]", "fe80::1"),
    ],
)
def test_parse_host_reads_ip_literals_as_resolvers_do(text: str, address: str) -> None:
    assert parse_host(text) == ipaddress.ip_address(address)


@pytest.mark.parametrize(
    "text",
    [
        "example.com",
        "localhost",
        "metadata.google.internal",
        "cafe.bad",
        "127.0.0.1.example.com",
        "1.2.3.4.5",
        "1.2.3.4..",
        "0x",
        "08.0.0.1",  # 08 is no octal number
        "256.0.0.1",
        "1.2.3.256",
        "127.0.0.1 extra",
        "",
    ],
)
def test_parse_host_leaves_names_alone(text: str) -> None:
    assert parse_host(text) is None


@pytest.mark.parametrize(
    "spelling",
    [
        "2852039166",
        "0xa9fea9fe",
        "0251.0376.0251.0376",
        "169.254.43518",
        "169.254.169.254.",
        "[::ffff:169.254.169.254]",
        "[fd00:ec2::254]",
        "[fe80::1]",
    ],
)
def test_every_spelling_of_a_metadata_address_classifies_always_denied(spelling: str) -> None:
    address = parse_host(spelling)
    assert address is not None
    assert classify(address) is ALWAYS
    assert static_denial(spelling) is not None


@pytest.mark.parametrize("spelling", ["2130706433", "0x7f000001", "0177.0.0.1", "127.1"])
def test_every_spelling_of_loopback_classifies_private(spelling: str) -> None:
    address = parse_host(spelling)
    assert address is not None
    assert classify(address) is PRIVATE
    assert static_denial(spelling) is None  # the allowlist decides, at run time


@pytest.mark.parametrize(
    "host", ["metadata.google.internal", "METADATA.Google.Internal.", "metadata", "metadata.goog"]
)
def test_metadata_names_are_denied_statically(host: str) -> None:
    assert static_denial(host) is not None


def test_allowlist_parses_cidrs_addresses_and_names() -> None:
    allow = Allowlist.from_setting(" 127.0.0.1, 10.0.0.0/8 ,[::1], fd00::/8, Hooks.Internal., ")
    assert allow.networks == (
        ipaddress.ip_network("127.0.0.1/32"),
        ipaddress.ip_network("10.0.0.0/8"),
        ipaddress.ip_network("::1/128"),
        ipaddress.ip_network("fd00::/8"),
    )
    assert allow.names == frozenset({"hooks.internal"})
    assert Allowlist.from_setting("") == Allowlist()
    assert Allowlist.from_setting("10.1.2.3/8").networks == (ipaddress.ip_network("10.0.0.0/8"),)
    assert Allowlist.from_setting("0x7f000001").networks == (ipaddress.ip_network("127.0.0.1"),)


@pytest.mark.parametrize("entry", ["not a host", "10.0.0.0/33", "http://x/", "a..b", "-x"])
def test_allowlist_refuses_malformed_entries(entry: str) -> None:
    with pytest.raises(ValueError, match="TICKGATE_HTTP_ALLOW"):
        Allowlist.from_setting(f"127.0.0.1,{entry}")


def test_allowlist_matches_addresses_embedded_forms_and_names() -> None:
    allow = Allowlist.from_setting("127.0.0.1,10.0.0.0/8,hooks.internal")
    ip = ipaddress.ip_address
    assert allow.permits(ip("127.0.0.1"), "127.0.0.1")
    assert allow.permits(ip("::ffff:127.0.0.1"), "::ffff:127.0.0.1")
    assert allow.permits(ip("10.9.8.7"), "whatever.example")
    assert not allow.permits(ip("127.0.0.2"), "127.0.0.2")
    assert not allow.permits(ip("::1"), "::1")
    assert not allow.permits(ip("192.168.1.1"), "192.168.1.1")
    assert allow.permits(ip("192.168.1.1"), "HOOKS.internal.")
    assert not allow.permits(ip("192.168.1.1"), "sub.hooks.internal")


def test_an_allowed_ipv4_admits_its_mapped_form_only() -> None:
    """6to4, Teredo and NAT64 addresses embedding an allowed IPv4 reach a relay or a
    translator, not that host: the allowlist never admits them (#42)."""
    allow = Allowlist.from_setting("10.0.0.0/8")
    ip = ipaddress.ip_address
    assert allow.permits(ip("::ffff:10.1.2.3"), "::ffff:10.1.2.3")
    for embedding in (
        "2002:0a01:0203::1",
        "2001:0:4136:e378:8000:63bf:f5fe:fdfc",
        "64:ff9b::a01:203",
    ):
        assert not allow.permits(ip(embedding), embedding), embedding


class FakeResolver:
    """Answers from a table, counting calls; never does DNS."""

    def __init__(self, table: dict[str, list[str]]) -> None:
        self.table = table
        self.calls: list[str] = []

    async def __call__(self, host: str, port: int) -> list[IPAddress]:
        self.calls.append(host)
        if host not in self.table:
            raise OSError(f"no such host {host}")
        return [ipaddress.ip_address(a) for a in self.table[host]]


async def vetted(url: str, allow: str = "", **table: list[str]) -> VettedTarget:
    resolver = FakeResolver({k.replace("_", "."): v for k, v in table.items()})
    return await vet(httpx.URL(url), Allowlist.from_setting(allow), resolver)


async def test_vet_takes_ip_literals_without_dns() -> None:
    resolver = FakeResolver({})
    target = await vet(
        httpx.URL("http://127.0.0.1:8080/x"), Allowlist.from_setting("127.0.0.1"), resolver
    )
    assert target == VettedTarget("127.0.0.1", 8080, (ipaddress.ip_address("127.0.0.1"),))
    odd = await vet(httpx.URL("https://0x7f000001/"), Allowlist.from_setting("127.0.0.1"), resolver)
    assert odd == VettedTarget("0x7f000001", 443, (ipaddress.ip_address("127.0.0.1"),))
    v6 = await vet(httpx.URL("http://[::1]:81/"), Allowlist.from_setting("::1"), resolver)
    assert v6 == VettedTarget("::1", 81, (ipaddress.ip_address("::1"),))
    assert resolver.calls == []


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1/",
        "http://2130706433/",
        "http://0x7f000001/",
        "http://127.1/",
        "http://[::1]/",
        "http://[::ffff:127.0.0.1]/",
        "http://10.0.0.1/",
        "http://192.168.1.1/",
    ],
)
async def test_vet_denies_private_literals_until_allowlisted(url: str) -> None:
    with pytest.raises(
        TargetDenied, match="loopback/private address; allow it with TICKGATE_HTTP_ALLOW"
    ):
        await vetted(url)
    await vetted(url, "127.0.0.0/8,::1,10.0.0.0/8,192.168.0.0/16")


@pytest.mark.parametrize(
    "url",
    [
        "http://169.254.169.254/latest/meta-data/",
        "http://2852039166/",
        "http://0xa9fea9fe/",
        "http://[fd00:ec2::254]/",
        "http://[::ffff:169.254.169.254]/",
        "http://[fe80::1]/",
        "http://169.254.1.1:8080/",
    ],
)
async def test_vet_denies_link_local_and_metadata_even_when_allowlisted(url: str) -> None:
    with pytest.raises(TargetDenied, match="link-local or cloud metadata address; never allowed"):
        await vetted(url, "0.0.0.0/0,::/0")


@pytest.mark.parametrize(
    "url", ["http://metadata.google.internal/", "http://METADATA/", "https://metadata.goog./x"]
)
async def test_vet_denies_metadata_names_before_resolving(url: str) -> None:
    resolver = FakeResolver({})
    allow = Allowlist.from_setting("metadata,metadata.google.internal,metadata.goog")
    with pytest.raises(TargetDenied, match="cloud metadata host name"):
        await vet(httpx.URL(url), allow, resolver)
    assert resolver.calls == []


async def test_vet_judges_every_address_a_name_resolves_to() -> None:
    public = await vetted("https://hooks.test/", hooks_test=["8.8.8.8", "2001:4860:4860::8888"])
    assert public.host == "hooks.test"
    assert public.port == 443
    assert [str(a) for a in public.addresses] == ["8.8.8.8", "2001:4860:4860::8888"]
    with pytest.raises(TargetDenied, match=r"mixed\.test \(10\.0\.0\.1\) is a loopback/private"):
        await vetted("http://mixed.test/", mixed_test=["8.8.8.8", "10.0.0.1"])
    with pytest.raises(TargetDenied, match=r"never allowed"):
        await vetted(
            "http://rebind.test/", "rebind.test", rebind_test=["8.8.8.8", "169.254.169.254"]
        )


async def test_a_name_entry_allows_the_names_private_addresses_only() -> None:
    target = await vetted(
        "http://hooks.internal:9000/", "hooks.internal", hooks_internal=["10.1.1.1"]
    )
    assert [str(a) for a in target.addresses] == ["10.1.1.1"]
    with pytest.raises(TargetDenied):
        await vetted("http://other.internal/", "hooks.internal", other_internal=["10.1.1.1"])
    with pytest.raises(TargetDenied, match="never allowed"):
        await vetted("http://hooks.internal/", "hooks.internal", hooks_internal=["169.254.169.254"])


async def test_vet_resolves_once() -> None:
    resolver = FakeResolver({"once.test": ["127.0.0.1"]})
    await vet(httpx.URL("http://once.test/"), Allowlist.from_setting("127.0.0.1"), resolver)
    assert resolver.calls == ["once.test"]


async def test_vet_reports_names_that_do_not_resolve() -> None:
    with pytest.raises(TargetUnresolved, match=r"nowhere\.test does not resolve"):
        await vetted("http://nowhere.test/")
    with pytest.raises(TargetUnresolved, match="resolves to no address"):
        await vetted("http://empty.test/", empty_test=[])


async def test_vet_refuses_other_schemes() -> None:
    with pytest.raises(TargetDenied, match="not http"):
        await vetted("ftp://127.0.0.1/", "127.0.0.1")


class Recording:
    """A socket factory that records what it is asked to open and opens nothing."""

    def __init__(self) -> None:
        self.opened: list[tuple[str, int]] = []

    def __call__(self, addr_info: AddrInfoType) -> socket.socket:
        self.opened.append((str(addr_info[4][0]), int(addr_info[4][1])))
        raise OSError("recorded")


def addr_info(host: str, port: int) -> AddrInfoType:
    if ":" in host:
        return (socket.AF_INET6, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (host, port, 0, 0))
    return (socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", (host, port))


PINNED = VettedTarget(
    "hooks.test", 80, (ipaddress.ip_address("127.0.0.1"), ipaddress.ip_address("::1"))
)


async def test_the_pinned_resolver_answers_only_vetted_names() -> None:
    resolver = PinnedResolver()
    with pytest.raises(OSError, match="not vetted"):
        await resolver.resolve("hooks.test", 80)
    with pinning() as pins:
        pins["hooks.test"] = PINNED
        with pytest.raises(OSError, match="not vetted"):
            await resolver.resolve("hooks.test", 81)
        with pytest.raises(OSError, match="not vetted"):
            await resolver.resolve("other.test", 80)
        answers = await resolver.resolve("hooks.test", 80)
    with pytest.raises(OSError, match="not vetted"):
        await resolver.resolve("hooks.test", 80)  # outside the exchange that vetted it
    assert [(a["hostname"], a["host"], a["port"], a["family"]) for a in answers] == [
        ("hooks.test", "127.0.0.1", 80, socket.AF_INET),
        ("hooks.test", "::1", 80, socket.AF_INET6),
    ]  # each vetted address, in the resolver's order


def test_pinned_sockets_open_only_toward_vetted_addresses() -> None:
    inner = Recording()
    sockets = PinnedSockets(inner)
    with pytest.raises(OSError, match="not vetted"):
        sockets(addr_info("127.0.0.1", 80))
    with pinning() as pins:
        pins["hooks.test"] = PINNED
        for refused in (addr_info("127.0.0.1", 81), addr_info("127.0.0.2", 80)):
            with pytest.raises(OSError, match="not vetted"):
                sockets(refused)
        for allowed in (addr_info("127.0.0.1", 80), addr_info("::1", 80)):
            with pytest.raises(OSError, match="recorded"):
                sockets(allowed)
    with pytest.raises(OSError, match="not vetted"):
        sockets(addr_info("127.0.0.1", 80))  # outside the exchange that vetted it
    assert inner.opened == [("127.0.0.1", 80), ("::1", 80)]


# The args model ------------------------------------------------------------------------


def args(**fields: Any) -> HttpArgs:
    return HttpArgs.model_validate({"url": "http://127.0.0.1:9/hook"} | fields)


def refusal(**fields: Any) -> str:
    with pytest.raises(ValidationError) as caught:
        args(**fields)
    return str(caught.value)


@pytest.mark.parametrize(
    "url",
    [
        "http://169.254.169.254/latest/meta-data/",
        "http://2852039166/",
        "http://0xa9fea9fe/",
        "http://0251.0376.0251.0376/",
        "http://[fd00:ec2::254]/",
        "http://[::ffff:169.254.169.254]/",
        "http://[fe80::1]/",
        "http://metadata.google.internal/computeMetadata/v1/",
        "http://Metadata.Google.Internal./",
        "https://metadata/",
    ],
)
def test_args_refuse_always_denied_targets(url: str) -> None:
    assert "the http task never calls it" in refusal(url=url)


@pytest.mark.parametrize(
    "url", ["http://127.0.0.1:9/", "http://localhost/", "http://10.0.0.1/", "https://hooks.test/"]
)
def test_args_leave_private_targets_to_the_runtime_allowlist(url: str) -> None:
    assert args(url=url).url.host is not None


def test_args_limit_the_url() -> None:
    args(url="http://hooks.test/" + "x" * (2048 - 18))
    assert "at most 2048 characters" in refusal(url="http://hooks.test/" + "x" * 2048)
    assert "scheme" in refusal(url="file:///etc/passwd")


def test_args_limit_headers() -> None:
    many = {f"X-H{i}": "v" for i in range(100)}
    assert args(headers=many).headers == many
    assert "at most 100 items" in refusal(headers=many | {"X-One-More": "v"})
    assert "at most 256 characters" in refusal(headers={"X" * 257: "v"})
    assert "not an HTTP token" in refusal(headers={"Bad Name": "v"})
    assert "not an HTTP token" in refusal(headers={"X-A:": "v"})
    assert "at least 1 character" in refusal(headers={"": "v"})
    args(headers={"X-Big": "v" * MAX_HEADER_VALUE_LENGTH})
    assert "at most 8192 characters" in refusal(
        headers={"X-Big": "v" * (MAX_HEADER_VALUE_LENGTH + 1)}
    )
    for value in ("a\r\nX-Injected: 1", "a\nb", "a\rb", "a\x00b", "caf\u00e9"):
        assert "no CR, LF" in refusal(headers={"X-A": value})
    assert args(headers={"X-A": "tab\tand space"}).headers == {"X-A": "tab\tand space"}


@pytest.mark.parametrize("name", ["Host", "content-length", "Transfer-Encoding", "Connection"])
def test_args_refuse_headers_the_client_owns(name: str) -> None:
    assert "set by the http client" in refusal(headers={name: "x"})


def test_args_refuse_a_header_given_twice() -> None:
    assert "given twice" in refusal(headers={"X-A": "1", "x-a": "2"})


def test_secret_headers_must_name_headers() -> None:
    ok = args(headers={"Authorization": "Bearer s3cret"}, secret_headers=["authorization"])
    assert ok.secret_names() == frozenset({"authorization"})
    assert "is not one of `headers`" in refusal(headers={"X-A": "1"}, secret_headers=["X-B"])
    assert "there is none" in refusal(headers={"X-A": "***"}, secret_headers=["X-A"])
    assert "not an HTTP token" in refusal(headers={"X-A": "1"}, secret_headers=["X A"])


STORED = {
    "url": "https://hooks.test/",
    "headers": {"Authorization": "Bearer s3cret", "X-Api-Key": "k3y", "X-Plain": "p"},
    "secret_headers": ["authorization", "X-API-KEY"],
}


def test_redact_args_masks_only_secret_headers_and_copies() -> None:
    redacted = redact_args(STORED)
    assert redacted == STORED | {
        "headers": {"Authorization": "***", "X-Api-Key": "***", "X-Plain": "p"}
    }
    assert STORED["headers"] == {
        "Authorization": "Bearer s3cret",
        "X-Api-Key": "k3y",
        "X-Plain": "p",
    }
    plain = {"url": "https://hooks.test/", "headers": {"A": "1"}}
    assert redact_args(plain) == plain
    assert redact_args({"message": "x"}) == {"message": "x"}
    assert redact_args({"headers": "junk", "secret_headers": ["a"]}) == {
        "headers": "junk",
        "secret_headers": ["a"],
    }


def test_merge_secret_headers_keeps_stored_values_for_the_mask() -> None:
    round_trip = merge_secret_headers(redact_args(STORED), STORED)
    assert round_trip == STORED
    changed = redact_args(STORED) | {"headers": {"authorization": "Bearer new", "X-API-KEY": "***"}}
    assert merge_secret_headers(changed, STORED)["headers"] == {
        "authorization": "Bearer new",
        "X-API-KEY": "k3y",
    }
    not_secret = {"headers": {"X-Plain": "***"}, "secret_headers": []}
    assert merge_secret_headers(not_secret, STORED) == not_secret
    missing = {"headers": {"X-New": "***"}, "secret_headers": ["X-New"]}
    assert merge_secret_headers(missing, STORED) == missing  # validation refuses it
    assert merge_secret_headers(redact_args(STORED), None) == redact_args(STORED)
    assert HttpArgs.model_validate(merge_secret_headers(redact_args(STORED), STORED))
