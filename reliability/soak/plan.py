"""The soak's jobs, the fleet's history, and the churn that changes it.

Every schedule here ticks on the whole POSIX seconds divisible by its period: intervals
anchored at 2026-01-01T00:00:00Z (a multiple of every period) and six-field crons
`*/5` and `*/10` in the seconds field (5 and 10 divide a minute). So the nominal ticks
of a job in any window are known from its period alone, independently of Tickgate's
schedule code.

`Fleet` records every change the harness made to a job (created, patched, deleted) as
the span from asking to knowing the outcome; a change whose outcome the harness could
not learn (the API did not answer) stays open until a later `GET` settles it. Only jobs
with no change anywhere near a window are judged in it (`Fleet.stable`).

`Churn` is a thread of its own: creates, edits (`PATCH` of the schedule or the args)
and deletes in turn at a fixed rate, round-robin over the replicas (another replica
when one does not answer), until its own deadline or its budget of operations runs out,
keeping the number of jobs within 10 % of the start.
"""

import random
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from bench.stats import latency_summary
from reliability.soak import Worker

ANCHOR = "2026-01-01T00:00:00Z"  # POSIX 1767225600, a multiple of every period below
GRACE_SECONDS = 30  # each job's misfire grace: retention keeps runs younger than +300 s
TIMEOUT_SECONDS = 30
HTTP_TIMEOUT_SECONDS = 10
REQUEST_TIMEOUT_SECONDS = 5.0
TRIES = 3  # replicas asked before an operation's outcome counts as unknown
BOUND = 0.10  # the number of jobs stays within this share of the start


@dataclass(frozen=True)
class Kind:
    """A kind of schedule, its period (ticks: whole seconds divisible by it) and its
    share of the mix."""

    label: str
    period: int
    schedule: dict[str, Any]
    share: float


def _interval(seconds: int) -> dict[str, Any]:
    return {"kind": "interval", "every_seconds": seconds, "anchor": ANCHOR}


def _cron(expression: str) -> dict[str, Any]:
    return {"kind": "cron", "expression": expression}


KINDS = (
    Kind("interval-1s", 1, _interval(1), 0.10),
    Kind("interval-5s", 5, _interval(5), 0.60),
    Kind("cron-5s", 5, _cron("*/5 * * * * *"), 0.15),
    Kind("cron-10s", 10, _cron("*/10 * * * * *"), 0.15),
)
TASKS = ("log", "http")


def fires_per_second(jobs: int) -> float:
    """The nominal rate of `jobs` jobs in the mix."""
    return sum(jobs * kind.share / kind.period for kind in KINDS)


def initial_kinds(jobs: int) -> list[Kind]:
    """`jobs` kinds in the mix's shares, interleaved (not in blocks)."""
    counts = [round(jobs * kind.share) for kind in KINDS]
    counts[1] += jobs - sum(counts)
    kinds = [kind for kind, count in zip(KINDS, counts, strict=True) for _ in range(count)]
    random.Random(13).shuffle(kinds)  # noqa: S311 - a reproducible mix, no secret
    return kinds


def period_of(schedule: dict[str, Any]) -> int | None:
    """The period of a schedule as the API returns it (None: not one of ours)."""
    for kind in KINDS:
        if all(
            schedule.get(key) == value for key, value in kind.schedule.items() if key != "anchor"
        ):
            return kind.period
    return None


def replacing(schedule: dict[str, Any]) -> dict[str, Any]:
    """A merge patch (RFC 7396, which merges objects) that replaces a job's schedule
    with `schedule`: every other kind's fields are deleted (null)."""
    fields = ("expression", "every_seconds", "anchor", "at", "every_days", "anchor_date")
    return dict.fromkeys(fields) | schedule


def job_args(task: str, name: str, receiver_url: str, revision: int) -> dict[str, Any]:
    if task == "log":
        return {"message": f"soak {name} revision {revision}"}
    return {
        "url": f"{receiver_url}/soak/{name}",
        "timeout_seconds": HTTP_TIMEOUT_SECONDS,
        "body": {"revision": revision},
    }


def job_body(name: str, kind: Kind, task: str, receiver_url: str) -> dict[str, Any]:
    return {
        "name": name,
        "schedule": kind.schedule,
        "task": task,
        "args": job_args(task, name, receiver_url, 0),
        "misfire_grace_seconds": GRACE_SECONDS,
        "timeout_seconds": TIMEOUT_SECONDS,
    }


def initial_jobs(jobs: int, receiver_url: str) -> list[dict[str, Any]]:
    return [
        job_body(f"soak-{index:05d}", kind, TASKS[index % 2], receiver_url)
        for index, kind in enumerate(initial_kinds(jobs))
    ]


# ---------------------------------------------------------------------------- the fleet

OPEN = float("inf")  # the end of a change whose outcome is not known yet


