"""Secrets stay where the operator put them, and no input becomes a 5xx (#42), on a real
`tickgate serve` replica with tokens, two loopback targets of different origins (`home`,
where the jobs' secrets belong, and `elsewhere`, a host of a job author's own) that echo
what they get (tests/support/echo.py), the operator's OAuth client bound to `home`'s token
URL, and signing keys bound to hosts.

Each secret is checked in every form an answer could show it (as sent, JSON-escaped,
URL-encoded, re-cased, in base64 at each alignment), in every answer any token gets."""

import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import quote_plus

import httpx
import pytest
from standardwebhooks.webhooks import Webhook

from harness.cluster import serve, serve_many
from harness.replicas import Replica
from harness.waiting import eventually
from tests.support.db import TemplateDatabases
from tests.support.echo import Echo, echoed, echoing
from tests.support.edges import EDGE_DATES

# Printable ASCII (a header value's alphabet) with what JSON and URLs escape.
SECRET = 'Bearer s3"cr\\et/+%~=Q'
HOOK_SECRET = 'hook"sec\\ret'
OAUTH_SECRET = 'oauth-"client"\\secret'
PASSWORD = "pw-S3cret-9"
SIGNING_KEY = "whsec_" + base64.b64encode(b"k" * 32).decode()
OTHER_KEY = "whsec_" + base64.b64encode(b"o" * 32).decode()
WRITE, READ = "write-token-42", "read-token-42"
TOKENS = {WRITE: ["read", "write"], READ: ["read"]}
NEVER = {"kind": "cron", "expression": "0 0 1 1 *"}
LOG_ARGS = {"message": "tick"}


def forms(secret: str) -> list[str]:
    """The forms of `secret` no answer may hold (the base64 ones: the characters of each
    alignment that encode the secret's bytes only)."""
    shown = echoed(secret)
    cores = [text[4:-4] for text in shown["base64"]]
    escaped = json.dumps(secret)[1:-1]
    return [secret, secret.upper(), shown["url"], escaped, json.dumps(escaped)[1:-1], *cores]


def leaks(text: str, *secrets: str) -> list[str]:
    return [form for secret in secrets for form in forms(secret) if form in text]


@pytest.fixture(scope="module")
def home() -> Iterator[Echo]:
    with echoing() as echo:
        yield echo


@pytest.fixture(scope="module")
def elsewhere() -> Iterator[Echo]:
    with echoing() as echo:
        yield echo


@pytest.fixture(scope="module")
def replica(
    templates: TemplateDatabases, tmp_path_factory: pytest.TempPathFactory, home: Echo
) -> Iterator[Replica]:
    workdir = tmp_path_factory.mktemp("secrets")
    oauth = {"billing": {"secret": OAUTH_SECRET, "token_url": f"{home.url}/token"}}
    keys = {
        "local": {"secrets": [SIGNING_KEY], "hosts": ["127.0.0.1"]},
        "prod": {"secrets": [OTHER_KEY], "hosts": ["hooks.example.com"]},
    }
    (workdir / "oauth.json").write_text(json.dumps(oauth))
    (workdir / "keys.json").write_text(json.dumps(keys))
    env = {
        "TICKGATE_API_TOKENS": json.dumps(TOKENS),
        "TICKGATE_OAUTH_SECRETS_FILE": str(workdir / "oauth.json"),
        "TICKGATE_WEBHOOK_KEYS_FILE": str(workdir / "keys.json"),
    }
    with (
        templates.cloned_url() as database_url,
        serve_many(workdir, 1, ready_path="/readyz", database_url=database_url, env=env) as [
            started
        ],
    ):
        yield started


@pytest.fixture(scope="module")
def api(replica: Replica) -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {WRITE}"}
    with httpx.Client(base_url=replica.url, headers=headers, timeout=30) as client:
        yield client


@pytest.fixture(scope="module")
def reader(replica: Replica) -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {READ}"}
    with httpx.Client(base_url=replica.url, headers=headers, timeout=30) as client:
        yield client


def http_job(name: str, url: str, **args: Any) -> dict[str, Any]:
    return {"name": name, "schedule": NEVER, "task": "http", "args": {"url": url, **args}}


def secret_args(url: str, value: str = SECRET) -> dict[str, Any]:
    return {
        "url": url,
        "headers": {"Authorization": value, "X-Plain": "plain"},
        "secret_headers": ["Authorization"],
    }


def created(api: httpx.Client, job: dict[str, Any]) -> dict[str, Any]:
    answer = api.post("/v1/jobs", json=job)
    assert answer.status_code == 201, answer.text
    return dict(answer.json())


