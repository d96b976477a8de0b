"""Every statement of the job definitions (create, read, list, change, delete), one
constant each."""

import functools
from uuid import UUID

from service.store import runs_sql
from service.store.columns import Column, Columns, Params, Statement, one
from service.store.fire_sql import CANCELS_CHANNEL
from service.store.rows import JOB_COLUMNS, JOB_TABLE, job_document, last_run_columns

JOBS_CHANNEL = "tickgate_jobs"

JOB_PLACEHOLDERS = ", ".join(f"${n}" for n in range(1, JOB_COLUMNS.count(",") + 2))

LOCK_KEY_UNIQUE = "tickgate_jobs_lock_key_unique"

JOB = job_document("j")  # every statement that reads whole jobs names the table j

COUNTS = "SELECT state, count(*) FROM tickgate_jobs GROUP BY state"
GET_JOB = f"SELECT {JOB} FROM tickgate_jobs j WHERE name = $1"
GET_JOBS = f"SELECT {JOB} FROM tickgate_jobs j WHERE name = ANY($1::text[])"
ACTIVE_VERSIONS = "SELECT name, incarnation, version FROM tickgate_jobs WHERE state = 'active'"
NOTIFY = "SELECT pg_notify($1, $2)"

_LAST_RUN_OF_J = runs_sql.LAST_RUN_OF.format(job="j.name")


def _with_last_run(page: str, order: str, *extra: str) -> str:
    """The jobs of `page` (a query of whole job rows named j, with its own ORDER BY and
    LIMIT), each with its latest run, in `order`. The page is cut first: joined before
    the LIMIT, the latest run is looked up for every job that passes the filters (a
    list of 100 among 16,000 jobs read 16,000 runs' index entries, 26 ms against 0.9)."""
    columns = ", ".join((JOB, last_run_columns("last"), *extra))
    return f"""SELECT {columns} FROM ({page}) AS j
    LEFT JOIN LATERAL ({_LAST_RUN_OF_J}) AS last ON true
    ORDER BY {order}"""


SHOW_JOB = _with_last_run("SELECT * FROM tickgate_jobs WHERE name = $1", "j.name")

# Changes lock job rows FOR NO KEY UPDATE: two changes of a job still take turns, but a
# claim (which holds its jobs' rows FOR KEY SHARE for one statement) never waits for
# one, nor one for a claim; only a delete does.
UPDATE_JOB = f"UPDATE tickgate_jobs SET ({JOB_COLUMNS}) = ({JOB_PLACEHOLDERS}) WHERE name = $1"

LOCK_JOBS = f"""SELECT {JOB} FROM tickgate_jobs j WHERE name = ANY($1::text[])
    ORDER BY name FOR NO KEY UPDATE"""


# Active jobs with nothing left to fire, by the database clock: the `end_at` passed and
# every tick before it decided (the cursor past the last one: a tick due before the end may
# still be waiting under queue_one, or within its grace), the run cap is used up, or the
# one-time tick is past its reach. Every replica asks every
# round, so each arm reads an index that holds only active jobs that may end: a range
# of the `end_at`s passed (0003), and the jobs with a run cap or a one-time tick
# (0028), never every job. The statement's start is the clock (clock_timestamp() bounds
# no index range).
ENDED_JOBS = f"""SELECT {JOB} FROM tickgate_jobs j WHERE j.name IN (
        SELECT name FROM tickgate_jobs e JOIN tickgate_cursors k ON k.job = e.name
        WHERE e.state = 'active' AND e.end_at <= statement_timestamp() AND k.tick = 'infinity'
        UNION
        SELECT name FROM tickgate_jobs
        WHERE state = 'active' AND (max_runs IS NOT NULL OR schedule->>'kind' = 'once')
          AND (runs_started >= max_runs
               OR (schedule->>'kind' = 'once'
                   AND (schedule->>'at')::timestamptz + make_interval(
                       secs => misfire_grace_seconds + jitter_seconds)
                       < statement_timestamp())))"""

LOCK_JOB = f"{GET_JOB} FOR NO KEY UPDATE"
INSERT = f"INSERT INTO tickgate_jobs ({JOB_COLUMNS}) VALUES ({JOB_PLACEHOLDERS})"
DELETE = "DELETE FROM tickgate_jobs WHERE name = $1"
# One notification on the channel given per name of `names`.
_notifying = Params()
NOTIFY_EACH = _notifying.statement(f"""SELECT pg_notify({_notifying("channel")}, n.name)
    FROM {_notifying.rows("names", one("name", "text")).unnest("n")}""")

