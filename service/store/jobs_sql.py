"""Every statement of the job definitions (create, read, list, change, delete), one
constant each."""

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
JOBS_WITH_LAST_RUN = f"""SELECT {JOB}, {last_run_columns("last")}
    FROM tickgate_jobs j LEFT JOIN LATERAL ({_LAST_RUN_OF_J}) AS last ON true"""

# Changes lock job rows FOR NO KEY UPDATE: two changes of a job still take turns, but a
# claim (which holds its jobs' rows FOR KEY SHARE for one statement) never waits for
# one, nor one for a claim; only a delete does.
UPDATE_JOB = f"UPDATE tickgate_jobs SET ({JOB_COLUMNS}) = ({JOB_PLACEHOLDERS}) WHERE name = $1"

LOCK_JOBS = f"""SELECT {JOB} FROM tickgate_jobs j WHERE name = ANY($1::text[])
    ORDER BY name FOR NO KEY UPDATE"""

# Jobs in name order after the name given first (NULL: from the first), filtered by
# state, task and name prefix (the next three), at most the fifth argument of them, with
# the labels of the sixth.
LIST_JOBS = f"""{JOBS_WITH_LAST_RUN}
    WHERE ($1::text IS NULL OR j.name > $1)
      AND ($2::text IS NULL OR j.state = $2)
      AND ($3::text IS NULL OR j.task = $3)
      AND ($4::text IS NULL OR starts_with(j.name, $4))
      AND j.labels @> $6::jsonb
    ORDER BY j.name LIMIT $5"""
SHOW_JOB = f"{JOBS_WITH_LAST_RUN} WHERE j.name = $1"

# Active jobs with nothing left to fire, by the database clock: the window closed and
# every tick in it decided (the cursor past the last one: a tick due before the end may
# still be waiting under queue_one, or within its grace), the run cap is used up, or the
# one-time tick is past its reach. Every replica asks every
# round, so each arm reads an index that holds only active jobs that may end: a range
# of the window ends passed (0003), and the jobs with a run cap or a one-time tick
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

# The book's order (migration 0012): the active jobs with a tick by (tick, name), after
# the position (the seventh argument, the first); then (JOBS_AFTER_TICKS) every other
# job by name, after the first. The filters (the second to the fifth: state, task, name
# prefix, labels) are list_jobs' own; the sixth is the limit.
JOB_FILTERS = """($2::text IS NULL OR j.state = $2)
    AND ($3::text IS NULL OR j.task = $3)
    AND ($4::text IS NULL OR starts_with(j.name, $4))
    AND j.labels @> $5::jsonb"""

JOBS_BY_NEXT_TICK = f"""SELECT {JOB}, {last_run_columns("last")}, n.tick AS booked_tick
    FROM tickgate_next_ticks n JOIN tickgate_jobs j ON j.name = n.job
    LEFT JOIN LATERAL ({_LAST_RUN_OF_J}) AS last ON true
    WHERE (n.tick, n.job) > ($7::timestamptz, $1::text) AND n.tick < 'infinity'
      AND j.state = 'active' AND {JOB_FILTERS}
    ORDER BY n.tick, n.job LIMIT $6"""

JOBS_AFTER_TICKS = f"""SELECT {JOB}, {last_run_columns("last")}, NULL::timestamptz AS booked_tick
    FROM tickgate_jobs j LEFT JOIN tickgate_next_ticks n ON n.job = j.name
    LEFT JOIN LATERAL ({_LAST_RUN_OF_J}) AS last ON true
    WHERE j.name > $1 AND NOT (j.state = 'active' AND coalesce(n.tick < 'infinity', false))
      AND {JOB_FILTERS}
    ORDER BY j.name LIMIT $6"""

# A bulk apply's rows, locked in name order: the jobs it names (the first argument) and,
# when it prunes (the second), every job in the prune's scope: of the manager given
# third (any when NULL) with the labels given fourth.
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