def ended(api: httpx.Client, started: httpx.Response) -> dict[str, Any]:
    assert started.status_code == 202, started.text
    run_url = f"/v1/runs/{started.json()['id']}"

    def over() -> dict[str, Any] | None:
        run: dict[str, Any] = api.get(run_url).json()
        return run if run["status"] not in {"running", "pending"} else None

    return eventually(over, 30, "the run to end")


def test_no_422_shows_a_stored_secret(api: httpx.Client, home: Echo) -> None:
    """Each request that once answered a 422 holding a stored secret (the job's secret
    header, or its hook's) merged in before validation: a 422 now, naming the field,
    with no form of either secret in it; the job unchanged."""
    hook = {
        "on": ["failure"],
        "action": {"kind": "http", "args": secret_args(f"{home.url}/hook", HOOK_SECRET)},
    }
    job = http_job("leaky", f"{home.url}/echo") | {"hooks": [hook]}
    job["args"] |= secret_args(f"{home.url}/echo")
    created(api, job)
    shown = api.get("/v1/jobs/leaky").json()
    masked_args = shown["args"]
    bad_hook = json.loads(json.dumps(shown["hooks"]))
    bad_hook[0]["action"]["args"]["headers"]["Host"] = "x"
    requests: list[tuple[str, str, dict[str, Any]]] = [
        (
            "POST",
            "/v1/jobs/leaky/trigger",
            {"args": masked_args | {"headers": {"Authorization": "***", "Host": "x"}}},
        ),
        ("PATCH", "/v1/jobs/leaky", {"args": {"headers": {"Host": "x"}}}),
        ("PATCH", "/v1/jobs/leaky", {"args": {"secret_headers": ["Authorization", "X-Nope"]}}),
        (
            "PUT",
            "/v1/jobs?dry_run=true",
            {
                "jobs": [
                    job | {"args": masked_args | {"headers": {"Authorization": "***", "Host": "x"}}}
                ]
            },
        ),
        ("PUT", "/v1/jobs/leaky", {**_declared(shown), "hooks": bad_hook}),
    ]
    for method, path, body in requests:
        answer = api.request(method, path, json=body)
        assert answer.status_code == 422, (method, path, answer.text)
        assert answer.json()["errors"], answer.text
        assert not leaks(answer.text, SECRET, HOOK_SECRET), (method, path, answer.text)
    assert api.get("/v1/jobs/leaky").json()["version"] == shown["version"]


def _declared(shown: dict[str, Any]) -> dict[str, Any]:
    names = ("name", "schedule", "timezone", "task", "args", "hooks")
    return {name: shown[name] for name in names}


def test_a_kept_secret_goes_to_its_own_origin_only(
    api: httpx.Client, reader: httpx.Client, home: Echo, elsewhere: Echo
) -> None:
    """ "***" keeps a stored secret header, or a URL's password, for the URL's origin
    only: sent with another origin (in a trigger's args, a merge patch of the URL alone,
    a whole PUT) it is a 422 naming the field, and that origin never hears of it. The
    same origin keeps it."""
    created(api, http_job("bound", f"{home.url}/echo") | {"args": secret_args(f"{home.url}/echo")})
    shown = api.get("/v1/jobs/bound").json()
    away = f"{elsewhere.url}/echo"
    refused = [
        api.post("/v1/jobs/bound/trigger", json={"args": shown["args"] | {"url": away}}),
        api.patch("/v1/jobs/bound", json={"args": {"url": away}}),
        api.put("/v1/jobs/bound", json=_declared(shown) | {"args": shown["args"] | {"url": away}}),
    ]
    for answer in refused:
        assert answer.status_code == 422, answer.text
        assert any("Authorization" in p["msg"] for p in answer.json()["errors"]), answer.text
    moved = api.patch("/v1/jobs/bound", json={"args": {"url": f"{home.url}/echo-moved"}})
    assert moved.status_code == 200, moved.text
    run = ended(api, api.post("/v1/jobs/bound/trigger"))
    assert run["status"] == "succeeded", run

    user_url = home.url.replace("http://", f"http://user:{PASSWORD}@") + "/echo-basic"
    created(api, http_job("creds", user_url))
    read_back = reader.get("/v1/jobs/creds").json()["args"]["url"]
    assert read_back == home.url.replace("http://", "http://user:***@") + "/echo-basic"
    stolen = read_back.replace(home.url.removeprefix("http://"), away.removeprefix("http://"))
    answer = api.post("/v1/jobs/creds/trigger", json={"args": {"url": stolen}})
    assert answer.status_code == 422, answer.text
    kept = api.post("/v1/jobs/creds/trigger", json={"args": {"url": read_back}})
    run = ended(api, kept)
    assert run["status"] == "succeeded", run
    assert not leaks(json.dumps(reader.get(f"/v1/runs/{run['id']}").json()), PASSWORD)

    assert elsewhere.requests() == [], elsewhere.everything()
    assert [one.headers["authorization"] for one in home.requests("/echo-moved")] == [SECRET]
    basic = "Basic " + base64.b64encode(f"user:{PASSWORD}".encode()).decode()
    assert [one.headers["authorization"] for one in home.requests("/echo-basic")] == [basic]


