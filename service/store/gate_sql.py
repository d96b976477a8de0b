"""Every statement of the app gate (`tickgate.apscheduler`, `service.store.gate`): an app's
scheduler hands it a run time, and the gate claims that tick in the ledger, records its
end, or records why it did not run. A tick is decided by the ledger's unique
(job, scheduled_for), as a replica's claim is; the job's advisory lock, held over the
run on the same connection, keeps two runs of one job apart across processes."""

from service.store.columns import Params, Statement
from service.store.fire_sql import OWN_BACKEND_START, same_backend

APP_JOB = "schedule->>'kind' = 'app'"

# The lock and its release, on the connection the run holds throughout. Never the
# blocking form: a tick another process holds is not waited for.
TRY_LOCK = "SELECT pg_try_advisory_lock($1)"
UNLOCK = "SELECT pg_advisory_unlock($1)"

ABANDONED_ERROR = "the app process running this stopped without finishing it"

# A run whose backend is gone: the process that claimed it died (its connection with
# it), so it never ends by itself. (PID, start) names a backend: PIDs are reused.
_HOLDER_GONE = f"""NOT EXISTS (SELECT 1 FROM pg_stat_activity a
    WHERE {same_backend("a.pid", "a.backend_start", "r.backend_pid", "r.backend_start")})"""


def _claim() -> Statement:
    """Claim one tick of an app's job: the ledger row `running`, unless the tick has a
    row already (`claimed` false) or the job is not active (`state`: paused, completed;
    NULL: no such app job). Runs of the job whose process died are ended `abandoned`
    first, and never run again: the app's scheduler moved past their ticks.

    The job row is read FOR KEY SHARE: a delete waits for the claim, and a job deleted
    first reads as gone."""
    p = Params()
    return p.statement(f"""WITH job AS MATERIALIZED (
        SELECT name, version, state, lock_key FROM tickgate_jobs
        WHERE name = {p("job", "text")} AND {APP_JOB} FOR KEY SHARE
    ), abandoned AS (
        UPDATE tickgate_runs r SET status = 'abandoned', finished_at = clock_timestamp(),
            duration_ms = (extract(epoch FROM clock_timestamp() - r.started_at) * 1000)::bigint,
            error = '{ABANDONED_ERROR}'
        FROM job WHERE r.job = job.name AND r.status = 'running' AND {_HOLDER_GONE}
        RETURNING r.id
    ), claimed AS (
        INSERT INTO tickgate_runs (id, job, scheduled_for, trigger, status, started_at,
            runner, job_version, lock_key, locked, backend_pid, backend_start)
        SELECT {p("id", "uuid")}, name, {p("tick", "timestamptz")}, 'schedule', 'running',
            clock_timestamp(), {p("runner", "text")}, version, lock_key,
            {p("locked", "boolean")}, pg_backend_pid(), {OWN_BACKEND_START}
        FROM job WHERE state = 'active'
        ON CONFLICT (job, scheduled_for) DO NOTHING
        RETURNING id
    )
    SELECT (SELECT state FROM job) AS state, EXISTS (SELECT FROM claimed) AS claimed,
        (SELECT count(*) FROM abandoned) AS abandoned""")


CLAIM = _claim()


def _finish() -> Statement:
    """Record a claimed run's end: its status, error and duration (on the database's
    clock, as every run's). A run ended meanwhile (abandoned by a sweep) keeps its end."""
    p = Params()
    return p.statement(f"""UPDATE tickgate_runs SET status = {p("status", "text")},
        finished_at = clock_timestamp(), error = {p("error", "text")},
        duration_ms = (extract(epoch FROM clock_timestamp() - started_at) * 1000)::bigint
    WHERE id = {p("id", "uuid")} AND status = 'running'
    RETURNING finished_at""")


FINISH = _finish()


def _skip() -> Statement:
    """Record a tick of an app's job as skipped with `reason`, unless it has a row: a
    process that found it past its misfire grace (`misfire`: no process started it in
    time), or one that found another run of the job in progress (`overlap`: only while a
    run of an earlier tick, by a live process, is still `running`; the lock alone may be
    another process claiming this very tick, or a Go replica sharing the key)."""
    p = Params()
    job, tick, reason = p("job", "text"), p("tick", "timestamptz"), p("reason", "text")
    return p.statement(f"""INSERT INTO tickgate_runs (id, job, scheduled_for, trigger,
        status, skip_reason, error, started_at, finished_at, duration_ms, attempts, runner,
        job_version, lock_key, locked, backend_pid, backend_start)
    SELECT {p("id", "uuid")}, j.name, {tick}, 'schedule', 'skipped', {reason},
        {p("note", "text")}, clock_timestamp(), clock_timestamp(), 0, 0, {p("runner", "text")},
        j.version, j.lock_key, false, pg_backend_pid(), {OWN_BACKEND_START}
    FROM tickgate_jobs j
    WHERE j.name = {job} AND j.{APP_JOB} AND j.state = 'active'
      AND ({reason} <> 'overlap' OR EXISTS (
          SELECT 1 FROM tickgate_runs r WHERE r.job = j.name AND r.status = 'running'
            AND r.scheduled_for < {tick} AND NOT {_HOLDER_GONE}))
    ON CONFLICT (job, scheduled_for) DO NOTHING
    RETURNING id""")


SKIP = _skip()