_CHANNEL, _BOOKED, _FIRST = (JOB_COLUMNS.count(",") + n for n in (2, 3, 4))

# A create that needs no row lock and no transaction: the name's own uniqueness makes
# the loser of a race see "exists"; the notification goes out only if the row went in.
# The job's cursor opens at its first tick (NULL: none) if it is active, at its threshold
# otherwise, as OPEN_CURSORS would move it (migration 0017 has the trigger leave it so).
INSERT_JOB = f"""WITH inserted AS (
        INSERT INTO tickgate_jobs ({JOB_COLUMNS}) VALUES ({JOB_PLACEHOLDERS})
        ON CONFLICT (name) DO NOTHING
        RETURNING name, state, fire_after, lock_key),
    booked AS (
        INSERT INTO tickgate_next_ticks (job, tick)
        SELECT name, coalesce(${_BOOKED}::timestamptz, 'infinity') FROM inserted),
    opened AS (
        INSERT INTO tickgate_cursors (job, tick, due_at, bucket)
        SELECT name,
            CASE WHEN state = 'active' THEN coalesce(${_FIRST}::timestamptz, 'infinity')
                 ELSE fire_after END,
            CASE WHEN state = 'active' THEN coalesce(${_FIRST}::timestamptz, 'infinity')
                 ELSE 'infinity' END,
            lock_key & 4095
        FROM inserted)
    SELECT pg_notify(${_CHANNEL}, name) FROM inserted"""

# The filters of a list of jobs, each written only when given: a generic plan of
# `($n IS NULL OR j.labels @> $n)` takes the labels to match few jobs, and then reads
# and sorts every job for a page rather than walk the name index to its first 100.
_FILTERS = {
    "after": "j.name > {}",
    "state": "j.state = {}",
    "task": "j.task = {}",
    "prefix": "starts_with(j.name, {})",
    "labels": "j.labels @> {}::jsonb",
}


def _where(p: Params, given: frozenset[str]) -> str:
    return " AND ".join(_FILTERS[name].format(p(name)) for name in _FILTERS if name in given)


@functools.cache
def list_jobs(given: frozenset[str]) -> Statement:
    """Jobs in name order, with the filters `given` (`after`: strictly after the name;
    `state`, `task`, `prefix` of the name, `labels` every one of), at most `limit`."""
    p = Params()
    page = f"""SELECT * FROM tickgate_jobs j WHERE {_where(p, given) or "true"}
    ORDER BY j.name LIMIT {p("limit")}"""
    return p.statement(_with_last_run(page, "j.name"))


@functools.cache
def jobs_by_next_tick(given: frozenset[str]) -> Statement:
    """The book's order (migration 0012): the active jobs with a tick by (tick, name),
    strictly after (`tick`, `after`), with the other filters `given`;
    `jobs_after_ticks` follows with every other job."""
    p = Params()
    position = f"({p('tick', 'timestamptz')}, {p('after', 'text')})"
    filters = _where(p, given - {"after"})
    page = f"""SELECT j.*, n.tick AS booked_tick
    FROM tickgate_next_ticks n JOIN tickgate_jobs j ON j.name = n.job
    WHERE (n.tick, n.job) > {position} AND n.tick < 'infinity' AND j.state = 'active'
      {f"AND {filters}" if filters else ""}
    ORDER BY n.tick, n.job LIMIT {p("limit")}"""
    return p.statement(_with_last_run(page, "j.booked_tick, j.name", "j.booked_tick"))


@functools.cache
def jobs_after_ticks(given: frozenset[str]) -> Statement:
    """Every job without a booked tick, in name order, strictly after `after`, with the
    filters `given`."""
    p = Params()
    page = f"""SELECT j.*, NULL::timestamptz AS booked_tick
    FROM tickgate_jobs j LEFT JOIN tickgate_next_ticks n ON n.job = j.name
    WHERE NOT (j.state = 'active' AND coalesce(n.tick < 'infinity', false))
      AND {_where(p, given | {"after"})}
    ORDER BY j.name LIMIT {p("limit")}"""
    return p.statement(_with_last_run(page, "j.name", "j.booked_tick"))


