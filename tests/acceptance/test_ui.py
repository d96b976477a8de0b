"""The dashboard in a real browser (Debian's chromium, driven by Playwright) against a live
`tickgate serve` with tokens configured and real jobs. Every request the browser makes is
routed through the test: one to a host other than loopback is aborted and fails the test."""

import json
import os
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from http.server import ThreadingHTTPServer
from importlib.metadata import version
from pathlib import Path
from urllib.parse import urlsplit

import httpx
import pytest
from axe_playwright_python.sync_playwright import Axe
from playwright.sync_api import Browser, Page, Response, Route, expect, sync_playwright
from playwright.sync_api import Error as PlaywrightError

from harness.receiver import Receiver
from harness.replicas import START_DEADLINE_SECONDS, Replica, start_replica
from harness.threaded import serving
from harness.waiting import eventually
from tests.support.answers import Target
from tests.support.db import TemplateDatabases

CHROMIUM = Path("/usr/bin/chromium")
LOOPBACK = frozenset({"127.0.0.1", "localhost", "[::1]", "::1"})
READ, WRITE = "ui-read-token", "ui-write-token"
TOKENS = {READ: ["read"], WRITE: ["read", "write"]}
NEVER = {"kind": "cron", "expression": "0 0 1 1 *"}
LOG = {"task": "log", "args": {"message": "from the ui test"}}
WAIT_MS = 30_000  # generous: a loaded 2-core box
# Assertions wait as long too (Playwright's default, 5 s, is one refresh of a page).
expect.set_options(timeout=WAIT_MS)


@pytest.fixture(scope="module")
def database_url(templates: TemplateDatabases) -> Iterator[str]:
    with templates.cloned_url() as url:
        yield url


@pytest.fixture(scope="module")
def server(database_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Replica]:
    with started(tmp_path_factory.mktemp("ui-server"), database_url) as replica:
        yield replica


@contextmanager
def started(workdir: Path, database_url: str) -> Iterator[Replica]:
    """A replica serving the API with the test's tokens, stopped on the way out."""
    replica = start_replica(
        workdir, database_url=database_url, TICKGATE_API_TOKENS=json.dumps(TOKENS)
    )
    try:
        eventually(lambda: answers(replica), START_DEADLINE_SECONDS, "the replica")
        yield replica
    finally:
        replica.stop()


@pytest.fixture(scope="module")
def url(server: Replica) -> str:
    return server.url


def answers(replica: Replica) -> bool:
    """Serving the API (with a token: Replica.answers asks without one)."""
    assert replica.alive, replica.log_tail()
    headers = {"Authorization": f"Bearer {READ}"}
    try:
        return httpx.get(f"{replica.url}/v1/tasks", headers=headers, timeout=2).is_success
    except httpx.TransportError:
        return False


@pytest.fixture(scope="module")
def api(url: str) -> Iterator[httpx.Client]:
    headers = {"Authorization": f"Bearer {WRITE}"}
    with httpx.Client(base_url=url, headers=headers, timeout=30) as client:
        yield client


@pytest.fixture(scope="module")
def chromium_browser() -> Iterator[Browser]:
    if not CHROMIUM.exists():
        pytest.fail(
            f"{CHROMIUM} is missing: the dashboard's browser tests drive Debian's chromium; "
            "install it with `apt-get install -y chromium` (make test does when run as root)"
        )
    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(
            executable_path=str(CHROMIUM),
            # Nothing but loopback resolves, so even a request the routing missed stays home.
            args=["--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"],
        )
        yield launched
        launched.close()


@pytest.fixture
def foreign() -> list[str]:
    """The non-loopback URLs the browser tried during the test (each one aborted)."""
    return []


def open_page(browser: Browser, foreign: list[str], token: str | None, width: int = 1280) -> Page:
    context = browser.new_context(viewport={"width": width, "height": 900})
    context.set_default_timeout(WAIT_MS)

    def only_loopback(route: Route) -> None:
        if urlsplit(route.request.url).hostname in LOOPBACK:
            route.continue_()
        else:
            foreign.append(route.request.url)
            route.abort()

    context.route("**/*", only_loopback)
    if token is not None:
        # As if the user had typed it into the token form earlier in this tab.
        context.add_init_script(f"sessionStorage.setItem('tickgate.token', {json.dumps(token)})")
    return context.new_page()


@pytest.fixture
def page_as(chromium_browser: Browser, foreign: list[str]) -> Iterator[Callable[..., Page]]:
    pages: list[Page] = []

    def opened(token: str | None, width: int = 1280) -> Page:
        pages.append(open_page(chromium_browser, foreign, token, width))
        return pages[-1]

    yield opened
    for page in pages:
        page.context.close()
    assert foreign == [], f"the browser tried to leave loopback: {foreign}"


def create(api: httpx.Client, name: str, **fields: object) -> dict[str, object]:
    body = {"name": name, "schedule": NEVER, **LOG, **fields}
    created = api.post("/v1/jobs", json=body)
    assert created.status_code == 201, created.text
    return dict(created.json())


def test_the_token_form_asks_once_and_the_table_shows_created_jobs(
    url: str, api: httpx.Client, page_as: Callable[..., Page]
) -> None:
    create(api, "tok-hourly", schedule={"kind": "interval", "every_seconds": 3600})
    page = page_as(None)
    page.goto(f"{url}/")
    expect(page).to_have_url(f"{url}/ui/")
    expect(page.locator("#token-form")).to_be_visible()
    page.fill("#token-input", READ)
    page.click("#token-form button[type=submit]")
    expect(page.locator("#jobs tbody")).to_contain_text("tok-hourly")
    row = page.locator("#jobs tbody tr", has_text="tok-hourly")
    expect(row).to_contain_text("Every hour")
    expect(row).to_contain_text("UTC")
    expect(row).to_contain_text("active")
    expect(page.locator("#token-form")).to_be_hidden()
    # The token stays in the tab's session: the next page asks for nothing.
    page.goto(f"{url}/ui/jobs/tok-hourly")
    expect(page.locator("#definition")).to_contain_text("Every hour")
    expect(page.locator("#token-form")).to_be_hidden()


