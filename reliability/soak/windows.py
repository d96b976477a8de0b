"""The soak's verdict, window by window, by `harness.accounting`'s per-tick rule.

The run is cut into windows (60 s in the full run). Once a window is `SETTLE_SECONDS`
old (past every job's misfire grace, so a tick nobody could start has had its skip
recorded), the jobs that lived through it unchanged (`Fleet.stable`, with
`MARGIN_SECONDS` either side, and a misfire grace more after it: a changed schedule
drops the ticks still undecided, by design) are judged by `harness.accounting.judge_span`,
the rule the stateful test and the fault tests judge by: each nominal tick (a whole
second divisible by the job's period) has exactly one ledger row, a run of any status or
a skip with its reason, or is one of the rowless ticks a *gap row* after them sums up
(one `misfire` row with `missed_ticks`, written when the cluster comes back from a time
nobody could record anything: here, the PostgreSQL restart). Retention keeps every row
younger than the misfire grace + 300 s, so the rows are all still there.

What is the soak's own: the window's bounds (a gap row after the window may sum up its
last ticks, so the rows are read up to it; the first row may sum up ticks before the
window), the counts kept per window (ticks summed up by a gap row are counted apart, and
the verdict allows them only near the restart), and the receiver. For the `http` jobs the
receiver's own records are held against the ledger: a tick the ledger has as `succeeded`
must have arrived; one that arrived must not be recorded as skipped nor be missing from
the ledger; none may arrive twice unless the ledger explains it (a run with more than one
attempt; the soak's jobs make one).

The ledger's unique key forbids two rows of one (job, tick); the accountant still counts
any, over every job of the window, changed or not.
"""

import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

import asyncpg

from harness.accounting import (
    Judged,
    Tick,
    first_arrivals,
    judge_span,
    ledger_rows,
    nominal_ticks,
    off_schedule,
)
from harness.postgres import Sql
from harness.receiver import ReceiverProcess
from reliability.soak import Worker
from reliability.soak.plan import GRACE_SECONDS, Fleet, Stable

MARGIN_SECONDS = 5.0  # a job changed this close to a window is not judged in it
SETTLE_SECONDS = 60.0  # a window is judged this long after it ends (grace 30 s + slack)
RETRY_SECONDS = 5.0
EXAMPLES = 5

# A gap row lies at the last tick of the span it sums up: one summing up ticks of the
# window lies at or after its start.
_GAPS = """
SELECT job, extract(epoch FROM scheduled_for)::float8 AS at, missed_ticks FROM tickgate_runs
WHERE job = ANY($1::text[]) AND missed_ticks IS NOT NULL
  AND scheduled_for >= to_timestamp($2)
"""
_DUPLICATES = """
SELECT count(*) FROM (
    SELECT 1 FROM tickgate_runs
    WHERE scheduled_for >= to_timestamp($1) AND scheduled_for < to_timestamp($2)
    GROUP BY job, scheduled_for HAVING count(*) > 1) AS twice
"""
# What each overlap skip of the window's jobs was behind: the run of its job (of any
# other tick: after an outage a later tick may be claimed first) in progress when the
# claim found the job busy (an overlap skip's row bears that moment), the latest begun
# (a later run of the job got its lock, so an earlier one no longer held it).
# A run's `finished_at` is taken as its end is written, before that commits: one ended
# up to ENDING_SECONDS ($5) before that moment may still have read as running
# (`run ending`).
# A run that ended well (or still runs) was in progress: the policy's skip. One
# `abandoned`, or fenced (lock lost), whose session a fault ($4: the moments the soak
# killed a replica, stopped PostgreSQL or cut a link) could have taken between its start
# and that moment, was gone while its lock or row still counted it: the skip is
# detection delay. One lost only after the skip was judged was still in progress.
ENDING_SECONDS = 2.0
_OVERLAP_BEHIND = """
SELECT CASE WHEN b.status IS NULL THEN 'no run'
            WHEN (b.status = 'abandoned' OR b.error LIKE 'lock lost%')
                 AND EXISTS (SELECT 1 FROM unnest($4::float8[]) AS f(at)
                             WHERE to_timestamp(f.at) BETWEEN b.started_at AND s.started_at)
                THEN 'run gone'
            WHEN b.finished_at <= s.started_at THEN 'run ending'
            ELSE 'run in progress' END AS behind, count(*) AS n
FROM tickgate_runs s LEFT JOIN LATERAL (
    SELECT r.status, r.error, r.started_at, r.finished_at FROM tickgate_runs r
    WHERE r.job = s.job AND r.scheduled_for <> s.scheduled_for AND r.status <> 'skipped'
      AND r.started_at <= s.started_at
      AND (r.finished_at IS NULL
           OR r.finished_at > s.started_at - make_interval(secs => $5))
    ORDER BY r.started_at DESC LIMIT 1) AS b ON true
WHERE s.job = ANY($1::text[]) AND s.skip_reason = 'overlap'
  AND s.scheduled_for >= to_timestamp($2) AND s.scheduled_for < to_timestamp($3)
GROUP BY 1
"""


