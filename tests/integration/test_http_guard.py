"""The http task's SSRF guard end to end: API, runner, task, the loopback receiver.

Every connection here goes to 127.0.0.1. Targets that must be refused are either
loopback too (refused until allowlisted) or refused before any connect; as a safety net,
apps built here connect through `LoopbackOnly`, which refuses (and records) anything but
a loopback address, so even a broken guard could not send traffic elsewhere.
"""

import asyncio
import ipaddress
import logging
import socket
import ssl
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest
import trustme
from aiohappyeyeballs import AddrInfoType

from harness.receiver import Receiver, receiving
from service.config import Settings
from service.store.targets import SqlTargetConnections
from service.tasks import TaskContext, TaskRegistry
from service.tasks.http import MAX_RESPONSE_BYTES, http_task
from service.tasks.netguard import Allowlist, IPAddress
from tests.support.inprocess import served, triggered_run

NEVER = {"kind": "cron", "expression": "0 0 1 1 *"}


class LoopbackOnly:
    """Opens sockets (the `http` task's `network` seam) for loopback addresses only;
    anything else is refused."""

    def __init__(self) -> None:
        self.connects: list[str] = []
        self.refused: list[str] = []

    def __call__(self, addr_info: AddrInfoType) -> socket.socket:
        family, kind, proto, _, address = addr_info
        host = str(address[0])
        try:
            loopback = ipaddress.ip_address(host).is_loopback
        except ValueError:  # a name: the guard must hand over vetted addresses only
            loopback = False
        if not loopback:
            self.refused.append(host)
            raise OSError(f"test safety net: no connection to {host}")
        self.connects.append(host)
        return socket.socket(family, kind, proto)


class Names:
    """A resolver from a table (names under .test, which DNS never answers), counting
    lookups; `then` is what a name resolves to from its second lookup on (rebinding)."""

    def __init__(self, first: dict[str, str], then: dict[str, str] | None = None) -> None:
        self.first, self.then = first, then or {}
        self.lookups: list[str] = []

    async def __call__(self, host: str, port: int) -> list[IPAddress]:
        self.lookups.append(host)
        table = self.then if self.lookups.count(host) > 1 and host in self.then else self.first
        if host not in table:
            raise OSError(f"{host}: no such name")
        return [ipaddress.ip_address(table[host])]


@pytest.fixture
def network() -> LoopbackOnly:
    return LoopbackOnly()


def guarded(network: LoopbackOnly, allow: str = "127.0.0.1", **kwargs: Any) -> TaskRegistry:
    return TaskRegistry([http_task(Allowlist.from_setting(allow), network=network, **kwargs)])


async def run_job(client: httpx.AsyncClient, name: str, **args: Any) -> dict[str, Any]:
    """Create an http job with `args`, trigger it once and return the finished run."""
    job = {"name": name, "schedule": NEVER, "task": "http", "args": args}
    created = await client.post("/v1/jobs", json=job)
    assert created.status_code == 201, created.text
    return await triggered_run(client, name)


async def test_loopback_is_denied_until_allowlisted(settings: Settings, receiver: Receiver) -> None:
    """Through the real wiring: Settings.http_allow -> create_app -> the http task."""
    denied_settings = settings.model_copy(update={"http_allow": ""})
    async with served(denied_settings) as client:
        run = await run_job(client, "denied", url=f"{receiver.url}/hook")
    assert run["status"] == "failed"
    assert run["error"] == (
        "TargetDenied: http target 127.0.0.1 is a loopback/private address; "
        "allow it with TICKGATE_HTTP_ALLOW"
    )
    assert receiver.receipts() == []

    async with served(settings) as client:  # the fixture allowlists 127.0.0.1
        run = await triggered_run(client, "denied")
    assert run["status"] == "succeeded"
    assert run["result"] == {"status": 200, "bytes": len(b'{"ok":true}')}
    assert [r.path for r in receiver.receipts()] == ["/hook"]


async def test_other_loopback_spellings_need_their_own_entry(
    settings: Settings, receiver: Receiver, network: LoopbackOnly
) -> None:
    port = receiver.url.rsplit(":", 1)[1]
    async with served(settings, guarded(network, allow="127.0.0.1")) as client:
        v6 = await run_job(client, "v6", url=f"http://[::1]:{port}/v6")
        mapped = await run_job(client, "mapped", url=f"http://[::ffff:127.0.0.2]:{port}/m")
        decimal = await run_job(client, "decimal", url=f"http://2130706433:{port}/decimal")
    assert (v6["status"], mapped["status"]) == ("failed", "failed")
    assert "http target ::1 is a loopback/private address" in v6["error"]
    assert "loopback/private address" in mapped["error"]
    assert decimal["status"] == "succeeded"  # stored as 127.0.0.1, which is allowlisted
    assert [r.path for r in receiver.receipts()] == ["/decimal"]
    assert network.refused == []