def test_filters_and_paging(url: str, api: httpx.Client, page_as: Callable[..., Page]) -> None:
    for index in range(30):
        create(api, f"pg-{index:02d}")
    create(api, "pg-zz-paused")
    assert api.post("/v1/jobs/pg-zz-paused/pause", json={"note": "x"}).status_code == 200
    create(api, "pg-zz-http", task="http", args={"url": "http://127.0.0.1:9/"})
    page = page_as(WRITE)
    page.goto(f"{url}/ui/")
    page.fill("input[name=prefix]", "pg-")
    page.select_option("select[name=limit]", "25")
    names = page.locator("#jobs tbody tr td:first-child")
    expect(names).to_have_text([f"pg-{index:02d}" for index in range(25)])
    page.click("#next-page")
    second = [*(f"pg-{index:02d}" for index in range(25, 30)), "pg-zz-http", "pg-zz-paused"]

    def on_the_second_page() -> None:
        expect(page.locator("#page-number")).to_have_text("Page 2")
        expect(names).to_have_text(second)
        expect(page.locator("#next-page")).to_be_disabled()
        expect(page.locator("#prev-page")).to_be_enabled()

    on_the_second_page()
    # It stays, rows and pager, past the end of the pause in typing and a refresh.
    refreshed(page)
    on_the_second_page()
    page.click("#prev-page")
    expect(names).to_have_count(25)
    page.select_option("select[name=state]", "paused")
    expect(names).to_have_text(["pg-zz-paused"])
    page.select_option("select[name=state]", "")
    page.fill("input[name=task]", "http")
    expect(names).to_have_text(["pg-zz-http"])
    # The filters survive the periodic refresh and a reload (they live in the address).
    refreshed(page)
    expect(names).to_have_text(["pg-zz-http"])
    page.reload()
    expect(names).to_have_text(["pg-zz-http"])
    assert page.input_value("input[name=prefix]") == "pg-"
    page.check("input[name=overdue]")
    expect(page.locator("#empty")).to_be_visible()


def refreshed(page: Page) -> None:
    """Wait for the list page's next load to land: its "Updated" time changes."""
    updated = page.locator("#updated")
    expect(updated).not_to_have_text("")
    expect(updated).not_to_have_text(updated.inner_text())


def reloaded_by_itself(page: Page, ending: str) -> None:
    """Wait for the page's own periodic load to fetch an API path ending so (and land)."""
    with page.expect_response(lambda answer: answer.url.endswith(ending), timeout=30_000):
        pass


def test_a_pause_in_typing_that_ends_after_next_keeps_the_second_page(
    url: str, api: httpx.Client, page_as: Callable[..., Page]
) -> None:
    # The race of test_filters_and_paging made certain with the page's clock held: the
    # prefix is typed and 25 a page chosen (which applies the prefix too), then "Next" is
    # clicked before the 300 ms pause in typing ends. The pause ending later, with the
    # filters unchanged, must not send the pager back to page 1, nor must a refresh.
    for index in range(30):
        create(api, f"tp-{index:02d}")
    page = page_as(READ)
    start = datetime.now(UTC)
    page.clock.install(time=start)
    page.goto(f"{url}/ui/")
    page.clock.pause_at(start + timedelta(minutes=1))
    page.fill("input[name=prefix]", "tp-")
    page.select_option("select[name=limit]", "25")
    names = page.locator("#jobs tbody tr td:first-child")
    expect(names).to_have_text([f"tp-{index:02d}" for index in range(25)])
    page.click("#next-page")
    second = [f"tp-{index:02d}" for index in range(25, 30)]
    expect(names).to_have_text(second)
    updated = page.locator("#updated").inner_text()
    page.clock.run_for(6000)  # the pause in typing ends, then the refresh is due
    expect(page.locator("#updated")).not_to_have_text(updated)
    expect(page.locator("#page-number")).to_have_text("Page 2")
    expect(names).to_have_text(second)
    expect(page.locator("#prev-page")).to_be_enabled()


def test_the_sort_control_orders_the_table_by_next_run(
    url: str, api: httpx.Client, page_as: Callable[..., Page]
) -> None:
    soon = datetime.now(UTC) + timedelta(days=2)
    for name, hours in (("srt-a", 3), ("srt-b", 1), ("srt-c", 2)):
        at = (soon + timedelta(hours=hours)).isoformat()
        create(api, name, schedule={"kind": "once", "at": at})
    create(api, "srt-d-paused")
    assert api.post("/v1/jobs/srt-d-paused/pause").status_code == 200
    page = page_as(READ)
    page.goto(f"{url}/ui/?prefix=srt-")
    names = page.locator("#jobs tbody tr td:first-child")
    expect(names).to_have_text(["srt-a", "srt-b", "srt-c", "srt-d-paused"])
    page.select_option("select[name=sort]", "next_run")
    expect(names).to_have_text(["srt-b", "srt-c", "srt-a", "srt-d-paused"])
    page.reload()  # the order is kept in the address, like the filters
    expect(names).to_have_text(["srt-b", "srt-c", "srt-a", "srt-d-paused"])
    page.check("input[name=overdue]")  # overdue jobs list by name only: sort is off
    expect(page.locator("select[name=sort]")).to_be_disabled()
    expect(page.locator("#empty")).to_be_visible()
    assert error_text(page) == ""


def error_text(page: Page) -> str:
    """The error box's text: empty when every API call of the page succeeded."""
    box = page.locator("#error")
    return "" if box.is_hidden() else box.inner_text()


def test_a_refresh_shows_new_jobs_and_keeps_the_filters_and_scroll_position(
    url: str, api: httpx.Client, page_as: Callable[..., Page]
) -> None:
    for index in range(60):
        create(api, f"live-{index:02d}")
    create(api, "live-paused-x")
    assert api.post("/v1/jobs/live-paused-x/pause").status_code == 200
    page = page_as(READ)
    page.goto(f"{url}/ui/")
    page.fill("input[name=prefix]", "live-")
    page.select_option("select[name=limit]", "100")
    page.select_option("select[name=state]", "active")
    names = page.locator("#jobs tbody tr td:first-child")
    expect(names).to_have_count(60)
    page.evaluate("window.scrollTo(0, 400); window.notReloaded = true")
    assert page.evaluate("window.scrollY") == 400
    # Sorts last, below the rows in view: nothing above them moves.
    create(api, "live-zz-new")
    expect(names.last).to_have_text("live-zz-new", timeout=WAIT_MS)  # within a refresh
    expect(names).to_have_count(61)
    assert page.evaluate("window.notReloaded") is True, "refreshed in place, not reloaded"
    assert page.evaluate("window.scrollY") == 400
    assert page.input_value("input[name=prefix]") == "live-"
    assert page.input_value("select[name=state]") == "active"
    assert page.input_value("select[name=limit]") == "100"


