"""A thin typed client of the Tickgate v1 REST API over httpx.

Pure HTTP: it knows the paths and the error shapes, nothing of the server's internals.
JSON bodies are returned as they came (`JsonObject`), so callers can print them verbatim.
"""

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Self
from urllib.parse import quote

import httpx

JsonObject = dict[str, object]

DEFAULT_URL = "http://127.0.0.1:8080"
MAX_PAGE = 1000  # the API's largest `limit`


class ClientError(Exception):
    """Base of every error this client raises."""


class Unreachable(ClientError):
    """No HTTP answer from the server: refused, timed out, reset, bad address."""

    def __init__(self, url: str, reason: str) -> None:
        super().__init__(f"cannot reach the Tickgate server at {url}: {reason}")
        self.url = url
        self.reason = reason


@dataclass(frozen=True)
class Problem:
    """One entry of a 422 answer: where, what is wrong, and the value given."""

    loc: tuple[str, ...]
    msg: str
    input: object
    has_input: bool

    @classmethod
    def parse(cls, entry: object) -> "Problem":
        """A FastAPI 422 entry (`loc`, `msg`, `input`), or an RFC 9457 `errors` entry
        that names its place by `loc` or a JSON `pointer` and says what by `detail`."""
        if not isinstance(entry, dict):
            return cls((), str(entry), None, has_input=False)
        loc, pointer = entry.get("loc"), entry.get("pointer")
        parts = tuple(str(part) for part in loc) if isinstance(loc, list) else ()
        if not parts and isinstance(pointer, str):
            parts = tuple(part for part in pointer.lstrip("#").split("/") if part)
        msg = entry.get("msg", entry.get("detail", ""))
        return cls(parts, str(msg), entry.get("input"), "input" in entry)


class ApiError(ClientError):
    """The server answered with a 4xx or 5xx status."""

    def __init__(self, status: int, detail: object, method: str, url: str) -> None:
        super().__init__(f"{method} {url}: HTTP {status}: {detail}")
        self.status = status
        self.detail = detail
        self.method = method
        self.url = url

    @property
    def problems(self) -> list[Problem]:
        """The field problems of a 422 (`{"detail": [...]}`, or a problem's `errors`);
        empty for other answers."""
        if not isinstance(self.detail, list):
            return []
        return [Problem.parse(entry) for entry in self.detail]


@dataclass(frozen=True)
class Page:
    """A page of a listing: its items and the cursor of the next page (None at the end)."""

    items: list[JsonObject]
    next_cursor: str | None

    def document(self) -> JsonObject:
        """The page as the API shapes it."""
        return {"items": list(self.items), "next_cursor": self.next_cursor}


@dataclass(frozen=True)
class Applied:
    """The answer to PUT /v1/jobs/{name}: 201 when it created the job, 200 otherwise."""

    status: int
    job: JsonObject

    @property
    def created(self) -> bool:
        return self.status == 201


@dataclass(frozen=True)
class JobFilter:
    state: str | None = None
    task: str | None = None
    prefix: str | None = None
    labels: tuple[str, ...] = ()  # `key=value` each; a job must carry every one


FetchPage = Callable[[int, str | None], Page]
Params = dict[str, str | int | list[str] | None]