async def test_a_redirect_to_a_metadata_address_is_refused_before_connecting(
    settings: Settings, receiver: Receiver, network: LoopbackOnly
) -> None:
    metadata = "http://169.254.169.254/latest/meta-data/iam/security-credentials/"
    receiver.respond("/hop", status=302, location=metadata)
    receiver.respond("/decimal-hop", status=307, location="http://2852039166/")
    receiver.respond("/name-hop", status=301, location="http://metadata.google.internal/")
    async with served(settings, guarded(network)) as client:
        runs = [
            await run_job(client, name, url=f"{receiver.url}/{name}")
            for name in ("hop", "decimal-hop", "name-hop")
        ]
    assert [run["status"] for run in runs] == ["failed"] * 3
    assert runs[0]["error"] == (
        f"TargetDenied: redirect to {metadata} refused: http target 169.254.169.254 is a "
        "link-local or cloud metadata address; never allowed"
    )
    assert "2852039166 (169.254.169.254) is a link-local or cloud metadata" in runs[1]["error"]
    assert "metadata.google.internal is a cloud metadata host name" in runs[2]["error"]
    assert [r.path for r in receiver.receipts()] == ["/hop", "/decimal-hop", "/name-hop"]
    assert network.refused == []  # the guard refused; the safety net never had to
    assert set(network.connects) == {"127.0.0.1"}


async def test_a_redirect_to_a_loopback_target_not_allowlisted_is_refused(
    settings: Settings, receiver: Receiver, network: LoopbackOnly
) -> None:
    port = receiver.url.rsplit(":", 1)[1]
    receiver.respond("/to-v6", status=302, location=f"http://[::1]:{port}/landed")
    async with served(settings, guarded(network)) as client:
        run = await run_job(client, "to-v6", url=f"{receiver.url}/to-v6")
    assert run["status"] == "failed"
    assert f"redirect to http://[::1]:{port}/landed refused: http target ::1" in run["error"]
    assert [r.path for r in receiver.receipts()] == ["/to-v6"]


async def test_allowed_redirects_are_followed_with_browser_method_rules(
    settings: Settings, receiver: Receiver, network: LoopbackOnly
) -> None:
    port = receiver.url.rsplit(":", 1)[1]
    receiver.respond("/see-other", status=303, location="/landed")
    receiver.respond("/temporary", status=307, location=f"http://0x7f000001:{port}/kept")
    async with served(settings, guarded(network)) as client:
        see_other = await run_job(client, "see-other", url=f"{receiver.url}/see-other")
        temporary = await run_job(
            client, "temporary", url=f"{receiver.url}/temporary", body={"keep": "me"}
        )
    assert (see_other["status"], temporary["status"]) == ("succeeded", "succeeded")
    first, landed, second, kept = receiver.receipts()
    assert (first.method, first.path, landed.method, landed.path) == (
        "POST",
        "/see-other",
        "GET",
        "/landed",
    )
    assert landed.body == b""
    assert landed.idempotency_key == first.idempotency_key == see_other["id"]
    assert (second.path, kept.method, kept.path) == ("/temporary", "POST", "/kept")
    assert kept.body == b'{"keep":"me"}'
    assert kept.headers["host"] == f"0x7f000001:{port}"


async def test_redirects_stop_after_five(
    settings: Settings, receiver: Receiver, network: LoopbackOnly
) -> None:
    receiver.respond("/loop", status=302, location="/loop")
    async with served(settings, guarded(network)) as client:
        run = await run_job(client, "loop", url=f"{receiver.url}/loop")
        listed = await run_job(client, "listed", url=f"{receiver.url}/loop", success_status=[302])
    assert run["status"] == "failed"
    assert "more than 5 redirects" in run["error"]
    assert listed["status"] == "succeeded"  # a status the job accepts is the answer
    assert listed["result"]["status"] == 302
    assert len(receiver.receipts()) == 6 + 1