def test_the_job_page_shows_runs_and_its_actions_work(
    url: str, api: httpx.Client, page_as: Callable[..., Page]
) -> None:
    create(api, "act-every-second", schedule={"kind": "interval", "every_seconds": 1})
    page = page_as(WRITE)
    page.goto(f"{url}/ui/jobs/act-every-second")
    expect(page.locator("#next-ticks li")).to_have_count(10)
    expect(page.locator("#runs tbody tr").first).to_contain_text("succeeded", timeout=60_000)

    page.fill("#pause-note", "maintenance window")
    page.click("#pause")
    expect(page.locator("#definition")).to_contain_text("maintenance window")
    job = api.get("/v1/jobs/act-every-second").json()
    assert (job["state"], job["pause_note"]) == ("paused", "maintenance window")

    page.click("#resume")
    expect(page.locator("#pause")).to_be_visible()
    assert api.get("/v1/jobs/act-every-second").json()["state"] == "active"

    api.post("/v1/jobs/act-every-second/pause")
    page.reload()
    page.click("#trigger")
    expect(page.locator("#runs tbody")).to_contain_text("manual", timeout=60_000)
    manual = api.get("/v1/jobs/act-every-second/runs").json()["items"]
    assert any(run["trigger"] == "manual" for run in manual)

    page.on("dialog", lambda dialog: dialog.accept())
    page.click("#delete")
    expect(page).to_have_url(f"{url}/ui/")
    assert api.get("/v1/jobs/act-every-second").status_code == 404


def test_pause_and_resume_wait_for_the_job_s_state(
    url: str, api: httpx.Client, page_as: Callable[..., Page]
) -> None:
    """Until the page knows whether the job is paused, it offers neither: a click on a
    Pause shown before the state arrived raced the page's own first read."""
    create(api, "state-unknown")
    page = page_as(WRITE)
    # The job's own read never answers; whoami and everything else do.
    page.route(f"{url}/v1/jobs/state-unknown", lambda route: route.abort())
    page.goto(f"{url}/ui/jobs/state-unknown")
    expect(page.locator("#actions")).to_have_attribute("data-scopes", "read write")
    expect(page.locator("#trigger")).to_be_visible()
    expect(page.locator("#pause")).to_be_hidden()
    expect(page.locator("#resume")).to_be_hidden()
    page.unroute(f"{url}/v1/jobs/state-unknown")
    page.reload()
    expect(page.locator("#pause")).to_be_visible()
    expect(page.locator("#resume")).to_be_hidden()


def test_the_job_page_charts_lateness_and_duration_of_each_run(
    url: str, api: httpx.Client, page_as: Callable[..., Page]
) -> None:
    create(api, "chart-every-second", schedule={"kind": "interval", "every_seconds": 1})
    page = page_as(READ)
    page.goto(f"{url}/ui/jobs/chart-every-second")
    chart = page.locator("svg#chart")
    expect(chart).to_have_attribute("role", "img")
    expect(chart.locator(".duration circle").nth(2)).to_be_attached(timeout=60_000)
    assert api.post("/v1/jobs/chart-every-second/pause").status_code == 200
    runs: list[dict[str, object]] = []

    def all_finished() -> bool:
        runs[:] = api.get("/v1/jobs/chart-every-second/runs?limit=100").json()["items"]
        return all(run["status"] != "running" for run in runs)

    eventually(all_finished, WAIT_MS / 1000, "the last run to finish")
    ran = [run for run in runs if run["status"] != "skipped"]
    # One point per run shown, in each series (every run here is scheduled and finished).
    expect(chart).to_have_attribute("data-runs", str(len(ran)))
    expect(chart.locator(".lateness circle")).to_have_count(len(ran))
    expect(chart.locator(".duration circle")).to_have_count(len(ran))
    label = chart.get_attribute("aria-label") or ""
    assert f"the last {len(ran)} runs" in label
    assert "Lateness: median" in label
    assert "Duration: median" in label
    expect(chart).to_contain_text("Lateness (s)")
    expect(chart).to_contain_text("Duration (ms)")


def test_the_definition_masks_secret_headers_and_a_refused_action_shows_the_apis_error(
    url: str, api: httpx.Client, page_as: Callable[..., Page]
) -> None:
    args = {
        "url": "http://127.0.0.1:9/",
        "headers": {"X-Api-Key": "hunter2-secret"},
        "secret_headers": ["X-Api-Key"],
    }
    create(api, "sec-http", task="http", args=args)
    page = page_as(WRITE)
    page.goto(f"{url}/ui/jobs/sec-http")
    expect(page.locator("#args")).to_contain_text('"X-Api-Key": "***"')
    assert "hunter2-secret" not in page.content()
    assert api.delete("/v1/jobs/sec-http").status_code == 204
    page.click("#trigger")
    expect(page.locator("#error")).to_contain_text("404: no job named 'sec-http'")


def test_a_read_only_token_sees_no_action_buttons(
    url: str, api: httpx.Client, page_as: Callable[..., Page]
) -> None:
    create(api, "ro-job")
    page = page_as(READ)
    page.goto(f"{url}/ui/jobs/ro-job")
    expect(page.locator("#definition")).to_contain_text("log")
    # The actions are hidden until whoami answers: wait for its answer, then judge.
    expect(page.locator("#actions")).to_have_attribute("data-scopes", "read")
    expect(page.locator("#actions")).to_be_hidden()
    for button in ("#pause", "#resume", "#trigger", "#delete"):
        expect(page.locator(button)).to_be_hidden()
    writer = page_as(WRITE)
    writer.goto(f"{url}/ui/jobs/ro-job")
    expect(writer.locator("#trigger")).to_be_visible()


def test_the_runs_page_shows_every_jobs_runs_filtered_by_status_and_job(
    url: str, api: httpx.Client, page_as: Callable[..., Page]
) -> None:
    # Nothing listens on the discard port: the http task's run fails.
    create(api, "runs-failing", task="http", args={"url": "http://127.0.0.1:9/"})
    create(api, "runs-fine")
    for name in ("runs-failing", "runs-fine"):
        assert api.post(f"/v1/jobs/{name}/trigger").status_code == 202
    page = page_as(READ)
    page.goto(f"{url}/ui/runs")
    jobs = page.locator("#runs tbody tr td:first-child")
    page.fill("input[name=job]", "runs-failing")
    expect(jobs.first).to_have_text("runs-failing")
    expect(page.locator("#runs tbody tr").first).to_contain_text("failed", timeout=60_000)
    page.fill("input[name=job]", "")
    page.select_option("select[name=status]", "failed,timed_out,abandoned")
    expect(page.locator("#runs tbody")).to_contain_text("runs-failing")
    expect(page.locator("#runs tbody")).not_to_contain_text("runs-fine")
    page.select_option("select[name=status]", "succeeded")
    expect(page.locator("#runs tbody")).to_contain_text("runs-fine")
    expect(page.locator("#runs tbody")).not_to_contain_text("runs-failing")


@pytest.fixture(scope="module")
def target() -> Iterator[str]:
    """A webhook target: /fail answers 500 with a JSON error echoing X-Token."""
    with serving(ThreadingHTTPServer(("127.0.0.1", 0), Target), "ui-target") as started:
        yield started