class TickgateClient:
    """Synchronous client of one Tickgate server; use as a context manager or close()."""

    def __init__(
        self,
        base_url: str = DEFAULT_URL,
        *,
        timeout: float = 10.0,
        token: str | None = None,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        headers = {"authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(
            base_url=self.base_url, timeout=timeout, transport=transport, headers=headers
        )

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self._http.close()

    # Jobs

    def list_jobs(
        self, where: JobFilter | None = None, *, limit: int = 100, cursor: str | None = None
    ) -> Page:
        where = where or JobFilter()
        params: Params = {"limit": limit, "cursor": cursor, "state": where.state}
        params |= {"task": where.task, "prefix": where.prefix, "label": list(where.labels)}
        return _page(self._request("GET", "/v1/jobs", params=params))

    def all_jobs(self, where: JobFilter | None = None, *, limit: int | None = None) -> Page:
        """Follow `next_cursor` until the end, or until `limit` jobs are in hand."""
        return collect(lambda size, cursor: self.list_jobs(where, limit=size, cursor=cursor), limit)

    def get_job(self, name: str) -> JsonObject:
        return _object(self._request("GET", _job_path(name)))

    def create_job(self, job: Mapping[str, object]) -> JsonObject:
        return _object(self._request("POST", "/v1/jobs", json=job))

    def put_job(self, name: str, job: Mapping[str, object]) -> Applied:
        response = self._request("PUT", _job_path(name), json=job)
        return Applied(response.status_code, _object(response))

    def apply_jobs(
        self,
        jobs: Sequence[Mapping[str, object]],
        *,
        managed_by: str | None,
        prune: bool,
        dry_run: bool = False,
        labels: Sequence[str] = (),
    ) -> JsonObject:
        """PUT /v1/jobs: the whole set in one transaction; counts and outcomes by name.
        A `dry_run` answers the same and changes nothing; `labels` (`key=value`) narrow
        the scope of `prune`."""
        params: Params = {"managed_by": managed_by, "prune": "true" if prune else None}
        params |= {"dry_run": "true" if dry_run else None, "label": list(labels)}
        return _object(self._request("PUT", "/v1/jobs", params=params, json={"jobs": jobs}))

    def patch_job(self, name: str, patch: Mapping[str, object]) -> JsonObject:
        return _object(self._request("PATCH", _job_path(name), json=patch))

    def delete_job(self, name: str) -> None:
        self._request("DELETE", _job_path(name))

    def pause_job(self, name: str) -> JsonObject:
        return _object(self._request("POST", f"{_job_path(name)}/pause"))

    def resume_job(self, name: str) -> JsonObject:
        return _object(self._request("POST", f"{_job_path(name)}/resume"))

    # Runs

    def trigger_job(
        self, name: str, args: JsonObject | None = None, note: str | None = None
    ) -> JsonObject:
        """Run the job now; with `args`, that run runs with them instead of the job's."""
        body = {key: value for key, value in (("args", args), ("note", note)) if value}
        return _object(self._request("POST", f"{_job_path(name)}/trigger", json=body or None))

    def list_runs(
        self,
        name: str | None,
        *,
        status: str | None = None,
        limit: int = 100,
        cursor: str | None = None,
    ) -> Page:
        """A page of the job's runs, or of every job's when `name` is None."""
        params: Params = {"limit": limit, "cursor": cursor, "status": status}
        path = "/v1/runs" if name is None else f"{_job_path(name)}/runs"
        return _page(self._request("GET", path, params=params))

    def recent_runs(
        self, name: str | None, *, status: str | None = None, limit: int | None
    ) -> Page:
        """Newest first, following `next_cursor` until `limit` runs (or all of them); of
        every job when `name` is None."""
        return collect(
            lambda size, cursor: self.list_runs(name, status=status, limit=size, cursor=cursor),
            limit,
        )

    def get_run(self, run_id: str) -> JsonObject:
        return _object(self._request("GET", f"/v1/runs/{quote(run_id, safe='')}"))

    def get_run_log(self, run_id: str) -> JsonObject:
        return _object(self._request("GET", f"/v1/runs/{quote(run_id, safe='')}/log"))

    def get_run_hooks(self, run_id: str) -> JsonObject:
        return _object(self._request("GET", f"/v1/runs/{quote(run_id, safe='')}/hooks"))

    def cancel_run(self, run_id: str, reason: str | None, by: str | None) -> JsonObject:
        """Ask the replica running the run to cancel it (202, or 409 once it ended)."""
        body = {key: value for key, value in (("reason", reason), ("by", by)) if value}
        path = f"/v1/runs/{quote(run_id, safe='')}/cancel"
        return _object(self._request("POST", path, json=body or None))

    def cancel_queued(self, name: str, reason: str | None, by: str | None) -> JsonObject:
        """Drop the tick of a queue_one job that waits for the run in progress."""
        body = {key: value for key, value in (("reason", reason), ("by", by)) if value}
        return _object(self._request("POST", f"{_job_path(name)}/queued/cancel", json=body or None))

    def backfill_job(self, name: str, start: str, end: str) -> JsonObject:
        """Run the ticks in [start, end] that have no run yet; the runs it made."""
        body = {"from": start, "to": end}
        return _object(self._request("POST", f"{_job_path(name)}/backfill", json=body))

    # Schedules and tasks

    def preview_schedule(self, request: Mapping[str, object]) -> JsonObject:
        return _object(self._request("POST", "/v1/schedules/preview", json=request))

    def list_tasks(self) -> JsonObject:
        return _object(self._request("GET", "/v1/tasks"))

    # Plumbing

    def _request(
        self,
        method: str,
        path: str,
        *,
        params: Params | None = None,
        json: Mapping[str, object] | None = None,
    ) -> httpx.Response:
        query = {key: value for key, value in (params or {}).items() if value not in (None, [])}
        try:
            response = self._http.request(method, path, params=query, json=json)
        except httpx.TransportError as error:
            raise Unreachable(self.base_url, _reason(error)) from error
        if response.is_error:
            raise ApiError(response.status_code, _detail(response), method, str(response.url))
        return response


def collect(fetch: FetchPage, limit: int | None) -> Page:
    """Pages from `fetch(size, cursor)` joined, up to `limit` items (all when None)."""
    items: list[JsonObject] = []
    cursor: str | None = None
    while True:
        wanted = MAX_PAGE if limit is None else min(MAX_PAGE, limit - len(items))
        page = fetch(wanted, cursor)
        items.extend(page.items)
        cursor = page.next_cursor
        if cursor is None or (limit is not None and len(items) >= limit):
            return Page(items, cursor)


def _job_path(name: str) -> str:
    # Dots survive quote(); "." or ".." as a path segment would be normalised away.
    quoted = quote(name, safe="")
    return f"/v1/jobs/{quoted.replace('.', '%2E') if set(name) == {'.'} else quoted}"


def _reason(error: httpx.TransportError) -> str:
    text = str(error) or type(error).__name__
    if isinstance(error, httpx.ConnectError) and "refused" in text.lower():
        return "connection refused"
    if isinstance(error, httpx.TimeoutException):
        return f"timed out ({type(error).__name__})"
    return text


def _detail(response: httpx.Response) -> object:
    try:
        body: object = response.json()
    except ValueError:
        return response.text.strip()[:500] or response.reason_phrase
    if isinstance(body, dict) and isinstance(body.get("errors"), list):
        errors: object = body["errors"]  # application/problem+json with field problems
        return errors
    if isinstance(body, dict) and "detail" in body:
        detail: object = body["detail"]
        return detail
    return body


def _object(response: httpx.Response) -> JsonObject:
    try:
        body: object = response.json()
    except ValueError as error:
        raise _unexpected(response, "not JSON") from error
    if not isinstance(body, dict):
        raise _unexpected(response, "not a JSON object")
    return {str(key): value for key, value in body.items()}


def _page(response: httpx.Response) -> Page:
    body = _object(response)
    items = body.get("items")
    cursor = body.get("next_cursor")
    if not isinstance(items, list) or not all(isinstance(item, dict) for item in items):
        raise _unexpected(response, "no list of objects in `items`")
    if cursor is not None and not isinstance(cursor, str):
        raise _unexpected(response, "`next_cursor` is not a string")
    return Page([{str(k): v for k, v in item.items()} for item in items], cursor)


def _unexpected(response: httpx.Response, what: str) -> ApiError:
    method = response.request.method
    return ApiError(response.status_code, f"unexpected answer: {what}", method, str(response.url))
