"""Tick accounting: every nominal tick against its ledger row and its deliveries.

One accountant for the tests, the benchmarks and the soak. A job's nominal ticks are the
whole seconds divisible by its period (true of every-N-seconds crons and of intervals
anchored at midnight UTC), so no cron parser is needed. `Accounting` holds, for each
expected (job, tick), its row in Tickgate's run ledger (`tickgate_runs`) and the run ids
the receiver saw delivered; the judgements (duplicates, misses, ticks with no row) are
read from it. The ledger's per-tick rule (`judge_span`: each nominal tick has one
outcome, or a gap row after it counts it) is written here once: `tick_problems` judges
each job by it from its cursor's start to its cursor (the stateful test, the fault
accounting test), and the soak (`reliability/soak/windows.py`) its windows by it.
`analyze_delivery` is the receiver-only view (no ledger): what arrived, how late,
against what should have.
"""

import math
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from itertools import islice
from typing import Any, Protocol

from harness.receiver import Receipt
from harness.waiting import eventually

Tick = tuple[str, float]
RUN_STATUSES_ENDED = ("succeeded", "failed", "timed_out", "cancelled", "abandoned")

# Every row of the window, jobs `$1` (NULL: all jobs); `late`: started_at - scheduled_for.
LEDGER_ROWS = """
    SELECT id::text AS id, job, extract(epoch FROM scheduled_for)::float8 AS at, trigger,
           status, skip_reason, missed_ticks, runner, attempts, started_at, finished_at,
           extract(epoch FROM started_at - scheduled_for)::float8 AS late
    FROM tickgate_runs
    WHERE ($1::text[] IS NULL OR job = ANY($1::text[]))
      AND scheduled_for BETWEEN to_timestamp($2::float8) AND to_timestamp($3::float8)
    ORDER BY job, scheduled_for
"""


class Fetches(Protocol):
    """A blocking connection (`harness.postgres.Sql`)."""

    def fetch(self, query: str, *args: object) -> list[Any]: ...


class HasReceipts(Protocol):
    """A receiver, in this process or another."""

    def receipts(self) -> list[Receipt]: ...