def ended(api: httpx.Client, run_id: str) -> dict[str, object]:
    def done() -> dict[str, object] | None:
        run: dict[str, object] = api.get(f"/v1/runs/{run_id}").json()
        return run if run["status"] != "running" else None

    run = eventually(done, 30, f"run {run_id} to end")
    assert run is not None
    return run


def body_of(answer: Response) -> str | None:
    """The answer's body; None for one the page's load before the last dropped."""
    try:
        return answer.text()
    except PlaywrightError:
        return None


def test_a_failed_run_s_page_shows_the_webhook_s_500_body_and_each_attempt(
    url: str, api: httpx.Client, page_as: Callable[..., Page], target: str
) -> None:
    secret = "ui-5ecret-token"
    args = {"url": f"{target}/fail", "headers": {"X-Token": secret}, "secret_headers": ["X-Token"]}
    retry = {"max_attempts": 2, "min_backoff_seconds": 0.2}
    create(api, "ui-fails", task="http", args=args, retry=retry)
    run = ended(api, api.post("/v1/jobs/ui-fails/trigger").json()["id"])
    page = page_as(READ)
    page.goto(f"{url}/ui/jobs/ui-fails")
    page.click("#runs tbody tr a")
    expect(page).to_have_url(f"{url}/ui/runs/{run['id']}")
    answers: list[Response] = []  # of the run page, loaded again: what its calls got
    # A plain function: Playwright tags the handler it is given, which a builtin refuses.
    page.on("response", lambda answer: answers.append(answer))  # noqa: PLW0108
    page.reload()
    expect(page.locator("#run-status")).to_have_text("failed")
    expect(page.locator("#answer")).to_contain_text("500")
    expect(page.locator("#body")).to_contain_text('"error": "token rejected"')
    expect(page.locator("#body")).to_contain_text('"token": "***"')
    expect(page.locator("#facts")).to_contain_text("answered HTTP 500")
    attempts = page.locator("#attempts tbody tr")
    expect(attempts).to_have_count(2)
    for n in range(2):
        expect(attempts.nth(n).locator("td").first).to_have_text(str(n + 1))
        expect(attempts.nth(n)).to_contain_text("answered HTTP 500")
        expect(attempts.nth(n).locator(".badge")).to_have_text("failed")
    assert page.locator("#actions").is_hidden()  # a read-only token: no Cancel
    bodies = [body_of(answer) for answer in answers if "/v1/" in answer.url]
    assert [body for body in bodies if body is not None]
    assert not [body for body in bodies if body is not None and secret in body]


def test_the_job_page_reads_in_words_and_the_last_failure_stands_out(
    url: str, api: httpx.Client, page_as: Callable[..., Page], target: str, receiver: Receiver
) -> None:
    alert = {"on": ["failure"], "action": {"kind": "http", "args": {"url": receiver.url_for("/a")}}}
    create(
        api,
        "ui-words",
        task="http",
        args={"url": f"{target}/fail"},
        retry={"max_attempts": 3, "min_backoff_seconds": 1, "max_backoff_seconds": 60},
        hooks=[alert],
        max_runs=5,
    )
    run = ended(api, api.post("/v1/jobs/ui-words/trigger").json()["id"])
    page = page_as(READ)
    page.goto(f"{url}/ui/jobs/ui-words")
    failure = page.locator("#last-failure")
    expect(failure).to_contain_text("answered HTTP 500")
    expect(page.locator("#definition")).to_contain_text(
        "up to 3 attempts, waiting 1 s at first, doubling 5 times, at most 60 s"
    )
    expect(page.locator("#definition")).to_contain_text("always")
    # A manual run does not count towards the cap; only scheduled ones do.
    expect(page.locator("#definition")).to_contain_text("0 used of 5")
    expect(page.locator("#hooks")).to_contain_text(f"on failure: POST {receiver.url_for('/a')}")
    expect(page.locator("#deliveries tbody")).to_contain_text("delivered")
    assert '"max_attempts": 3' in page.locator("#policies-json").text_content()
    failure.get_by_role("link").click()
    expect(page).to_have_url(f"{url}/ui/runs/{run['id']}")


def test_a_running_run_is_cancelled_from_its_page_with_a_reason(
    url: str, api: httpx.Client, page_as: Callable[..., Page], receiver: Receiver
) -> None:
    create(api, "ui-hung", task="http", args={"url": receiver.url_for("/ui-hung", seconds=60)})
    run_id = api.post("/v1/jobs/ui-hung/trigger").json()["id"]
    page = page_as(WRITE)
    page.goto(f"{url}/ui/runs/{run_id}")
    expect(page.locator("#run-status")).to_have_text("running")
    page.fill("#cancel-reason", "stuck on a dead host")
    reloaded_by_itself(page, f"/v1/runs/{run_id}/log")  # a refresh keeps the reason typed
    expect(page.locator("#cancel-reason")).to_have_value("stuck on a dead host")
    page.click("#cancel")
    expect(page.locator("#run-status")).to_have_text("cancelled")
    expect(page.locator("#facts")).to_contain_text("stuck on a dead host")
    expect(page.locator("#cancel-form")).to_be_hidden()
    run = api.get(f"/v1/runs/{run_id}").json()
    assert run["status"] == "cancelled"
    assert run["error"].startswith("cancelled by dashboard (127.0.0.1, token ")
    assert run["error"].endswith(": stuck on a dead host")