async def test_the_connection_goes_to_the_vetted_address_resolved_once(
    settings: Settings, receiver: Receiver, network: LoopbackOnly
) -> None:
    """`pinned.test` resolves to 127.0.0.1, then (rebinding) to the metadata address:
    each run resolves once and connects where it vetted, keeping the Host header."""
    port = receiver.url.rsplit(":", 1)[1]
    names = Names({"pinned.test": "127.0.0.1"}, then={"pinned.test": "169.254.169.254"})
    async with served(settings, guarded(network, resolve=names)) as client:
        first = await run_job(client, "pinned", url=f"http://pinned.test:{port}/pin")
        assert names.lookups == ["pinned.test"]
        second = await triggered_run(client, "pinned")
    assert first["status"] == "succeeded"
    [receipt] = receiver.receipts()
    assert receipt.headers["host"] == f"pinned.test:{port}"
    assert second["status"] == "failed"
    assert "pinned.test (169.254.169.254) is a link-local or cloud metadata" in second["error"]
    assert names.lookups == ["pinned.test", "pinned.test"]
    assert network.connects == ["127.0.0.1"]
    assert network.refused == []


async def test_runs_to_one_origin_reuse_a_kept_alive_connection(
    settings: Settings, network: LoopbackOnly
) -> None:
    with receiving(keep_alive=True) as target:
        async with served(settings, guarded(network)) as client:
            runs = [await run_job(client, "again", url=f"{target.url}/again")]
            runs += [await triggered_run(client, "again") for _ in range(2)]
        assert [run["status"] for run in runs] == ["succeeded"] * 3
        assert len(target.receipts()) == 3
    assert network.connects == ["127.0.0.1"]  # one connection carried all three


async def test_secret_headers_do_not_follow_a_redirect_to_another_origin(
    settings: Settings, receiver: Receiver, network: LoopbackOnly
) -> None:
    port = receiver.url.rsplit(":", 1)[1]
    names = Names({"other.test": "127.0.0.1"})
    receiver.respond("/same", status=302, location="/same-landed")
    receiver.respond("/away", status=302, location=f"http://other.test:{port}/away-landed")
    headers = {"Authorization": "Bearer s3cret", "X-Api-Key": "k3y", "X-Plain": "p"}
    args = {"headers": headers, "secret_headers": ["x-api-key"]}
    async with served(settings, guarded(network, resolve=names)) as client:
        for path in ("same", "away"):
            run = await run_job(client, path, url=f"{receiver.url}/{path}", **args)
            assert run["status"] == "succeeded"
    sent = {r.path: r.headers for r in receiver.receipts()}
    for path in ("/same", "/same-landed", "/away"):
        assert sent[path]["authorization"] == "Bearer s3cret"
        assert sent[path]["x-api-key"] == "k3y"
    assert "authorization" not in sent["/away-landed"]
    assert "x-api-key" not in sent["/away-landed"]
    assert sent["/away-landed"]["x-plain"] == "p"


async def test_a_name_is_tried_at_each_vetted_address_in_turn(
    settings: Settings, receiver: Receiver, network: LoopbackOnly
) -> None:
    """Nothing listens on 127.0.0.2: the connect falls back to the next vetted address."""
    port = receiver.url.rsplit(":", 1)[1]

    async def two_addresses(host: str, port: int) -> list[IPAddress]:
        return [ipaddress.ip_address("127.0.0.2"), ipaddress.ip_address("127.0.0.1")]

    registry = guarded(network, allow="127.0.0.0/8", resolve=two_addresses)
    async with served(settings, registry) as client:
        run = await run_job(client, "two", url=f"http://two.test:{port}/two")
    assert run["status"] == "succeeded", run
    assert network.connects == ["127.0.0.2", "127.0.0.1"]
    [receipt] = receiver.receipts()
    assert receipt.headers["host"] == f"two.test:{port}"


async def test_a_redirect_to_a_legacy_ip_spelling_connects_to_its_address(
    settings: Settings, receiver: Receiver, network: LoopbackOnly
) -> None:
    """`2130706433` is 127.0.0.1 to the guard, as to the OS; the Host header keeps it."""
    port = receiver.url.rsplit(":", 1)[1]
    receiver.respond("/legacy", status=307, location=f"http://2130706433:{port}/landed")
    async with served(settings, guarded(network)) as client:
        run = await run_job(client, "legacy", url=f"{receiver.url}/legacy")
    assert run["status"] == "succeeded", run
    _, landed = receiver.receipts()
    assert (landed.method, landed.path) == ("POST", "/landed")
    assert landed.headers["host"] == f"2130706433:{port}"
    assert set(network.connects) == {"127.0.0.1"}