@dataclass
class JobRecord:
    name: str
    task: str
    periods: list[tuple[float, int]]  # (from, period): each schedule the harness set
    changes: list[list[float]]  # [asked, settled] of each change, creation first
    exists: bool = True
    delete_asked: float | None = None
    revision: int = 0

    def period_at(self, moment: float) -> int:
        return [period for since, period in self.periods if since <= moment][-1]

    def quiet(self, start: float, end: float) -> bool:
        """No change overlaps [start, end], and the job existed before start."""
        created = self.changes[0][1]
        return created < start and all(s > end or e < start for s, e in self.changes)


@dataclass(frozen=True)
class Stable:
    """A job judged in a window: its period there and its task."""

    name: str
    period: int
    task: str


class Fleet:
    """Every job the harness made, and every change it made to each. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: dict[str, JobRecord] = {}
        self._live: list[str] = []
        self.unsettled: list[str] = []

    def created(self, body: dict[str, Any], asked: float, settled: float) -> None:
        period = period_of(body["schedule"]) or 0
        record = JobRecord(body["name"], body["task"], [(asked, period)], [[asked, settled]])
        with self._lock:
            self._jobs[record.name] = record
            if settled != OPEN:
                self._live.append(record.name)
            else:
                record.exists = False
                self.unsettled.append(record.name)

    def begin_change(self, name: str, now: float, *, delete: bool = False) -> JobRecord:
        with self._lock:
            record = self._jobs[name]
            record.changes.append([now, OPEN])
            if delete:
                record.delete_asked = now
                self._live.remove(name)
            return record

    def end_change(self, name: str, now: float, *, exists: bool, period: int | None) -> None:
        """The last change's outcome is known: the job exists (with `period`) or not."""
        with self._lock:
            record = self._jobs[name]
            record.changes[-1][1] = now
            if period is not None and period != record.periods[-1][1]:
                record.periods.append((record.changes[-1][0], period))
            if exists and name not in self._live:
                self._live.append(name)
                record.delete_asked = None
            elif not exists and name in self._live:
                self._live.remove(name)
            record.exists = exists

    def leave_open(self, name: str) -> None:
        """The outcome is unknown: the change stays open until `end_change`."""
        with self._lock:
            if name in self._live:
                self._live.remove(name)
            self.unsettled.append(name)

    def pick(self, rng: random.Random) -> str | None:
        with self._lock:
            return rng.choice(self._live) if self._live else None

    def take_unsettled(self) -> str | None:
        with self._lock:
            return self.unsettled.pop(0) if self.unsettled else None

    def live_count(self) -> int:
        with self._lock:
            return len(self._live)

    def stable(
        self, start: float, end: float, margin: float, now: float, reach: float = 0.0
    ) -> list[Stable]:
        """Jobs that existed before `start - margin`, had no change from then until
        `end + margin + reach`, and whose deletion nobody asked for by `now` (a deleted
        job's rows go with it). `reach`: a changed schedule starts the job's cursor again
        at a new fence, and a tick still undecided then (its owner behind, within its
        misfire grace) is no tick of the job as it stands: it gets no row, by design."""
        with self._lock:
            return [
                Stable(record.name, record.period_at(start - margin), record.task)
                for record in self._jobs.values()
                if record.exists
                and record.delete_asked is None
                and record.quiet(start - margin, end + margin + reach)
                and record.changes[-1][0] < now
            ]

    def summary(self) -> dict[str, Any]:
        with self._lock:
            records = list(self._jobs.values())
        return {
            "jobs_ever": len(records),
            "jobs_live": sum(record.exists for record in records),
            "changes": sum(len(record.changes) for record in records),
        }


# ---------------------------------------------------------------------------- churn


@dataclass
class ChurnStats:
    asked: Counter[str] = field(default_factory=Counter)  # per operation
    outcomes: Counter[str] = field(default_factory=Counter)  # "create 201", "patch error"...
    retried: int = 0  # operations another replica answered after one did not
    unsettled: int = 0  # outcomes learnt only later, by GET
    latencies: list[float] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {
            "asked": dict(self.asked),
            "outcomes": dict(sorted(self.outcomes.items())),
            "retried_on_another_replica": self.retried,
            "settled_later_by_get": self.unsettled,
            "latency": latency_summary(self.latencies),
        }