def test_a_cron_job_made_with_the_form_alone_fires_and_its_secret_never_comes_back(
    url: str, api: httpx.Client, page_as: Callable[..., Page], receiver: Receiver
) -> None:
    """A 6-field cron in Kyiv's zone, an http task with a secret header, through the
    form: the next 10 ticks it shows are the API's, the job fires at the receiver, and
    the secret is in no answer the browser got."""
    secret = "form-5ecret-value"
    page = page_as(WRITE)
    answers: list[Response] = []
    page.goto(f"{url}/ui/")
    page.click("#new-job")
    expect(page).to_have_url(f"{url}/ui/new")
    page.on("response", lambda answer: answers.append(answer))  # noqa: PLW0108
    page.fill("#f-name", "ui-kyiv")
    page.select_option("#f-kind", "cron")
    page.fill("#f-expression", "*/2 * * * *")
    page.check("#f-seconds")
    expect(page.locator("#f-expression")).to_have_value("0 */2 * * * *")
    page.fill("#f-expression", "*/2 * * * * *")
    page.fill("#f-timezone", "Europe/Kyiv")
    page.select_option("#f-task", "http")
    page.fill("#a-url", receiver.url_for("/form"))
    expect(page.locator("#a-timeout_seconds")).to_have_attribute("max", "3600")
    expect(page.locator("#a-timeout_seconds-help")).to_contain_text("above 0 to 3600.")
    page.click("#a-headers-add")
    page.fill("#a-headers-0-name", "X-Token")
    page.fill("#a-headers-0-value", secret)
    page.check("#a-headers-0-secret")
    expect(page.locator("#a-headers-0-value")).to_have_attribute("type", "password")
    ticks = page.locator("#preview-ticks tbody td:first-child time")
    expect(ticks).to_have_count(10)
    expect(page.locator("#schedule-words")).not_to_be_empty()
    shown = [ticks.nth(n).get_attribute("datetime") for n in range(10)]
    first = datetime.fromisoformat(str(shown[0]).replace("Z", "+00:00"))
    preview = api.post(
        "/v1/schedules/preview",
        json={
            "schedule": {"kind": "cron", "expression": "*/2 * * * * *"},
            "timezone": "Europe/Kyiv",
            "after": (first - timedelta(microseconds=1)).isoformat(),
            "count": 10,
        },
    ).json()["fire_times"]
    assert [datetime.fromisoformat(str(t).replace("Z", "+00:00")) for t in shown] == [
        datetime.fromisoformat(t.replace("Z", "+00:00")) for t in preview
    ]
    page.click("#save")
    expect(page).to_have_url(f"{url}/ui/jobs/ui-kyiv")
    job = api.get("/v1/jobs/ui-kyiv").json()
    assert (job["timezone"], job["schedule"]["expression"]) == ("Europe/Kyiv", "*/2 * * * * *")
    assert job["args"]["headers"] == {"X-Token": "***"}
    eventually(lambda: receiver.receipts("ui-kyiv"), 30, "the job's first fire")
    assert receiver.receipts("ui-kyiv")[0].headers["x-token"] == secret
    api.post("/v1/jobs/ui-kyiv/pause")
    bodies = [body_of(answer) for answer in answers if "/v1/" in answer.url]
    assert not [body for body in bodies if body is not None and secret in body]


def test_the_json_tab_and_the_form_hold_the_same_body_both_ways(
    url: str, api: httpx.Client, page_as: Callable[..., Page]
) -> None:
    page = page_as(WRITE)
    page.goto(f"{url}/ui/new")
    page.fill("#f-name", "ui-json")
    page.fill("#f-description", "from the form")
    page.select_option("#f-kind", "interval")
    page.fill("#f-every", "30")
    page.fill("#a-message", "hello")
    page.click("#tab-json")
    pasted = json.loads(page.input_value("#f-json"))
    assert (pasted["name"], pasted["description"]) == ("ui-json", "from the form")
    assert pasted["schedule"] == {"kind": "interval", "every_seconds": 30}
    # Pasted over: fields the form shows, and one it has no field for (max_runs).
    pasted |= {"description": "pasted", "timezone": "Asia/Tokyo", "labels": {"team": "json"}}
    page.fill("#f-json", json.dumps(pasted | {"max_runs": 3}))
    page.click("#tab-form")
    expect(page.locator("#f-description")).to_have_value("pasted")
    expect(page.locator("#f-timezone")).to_have_value("Asia/Tokyo")
    expect(page.locator("#f-labels")).to_have_value("team=json")
    page.fill("#f-every", "45")
    page.click("#tab-json")
    back = json.loads(page.input_value("#f-json"))
    assert (back["schedule"]["every_seconds"], back["max_runs"]) == (45, 3)
    # Not an object yet: the JSON tab stays, and says why.
    page.fill("#f-json", "{")
    page.click("#tab-form")
    expect(page.locator("#json-error")).to_contain_text("not a JSON object")
    expect(page.locator("#f-json")).to_be_visible()
    page.fill("#f-json", json.dumps(back))
    page.click("#save")  # from the JSON tab
    expect(page).to_have_url(f"{url}/ui/jobs/ui-json")
    job = api.get("/v1/jobs/ui-json").json()
    assert job["args"] == {"message": "hello"}
    assert (job["description"], job["timezone"], job["labels"]) == (
        "pasted",
        "Asia/Tokyo",
        {"team": "json"},
    )
    assert (job["schedule"]["every_seconds"], job["max_runs"]) == (45, 3)


def test_the_api_s_field_problems_show_beside_their_fields_and_nothing_is_made(
    url: str, api: httpx.Client, page_as: Callable[..., Page]
) -> None:
    page = page_as(WRITE)
    page.goto(f"{url}/ui/new")
    page.fill("#f-name", "ui-bad")
    page.fill("#f-expression", "99 * * * *")
    page.select_option("#f-task", "http")
    page.click("#save")
    expression = page.locator("#f-expression")
    expect(expression).to_have_attribute("aria-invalid", "true")
    problem = page.locator("#f-expression ~ .field-problem")
    expect(problem).to_contain_text("99")
    page.fill("#f-expression", "0 3 * * *")
    page.click("#save")
    expect(page.locator("#a-url")).to_have_attribute("aria-invalid", "true")
    expect(page.locator("#a-url ~ .field-problem")).to_contain_text("required")
    expect(expression).not_to_have_attribute("aria-invalid", "true")
    assert api.get("/v1/jobs/ui-bad").status_code == 404


def test_an_edit_racing_another_change_gets_the_412_choice_and_loses_nothing(
    url: str, api: httpx.Client, page_as: Callable[..., Page]
) -> None:
    create(api, "ui-race", description="first")
    page = page_as(WRITE)
    page.goto(f"{url}/ui/jobs/ui-race/edit")
    expect(page.locator("#f-description")).to_have_value("first")
    assert api.patch("/v1/jobs/ui-race", json={"description": "theirs"}).status_code == 200
    page.fill("#f-description", "mine")
    page.click("#save")
    expect(page.locator("#conflict")).to_be_visible()
    expect(page.locator("#theirs")).to_contain_text('description: "theirs"')
    assert api.get("/v1/jobs/ui-race").json()["description"] == "theirs"
    page.click("#reload")
    expect(page.locator("#f-description")).to_have_value("theirs")
    page.fill("#f-description", "mine, after reading theirs")
    page.click("#save")
    expect(page).to_have_url(f"{url}/ui/jobs/ui-race")
    assert api.get("/v1/jobs/ui-race").json()["description"] == "mine, after reading theirs"
    # The other choice: overwrite their change with mine, knowingly.
    page.goto(f"{url}/ui/jobs/ui-race/edit")
    expect(page.locator("#f-description")).to_have_value("mine, after reading theirs")
    theirs = {"description": "theirs again", "labels": {"team": "theirs"}}
    assert api.patch("/v1/jobs/ui-race", json=theirs).status_code == 200
    page.fill("#f-description", "mine, over theirs")
    page.click("#save")
    expect(page.locator("#theirs")).to_contain_text('labels: {"team":"theirs"}')
    page.click("#overwrite")
    expect(page).to_have_url(f"{url}/ui/jobs/ui-race")
    stored = api.get("/v1/jobs/ui-race").json()
    assert (stored["description"], stored["labels"]) == ("mine, over theirs", {})


