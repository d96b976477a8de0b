"""Every statement of the cluster-wide chores (migrations 0008 and 0012): taking a round,
the overdue book, the next-tick book and retention. One constant per statement."""

from datetime import datetime

from service.domain.jobs import Job
from service.store.columns import Column, Columns, Params, Statement
from service.store.fire_sql import ORPHANED
from service.store.rows import job_document

_JOB = job_document("j")

# Take this round of the chore named (the first argument): only if the last one began
# at least the second argument's seconds ago.
TAKE_CHORE = """UPDATE tickgate_chores SET started_at = clock_timestamp()
    WHERE name = $1 AND started_at < clock_timestamp() - make_interval(secs => $2)
    RETURNING true"""

# Keyset paging in name order: each page is one probe of the primary key.
ACTIVE_JOBS_PAGE = f"""SELECT {_JOB} FROM tickgate_jobs j
    WHERE j.state = 'active' AND ($1::text IS NULL OR j.name > $1)
    ORDER BY j.name LIMIT $2"""

# The whole book at once, so a scrape never sees half of two checks. A job deleted
# while the check walked is left out; it has no row to refer to.
CLEAR_BOOK = "DELETE FROM tickgate_overdue"
# The book's rows: each job and the tick it missed.
BOOK_COLUMNS: Columns[tuple[str, datetime]] = Columns(
    Column("job", "text", lambda t: t[0]),
    Column("tick", "timestamptz", lambda t: t[1]),
)
_filing = Params()
FILE_BOOK = _filing.statement(f"""INSERT INTO tickgate_overdue (job, tick)
    SELECT t.job, t.tick FROM {_filing.rows("ticks", BOOK_COLUMNS).unnest("t")}
    JOIN tickgate_jobs j ON j.name = t.job""")
FINISH_CHORE = "UPDATE tickgate_chores SET finished_at = clock_timestamp() WHERE name = $1"

SUMMARY = """SELECT (SELECT count(*) FROM tickgate_overdue) AS overdue,
    (SELECT finished_at FROM tickgate_chores WHERE name = 'overdue') AS checked_at"""

BOOKED_JOBS = f"""SELECT {_JOB}, o.tick AS overdue_tick FROM tickgate_overdue o
    JOIN tickgate_jobs j ON j.name = o.job ORDER BY j.name"""

# The next-tick book's rows: each job (at the revision read) and its next tick (None:
# none left).
NEXT_TICK_COLUMNS: Columns[tuple[Job, datetime | None]] = Columns(
    Column("job", "text", lambda t: t[0].name),
    Column("tick", "timestamptz", lambda t: t[1]),
    Column("incarnation", "uuid", lambda t: t[0].incarnation),
    Column("version", "bigint", lambda t: t[0].version),
)


def _file_next_ticks(p: Params) -> str:
    """The next-tick book (migration 0012): a tick is filed only for a job still active
    at the revision given (a change made meanwhile files its own), and a row is written
    only if its tick moved. The rows to write lock their job FOR KEY SHARE: a DELETE
    committing after this statement's snapshot then drops the row from the insert (the
    job is gone) instead of failing its foreign key check; jobs whose tick is already
    booked take no lock."""
    return f"""INSERT INTO tickgate_next_ticks (job, tick)
    SELECT t.job, coalesce(t.tick, 'infinity')
    FROM {p.rows("ticks", NEXT_TICK_COLUMNS).unnest("t")}
    JOIN tickgate_jobs j ON j.name = t.job AND j.incarnation = t.incarnation
        AND j.version = t.version AND j.state = 'active'
    WHERE NOT EXISTS (SELECT FROM tickgate_next_ticks n
                      WHERE n.job = t.job AND n.tick = coalesce(t.tick, 'infinity'))
    FOR KEY SHARE OF j
    ON CONFLICT (job) DO UPDATE SET tick = excluded.tick
        WHERE tickgate_next_ticks.tick <> excluded.tick"""


_next_ticks = Params()
FILE_NEXT_TICKS = _next_ticks.statement(_file_next_ticks(_next_ticks))


def _file_next_ticks_page() -> Statement:
    """The overdue check's page of active jobs, as FILE_NEXT_TICKS; and the rows of jobs
    in the page's name range (`after`, `through`] (NULL: open) that are no longer active
    go, so the book stays small."""
    p = Params()
    after, through = p("after", "text"), p("through", "text")
    return p.statement(f"""WITH filed AS ({_file_next_ticks(p)})
    DELETE FROM tickgate_next_ticks n USING tickgate_jobs j
    WHERE j.name = n.job AND j.state <> 'active'
      AND ({after} IS NULL OR n.job > {after}) AND ({through} IS NULL OR n.job <= {through})""")


