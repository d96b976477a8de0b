"""Every statement of the tick cursors' audit (migration 0014), one constant each.

The audit runs in one transaction per batch: set `due_at` again where claims moved the
cursor on, lock the lagging cursors, read the rows of the ticks they wait for, then write
the misfires and move the cursors (the owed ticks are claimed afterwards, as any). Claims and skips
lock a job's cursor too, so the audit's lock and theirs wait for each other: no tick is
claimed while the audit counts it as missed.
"""

from service.store.fire_sql import OWN_BACKEND_START
from service.store.hooks_sql import deliveries
from service.store.members_sql import MEMBER_IS_LIVE
from service.store.rows import job_document

# The cursors whose `due_at` is more than $2 seconds (the takeover time) behind the
# database's clock and whose claims moved them on since (the tick is no longer behind),
# at most $1 of them: `due_at` is set again from the tick, no schedule math needed. Rows
# a claim, a skip, an edit or another audit holds are skipped, never waited for.
REFRESH = """WITH moved AS (
        SELECT job FROM tickgate_cursors
        WHERE due_at < clock_timestamp() - make_interval(secs => $2)
          AND tick >= clock_timestamp() - make_interval(secs => $2)
        ORDER BY due_at LIMIT $1
        FOR UPDATE SKIP LOCKED)
    UPDATE tickgate_cursors k SET due_at = k.tick FROM moved WHERE k.job = moved.job"""

# The cursors that do lag: the tick they wait for is due more than $2 seconds ago, the
# longest lagging first, at most $1, with their jobs as they stand, locked, skipping
# (never waiting for) rows others hold: this round leaves them to the next. An audit that
# takes nothing over ($3 false) reads only the cursors with a tick past its job's reach
# to record, and leaves the others alone (its lock would make their claims wait).
LAGGING = f"""SELECT {job_document("j")}, k.tick AS cursor, clock_timestamp() AS now
    FROM tickgate_cursors k JOIN tickgate_jobs j ON j.name = k.job
    WHERE k.due_at < clock_timestamp() - make_interval(secs => $2)
      AND k.tick < clock_timestamp() - make_interval(secs => $2)
      AND j.state = 'active'
      AND ($3 OR k.tick < clock_timestamp()
          - make_interval(secs => j.misfire_grace_seconds + j.jitter_seconds))
    ORDER BY k.due_at LIMIT $1
    FOR UPDATE OF k SKIP LOCKED FOR KEY SHARE OF j SKIP LOCKED"""

# The ticks of each job ($1) from its cursor ($2) on that have a ledger row, the first
# $3 of each: one range of the (job, scheduled_for) index per job. A manual run is no
# tick's outcome, whenever it was asked for; a backfill run is the outcome of its tick.
DECIDED = """SELECT c.job, r.scheduled_for
    FROM unnest($1::text[], $2::timestamptz[]) AS c (job, cursor)
    CROSS JOIN LATERAL (
        SELECT scheduled_for FROM tickgate_runs
        WHERE job = c.job AND scheduled_for >= c.cursor AND trigger NOT IN ('manual', 'chain')
        ORDER BY scheduled_for LIMIT $3) AS r"""

# The queue_one slots (migration 0003) of the lagging jobs $1 that still hold a tick: the
# waiter's time has not run out and the tick has no row. Such a tick runs after the run
# in progress, whatever its grace: the audit neither records it nor hands it over while
# its waiter is live, a live member of its name that joined before it took the slot
# (migration 0028: one restarted under the same name forgot the tick). When the audit
# takes over ($3), the slot of a waiter not live passes to the auditing replica ($2),
# which waits in its place for the time the slot has left (`seconds_left`, `adopted`).
# The members are read (pg_locks, whole) only if some slot is found.
WAITING = f"""WITH live AS MATERIALIZED (
        SELECT m.runner_id, m.started_at FROM tickgate_members m WHERE {MEMBER_IS_LIVE}
    ), slots AS (
        SELECT p.job, p.scheduled_for, p.runner, p.expires_at,
            EXISTS (SELECT 1 FROM live WHERE live.runner_id = p.runner
                    AND live.started_at <= coalesce(p.reserved_at, 'infinity')) AS live
        FROM tickgate_pending p
        WHERE p.job = ANY($1::text[]) AND p.expires_at > clock_timestamp()
          AND NOT EXISTS (SELECT 1 FROM tickgate_runs r
                          WHERE r.job = p.job AND r.scheduled_for = p.scheduled_for)
    ), adopted AS (
        UPDATE tickgate_pending p SET runner = $2, reserved_at = clock_timestamp()
        FROM slots s
        WHERE $3 AND NOT s.live AND p.job = s.job AND p.scheduled_for = s.scheduled_for
          AND p.runner = s.runner
        RETURNING p.job
    )
    SELECT s.job, s.scheduled_for, a.job IS NOT NULL AS adopted,
        extract(epoch FROM s.expires_at - clock_timestamp())::float8 AS seconds_left
    FROM slots s LEFT JOIN adopted a ON a.job = s.job"""

