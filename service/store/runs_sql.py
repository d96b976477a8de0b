"""The ledger's reads (what the API lists and shows of runs), one constant or
builder per statement. The fire path's writes are in `fire_sql`."""

from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from service.domain.runs import RunStatus
from service.store.columns import Column, Columns, Params, one
from service.store.rows import RUN_COLUMNS, last_run_columns


@dataclass(frozen=True)
class RunPosition:
    """Where a newest-first page of runs stopped."""

    started_at: datetime
    run_id: UUID


@dataclass(frozen=True)
class RunFilter:
    """Which runs a listing shows: any of `statuses` (all when empty), started in
    [since, until)."""

    statuses: frozenset[RunStatus] = frozenset()
    since: datetime | None = None
    until: datetime | None = None


def runs_statement(
    job: str | None, before: RunPosition | None, where: RunFilter, limit: int
) -> tuple[str, list[object]]:
    """Runs of `job` (of every job when None), newest first, strictly older than
    `before`, at most `limit`; the statement and its arguments."""
    conditions: list[str] = []
    args: list[object] = []

    def arg(value: object) -> str:
        args.append(value)
        return f"${len(args)}"

    if job is not None:
        conditions.append(f"job = {arg(job)}")
    if before is not None:
        position = f"({arg(before.started_at)}, {arg(before.run_id)}::uuid)"
        conditions.append(f"(started_at, id) < {position}")
    if where.statuses:
        statuses = sorted(status.value for status in where.statuses)
        conditions.append(f"status = ANY({arg(statuses)}::text[])")
    if where.since is not None:
        conditions.append(f"started_at >= {arg(where.since)}")
    if where.until is not None:
        conditions.append(f"started_at < {arg(where.until)}")
    predicate = " AND ".join(conditions) or "TRUE"
    statement = f"""SELECT {RUN_COLUMNS} FROM tickgate_runs WHERE {predicate}
                    ORDER BY started_at DESC, id DESC LIMIT {arg(limit)}"""
    return statement, args


# A job's latest run: one probe of the runs' (job, started_at DESC, id DESC) index.
LAST_RUN_OF = f"""SELECT {RUN_COLUMNS} FROM tickgate_runs
    WHERE job = {{job}} ORDER BY started_at DESC, id DESC LIMIT 1"""

# Ticks of jobs, as (job, tick) pairs.
TICK_COLUMNS: Columns[tuple[str, datetime]] = Columns(
    Column("job", "text", lambda t: t[0]),
    Column("tick", "timestamptz", lambda t: t[1]),
)

# Which of the `ticks` have no row, or only a skip for one of the reasons `unrun`.
_without = Params()
TICKS_WITHOUT_RUNS = _without.statement(f"""SELECT t.job, t.tick
    FROM {_without.rows("ticks", TICK_COLUMNS).unnest("t")}
    WHERE NOT EXISTS (SELECT 1 FROM tickgate_runs r
                      WHERE r.job = t.job AND r.scheduled_for = t.tick
                        AND (r.skip_reason IS NULL
                             OR r.skip_reason <> ALL({_without("unrun", "text[]")})))""")

GET_RUN = f"SELECT {RUN_COLUMNS} FROM tickgate_runs WHERE id = $1"
# A run with what was kept beside it (migrations 0019, 0020): its output and its log.
GET_RUN_KEPT = f"""SELECT {RUN_COLUMNS}, o.output AS kept_output, o.log AS kept_log,
        o.earlier_attempts AS kept_attempts
    FROM tickgate_runs r LEFT JOIN tickgate_run_outputs o ON o.run_id = r.id
    WHERE r.id = $1"""
# The latest run of each job of `names`.
_last = Params()
LAST_RUNS = _last.statement(f"""SELECT {last_run_columns("last")}
    FROM {_last.rows("names", one("name", "text")).unnest("n")}
    CROSS JOIN LATERAL ({LAST_RUN_OF.format(job="n.name")}) AS last""")