@dataclass(frozen=True)
class Ledger:
    rows: dict[str, dict[float, asyncpg.Record]]  # job -> tick -> its row
    reach: dict[str, float]  # job -> the last tick read: a gap row summing up the window's
    duplicates: int
    overlap_behind: dict[str, int] = field(default_factory=dict)  # see _OVERLAP_BEHIND

    def row(self, key: Tick) -> asyncpg.Record | None:
        return self.rows.get(key[0], {}).get(key[1])


def reaches(gaps: Iterable[Any], jobs: dict[str, Stable], end: int) -> dict[str, float]:
    """Each job's last gap row summing up a tick before `end` (its `missed_ticks`
    consecutive nominal ticks end at its own): how far to read the job's rows."""
    found: dict[str, float] = {}
    for row in gaps:
        if row["at"] - (row["missed_ticks"] - 1) * jobs[row["job"]].period < end:
            found[row["job"]] = max(row["at"], found.get(row["job"], row["at"]))
    return found


def by_job(rows: Iterable[Any]) -> dict[str, dict[float, Any]]:
    keyed: dict[str, dict[float, Any]] = {}
    for row in rows:
        keyed.setdefault(row["job"], {})[float(row["at"])] = row
    return keyed


def read_ledger(
    url: str, jobs: dict[str, Stable], start: int, end: int, faults: Sequence[float] = ()
) -> Ledger:
    """The rows of `jobs` for ticks in [start, end) and up to the gap rows that sum up
    ticks of it, and the window's duplicate (job, tick) rows of any job; `faults`: when
    a session could have been taken away (POSIX seconds), for what each overlap skip was
    behind."""
    sql = Sql(url)
    try:
        reach = reaches(sql.fetch(_GAPS, list(jobs), start), jobs, end)
        rows = ledger_rows(sql, list(jobs), start, max([end - 1, *reach.values()]))
        duplicates = int(sql.value(_DUPLICATES, start, end))
        behind = sql.fetch(_OVERLAP_BEHIND, list(jobs), start, end, list(faults), ENDING_SECONDS)
    finally:
        sql.close()
    overlap_behind = {row["behind"]: int(row["n"]) for row in behind}
    return Ledger(by_job(rows), reach, duplicates, overlap_behind)


def ticks_of(job: Stable, start: int, end: int) -> list[Tick]:
    """The job's nominal ticks in [start, end)."""
    return nominal_ticks({job.name: job.period}, start, end - 1)


@dataclass
class Window:
    """The judgement of one window [start, end) (POSIX seconds)."""

    start: int
    end: int
    jobs: int = 0
    http_jobs: int = 0
    expected: int = 0
    statuses: Counter[str] = field(default_factory=Counter)
    skip_reasons: Counter[str] = field(default_factory=Counter)
    overlap_behind: Counter[str] = field(default_factory=Counter)
    unaccounted: int = 0
    gap_covered: int = 0
    double_counted: int = 0  # ticks with a row of their own that a gap row sums up too
    unexpected_rows: int = 0
    ledger_duplicates: int = 0
    http: Counter[str] = field(default_factory=Counter)
    examples: dict[str, list[str]] = field(default_factory=dict)
    checked_at: float = 0.0

    def example(self, problem: str, text: str) -> None:
        shown = self.examples.setdefault(problem, [])
        if len(shown) < EXAMPLES:
            shown.append(text)

    def as_dict(self) -> dict[str, Any]:
        return {
            "start": self.start,
            "end": self.end,
            "jobs": self.jobs,
            "http_jobs": self.http_jobs,
            "expected_ticks": self.expected,
            "statuses": dict(self.statuses),
            "skip_reasons": dict(self.skip_reasons),
            "overlap_behind": dict(self.overlap_behind),
            "unaccounted": self.unaccounted,
            "gap_covered": self.gap_covered,
            "double_counted": self.double_counted,
            "unexpected_rows": self.unexpected_rows,
            "ledger_duplicates": self.ledger_duplicates,
            "http": dict(self.http),
            "examples": self.examples,
            "checked_at": round(self.checked_at, 1),
        }


def judge_ledger(window: Window, jobs: dict[str, Stable], ledger: Ledger) -> None:
    window.ledger_duplicates = ledger.duplicates
    window.overlap_behind.update(ledger.overlap_behind)
    for job in jobs.values():
        outcomes = ledger.rows.get(job.name, {})
        last = max(window.end - 1, ledger.reach.get(job.name, window.start))
        nominal = [at for _, at in nominal_ticks({job.name: job.period}, window.start, int(last))]
        _count(window, job, judge_span(nominal, outcomes, open_start=True))
        # The rows read begin at the window's start: none lies before it.
        for at in off_schedule(outcomes, nominal, window.start - 1, window.end):
            window.unexpected_rows += 1
            window.example("unexpected_rows", f"{job.name} @ {at:.0f} ({outcomes[at]['status']})")