# The misfire rows of the runs of ticks nobody started ($1 jobs, $2 ids, $3 each run's
# last tick, $4 how many, $5 notes, $10 their hooks' calls; $6 the runner), and each
# cursor's new place ($7 jobs, $8 ticks, NULL for none left; $9 when to look again, NULL
# for never).
MOVE_CURSORS = f"""WITH misfires AS (
        SELECT * FROM unnest($1::text[], $2::uuid[], $3::timestamptz[], $4::int[], $5::text[],
                             $10::jsonb[])
            AS m (job, id, tick, missed, note, calls)
    ), recorded AS (
        INSERT INTO tickgate_runs (id, job, scheduled_for, trigger, status, skip_reason, error,
            missed_ticks, started_at, finished_at, duration_ms, attempts, runner, job_version,
            lock_key, locked, backend_pid, backend_start)
        SELECT m.id, m.job, m.tick, 'schedule', 'skipped', 'misfire', m.note, m.missed,
            clock_timestamp(), clock_timestamp(), 0, 0, $6, j.version, j.lock_key, false,
            pg_backend_pid(), {OWN_BACKEND_START}
        FROM misfires m JOIN tickgate_jobs j ON j.name = m.job
        ORDER BY m.job, m.tick
        ON CONFLICT (job, scheduled_for) DO NOTHING
        RETURNING id, job, started_at
    ), hooked AS (
        {
    deliveries('''(SELECT r.id AS run_id, r.job, r.started_at, m.calls
            FROM recorded r JOIN misfires m ON m.id = r.id WHERE m.calls IS NOT NULL)''')
}
    )
    UPDATE tickgate_cursors k SET tick = coalesce(c.tick, 'infinity'),
        due_at = coalesce(c.due_at, 'infinity')
    FROM unnest($7::text[], $8::timestamptz[], $9::timestamptz[]) AS c (job, tick, due_at)
    WHERE k.job = c.job"""

# A job's cursor, for the API and the tests.
CURSOR = "SELECT tick FROM tickgate_cursors WHERE job = $1"

# The window (migration 0016): each active job of the buckets $1 whose cursor may fall
# due before $2, the window's end, with its cursor; one range of the (bucket, due_at)
# index per bucket. `due_at` is a bound at or before the cursor's due time, so a job
# whose claims moved its cursor on a moment ago is read too, until the audit sets it
# again: the plan then files nothing for it. Each job's revision, not the job: a crowd
# is read again while it drains, and the window reads the definitions only of the jobs
# it does not hold at that revision (WINDOW_JOBS).
WINDOW = """SELECT j.name, j.incarnation, j.version, k.tick AS cursor
    FROM tickgate_cursors k JOIN tickgate_jobs j ON j.name = k.job
    WHERE k.bucket = ANY($1::smallint[]) AND k.due_at < $2 AND j.state = 'active'"""

# The same for every bucket (a replica alone, or with ownership off).
WINDOW_ALL = """SELECT j.name, j.incarnation, j.version, k.tick AS cursor
    FROM tickgate_cursors k JOIN tickgate_jobs j ON j.name = k.job
    WHERE k.due_at < $1 AND j.state = 'active'"""