def test_a_one_time_job_in_another_zone_is_edited_without_moving(
    url: str, api: httpx.Client, page_as: Callable[..., Page]
) -> None:
    once = {"kind": "once", "at": "2031-06-01T03:30:00"}  # a wall time in Kyiv (UTC+3)
    at = create(api, "ui-once", schedule=once, timezone="Europe/Kyiv")["schedule"]["at"]
    page = page_as(WRITE)
    page.goto(f"{url}/ui/jobs/ui-once/edit")
    expect(page.locator("#f-at")).to_have_value(re.compile(r"^2031-06-01T03:30(:00)?$"))
    page.fill("#f-description", "moved nothing")
    page.click("#save")
    expect(page).to_have_url(f"{url}/ui/jobs/ui-once")
    job = api.get("/v1/jobs/ui-once").json()
    assert (job["description"], job["schedule"]["at"]) == ("moved nothing", at)
    assert datetime.fromisoformat(at.replace("Z", "+00:00")).hour == 0


def test_a_managed_job_opens_read_only_until_edit_anyway(
    url: str, api: httpx.Client, page_as: Callable[..., Page]
) -> None:
    create(api, "ui-managed", managed_by="helm:billing", labels={"team": "x"})
    page = page_as(WRITE)
    page.goto(f"{url}/ui/jobs/ui-managed/edit")
    expect(page.locator("#managed")).to_contain_text("helm:billing")
    expect(page.locator("#f-description")).to_be_disabled()
    expect(page.locator("#save")).to_be_disabled()
    page.click("#edit-anyway")
    expect(page.locator("#managed")).to_contain_text("next apply")
    page.fill("#f-description", "edited anyway")
    page.fill("#f-labels", "")
    page.click("#save")
    expect(page).to_have_url(f"{url}/ui/jobs/ui-managed")
    job = api.get("/v1/jobs/ui-managed").json()
    assert (job["description"], job["managed_by"], job["labels"]) == (
        "edited anyway",
        "helm:billing",
        {},
    )


def test_run_with_arguments_delivers_those_arguments(
    url: str, api: httpx.Client, page_as: Callable[..., Page], receiver: Receiver
) -> None:
    create(api, "ui-args", task="http", args={"url": receiver.url_for("/args"), "body": {"v": 1}})
    page = page_as(WRITE)
    page.goto(f"{url}/ui/jobs/ui-args")
    page.click("#run-with-args")
    body = page.locator("#run-args #a-body")
    expect(body).to_have_value('{\n  "v": 1\n}')
    body.fill('{"v": 2}')
    page.fill("#run-note", "louder")
    reloaded_by_itself(page, "/v1/jobs/ui-args")  # the typing stays through it
    expect(body).to_have_value('{"v": 2}')
    expect(page.locator("#run-note")).to_have_value("louder")
    page.click("#run-args-go")
    expect(page.locator("#notice a")).to_be_visible()
    page.click("#notice a")
    expect(page.locator("#run-status")).to_have_text("succeeded")
    [delivered] = eventually(lambda: receiver.receipts("ui-args"), 30, "the delivery")
    assert json.loads(delivered.body) == {"v": 2}
    assert api.get("/v1/jobs/ui-args").json()["args"]["body"] == {"v": 1}
    [run] = api.get("/v1/jobs/ui-args/runs").json()["items"]
    assert (run["args"]["body"], run["note"]) == ({"v": 2}, "louder")


def test_hooks_retry_and_a_daily_anchor_are_made_with_fields_and_a_kept_secret_stays_its_own(
    url: str, api: httpx.Client, page_as: Callable[..., Page], receiver: Receiver
) -> None:
    """Hooks are cards of fields (the webhook's those of the http task, a secret header
    masked), as are the retry policy and a daily schedule's first day. Removing one of
    two hooks with secrets of the same name leaves the other its own."""
    create(api, "ui-next")
    receiver.respond("/down", status=500)
    page = page_as(WRITE)
    page.goto(f"{url}/ui/new")
    page.fill("#f-name", "ui-hooked")
    page.select_option("#f-task", "http")
    page.fill("#a-url", receiver.url_for("/down"))
    page.select_option("#f-kind", "daily")
    page.fill("#f-times", "03:00")
    page.fill("#f-every-days", "2")
    page.fill("#f-anchor-date", "2030-01-02")
    page.fill("#f-doublings", "3")
    page.fill("#f-retry-for", "120")
    for n, name in enumerate(["first", "second"]):
        page.click("#add-hook")
        expect(page.locator(f"#hook-{n}-on-failure")).to_be_focused()
        page.fill(f"#h{n}-url", receiver.url_for(f"/{name}"))
        page.click(f"#h{n}-headers-add")
        page.fill(f"#h{n}-headers-0-name", "X-Token")
        page.fill(f"#h{n}-headers-0-value", f"{name}-s3cret")
        page.check(f"#h{n}-headers-0-secret")
    page.click("#add-hook")
    page.check("#hook-2-on-success")
    page.uncheck("#hook-2-on-failure")
    page.select_option("#hook-2-kind", "trigger")
    page.fill("#hook-2-job", "ui-next")
    page.fill("#hook-2-attempts", "2")
    page.click("#save")
    expect(page).to_have_url(f"{url}/ui/jobs/ui-hooked")
    job = api.get("/v1/jobs/ui-hooked").json()
    assert job["schedule"]["anchor_date"] == "2030-01-02"
    assert (job["retry"]["max_doublings"], job["retry"]["max_retry_seconds"]) == (3, 120)
    assert [hook["on"] for hook in job["hooks"]] == [["failure"], ["failure"], ["success"]]
    assert job["hooks"][1]["action"]["args"]["headers"] == {"X-Token": "***"}
    assert (job["hooks"][2]["action"]["kind"], job["hooks"][2]["action"]["job"]) == (
        "trigger",
        "ui-next",
    )
    assert job["hooks"][2]["retry"]["max_attempts"] == 2
    page.goto(f"{url}/ui/jobs/ui-hooked/edit")
    expect(page.locator("#h1-headers-0-value")).to_have_attribute("type", "password")
    expect(page.locator("#h1-headers-0-value")).to_have_value("***")
    page.click("#hook-0-remove")
    expect(page.locator("#hook-list .hook")).to_have_count(2)
    expect(page.locator("#h0-url")).to_have_value(receiver.url_for("/second"))
    page.click("#save")
    expect(page).to_have_url(f"{url}/ui/jobs/ui-hooked")
    assert api.post("/v1/jobs/ui-hooked/trigger").status_code == 202
    [alert] = eventually(
        lambda: [r for r in receiver.receipts("ui-hooked") if r.path == "/second"], 30, "alert"
    )
    assert alert.headers["x-token"] == "second-s3cret"