def test_operator_secrets_go_only_where_the_operator_bound_them(
    api: httpx.Client, home: Echo, elsewhere: Echo
) -> None:
    """The OAuth client secret `billing` is bound to home's token URL: a job naming it
    with another token URL is a 422, and that URL is never called. Signing key `prod`
    signs for hooks.example.com only: a job to this host naming it is a 422, and `local`
    signs. Unknown names are 422s that list none of the configured ones."""
    client = {"client_id": "reports", "client_secret": "billing"}
    target = f"{home.url}/echo-oauth"
    cases = [
        (
            http_job("o1", target, oauth=client | {"token_url": f"{elsewhere.url}/token"}),
            "token_url",
        ),
        (
            http_job(
                "o2",
                target,
                oauth=client | {"client_secret": "nope", "token_url": f"{home.url}/token"},
            ),
            "client_secret",
        ),
        (http_job("s1", target, signing_key="prod"), "signing_key"),
        (http_job("s2", target, signing_key="nope"), "signing_key"),
    ]
    for job, field in cases:
        answer = api.post("/v1/jobs", json=job)
        assert answer.status_code == 422, answer.text
        assert answer.json()["errors"][0]["loc"][-1] == field, answer.text
        for configured in ("billing", "local", "prod"):
            if configured not in json.dumps(job):
                assert configured not in answer.text, answer.text
    created(api, http_job("oauth", target, oauth=client | {"token_url": f"{home.url}/token"}))
    created(api, http_job("signed", f"{home.url}/echo-signed", signing_key="local"))
    assert ended(api, api.post("/v1/jobs/oauth/trigger"))["status"] == "succeeded"
    assert ended(api, api.post("/v1/jobs/signed/trigger"))["status"] == "succeeded"

    assert elsewhere.requests() == [], elsewhere.everything()
    [grant] = home.requests("/token")
    pair = f"reports:{quote_plus(OAUTH_SECRET)}"
    assert grant.headers["authorization"] == "Basic " + base64.b64encode(pair.encode()).decode()
    [call] = home.requests("/echo-oauth")
    assert call.headers["authorization"].startswith("Bearer tok-")
    [signed] = home.requests("/echo-signed")
    Webhook(SIGNING_KEY).verify(signed.body, signed.headers)


def test_what_a_target_echoes_of_a_secret_is_masked_in_every_form(
    api: httpx.Client, reader: httpx.Client, home: Echo
) -> None:
    """A target echoing the secret header as sent, re-cased, URL-encoded, in base64 and
    inside a JSON string, and in a response header: the run's output shows `***` in
    each place, to a read token, and no form of the secret."""
    job = http_job("echoed", f"{home.url}/echo") | {"args": secret_args(f"{home.url}/echo")}
    created(api, job)
    run = ended(api, api.post("/v1/jobs/echoed/trigger"))
    shown = reader.get(f"/v1/runs/{run['id']}").text
    assert run["status"] == "succeeded", run
    assert not leaks(shown, SECRET), shown
    output = json.loads(reader.get(f"/v1/runs/{run['id']}").json()["output"]["body"])
    assert (output["raw"], output["upper"], output["url"]) == ("***", "***", "***"), output
    assert "***" in reader.get(f"/v1/runs/{run['id']}").json()["output"]["headers"]["x-request-id"]


SCHEDULES = [
    {"kind": "cron", "expression": "0 0 29 2 1"},
    {"kind": "cron", "expression": "* * * * * *"},
    {"kind": "interval", "every_seconds": 31_622_400},
    {"kind": "daily", "every_days": 366, "at": ["23:59:59"]},
]