# The jobs of the names $1 that a window read and does not hold at their revision, as
# they stand if still active, each with its cursor.
WINDOW_JOBS = f"""SELECT {job_document("j")}, k.tick AS cursor
    FROM tickgate_jobs j JOIN tickgate_cursors k ON k.job = j.name
    WHERE j.name = ANY($1::text[]) AND j.state = 'active'"""

# The jobs of the names $1 as they stand, in any state, each with its cursor: what a
# window makes of a change it was notified of.
CURSORED_JOBS = f"""SELECT {job_document("j")}, k.tick AS cursor
    FROM tickgate_jobs j JOIN tickgate_cursors k ON k.job = j.name
    WHERE j.name = ANY($1::text[])"""

# A write of jobs ($1 names, $2 incarnations, $3 versions) moves each cursor still at its
# job's threshold (just made, or made anew by a new threshold) on to the job's first tick
# ($4, which the writer worked out; NULL: none), if the job is still the revision
# written and active: no tick lies between them, so the invariant holds, and `due_at` is
# right from the start. A job is then read by no window before its first tick's, and
# by no audit at all, however many are made at once.
OPEN_CURSORS = """UPDATE tickgate_cursors k
    SET tick = coalesce(c.first, 'infinity'), due_at = coalesce(c.first, 'infinity')
    FROM unnest($1::text[], $2::uuid[], $3::bigint[], $4::timestamptz[])
        AS c (job, incarnation, version, first)
    JOIN tickgate_jobs j ON j.name = c.job AND j.incarnation = c.incarnation
        AND j.version = c.version AND j.state = 'active'
    WHERE k.job = c.job AND k.tick = j.fire_after"""

# An edit that gives active jobs other ticks (a new threshold), or pauses them, first
# locks their cursors ($1, in name order, as RECORD_SKIPS does), waiting for a claim,
# skip or audit that holds one: no tick of the old definition is claimed or recorded
# behind the edit's back (a claim finds the cursor held, asks again, and then meets the
# new version). Answers each cursor, and the database's clock read under the locks: the
# edit's moment.
LOCK_CURSORS = """SELECT job, tick, clock_timestamp() AS now FROM tickgate_cursors
    WHERE job = ANY($1::text[]) ORDER BY job FOR NO KEY UPDATE"""

# The ticks of each job ($1) from its cursor ($2) through the edit's moment ($3) that have
# a ledger row, the first $4 of each: which of the old definition's ticks are decided.
DECIDED_THROUGH = """SELECT c.job, r.scheduled_for
    FROM unnest($1::text[], $2::timestamptz[]) AS c (job, cursor)
    CROSS JOIN LATERAL (
        SELECT scheduled_for FROM tickgate_runs
        WHERE job = c.job AND scheduled_for >= c.cursor AND scheduled_for <= $3
          AND trigger NOT IN ('manual', 'chain')
        ORDER BY scheduled_for LIMIT $4) AS r"""

# The `superseded` rows of the ticks the old definition left undecided ($1 jobs, $2 ids,
# $3 each run's last tick, $4 how many, $5 notes; $6 the runner), written before the job
# row changes, under the cursors' locks: the version they name is the old one. A row
# already there (the first writer wins) keeps its tick. No hook fires for them: the
# user's own edit replaced them.
RECORD_SUPERSEDED = """INSERT INTO tickgate_runs (id, job, scheduled_for, trigger, status,
        skip_reason, error, missed_ticks, started_at, finished_at, duration_ms, attempts,
        runner, job_version, lock_key, locked, backend_pid)
    SELECT s.id, s.job, s.tick, 'schedule', 'skipped', 'superseded', s.note, s.missed,
        clock_timestamp(), clock_timestamp(), 0, 0, $6, j.version, j.lock_key, false,
        pg_backend_pid()
    FROM unnest($1::text[], $2::uuid[], $3::timestamptz[], $4::int[], $5::text[])
        AS s (job, id, tick, missed, note)
    JOIN tickgate_jobs j ON j.name = s.job
    ORDER BY s.job, s.tick
    ON CONFLICT (job, scheduled_for) DO NOTHING"""