def tab_to(page: Page, control: str, seen: list[str]) -> None:
    """Press Tab until `control` has the focus (at most 80 times), noting each stop."""
    for _ in range(80):
        seen.append(page.evaluate("document.activeElement.id"))
        if seen[-1] == control:
            return
        page.keyboard.press("Tab")
    raise AssertionError(f"Tab never reached #{control}: {seen}")


def test_the_job_form_is_usable_with_the_keyboard_alone(
    url: str, api: httpx.Client, page_as: Callable[..., Page]
) -> None:
    page = page_as(WRITE)
    page.goto(f"{url}/ui/new")
    page.evaluate("document.addEventListener('focusin', (e) => { e.target.dataset.reached = 1; })")
    expect(page.locator("#f-name")).to_be_enabled()
    page.locator("#f-name").focus()
    page.keyboard.type("ui-keys")
    seen: list[str] = []
    tab_to(page, "f-expression", seen)
    page.keyboard.type("0 3 * * *")
    tab_to(page, "f-timezone", seen)
    tab_to(page, "a-message", seen)
    page.keyboard.type("typed, not clicked")
    tab_to(page, "add-hook", seen)
    page.keyboard.press("Enter")
    expect(page.locator("#hook-0-on-failure")).to_be_focused()
    tab_to(page, "h0-url", seen)
    page.keyboard.type(f"{url}/hook")
    tab_to(page, "h0-headers-add", seen)
    page.keyboard.press("Enter")
    page.keyboard.type("X-Key")
    page.keyboard.press("Tab")
    page.keyboard.type("by-keys")
    tab_to(page, "h0-headers-0-secret", seen)
    page.keyboard.press("Space")
    tab_to(page, "save", seen)
    # The keyboard reached every control the form shows (each marked as it took focus).
    shown, missed = page.evaluate(
        """() => {
        const all = [...document.querySelectorAll('#job-form :is(input, select, textarea, button)')]
          .filter((node) => !node.disabled && node.checkVisibility());
        return [all.length, all.filter((node) => !node.dataset.reached).map((n) => n.outerHTML)];
        }"""
    )
    assert shown > 40
    assert missed == []
    page.keyboard.press("Enter")
    expect(page).to_have_url(f"{url}/ui/jobs/ui-keys")
    job = api.get("/v1/jobs/ui-keys").json()
    assert (job["schedule"]["expression"], job["args"]) == (
        "0 3 * * *",
        {"message": "typed, not clicked"},
    )
    [hook] = job["hooks"]
    assert (hook["on"], hook["action"]["args"]["url"]) == (["failure"], f"{url}/hook")
    assert hook["action"]["args"]["headers"] == {"X-Key": "***"}


def test_run_with_arguments_and_cancel_are_usable_with_the_keyboard_alone(
    url: str, api: httpx.Client, page_as: Callable[..., Page], receiver: Receiver
) -> None:
    hung = receiver.url_for("/keys", seconds=60)
    create(api, "ui-keys-run", task="http", args={"url": hung, "body": {"v": 1}})
    page = page_as(WRITE)
    page.goto(f"{url}/ui/jobs/ui-keys-run")
    expect(page.locator("#run-with-args")).to_be_visible()
    seen: list[str] = []
    tab_to(page, "run-with-args", seen)
    page.keyboard.press("Enter")
    tab_to(page, "a-body", seen)
    page.keyboard.press("Control+A")
    page.keyboard.type('{"v": 3}')
    tab_to(page, "run-note", seen)
    page.keyboard.type("by keys")
    tab_to(page, "run-args-go", seen)
    page.keyboard.press("Enter")
    expect(page.locator("#notice a")).to_be_focused()
    [delivered] = eventually(lambda: receiver.receipts("ui-keys-run"), 30, "the delivery")
    assert json.loads(delivered.body) == {"v": 3}
    page.keyboard.press("Enter")
    expect(page.locator("#run-status")).to_have_text("running")
    tab_to(page, "cancel-reason", seen)
    page.keyboard.type("typed reason")
    tab_to(page, "cancel", seen)
    page.keyboard.press("Enter")
    expect(page.locator("#run-status")).to_have_text("cancelled")
    expect(page.locator("#facts")).to_contain_text("typed reason")


def test_the_api_docs_render_their_operations_offline(
    url: str, page_as: Callable[..., Page]
) -> None:
    page = page_as(None)
    page.goto(f"{url}/docs")
    expect(page.locator(".opblock").first).to_be_visible()
    assert page.locator(".opblock").count() > 10


def test_the_cluster_page_lists_the_live_replicas(
    server: Replica, database_url: str, page_as: Callable[..., Page], tmp_path: Path
) -> None:
    page = page_as(READ)
    page.goto(f"{server.url}/ui/")
    page.click("nav >> text=Cluster")
    expect(page).to_have_url(f"{server.url}/ui/cluster")
    runners = page.locator("#members tbody tr td:first-child")
    expect(runners).to_have_text([server.runner_id])
    with started(tmp_path, database_url) as second:
        # The page refreshes itself: the second replica shows up without a reload.
        expect(runners).to_have_text([server.runner_id, second.runner_id])
        row = page.locator("#members tbody tr", has_text=second.runner_id)
        expect(row.locator("td").nth(1)).to_have_text(re.compile(r"\d+\.\d+"))
        expect(row.locator("td").nth(6)).to_have_text(re.compile(r"^\d+ s ago$"))
    expect(page.locator("#overdue-summary")).to_contain_text("overdue")
    expect(runners).to_have_text([server.runner_id])


def violations(page: Page) -> list[str]:
    """axe-core's findings on the page as it stands, at every impact from minor to critical,
    one line each (axe.min.js as the axe-playwright-python package ships it: nothing fetched)."""
    return [
        f"{v['id']} ({v['impact']}): {v['help']}; {[n['target'] for n in v['nodes']][:5]}"
        for v in Axe().run(page).response["violations"]
    ]