def edge_requests() -> Iterator[tuple[str, str, dict[str, Any]]]:
    """Every kind of schedule, in zones at both ends of the offsets, with dates at both
    ends of what a datetime holds: through create, patch, preview and backfill."""
    for index, (schedule, zone) in enumerate(
        (s, z) for s in SCHEDULES for z in ("UTC", "Pacific/Kiritimati", "Etc/GMT+12")
    ):
        for moment in EDGE_DATES:
            name = f"edge-{index}-{EDGE_DATES.index(moment)}"
            job = {
                "name": name,
                "schedule": schedule,
                "timezone": zone,
                "task": "log",
                "args": LOG_ARGS,
            }
            yield "POST", "/v1/jobs", job | {"start_at": moment}
            yield "POST", "/v1/jobs", job | {"name": f"{name}-end", "end_at": moment}
            yield (
                "POST",
                "/v1/schedules/preview",
                {"schedule": schedule, "timezone": zone, "after": moment, "count": 100},
            )
            yield "PATCH", f"/v1/jobs/{name}-base", {"start_at": moment}
            yield "PATCH", f"/v1/jobs/{name}-base", {"end_at": moment}
            yield "POST", f"/v1/jobs/{name}-base/backfill", {"from": moment, "to": moment}
    for moment in EDGE_DATES:
        wall = moment[:19]
        for at in (moment, wall):
            once = {"kind": "once", "at": at}
            yield "POST", "/v1/schedules/preview", {"schedule": once, "timezone": "Etc/GMT+12"}
            yield (
                "POST",
                "/v1/jobs",
                {
                    "name": f"once-{len(at)}-{EDGE_DATES.index(moment)}",
                    "schedule": once,
                    "task": "log",
                    "args": LOG_ARGS,
                },
            )
        anchored = {"kind": "interval", "every_seconds": 60, "anchor": moment}
        yield "POST", "/v1/schedules/preview", {"schedule": anchored}
        daily = {"kind": "daily", "at": ["00:00"], "anchor_date": moment[:10]}
        yield "POST", "/v1/schedules/preview", {"schedule": daily, "timezone": "Pacific/Kiritimati"}


def test_no_edge_date_answers_a_5xx_and_every_stored_job_reads_back(api: httpx.Client) -> None:
    """Dates at year 1 and 9999, in zones 14 hours either side of UTC, for every kind of
    schedule, through create, patch, preview and backfill: a 2xx or a 4xx naming the
    field, never a 5xx; every job a create stored answers its GET and is listed."""
    for index in range(len(SCHEDULES) * 3):
        for moment in range(len(EDGE_DATES)):
            schedule = SCHEDULES[index // 3]
            base = {
                "name": f"edge-{index}-{moment}-base",
                "schedule": schedule,
                "task": "log",
                "args": LOG_ARGS,
            }
            created(api, base)
    answers = [
        (method, path, body, api.request(method, path, json=body))
        for method, path, body in edge_requests()
    ]
    failed = [(m, p, b, a.status_code, a.text) for m, p, b, a in answers if a.status_code >= 500]
    assert not failed, failed[:5]
    assert any(a.status_code == 422 for *_, a in answers)
    stored = [
        a.json()["name"]
        for m, p, _, a in answers
        if (m, p) == ("POST", "/v1/jobs") and a.status_code == 201
    ]
    assert stored  # not vacuous: some edge jobs are valid
    for name in stored:
        got = api.get(f"/v1/jobs/{name}")
        assert got.status_code == 200, got.text
    listed = api.get("/v1/jobs", params={"prefix": "edge-", "limit": 1000})
    assert listed.status_code == 200, listed.text
    for refused in (a for m, p, _, a in answers if a.status_code == 422):
        assert all(problem["loc"] for problem in refused.json()["errors"]), refused.text


@pytest.fixture
def tokenless(database_url: str, tmp_path: Path) -> Iterator[Replica]:
    with serve(tmp_path, database_url=database_url) as started:
        yield started


def test_a_server_without_tokens_answers_only_requests_meant_for_it(tokenless: Replica) -> None:
    """What `make run` serves: another `Host` (a page rebinding its own name to this
    address) is a 403, and so is a change asked from another site (`Origin`,
    `Sec-Fetch-Site`); an empty form post is a 415. A client that sends neither header,
    and the same origin, are served."""
    port = tokenless.url.rsplit(":", 1)[1]
    with httpx.Client(base_url=tokenless.url, timeout=30) as client:
        made = client.post(
            "/v1/jobs", json={"name": "local", "schedule": NEVER, "task": "log", "args": LOG_ARGS}
        )
        assert made.status_code == 201, made.text
        for host in ("evil.example", f"evil.example:{port}", f"127.0.0.1.nip.io:{port}"):
            answer = client.get("/v1/jobs", headers={"Host": host})
            assert answer.status_code == 403, (host, answer.text)
        assert client.get("/v1/jobs", headers={"Host": f"localhost:{port}"}).status_code == 200
        for cross in ({"Origin": "http://evil.example"}, {"Sec-Fetch-Site": "cross-site"}):
            answer = client.post("/v1/jobs/local/pause", headers=cross)
            assert answer.status_code == 403, (cross, answer.text)
        form = {"Content-Type": "application/x-www-form-urlencoded"}
        assert client.post("/v1/jobs/local/pause", headers=form).status_code == 415
        assert client.get("/v1/jobs/local").json()["state"] == "active"
        same = {"Origin": tokenless.url, "Sec-Fetch-Site": "same-origin"}
        assert client.post("/v1/jobs/local/pause", headers=same).status_code == 200
        assert client.post("/v1/jobs/local/resume").status_code == 200