def _count(window: Window, job: Stable, judged: Judged) -> None:
    """The window's share of a job's judgement (the ticks read past its end only let a
    gap row there sum up its last ticks)."""
    window.expected += sum(at < window.end for at in judged.ticks)
    for at, row in judged.rows.items():
        if at < window.end:
            window.statuses[row["status"]] += 1
            if row["skip_reason"]:
                window.skip_reasons[row["skip_reason"]] += 1
    for at in (at for at in judged.counted if at < window.end):
        window.gap_covered += 1
        window.example("gap_covered", f"{job.name} @ {at}")
    for at in (at for at in judged.uncounted + judged.trailing if at < window.end):
        window.unaccounted += 1
        window.example("unaccounted", f"{job.name} @ {at} (period {job.period})")
    for at, counts, should in judged.miscounts:
        if at < window.end and counts > should:
            window.double_counted += counts - should
            window.example("double_counted", f"{job.name} @ {at:.0f} counts {counts}, not {should}")


def judge_deliveries(
    window: Window, jobs: dict[str, Stable], ledger: Ledger, received: Counter[tuple[str, float]]
) -> None:
    """The receiver's records of the window's `http` jobs, against the ledger."""
    http = {name: job for name, job in jobs.items() if job.task == "http"}
    window.http_jobs = len(http)
    nominal: set[tuple[str, float]] = set()
    for job in http.values():
        for key in ticks_of(job, window.start, window.end):
            nominal.add(key)
            _judge_delivery(window, key, ledger.row(key), received[key])
    for key, count in received.items():
        if key[0] in http and key not in nominal:
            window.http["unexpected_deliveries"] += count
            window.example("unexpected_deliveries", f"{key[0]} @ {key[1]:.0f}")


def _judge_delivery(
    window: Window, key: tuple[str, float], row: asyncpg.Record | None, count: int
) -> None:
    window.http["expected"] += 1
    window.http["delivered"] += count > 0
    status = row["status"] if row is not None else None
    text = f"{key[0]} @ {key[1]:.0f} ({status}, received {count}x)"
    if count > 1:
        explained = row is not None and row["attempts"] >= count
        problem = "duplicates_explained" if explained else "duplicates"
        window.http[problem] += count - 1
        window.example(problem, text)
    if status == "succeeded" and count == 0:
        window.http["succeeded_not_delivered"] += 1
        window.example("succeeded_not_delivered", text)
    elif status == "skipped" and count > 0:
        window.http["delivered_but_skipped"] += 1
        window.example("delivered_but_skipped", text)
    elif row is None and count > 0:
        window.http["delivered_without_row"] += 1
        window.example("delivered_without_row", text)


class Accountant(Worker):
    """Judges each window [start + k * length, ...) once it has settled, until `end`."""

    def __init__(
        self,
        fleet: Fleet,
        database_url: str,
        receiver: ReceiverProcess,
        start: int,
        length: int,
        *,
        faults: Callable[[], list[float]] = list,
    ) -> None:
        super().__init__("soak-accountant")
        self._fleet = fleet
        self._faults = faults  # when a session could have been taken away, so far
        self._url = database_url
        self._receiver = receiver
        self._next = start
        self._length = length
        self.end: int | None = None  # set when the run's end is known
        self.windows: list[Window] = []
        self.errors: list[str] = []

    @property
    def done(self) -> bool:
        return self.end is not None and self._next + self._length > self.end

    def run(self) -> None:
        while not self.done:
            due = self._next + self._length + SETTLE_SECONDS
            if self._halt.wait(max(0.0, due - time.time())):
                return
            if self.done:
                return
            try:
                self.windows.append(self.check(self._next, self._next + self._length))
                self._next += self._length
            except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as error:
                self.errors.append(f"{time.strftime('%H:%M:%S')} {error!r}"[:300])
                self._halt.wait(RETRY_SECONDS)

    def _stable(self, start: int, end: int, now: float) -> list[Stable]:
        # Changed up to a misfire grace after the window, a job may drop ticks of it.
        return self._fleet.stable(start, end, MARGIN_SECONDS, now, reach=GRACE_SECONDS)

    def check(self, start: int, end: int) -> Window:
        asked = time.time()
        jobs = {job.name: job for job in self._stable(start, end, asked)}
        ledger = read_ledger(self._url, jobs, start, end, self._faults())
        # A job whose deletion began while the ledger was read may have lost its rows.
        still = {job.name for job in self._stable(start, end, time.time())}
        jobs = {name: job for name, job in jobs.items() if name in still}
        receipts = self._receiver.receipts((start, end))
        received = first_arrivals(receipts)[1]
        window = Window(start, end, jobs=len(jobs), checked_at=time.time())
        judge_ledger(window, jobs, ledger)
        judge_deliveries(window, jobs, ledger, received)
        return window