class Churn(Worker):
    """Creates, edits and deletes at `rate` per second in turn, until `deadline`
    (time.time()) or `rate * seconds` operations; stops itself."""

    OPERATIONS = ("create", "edit", "delete")

    def __init__(
        self,
        fleet: Fleet,
        urls: Callable[[], Sequence[str]],
        receiver_url: str,
        *,
        rate: float,
        deadline: float,
        target_jobs: int,
    ) -> None:
        super().__init__("soak-churn")
        self._fleet = fleet
        self._urls = urls
        self._receiver_url = receiver_url
        self._rate = rate
        self._deadline = deadline
        self._budget = int(rate * max(0.0, deadline - time.time())) + 1
        self._bounds = (target_jobs * (1 - BOUND), target_jobs * (1 + BOUND))
        self._rng = random.Random(1313)  # noqa: S311 - reproducible churn, no secret
        self._turn = 0
        self._created = 0
        self.stats = ChurnStats()

    def run(self) -> None:
        began = time.time()
        with httpx.Client(timeout=REQUEST_TIMEOUT_SECONDS) as client:
            for index in range(self._budget):
                moment = began + index / self._rate
                if moment >= self._deadline or self._halt.wait(max(0.0, moment - time.time())):
                    break
                self._settle_one(client)
                self._operate(client, self.OPERATIONS[index % 3])
            while self._fleet.unsettled and not self._halt.wait(1.0):
                self._settle_one(client)

    def _operate(self, client: httpx.Client, operation: str) -> None:
        live = self._fleet.live_count()
        if operation == "create" and live >= self._bounds[1]:
            operation = "delete"
        elif operation == "delete" and live <= self._bounds[0]:
            operation = "create"
        self.stats.asked[operation] += 1
        {"create": self._create, "edit": self._edit, "delete": self._remove}[operation](client)

    def _create(self, client: httpx.Client) -> None:
        self._created += 1
        kind = self._rng.choices(KINDS, weights=[k.share for k in KINDS])[0]
        name = f"soak-c{self._created:06d}"
        body = job_body(name, kind, self._rng.choice(TASKS), self._receiver_url)
        asked = time.time()
        status = self._send(client, "POST", "/v1/jobs", body, "create")
        if status in (201, 409):  # 409: an earlier try went through and this one found it
            self._fleet.created(body, asked, time.time())
        else:
            self._fleet.created(body, asked, OPEN)

    def _edit(self, client: httpx.Client) -> None:
        name = self._fleet.pick(self._rng)
        if name is None:
            return
        record = self._fleet.begin_change(name, time.time())
        period = None
        if self._rng.random() < 0.5:
            kind = self._rng.choices(KINDS, weights=[k.share for k in KINDS])[0]
            patch: dict[str, Any] = {"schedule": replacing(kind.schedule)}
            period = kind.period
        else:
            record.revision += 1
            patch = {"args": job_args(record.task, name, self._receiver_url, record.revision)}
        status = self._send(client, "PATCH", f"/v1/jobs/{name}", patch, "edit")
        self._settled(name, status, {200: True, 404: False}, period)

    def _remove(self, client: httpx.Client) -> None:
        name = self._fleet.pick(self._rng)
        if name is None:
            return
        self._fleet.begin_change(name, time.time(), delete=True)
        status = self._send(client, "DELETE", f"/v1/jobs/{name}", None, "delete")
        self._settled(name, status, {204: False, 404: False}, None)

    def _settled(
        self, name: str, status: int | None, known: dict[int, bool], period: int | None
    ) -> None:
        if status in known:
            self._fleet.end_change(name, time.time(), exists=known[status], period=period)
        else:
            self._fleet.leave_open(name)

    def _settle_one(self, client: httpx.Client) -> None:
        """Learn, by GET, the outcome of one change the API did not answer."""
        name = self._fleet.take_unsettled()
        if name is None:
            return
        self.stats.unsettled += 1
        for url in self._rotation():
            try:
                response = client.get(f"{url}/v1/jobs/{name}")
            except httpx.HTTPError:
                continue
            if response.status_code == 200:
                period = period_of(response.json()["schedule"])
                self._fleet.end_change(name, time.time(), exists=True, period=period)
                return
            if response.status_code == 404:
                self._fleet.end_change(name, time.time(), exists=False, period=None)
                return
        self._fleet.leave_open(name)  # still unknown: ask again later

    def _rotation(self) -> list[str]:
        urls = list(self._urls())
        self._turn += 1
        shift = self._turn % len(urls)
        return urls[shift:] + urls[:shift]

    def _send(
        self, client: httpx.Client, method: str, path: str, body: Any, operation: str
    ) -> int | None:
        """The first answer that is not a server error, from up to TRIES replicas in
        turn; None when none gave one (the outcome is unknown)."""
        for attempt, url in enumerate(self._rotation()[:TRIES]):
            began = time.monotonic()
            try:
                response = client.request(method, f"{url}{path}", json=body)
            except httpx.HTTPError:
                continue
            if response.status_code >= 500:
                self.stats.outcomes[f"{operation} {response.status_code} (tried elsewhere)"] += 1
                continue
            self.stats.latencies.append(time.monotonic() - began)
            self.stats.outcomes[f"{operation} {response.status_code}"] += 1
            self.stats.retried += attempt > 0
            return response.status_code
        self.stats.outcomes[f"{operation} no answer"] += 1
        return None