FILE_NEXT_TICKS_PAGE = _file_next_ticks_page()

# Retention (migration 0008's watermark): for PRUNE_JOBS_PER_STATEMENT jobs (`jobs`)
# after the name `after` (NULL: from the first), keeping the newest `keep` rows of each.
# The deletion and the watermark move together, in one statement: a backfill that
# finds a pruned tick missing from the ledger finds the watermark covering it too.
# The watermark only moves forward (a row older than it may still be pruned later).
# A row is spared while its tick is within the job's reach (grace + jitter, `Job.reach`)
# and 300 s more: a pruned tick a replica could still fire would run again.
# Jobs are key-share locked in name order, as the API locks them, before their runs:
# a job deleted meanwhile (it locks the job, then its runs) makes this wait, not deadlock.
_pruning = Params()
_keep, _after, _jobs = _pruning("keep"), _pruning("after", "text"), _pruning("jobs")
PRUNE_RUNS = _pruning.statement(f"""WITH batch AS (
        SELECT name, misfire_grace_seconds + jitter_seconds AS reach FROM tickgate_jobs
        WHERE {_after} IS NULL OR name > {_after} ORDER BY name LIMIT {_jobs}
        FOR KEY SHARE),
    doomed AS (
        SELECT old.id FROM batch j
        CROSS JOIN LATERAL (
            SELECT id, scheduled_for, status FROM tickgate_runs
            WHERE job = j.name ORDER BY scheduled_for DESC OFFSET {_keep}) AS old
        WHERE old.status <> 'running'
          AND old.scheduled_for
              < clock_timestamp() - make_interval(secs => j.reach + 300)),
    deleted AS (
        DELETE FROM tickgate_runs r USING doomed WHERE r.id = doomed.id
        RETURNING r.job, r.scheduled_for),
    marked AS (
        INSERT INTO tickgate_pruned (job, through)
        SELECT job, max(scheduled_for) FROM deleted GROUP BY job
        ON CONFLICT (job) DO UPDATE
            SET through = greatest(tickgate_pruned.through, excluded.through))
    SELECT (SELECT count(*) FROM deleted) AS pruned,
        (SELECT max(name) FROM batch) AS last_job""")

# The outputs and logs a job keeps, in all, at most `bytes` (as stored: compressed
# jsonb; TICKGATE_OUTPUT_BYTES_PER_JOB): for the jobs of one retention batch (after the
# name `after`, `jobs` of them), the outputs and logs of the oldest runs past it are
# dropped, the runs themselves kept. pg_column_size reads a stored value's size without
# reading it.
_trimming = Params()
_bytes, _after, _jobs = _trimming("bytes"), _trimming("after", "text"), _trimming("jobs")
TRIM_OUTPUTS = _trimming.statement(f"""WITH batch AS (
        SELECT name FROM tickgate_jobs
        WHERE {_after} IS NULL OR name > {_after} ORDER BY name LIMIT {_jobs}),
    sized AS (
        SELECT o.run_id,
               sum(coalesce(pg_column_size(o.output), 0) + coalesce(pg_column_size(o.log), 0))
                   OVER (PARTITION BY r.job ORDER BY r.scheduled_for DESC, r.id DESC)
                   AS with_newer
        FROM batch j
        JOIN tickgate_runs r ON r.job = j.name
        JOIN tickgate_run_outputs o ON o.run_id = r.id
        WHERE o.output IS NOT NULL OR o.log IS NOT NULL),
    trimmed AS (
        UPDATE tickgate_run_outputs o SET output = NULL, log = NULL
        FROM sized WHERE o.run_id = sized.run_id AND sized.with_newer > {_bytes}
        RETURNING 1)
    SELECT count(*) FROM trimmed""")

# The newest tick of a job whose run retention deleted.
PRUNED_THROUGH = "SELECT through FROM tickgate_pruned WHERE job = $1"

# How long the row of a run a delete left behind (migration 0031) is kept once it ended:
# meanwhile GET /v1/runs/{id} shows how it ended (`cancelled`, naming the delete).
DETACHED_KEPT_SECONDS = 300
# Retention of the runs a delete left behind: each goes once it has ended that long
# ago, or at once if its replica is gone (an orphan: nobody is left to end it, and its
# job, history and all, was deleted). Their rows, few, are found through their table.
PRUNE_DETACHED = f"""WITH doomed AS (
        SELECT r.id FROM tickgate_detached_runs d JOIN tickgate_runs r ON r.id = d.run_id
        WHERE (r.status <> 'running'
               AND r.finished_at < clock_timestamp() - make_interval(secs => $1))
           OR ({ORPHANED}))
    DELETE FROM tickgate_runs r USING doomed WHERE r.id = doomed.id"""
