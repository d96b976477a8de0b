"""The soak tells its overlap skips apart by what each was behind when its claim found the
job busy (reliability/soak/windows.py): a run in progress (the policy's skip), or a run whose
session a fault had already taken while its lock or row still counted it (detection
delay). On real PostgreSQL rows."""

from datetime import UTC, datetime, timedelta
from uuid import uuid4

from harness.postgres import Sql
from reliability.soak.plan import Stable
from reliability.soak.windows import read_ledger
from service.scheduler.running import LOCK_LOST

T0 = datetime(2026, 12, 6, 12, 0, tzinfo=UTC)
JOB = Stable("every-second", 1, "log")

INSERT = """INSERT INTO tickgate_runs (id, job, scheduled_for, trigger, status, started_at,
    finished_at, skip_reason, error, runner, job_version, lock_key, locked, backend_pid)
    VALUES ($1, $2, $3, 'schedule', $4, $5, $6, $7, $8, 'r', 1, 1, true, 1)"""


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def run(
    sql: Sql,
    tick: float,
    status: str,
    ended: float | None,
    error: str | None = None,
    began: float | None = None,
) -> None:
    finished = at(ended) if ended is not None else None
    started = at(tick if began is None else began)
    sql.fetch(INSERT, uuid4(), JOB.name, at(tick), status, started, finished, None, error)


def overlap_skip(sql: Sql, tick: float, seen: float | None = None) -> None:
    """An overlap skip whose claim found the job busy at `seen` (the row's time), by
    default half a second after its tick."""
    noted = at(tick + 0.5 if seen is None else seen)
    sql.fetch(INSERT, uuid4(), JOB.name, at(tick), "skipped", noted, noted, "overlap", None)


def test_overlap_skips_are_told_apart_by_the_run_they_were_behind(
    database_url: str, sql: Sql
) -> None:
    run(sql, 0, "succeeded", 2.8)  # a long run: the skips at 1 and 2 are the policy's
    overlap_skip(sql, 1)
    overlap_skip(sql, 2)
    run(sql, 10, "abandoned", 30)  # its replica was killed at 10.8; the sweep ended it
    overlap_skip(sql, 11)
    run(sql, 20, "cancelled", 40, LOCK_LOST)  # fenced: PostgreSQL stopped at 20.2
    overlap_skip(sql, 21)
    run(sql, 30, "cancelled", 45, LOCK_LOST)  # judged at 31.5, before the cut at 32
    overlap_skip(sql, 31)
    run(sql, 50, "succeeded", 50.2)  # ended well before the skip was judged: behind nothing
    overlap_skip(sql, 53)
    run(sql, 55, "running", None)  # still running when judged: in progress too
    overlap_skip(sql, 56)
    # After an outage a later tick may be claimed first: an earlier one is skipped behind it.
    run(sql, 59, "succeeded", 65, began=60)
    overlap_skip(sql, 58, seen=60.2)
    run(sql, 70, "succeeded", 71.4)  # its end written at 71.4, committed after 71.5
    overlap_skip(sql, 71)
    start = int(T0.timestamp())
    faults = [at(moment).timestamp() for moment in (10.8, 20.2, 32.0)]
    ledger = read_ledger(database_url, {JOB.name: JOB}, start, start + 80, faults)
    assert ledger.overlap_behind == {
        "run in progress": 5,
        "run ending": 1,
        "run gone": 2,
        "no run": 1,
    }


def test_without_a_fault_a_run_that_ended_badly_was_in_progress(
    database_url: str, sql: Sql
) -> None:
    """A run fenced or abandoned with no fault before the skip was judged was alive then
    (the skip is the policy's, whatever became of the run later)."""
    run(sql, 0, "abandoned", 30)
    overlap_skip(sql, 1)
    start = int(T0.timestamp())
    ledger = read_ledger(database_url, {JOB.name: JOB}, start, start + 60)
    assert ledger.overlap_behind == {"run in progress": 1}