def test_no_accessibility_violations_at_any_impact(
    url: str, api: httpx.Client, page_as: Callable[..., Page]
) -> None:
    create(api, "a11y-every-second", schedule={"kind": "interval", "every_seconds": 1})
    create(api, "a11y-paused")
    assert api.post("/v1/jobs/a11y-paused/pause", json={"note": "x"}).status_code == 200
    run = ended(api, api.post("/v1/jobs/a11y-paused/trigger").json()["id"])
    secret = {"url": f"{url}/hook", "headers": {"X-Token": "t"}, "secret_headers": ["X-Token"]}
    hooks = [
        {"on": ["failure"], "action": {"kind": "http", "args": secret}},
        {"on": ["success"], "action": {"kind": "trigger", "job": "a11y-paused"}},
    ]
    create(api, "a11y-hooked", task="http", args=secret, hooks=hooks)
    pages = {
        "/ui/?prefix=a11y-": "#jobs tbody tr",
        "/ui/jobs/a11y-every-second": "svg#chart circle",
        "/ui/runs": "#runs tbody tr",
        f"/ui/runs/{run['id']}": "#facts dd",
        "/ui/new": "#f-task option",
        "/ui/jobs/a11y-paused/edit": "#args .field",
        "/ui/jobs/a11y-hooked/edit": "#hook-list .hook .pair",
        "/ui/cluster": "#members tbody tr",
    }
    found = {}
    for token in (WRITE, None):  # with a token, and asking for one
        page = page_as(token)
        for path, ready in pages.items():
            page.goto(f"{url}{path}")
            if token is None:
                expect(page.locator("#token-form")).to_be_visible()
            else:
                expect(page.locator(ready)).not_to_have_count(0)
            found[f"{path} ({'token' if token else 'no token'})"] = violations(page)
    assert found == {key: [] for key in found}, json.dumps(found, indent=1)


@pytest.mark.parametrize("width", [1280, 390])
def test_the_layout_holds(
    url: str, api: httpx.Client, page_as: Callable[..., Page], width: int
) -> None:
    name = f"layout-{width}-a-rather-long-job-name-that-should-wrap"
    create(api, name, description="x " * 80)
    page = page_as(WRITE, width)
    triggered = api.post(f"/v1/jobs/{name}/trigger")
    assert triggered.status_code == 202
    shown = {"/ui/": name, f"/ui/jobs/{name}": name, f"/ui/runs?job={name}": name}
    shown[f"/ui/runs/{triggered.json()['id']}"] = name
    shown[f"/ui/jobs/{name}/edit"] = "Schedule"
    # The cluster page shows the replica's version.
    for path, text in (shown | {"/ui/cluster": version("tickgate")}).items():
        page.goto(f"{url}{path}")
        expect(page.locator("main")).to_contain_text(text, timeout=60_000)
        overflow = page.evaluate(
            "document.documentElement.scrollWidth - document.documentElement.clientWidth"
        )
        assert overflow <= 0, f"{path} overflows {overflow}px sideways at {width}px"


def test_screenshots_of_the_jobs_job_cluster_form_and_run_pages(
    server: Replica,
    database_url: str,
    api: httpx.Client,
    page_as: Callable[..., Page],
    tmp_path: Path,
    target: str,
) -> None:
    """`make screenshots` runs this alone with TICKGATE_UI_SCREENSHOTS=docs/img."""
    url = server.url
    folder = Path(os.environ.get("TICKGATE_UI_SCREENSHOTS") or tmp_path)
    create(api, "demo-backup", schedule={"kind": "daily", "at": ["03:00"]}, timezone="Europe/Kyiv")
    alert = {
        "url": f"{target}/alert",
        "headers": {"X-Token": "t0ken"},
        "secret_headers": ["X-Token"],
    }
    create(
        api,
        "demo-report",
        schedule={"kind": "cron", "expression": "30 9 * * MON-FRI"},
        hooks=[{"on": ["failure"], "action": {"kind": "http", "args": alert}}],
    )
    create(api, "demo-heartbeat", schedule={"kind": "interval", "every_seconds": 2})
    create(api, "demo-webhook", task="http", args={"url": f"{target}/fail"})
    assert api.post("/v1/jobs/demo-webhook/trigger").status_code == 202
    create(api, "demo-archive", schedule={"kind": "cron", "expression": "@monthly"})
    assert api.post("/v1/jobs/demo-archive/pause", json={"note": "disk full"}).status_code == 200
    page = page_as(WRITE)
    page.goto(f"{url}/ui/jobs/demo-heartbeat")
    expect(page.locator("#runs tbody tr").nth(3)).to_be_visible(timeout=60_000)
    page.screenshot(path=folder / "dashboard-job.png", full_page=True)
    assert api.post("/v1/jobs/demo-heartbeat/pause", json={"note": "demo"}).status_code == 200
    page.goto(f"{url}/ui/?prefix=demo-")
    expect(page.locator("#jobs tbody tr")).to_have_count(5)
    expect(page.locator("#jobs tbody")).to_contain_text("failed", timeout=60_000)
    page.screenshot(path=folder / "dashboard-jobs.png", full_page=True)
    with started(tmp_path, database_url):
        page.goto(f"{url}/ui/cluster")
        expect(page.locator("#members tbody tr")).to_have_count(2)
        for row in (page.locator("#members tbody tr").nth(n) for n in (0, 1)):
            expect(row.locator("td").nth(5)).to_have_text(re.compile(" ago$"))  # synced
        page.screenshot(path=folder / "dashboard-cluster.png", full_page=True)
    page.goto(f"{url}/ui/jobs/demo-report/edit")
    expect(page.locator("#preview-ticks tbody tr")).to_have_count(10)
    page.screenshot(path=folder / "dashboard-form.png", full_page=True)
    [failed] = api.get("/v1/jobs/demo-webhook/runs").json()["items"]
    page.goto(f"{url}/ui/runs/{failed['id']}")
    expect(page.locator("#run-status")).to_have_text("failed")
    expect(page.locator("#body")).to_contain_text("token rejected")
    page.screenshot(path=folder / "dashboard-run.png", full_page=True)
    shots = ("jobs", "job", "cluster", "form", "run")
    for name in (f"dashboard-{shot}.png" for shot in shots):
        assert (folder / name).read_bytes().startswith(b"\x89PNG"), name


def test_the_dashboard_works_against_a_server_without_tokens(
    database_url: str, tmp_path: Path, page_as: Callable[..., Page]
) -> None:
    """What `make run` serves refuses foreign `Host`s and cross-site changes (#42): the
    dashboard, same-origin, still acts on a job. (A replica without tokens, beside the
    module's, on its database.)"""
    replica = start_replica(tmp_path, database_url=database_url)
    try:
        eventually(replica.answers, START_DEADLINE_SECONDS, "the replica")
        made = httpx.post(
            f"{replica.url}/v1/jobs", json={"name": "open-job", "schedule": NEVER, **LOG}
        )
        assert made.status_code == 201, made.text
        page = page_as(None)
        page.goto(f"{replica.url}/ui/jobs/open-job")
        expect(page.locator("#pause")).to_be_visible()
        page.click("#pause")
        expect(page.locator("#resume")).to_be_visible()
        job = httpx.get(f"{replica.url}/v1/jobs/open-job").json()
    finally:
        replica.stop()
    assert job["state"] == "paused"
