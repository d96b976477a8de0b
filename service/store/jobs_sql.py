"""Every statement of the job definitions (create, read, list, change, delete), one
constant each."""

from service.store import runs_sql
from service.store.fire_sql import CANCELS_CHANNEL
from service.store.rows import (
    JOB_COLUMN_TYPES,
    JOB_COLUMNS,
    job_document,
    last_run_columns,
)

JOBS_CHANNEL = "tickgate_jobs"

JOB_PLACEHOLDERS = ", ".join(f"${n}" for n in range(1, JOB_COLUMNS.count(",") + 2))

LOCK_KEY_UNIQUE = "tickgate_jobs_lock_key_unique"

JOB = job_document("j")  # every statement that reads whole jobs names the table j

COUNTS = "SELECT state, count(*) FROM tickgate_jobs GROUP BY state"
GET_JOB = f"SELECT {JOB} FROM tickgate_jobs j WHERE name = $1"
GET_JOBS = f"SELECT {JOB} FROM tickgate_jobs j WHERE name = ANY($1::text[])"
ACTIVE_VERSIONS = "SELECT name, incarnation, version FROM tickgate_jobs WHERE state = 'active'"
CLOCK = "SELECT clock_timestamp()"
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

# Jobs in name order after $1 (NULL: from the first), filtered as JOB_FILTERS with the
# limit $5 and the labels $6.
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
NOTIFY_EACH = "SELECT pg_notify($1, name) FROM unnest($2::text[]) AS name"

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
# the position ($7, $1); then (JOBS_AFTER_TICKS) every other job by name, after $1.
# The filters are list_jobs' own; $6 is the limit.
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

# A bulk apply's rows, locked in name order: the jobs it names and, when it prunes ($2),
# every job in the prune's scope: of the manager $3 (any when NULL) with the labels $4.
LOCK_NAMED_OR_IN_SCOPE = f"""SELECT {JOB} FROM tickgate_jobs j
    WHERE name = ANY($1::text[])
       OR ($2::boolean AND ($3::text IS NULL OR managed_by = $3) AND labels @> $4::jsonb)
    ORDER BY name FOR NO KEY UPDATE"""

UNNESTED_JOBS = "unnest({}) AS u ({})".format(
    ", ".join(f"${n}::{sql_type}[]" for n, sql_type in enumerate(JOB_COLUMN_TYPES, start=1)),
    JOB_COLUMNS,
)

# The name conflict is the only one skipped: a lock key taken raises, and is named.
INSERT_JOBS = f"""INSERT INTO tickgate_jobs ({JOB_COLUMNS})
    SELECT * FROM {UNNESTED_JOBS} ON CONFLICT (name) DO NOTHING RETURNING name"""

UPDATE_JOBS = f"""UPDATE tickgate_jobs AS j
    SET ({JOB_COLUMNS}) = ({", ".join(f"u.{c}" for c in JOB_COLUMNS.split(", "))})
    FROM {UNNESTED_JOBS} WHERE j.name = u.name"""

DELETE_JOBS = "DELETE FROM tickgate_jobs WHERE name = ANY($1::text[])"

# A delete is a cancel (migration 0031): run in the delete's transaction right after
# DELETE or DELETE_JOBS, as a statement of its own, so that its snapshot sees every run
# whose claim the delete waited for (a claim holds the job row for its statement). The
# `running` runs of the jobs $1 (their incarnations $2) stay until they end (or their
# replica is gone), detached (`name@deleted:incarnation`, no job's name, so a job made
# again under the name shares no tick with them), and have their cancel asked ($3 who,
# $4 why) with every replica told, as REQUEST_CANCEL asks it: the replica running each
# stops it and records it `cancelled`, releasing the lock. A cancel someone asked
# before stays as asked.
DETACH_RUNS = f"""WITH gone AS (
        SELECT * FROM unnest($1::text[], $2::uuid[]) AS g(name, incarnation)
    ), asked AS (
        UPDATE tickgate_runs r SET job = gone.name || '@deleted:' || gone.incarnation,
            cancel_requested_at = COALESCE(r.cancel_requested_at, clock_timestamp()),
            cancelled_by = CASE WHEN r.cancel_requested_at IS NULL THEN $3
                                ELSE r.cancelled_by END,
            cancel_reason = CASE WHEN r.cancel_requested_at IS NULL THEN $4
                                 ELSE r.cancel_reason END
        FROM gone
        WHERE r.job = gone.name AND r.status = 'running'
        RETURNING r.id, gone.name, gone.incarnation, r.lock_key,
            pg_notify('{CANCELS_CHANNEL}', r.id::text)
    )
    INSERT INTO tickgate_detached_runs (run_id, job, incarnation, lock_key, detached_at)
    SELECT id, name, incarnation, lock_key, clock_timestamp() FROM asked"""

# Then, a statement later (a run that ended while DETACH_RUNS ran is seen ended here),
# the rest of the deleted jobs' runs go, with what cascades from them (outputs, hook
# deliveries), as the cascade from the job did before migration 0031.
DELETE_ENDED_RUNS = "DELETE FROM tickgate_runs WHERE job = ANY($1::text[])"

HOLDERS_OF_KEYS = "SELECT lock_key, name FROM tickgate_jobs WHERE lock_key = ANY($1::bigint[])"