async def test_credentials_in_the_url_are_sent_as_basic_authorization(
    settings: Settings, receiver: Receiver, network: LoopbackOnly
) -> None:
    port = receiver.url.rsplit(":", 1)[1]
    url = f"http://user:p%40ss@127.0.0.1:{port}/auth"
    headers = {"Authorization": "Bearer replaced", "Content-Type": "text/plain"}
    async with served(settings, guarded(network)) as client:
        run = await run_job(client, "auth", url=url, headers=headers, body="plain")
    assert run["status"] == "succeeded", run
    [receipt] = receiver.receipts()
    assert receipt.headers["authorization"] == "Basic dXNlcjpwQHNz"  # user:p@ss
    assert receipt.content_type == "text/plain"  # the job's own content type is kept
    assert receipt.body == b'"plain"'
    assert receipt.headers["host"] == f"127.0.0.1:{port}"


async def test_a_long_response_header_is_read(
    settings: Settings, receiver: Receiver, network: LoopbackOnly
) -> None:
    receiver.respond("/long", headers=(("Content-Security-Policy", "x" * 20_000),))
    async with served(settings, guarded(network)) as client:
        run = await run_job(client, "long", url=f"{receiver.url}/long")
    assert run["status"] == "succeeded", run


async def test_cookies_a_target_sets_are_not_sent_by_later_runs(
    settings: Settings, network: LoopbackOnly
) -> None:
    names = Names({"cookie.test": "127.0.0.1"})  # a client keeps no cookies for an IP
    with receiving(keep_alive=True) as target:
        target.respond("/cookie", headers=(("Set-Cookie", "session=s3cret; Path=/"),))
        port = target.url.rsplit(":", 1)[1]
        async with served(settings, guarded(network, resolve=names)) as client:
            runs = [await run_job(client, "cookie", url=f"http://cookie.test:{port}/cookie")]
            runs.append(await triggered_run(client, "cookie"))
        assert [run["status"] for run in runs] == ["succeeded"] * 2
        assert [r.headers.get("cookie") for r in target.receipts()] == [None, None]


async def test_a_refused_connection_fails_the_run_naming_the_target(
    settings: Settings, network: LoopbackOnly
) -> None:
    with socket.socket() as closed:  # a port nothing listens on once it is closed
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    async with served(settings, guarded(network)) as client:
        run = await run_job(client, "refused", url=f"http://127.0.0.1:{port}/x")
    assert run["status"] == "failed"
    assert run["error"].startswith(
        f"HttpTaskError: POST http://127.0.0.1:{port}/x failed: ClientConnectorError: "
        f"Cannot connect to host 127.0.0.1:{port}"
    ), run["error"]
    assert network.connects == ["127.0.0.1"]


def task_context(job: str, shared: httpx.AsyncClient) -> TaskContext:
    now = datetime.now(UTC)
    logger = logging.LoggerAdapter(logging.getLogger("test"), {})
    deadline, sql = now + timedelta(seconds=30), SqlTargetConnections({})
    return TaskContext(job, uuid.uuid4(), now, 1, logger, deadline, shared, sql)


async def test_a_warmed_task_runs_and_reopens_its_pool_after_closing(
    receiver: Receiver, network: LoopbackOnly
) -> None:
    definition = http_task(Allowlist.from_setting("127.0.0.1"), network=network)
    assert definition.warm is not None
    assert definition.close is not None
    definition.warm()  # as the app does before readiness, with the loop running
    args = definition.parse_args({"url": f"{receiver.url}/warm"})
    async with httpx.AsyncClient() as shared:  # TaskContext.http; the http task has its own
        first = await definition.run(args, task_context("warm", shared))
        await definition.close()
        second = await definition.run(args, task_context("warm", shared))
        await definition.close()
    assert first == second == {"status": 200, "bytes": len(b'{"ok":true}')}
    assert len(receiver.receipts()) == 2


class TlsTarget:
    """An HTTPS server on 127.0.0.1 with a certificate for `tls.test` from a test CA;
    records the SNI name of each handshake and the Host header of each request."""

    def __init__(self, ca: trustme.CA) -> None:
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        ca.issue_cert("tls.test").configure_cert(self.context)
        self.context.sni_callback = self._sni
        self.names: list[str | None] = []
        self.hosts: list[str] = []
        self.port = 0

    def _sni(self, _: ssl.SSLObject, name: str | None, __: ssl.SSLContext) -> None:
        self.names.append(name)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode("ascii").lower()
        self.hosts += [line[5:].strip() for line in head.split("\r\n") if line[:5] == "host:"]
        length = [int(line[15:]) for line in head.split("\r\n") if line[:15] == "content-length:"]
        await reader.readexactly(sum(length))
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok")
        await writer.drain()
        writer.close()

    @asynccontextmanager
    async def serving(self) -> AsyncIterator["TlsTarget"]:
        server = await asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=self.context)
        self.port = server.sockets[0].getsockname()[1]
        async with server:
            yield self