# A bulk apply's rows, locked in name order: the jobs it names (the first argument) and,
# when it prunes (the second), every job in the prune's scope: of the manager given
# third (any when NULL) with the labels given fourth.
# Each job an app fires (the APScheduler gate) and when it last succeeded (NULL: never
# yet), for the API's /metrics: the jobs by their partial index (migration 0033), each
# one's newest successful run by the runs' (job, started_at) index.
APP_LAST_SUCCESSES = """SELECT j.name, s.finished_at FROM tickgate_jobs j
    LEFT JOIN LATERAL (SELECT r.finished_at FROM tickgate_runs r
        WHERE r.job = j.name AND r.status = 'succeeded'
        ORDER BY r.started_at DESC LIMIT 1) s ON true
    WHERE j.schedule->>'kind' = 'app'"""

LOCK_NAMED_OR_IN_SCOPE = f"""SELECT {JOB} FROM tickgate_jobs j
    WHERE name = ANY($1::text[])
       OR ($2::boolean AND ($3::text IS NULL OR managed_by = $3) AND labels @> $4::jsonb)
    ORDER BY name FOR NO KEY UPDATE"""


def _insert_jobs() -> Statement:
    """The name conflict is the only one skipped: a lock key taken raises, and is named."""
    p = Params()
    return p.statement(f"""INSERT INTO tickgate_jobs ({JOB_COLUMNS})
    SELECT * FROM {p.rows("jobs", JOB_TABLE).unnest("u")}
    ON CONFLICT (name) DO NOTHING RETURNING name""")


def _update_jobs() -> Statement:
    p = Params()
    return p.statement(f"""UPDATE tickgate_jobs AS j
    SET ({JOB_COLUMNS}) = ({", ".join(f"u.{c.name}" for c in JOB_TABLE.columns)})
    FROM {p.rows("jobs", JOB_TABLE).unnest("u")} WHERE j.name = u.name""")


INSERT_JOBS = _insert_jobs()
UPDATE_JOBS = _update_jobs()

DELETE_JOBS = "DELETE FROM tickgate_jobs WHERE name = ANY($1::text[])"

# A delete is a cancel (migration 0031): run in the delete's transaction right after
# DELETE or DELETE_JOBS, as a statement of its own, so that its snapshot sees every run
# whose claim the delete waited for (a claim holds the job row for its statement). The
# `running` runs of the jobs (`jobs`: names and incarnations) stay until they end (or their
# replica is gone), detached (`name@deleted:incarnation`, no job's name, so a job made
# again under the name shares no tick with them), and have their cancel asked (`by`
# who, `reason` why) with every replica told, as REQUEST_CANCEL asks it: the replica
# running each stops it and records it `cancelled`, releasing the lock. A cancel
# someone asked before stays as asked.
GONE_COLUMNS: Columns[tuple[str, UUID]] = Columns(
    Column("name", "text", lambda g: g[0]),
    Column("incarnation", "uuid", lambda g: g[1]),
)
_detaching = Params()
DETACH_RUNS = _detaching.statement(f"""WITH gone AS (
        SELECT * FROM {_detaching.rows("jobs", GONE_COLUMNS).unnest("g")}
    ), asked AS (
        UPDATE tickgate_runs r SET job = gone.name || '@deleted:' || gone.incarnation,
            cancel_requested_at = COALESCE(r.cancel_requested_at, clock_timestamp()),
            cancelled_by = CASE WHEN r.cancel_requested_at IS NULL THEN {_detaching("by")}
                                ELSE r.cancelled_by END,
            cancel_reason = CASE WHEN r.cancel_requested_at IS NULL THEN {_detaching("reason")}
                                 ELSE r.cancel_reason END
        FROM gone
        WHERE r.job = gone.name AND r.status = 'running'
        RETURNING r.id, gone.name, gone.incarnation, r.lock_key,
            pg_notify('{CANCELS_CHANNEL}', r.id::text)
    )
    INSERT INTO tickgate_detached_runs (run_id, job, incarnation, lock_key, detached_at)
    SELECT id, name, incarnation, lock_key, clock_timestamp() FROM asked""")

# Then, a statement later (a run that ended while DETACH_RUNS ran is seen ended here),
# the rest of the deleted jobs' runs go, with what cascades from them (outputs, hook
# deliveries), as the cascade from the job did before migration 0031.
DELETE_ENDED_RUNS = "DELETE FROM tickgate_runs WHERE job = ANY($1::text[])"

HOLDERS_OF_KEYS = "SELECT lock_key, name FROM tickgate_jobs WHERE lock_key = ANY($1::bigint[])"