def rfc3339(moment: float) -> str:
    return datetime.fromtimestamp(moment, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


# Each job's threshold and tick cursor (migration 0014), and its ticks' outcomes: every row
# of a tick (runs on demand are no tick's), and the tick a `queue_one` job has waiting.
CURSORS = """SELECT j.name AS job, extract(epoch FROM j.fire_after)::float8 AS threshold,
           extract(epoch FROM k.tick)::float8 AS cursor
    FROM tickgate_jobs j JOIN tickgate_cursors k ON k.job = j.name
    WHERE j.name = ANY($1::text[])"""
OUTCOMES = """SELECT job, extract(epoch FROM scheduled_for)::float8 AS at, missed_ticks,
           trigger::text AS trigger
    FROM tickgate_runs
    WHERE job = ANY($1::text[]) AND trigger NOT IN ('manual', 'chain')
    UNION ALL
    SELECT job, extract(epoch FROM scheduled_for)::float8, NULL, 'waiting'
    FROM tickgate_pending WHERE job = ANY($1::text[])"""
# Two rows of one (job, tick): the ledger's unique key forbids them; counted all the same,
# so that a change of that key cannot pass unseen.
TWICE = """SELECT job, extract(epoch FROM scheduled_for)::float8 AS at, count(*) AS rows
    FROM tickgate_runs
    WHERE job = ANY($1::text[]) AND trigger NOT IN ('manual', 'chain')
    GROUP BY job, scheduled_for HAVING count(*) > 1"""
# The scheduled rows (and waiting ticks) that must fall on a nominal tick: a backfill's
# may lie outside the job's window, which ticks asked for by name ignore.
_ON_SCHEDULE = ("schedule", "catchup", "waiting")
# How many ticks one job's judgement reads at most: a cursor parked past the last tick
# while ticks remain (an end moved later) has unboundedly many undecided ticks before it.
MAX_TICKS = 1000

# A job's nominal ticks strictly after `after` and before `before` (POSIX seconds).
Ticks = Callable[[float, float], Iterator[float]]


def every(period: int) -> Ticks:
    """The ticks of a job of a period: the whole seconds divisible by it."""

    def ticks(after: float, before: float) -> Iterator[float]:
        if not math.isfinite(before):
            raise ValueError("the cursor is past its last tick: not a job of a period")
        at = (math.floor(after / period) + 1) * period
        while at < before:
            yield float(at)
            at += period

    return ticks


def tick_problems(sql: Fetches, tickers: Mapping[str, Ticks]) -> list[str]:
    """The ledger's invariant, read from the database alone (the stateful test and the
    soak judge by it): for each job, every nominal tick after its threshold and before its
    cursor has exactly one outcome (a row, or the tick waiting under `queue_one`), or is
    one of the ticks without a row that the misfire row ending their run counts; no row of
    a tick falls between the job's nominal ticks, and no (job, tick) has two rows."""
    jobs = list(tickers)
    cursors = sql.fetch(CURSORS, jobs)  # first: rows written meanwhile only add outcomes
    twice = [
        f"{r['job']} tick {rfc3339(r['at'])} has {r['rows']} rows" for r in sql.fetch(TWICE, jobs)
    ]
    return twice + judge_ticks(cursors, sql.fetch(OUTCOMES, jobs), tickers)


def cursor_problems(sql: Fetches, periods: Mapping[str, int]) -> list[str]:
    """`tick_problems` of jobs of a period."""
    return tick_problems(sql, {job: every(period) for job, period in periods.items()})


def judge_cursors(
    cursors: Iterable[Any], outcomes: Iterable[Any], periods: Mapping[str, int]
) -> list[str]:
    """`cursor_problems` of rows already read (CURSORS and OUTCOMES)."""
    return judge_ticks(cursors, outcomes, {job: every(period) for job, period in periods.items()})


def judge_ticks(
    cursors: Iterable[Any], outcomes: Iterable[Any], tickers: Mapping[str, Ticks]
) -> list[str]:
    """`tick_problems` of rows already read (CURSORS and OUTCOMES)."""
    counted: dict[str, dict[float, Any]] = {job: {} for job in tickers}
    for row in outcomes:
        counted[row["job"]][round(row["at"], 6)] = row
    return [
        problem
        for row in cursors
        for problem in _tick_problems(
            row["job"], tickers[row["job"]], row["threshold"], row["cursor"], counted[row["job"]]
        )
    ]


def _tick_problems(
    job: str, ticks: Ticks, threshold: float, cursor: float, outcomes: dict[float, Any]
) -> list[str]:
    judged = judge_span(islice(ticks(threshold, cursor), MAX_TICKS), outcomes)
    problems = [
        f"{job} tick {rfc3339(at)} counts {counts} ticks, not {should}"
        for at, counts, should in judged.miscounts
    ]
    if judged.trailing:
        problems.append(
            f"{job}: {len(judged.trailing)} ticks before its cursor {_moment(cursor)}"
            " have no outcome"
        )
    if len(judged.ticks) < MAX_TICKS:  # past the last tick read, a row is no stray
        strays = off_schedule(outcomes, judged.ticks, threshold, cursor)
        problems += [f"{job} has a row at {rfc3339(t)}, no nominal tick" for t in strays]
    return problems


@dataclass
class Judged:
    """One job's nominal ticks, walked in order, each against its outcome (`judge_span`).

    A tick has its row, or has none: then the gap row that ends its run of rowless ticks
    (the audit's misfire row, whose `missed_ticks` sums up the ticks nobody could start,
    itself included) counts it, or nothing does."""

    ticks: list[float] = field(default_factory=list)  # every nominal tick walked
    rows: dict[float, Any] = field(default_factory=dict)  # each tick with a row: its row
    counted: list[float] = field(default_factory=list)  # rowless, summed up by a gap row
    uncounted: list[float] = field(default_factory=list)  # rowless, before a row counting fewer
    trailing: list[float] = field(default_factory=list)  # rowless, after the last row
    # Each row counting other than its run of rowless ticks plus itself: (tick, counts, should).
    miscounts: list[tuple[float, int, int]] = field(default_factory=list)

    def settle(self, at: float, counts: int, rowless: list[float], open_start: bool) -> None:
        """The row at `at` counts `counts` ticks: itself and the rowless ticks before it."""
        summed = len(rowless) - min(counts - 1, len(rowless))
        self.counted += rowless[summed:]
        self.uncounted += rowless[:summed]
        if counts != len(rowless) + 1 and not (open_start and counts > len(rowless) + 1):
            self.miscounts.append((at, counts, len(rowless) + 1))


def judge_span(
    nominal: Iterable[float], outcomes: Mapping[float, Any], *, open_start: bool = False
) -> Judged:
    """The per-tick rule, for one job (the stateful test, the fault tests and the soak
    judge by it): each nominal tick (in order) has exactly one outcome in `outcomes` (its
    row, keyed by tick; the ledger's key forbids two), or is one of the rowless ticks the
    row after them counts (`missed_ticks`). `open_start`: the ticks are cut from a longer
    run, so the first row may also count ticks before the first one walked."""
    judged, rowless = Judged(), []
    for at in nominal:
        judged.ticks.append(at)
        if (row := outcomes.get(at)) is None:
            rowless.append(at)
            continue
        judged.rows[at] = row
        judged.settle(at, row["missed_ticks"] or 1, rowless, open_start and len(judged.rows) == 1)
        rowless = []
    judged.trailing = rowless
    return judged


def off_schedule(
    outcomes: Mapping[float, Any], nominal: Collection[float], after: float, before: float
) -> list[float]:
    """The rows strictly between `after` and `before` of a tick on the schedule (a backfill
    may ask for any tick by name) that is none of the `nominal` ticks: a wrong schedule."""
    known = set(nominal)
    return sorted(
        at
        for at, row in outcomes.items()
        if after < at < before and at not in known and row["trigger"] in _ON_SCHEDULE
    )


def _moment(at: float) -> str:
    return rfc3339(at) if math.isfinite(at) else "past its last tick"


def lock_problems(sql: Fetches, lock_key: Callable[[str], int]) -> list[str]:
    """Each job lock (a bigint advisory lock) held while no `running` row is of its job:
    a lock nobody's run explains blocks every tick of the job. A run detached by a delete
    (`name@deleted:incarnation`) holds its name's key. Transient between a claim's lock
    and its row, and between a finish and its unlock: the caller waits it out."""
    running = sql.fetch("SELECT job FROM tickgate_runs WHERE status = 'running'")
    explained = {lock_key(row["job"].split("@deleted:")[0]) for row in running}
    return [
        f"advisory lock {row['key']} held by backend {row['pid']} with no running run"
        for row in sql.fetch(_JOB_LOCKS)
        if row["key"] not in explained
    ]


# The bigint advisory locks held in this database (a job's lock; members lock (int, int)).
_JOB_LOCKS = """SELECT (classid::bigint << 32) | objid::bigint AS key, pid FROM pg_locks
    WHERE locktype = 'advisory' AND granted AND objsubid = 1
      AND database = (SELECT oid FROM pg_database WHERE datname = current_database())"""


def nominal_ticks(periods: Mapping[str, int], first: int, last: int) -> list[Tick]:
    """Each job's ticks in [first, last]: the whole seconds divisible by its period."""
    return [
        (job, float(at))
        for job, period in periods.items()
        for at in range(first + (-first % period), last + 1, period)
    ]


def ledger_rows(sql: Fetches, jobs: Sequence[str] | None, first: float, last: float) -> list[Any]:
    """The ledger rows of `jobs` (None: every job) for ticks in [first, last]."""
    return sql.fetch(LEDGER_ROWS, None if jobs is None else list(jobs), float(first), float(last))


def row_text(row: Any) -> str:
    started = row["started_at"].isoformat(timespec="milliseconds") if row["started_at"] else "-"
    finished = row["finished_at"].isoformat(timespec="milliseconds") if row["finished_at"] else "-"
    return (
        f"{row['status']}/{row['skip_reason'] or '-'} by {row['runner']}"
        f" started {started} finished {finished}"
    )


@dataclass
class Accounting:
    """Every nominal tick of a window: its deliveries (the receiver's count) and its
    ledger row. A tick is accounted for when it has exactly one row, and the row is a
    run delivered exactly once (with the row's run id) or a skip delivered never."""

    expected: list[Tick]
    rows: dict[Tick, Any]
    receipts: dict[Tick, list[str | None]] = field(default_factory=dict)  # run ids delivered
    extra_rows: int = 0  # rows beyond one per (job, tick): never, by the ledger's key

    def rows_with(self, status: str, skip_reason: str | None = None) -> list[Any]:
        return [
            row
            for tick in self.expected
            if (row := self.rows.get(tick)) is not None
            and row["status"] == status
            and (skip_reason is None or row["skip_reason"] == skip_reason)
        ]

    def without_rows(self) -> list[Tick]:
        return [tick for tick in self.expected if tick not in self.rows]

    def problems(
        self, skip_reasons: Collection[str] = (), run_statuses: Collection[str] = ("succeeded",)
    ) -> list[str]:
        """Every tick not accounted for, or whose row is a run ending in a status not in
        `run_statuses`, or a skip for a reason not in `skip_reasons`."""
        return [
            problem
            for tick in self.expected
            for problem in self._problems_of(tick, skip_reasons, run_statuses)
        ]

    def _problems_of(
        self, tick: Tick, skip_reasons: Collection[str], run_statuses: Collection[str]
    ) -> list[str]:
        name = f"{tick[0]} tick {rfc3339(tick[1])}"
        row = self.rows.get(tick)
        delivered = self.receipts.get(tick, [])
        problems = [f"{name} delivered {len(delivered)} times: {delivered}"] * (len(delivered) > 1)
        if row is None:
            problems.append(f"{name} has no ledger row (delivered {len(delivered)} times)")
        elif row["status"] == "skipped":
            if row["skip_reason"] not in skip_reasons:
                problems.append(f"{name} skipped ({row['skip_reason']}): {row_text(row)}")
            if delivered:
                problems.append(f"{name} skipped but delivered: {row_text(row)}")
        elif row["status"] not in run_statuses:
            problems.append(f"{name} is {row['status']}: {row_text(row)}")
        elif delivered != [row["id"]]:
            problems.append(f"{name} delivered as {delivered}, ledger: {row_text(row)}")
        return problems


def unfounded_overlaps(accounting: Accounting, history: Sequence[Any]) -> list[str]:
    """Each overlap skip of the window that no run of its job was in flight for: one
    started before the skip was recorded and not finished by then. `history`: the jobs'
    ledger rows from before the window on (`ledger_rows`), so a run of the tick before the
    window's first counts."""
    runs = [row for row in history if row["status"] != "skipped" and row["started_at"]]
    return [
        f"{skip['job']} tick {rfc3339(skip['at'])} skipped (overlap) with no run in flight:"
        f" {row_text(skip)}"
        for skip in accounting.rows_with("skipped", "overlap")
        if not any(_in_flight(run, skip) for run in runs)
    ]


def _in_flight(run: Any, skip: Any) -> bool:
    moment = skip["started_at"]
    ended = run["finished_at"]
    return bool(
        run["job"] == skip["job"]
        and run["started_at"] <= moment
        and (ended is None or ended >= moment)
    )


def delivered_run_ids(
    receipts: Iterable[Receipt], jobs: Collection[str]
) -> dict[Tick, list[str | None]]:
    """The run ids delivered for each (job, tick) of `jobs`."""
    found: dict[Tick, list[str | None]] = {}
    for receipt in receipts:
        job, tick = receipt.job, receipt.tick
        if job is not None and job in jobs and tick is not None:
            found.setdefault((job, tick), []).append(receipt.run_id)
    return found


def account(
    receiver: HasReceipts | None, sql: Fetches, periods: Mapping[str, int], first: int, last: int
) -> Accounting:
    """Each job's nominal ticks in [first, last]: their ledger rows and (with a
    receiver) their deliveries."""
    rows = ledger_rows(sql, list(periods), first, last)
    keyed = {(row["job"], float(row["at"])): row for row in rows}
    receipts = delivered_run_ids(receiver.receipts(), periods) if receiver else {}
    return Accounting(nominal_ticks(periods, first, last), keyed, receipts, len(rows) - len(keyed))


def await_accounting(
    receiver: HasReceipts,
    sql: Fetches,
    periods: Mapping[str, int],
    first: int,
    last: int,
    *,
    skip_reasons: Collection[str] = (),
    deadline_seconds: float = 30,
    problems_of: Callable[[Accounting], list[str]] | None = None,
) -> Accounting:
    """The accounting once every tick of the window is accounted for (rows of late runs
    and skips come in late on a loaded machine); AssertionError with the problems left
    at the deadline. A caller that allows more than `problems` does (a killed replica's
    runs) passes its own judge as `problems_of`."""
    judge = problems_of or (lambda accounting: accounting.problems(skip_reasons))

    def settled() -> Accounting:
        accounting = account(receiver, sql, periods, first, last)
        problems = judge(accounting)
        assert not problems, f"{len(problems)} problems, first: {problems[:20]}"
        return accounting

    return eventually(settled, deadline_seconds, "every tick accounted for", poll=0.2)


@dataclass
class Tally:
    """Deliveries and ledger rows of the expected (job, tick) pairs in a window, for
    tests that allow some ticks to be missed (`await_ticks`).

    `overlap_skipped`: missing ticks the ledger records as skipped by the overlap policy
    (an earlier run of the job was still in progress). `unaccounted`: expected ticks
    with no ledger row at all, neither a run nor a recorded skip: a tick lost in silence.
    """

    expected: int = 0
    ticks: list[Tick] = field(default_factory=list)
    duplicated: list[str] = field(default_factory=list)
    missing: list[Tick] = field(default_factory=list)
    overlap_skipped: set[Tick] = field(default_factory=set)
    unaccounted: list[Tick] = field(default_factory=list)

    def unexplained(self, may_miss: Callable[[Tick], bool]) -> list[str]:
        """Every duplicate, every tick without a ledger row, and every missing tick
        neither the requirement (`may_miss`) nor the overlap policy excuses."""
        return (
            self.duplicated
            + [f"{job} tick {rfc3339(at)} has no ledger row" for job, at in self.unaccounted]
            + [
                f"{job} tick {rfc3339(at)} never arrived"
                for job, at in self.missing
                if not may_miss((job, at)) and (job, at) not in self.overlap_skipped
            ]
        )

    def account(self, sql: Fetches) -> None:
        """Read from the ledger which missing ticks are overlap skips, and which
        expected ticks have no row."""
        if not self.ticks:
            return
        first, last = min(at for _, at in self.ticks), max(at for _, at in self.ticks)
        rows = ledger_rows(sql, sorted({job for job, _ in self.ticks}), first, last)
        keyed = {(row["job"], float(row["at"])): row for row in rows}
        self.overlap_skipped = {
            tick for tick in self.missing if _skipped_for_overlap(keyed.get(tick))
        }
        self.unaccounted = [tick for tick in self.ticks if tick not in keyed]


def _skipped_for_overlap(row: Any) -> bool:
    return row is not None and row["status"] == "skipped" and row["skip_reason"] == "overlap"


def tally(
    receiver: HasReceipts,
    periods: Mapping[str, int],
    first: int,
    last: int,
    skip: Callable[[int], bool] = lambda tick: False,
) -> Tally:
    """Each job's nominal ticks in [first, last], except those `skip` leaves out: how
    many, which arrived twice, which never."""
    counts = first_arrivals(receiver.receipts())[1]
    result = Tally()
    for job, at in nominal_ticks(periods, first, last):
        if skip(int(at)):
            continue
        result.expected += 1
        result.ticks.append((job, at))
        if (count := counts[(job, at)]) > 1:
            result.duplicated.append(f"{job} tick {rfc3339(at)} arrived {count} times")
        elif count == 0:
            result.missing.append((job, at))
    return result


def await_ticks(  # noqa: PLR0917 - the fault tests' positional calls, as before
    receiver: HasReceipts,
    periods: Mapping[str, int],
    first: int,
    last: int,
    may_miss: Callable[[Tick], bool],
    sql: Fetches,
) -> Tally:
    """Wait (generously) until every expected tick in [first, last] arrived or may be
    missing, then tally the window, noting which missing ticks the ledger shows were
    dropped by the overlap policy."""

    def settled() -> Tally:
        result = tally(receiver, periods, first, last)
        result.account(sql)
        problems = result.unexplained(may_miss)
        assert not problems, f"{len(problems)} unexplained, first: {problems[:20]}"
        return result

    return eventually(settled, 15, "every tick delivered or excused", poll=0.1)


@dataclass(frozen=True)
class Delivery:
    """What arrived, against what should have.

    `expected`: (job, tick) pairs that should have arrived once each. `delivered`: how
    many of them arrived at least once. `misses`: expected pairs that never arrived.
    `duplicates`: receipts beyond the first for any (job, tick), expected or not (a
    duplicate anywhere, warm-up included, is a correctness bug). `lateness`: receipt minus
    nominal tick, in seconds, of each delivered expected pair's first arrival.
    """

    expected: int
    delivered: int
    misses: int
    duplicates: int
    duplicate_examples: list[str]
    unexpected: int
    lateness: list[float]
    first_received: float | None
    last_received: float | None


def first_arrivals(receipts: Iterable[Receipt]) -> tuple[dict[Tick, float], Counter[Tick]]:
    """Each (job, tick)'s first receipt time, and how many receipts each had."""
    counts: Counter[Tick] = Counter()
    first: dict[Tick, float] = {}
    for receipt in receipts:
        if receipt.job is None or (tick := receipt.tick) is None:
            continue
        key = (receipt.job, tick)
        counts[key] += 1
        first.setdefault(key, receipt.received_at)
    return first, counts


def analyze_delivery(receipts: Iterable[Receipt], expected: set[Tick]) -> Delivery:
    first, counts = first_arrivals(receipts)
    repeated = {key: n for key, n in counts.items() if n > 1}
    delivered = [key for key in expected if key in first]
    arrivals = [first[key] for key in delivered]
    return Delivery(
        expected=len(expected),
        delivered=len(delivered),
        misses=len(expected) - len(delivered),
        duplicates=sum(n - 1 for n in repeated.values()),
        duplicate_examples=[
            f"{job} @ {tick} x{n}" for (job, tick), n in list(repeated.items())[:5]
        ],
        unexpected=sum(1 for key in first if key not in expected),
        lateness=[first[key] - key[1] for key in delivered],
        first_received=min(arrivals, default=None),
        last_received=max(arrivals, default=None),
    )