@pytest.fixture
def ca() -> trustme.CA:
    return trustme.CA()


async def test_https_verifies_the_certificate_for_the_name_not_the_address(
    settings: Settings, network: LoopbackOnly, ca: trustme.CA
) -> None:
    """The connection goes to the vetted address; SNI, the Host header and the
    certificate check use the URL's host name."""
    trusted = ssl.create_default_context()
    ca.configure_trust(trusted)
    names = Names({"tls.test": "127.0.0.1", "other.test": "127.0.0.1"})
    async with TlsTarget(ca).serving() as target:
        registry = guarded(network, resolve=names, trust=trusted)
        async with served(settings, registry) as client:
            good = await run_job(client, "good", url=f"https://tls.test:{target.port}/")
            wrong = await run_job(client, "wrong", url=f"https://other.test:{target.port}/")
    assert good["status"] == "succeeded", good
    assert good["result"] == {"status": 200, "bytes": 2}
    assert wrong["status"] == "failed"
    assert "failed: ClientConnectorCertificateError" in wrong["error"]
    assert "other.test" in wrong["error"]  # the certificate names tls.test only
    assert target.names == ["tls.test", "other.test"]
    assert target.hosts == [f"tls.test:{target.port}"]
    assert network.connects == ["127.0.0.1", "127.0.0.1"]


async def test_https_refuses_a_certificate_from_an_unknown_authority(
    settings: Settings, network: LoopbackOnly, ca: trustme.CA
) -> None:
    names = Names({"tls.test": "127.0.0.1"})
    async with (
        TlsTarget(ca).serving() as target,
        served(settings, guarded(network, resolve=names)) as client,
    ):
        run = await run_job(client, "untrusted", url=f"https://tls.test:{target.port}/")
    assert run["status"] == "failed"
    assert "CERTIFICATE_VERIFY_FAILED" in run["error"]
    assert target.names == ["tls.test"]
    assert target.hosts == []


@pytest.mark.parametrize(
    ("size", "result"),
    [
        (5, {"status": 200, "bytes": 5}),
        (MAX_RESPONSE_BYTES, {"status": 200, "bytes": MAX_RESPONSE_BYTES}),
        (
            3 * MAX_RESPONSE_BYTES,
            {"status": 200, "bytes": MAX_RESPONSE_BYTES, "truncated": True},
        ),
    ],
)
async def test_the_response_bytes_read_are_capped(
    settings: Settings,
    receiver: Receiver,
    network: LoopbackOnly,
    size: int,
    result: dict[str, Any],
) -> None:
    receiver.respond("/big", body_size=size)
    async with served(settings, guarded(network)) as client:
        run = await run_job(client, "big", url=f"{receiver.url}/big")
    assert run["status"] == "succeeded"
    assert run["result"] == result


@pytest.mark.parametrize(
    "url",
    [
        "http://169.254.169.254/latest/meta-data/",
        "http://2852039166/",
        "http://[fd00:ec2::254]/",
        "http://[::ffff:169.254.169.254]/",
        "http://metadata.google.internal/computeMetadata/v1/",
    ],
)
async def test_always_denied_targets_are_refused_when_the_job_is_written(
    client: httpx.AsyncClient, url: str
) -> None:
    job = {"name": "meta", "schedule": NEVER, "task": "http", "args": {"url": url}}
    answer = await client.post("/v1/jobs", json=job)
    assert answer.status_code == 422, answer.text
    assert "the http task never calls it" in answer.text


async def test_header_limits_are_checked_when_the_job_is_written(
    client: httpx.AsyncClient,
) -> None:
    def job(**args: Any) -> dict[str, Any]:
        return {"name": "h", "schedule": NEVER, "task": "http", "args": args}

    url = "http://127.0.0.1:9/"
    injected = await client.post("/v1/jobs", json=job(url=url, headers={"X-A": "1\r\nX-B: 2"}))
    secret = await client.post(
        "/v1/jobs", json=job(url=url, headers={"X-A": "1"}, secret_headers=["X-B"])
    )
    long_url = await client.post("/v1/jobs", json=job(url=url + "x" * 2048))
    assert [injected.status_code, secret.status_code, long_url.status_code] == [422] * 3
