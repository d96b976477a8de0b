"""Every statement of the fire path, one builder per statement, and their arguments.

The fire path is: gather due ticks, admit, claim, run, record. Claims and ends go over
the pinned connection that holds the job's advisory lock; skips and the queue_one slot
go over the API pool, since they hold no lock. Values are passed as parallel arrays
(unnest), so a crowd of ticks costs one round trip, and rows come back in the order the
ticks were given (`n`).
"""

from collections.abc import Collection, Sequence
from datetime import datetime
from uuid import UUID

from service.domain.hooks import HookCall, HookPlan, events_of_end, events_of_skip
from service.domain.jobs import Job, JobState
from service.domain.runs import AttemptEnd, Run, RunStatus, RunTrigger
from service.store.hooks_sql import deliveries, encoded_calls
from service.store.members_sql import MEMBER_IS_LIVE
from service.store.ports import BackendId, Following, NextTick, Orphan, RunEnd, Skip, TickClaim
from service.store.rows import RUN_COLUMNS, job_document

# The ledger's columns, read from the table named r (where another table is joined).
_RUN_COLUMNS_OF_R = ", ".join(f"r.{column.strip()}" for column in RUN_COLUMNS.split(","))


# When this statement's backend started (migration 0026): with its PID, the backend that
# a row it writes names. A PID alone names none: PIDs are reused. An uncorrelated
# subquery, so it is read once per statement, however many rows the statement writes.
OWN_BACKEND_START = "(SELECT backend_start FROM pg_stat_get_activity(pg_backend_pid()))"


# This session's backend, as the rows of its runs name it: read once, as a lock
# session opens, for the ends it may have to record from elsewhere.
OWN_BACKEND = f"SELECT pg_backend_pid() AS pid, {OWN_BACKEND_START} AS started_at"


def same_backend(pid: str, start: str, other_pid: str, other_start: str) -> str:
    """Whether two (PID, start) pairs name one backend: the same PID, and the same start
    where both are known. A row written before migration 0026 knows no start, and
    pg_stat_activity hides the start of another role's backend: then the PID decides,
    as it did before (a backend thought alive keeps its run; none is taken twice)."""
    return f"""({pid} = {other_pid} AND ({start} IS NULL OR {other_start} IS NULL
        OR {start} = {other_start}))"""


# A claim's view of each job: the row and its cursor.
_CURSORED_JOB = """j.name, j.incarnation, j.version, j.state, j.overlap, j.max_runs,
    j.runs_started, j.fire_after, k.tick AS cursor"""


def _passed(tick: str, job: str) -> str:
    """A scheduled tick before its job's cursor: it has its outcome, whatever the ledger
    shows now."""
    return f"({tick}.trigger IN ('schedule', 'catchup') AND {tick}.scheduled_for < {job}.cursor)"


def _waits(slot: str) -> str:
    """Whether the queue_one slot `slot` still holds its tick: the waiter's time has not
    run out, and the tick is undecided (at or after the job's cursor, and without a
    row). A slot whose tick was decided otherwise (skipped, dropped by a new threshold)
    holds nothing, though its waiter died before freeing it: it never keeps the job's
    later ticks out until it expires."""
    return f"""({slot}.expires_at > clock_timestamp()
        AND EXISTS (SELECT 1 FROM tickgate_cursors c
                    WHERE c.job = {slot}.job AND c.tick <= {slot}.scheduled_for)
        AND NOT EXISTS (SELECT 1 FROM tickgate_runs r
                        WHERE r.job = {slot}.job AND r.scheduled_for = {slot}.scheduled_for))"""


def _advance(decided: str) -> str:
    """Move each cursor standing at a scheduled tick of `decided` on to the tick after it
    (`decided`: job, scheduled_for, trigger, following, opens, fire_after). Every tick
    there ends the statement with a row, this statement's or one already there (the
    conflict that kept this one out), so the cursor may pass it either way. A cursor
    that stands elsewhere stays: an earlier tick is still undecided, or the job changed.

    Only `tick` moves, an update PostgreSQL makes in place (no index names it), so a
    cursor costs a claim little; `due_at` falls behind, and the audit, finding it
    passed, sets it again from the tick (or takes over a cursor that does lag). A job
    left with no tick never lags."""
    return f"""UPDATE tickgate_cursors k SET tick = coalesce(d.following, 'infinity'),
            due_at = CASE WHEN d.following IS NULL THEN 'infinity' ELSE k.due_at END
        FROM {decided} d
        WHERE k.job = d.job AND d.trigger IN ('schedule', 'catchup')
          AND (k.tick = d.scheduled_for OR (d.opens AND k.tick = d.fire_after))"""


def claim_statement(*, counted: bool) -> str:
    """Per tick: try the job's lock, unless this session holds it already (`held`: the
    keys it holds, for other runs; a session's locks are re-entrant, so taking one
    again would let two runs of a job through); read the job under a row lock (a delete waits for
    the claim, and a job deleted first reads as gone, for its own ticks only); insert
    the ledger row if the job is the one the replica scheduled from and a run cap
    leaves room; release the lock of every tick not claimed. For ticks not claimed it
    also says whether the tick has a row already (`ticked`) and whether another run of
    the job is in progress, or an earlier tick of a queue_one job waits for one (`busy`:
    the overlap policy's question). A tick never runs ahead of an earlier waiting tick.

    Rows go in (job, tick) order, so two replicas inserting the same ticks of "allow"
    jobs wait on each other in one order, never in a cycle. A claim that counts runs
    (`counted`: one tick of a job with `max_runs`) locks the row for update and raises
    its count in the same statement. A `skipped` row is no run: a backfill may claim it,
    and the row keeps its id (the skip's hook deliveries name it), so a tick's answer is
    found by (job, tick), never by the id the claim brought.
    A claimed tick releases the queue_one slot that names it, whoever reserved it. A
    claimed tick that takes any version (manual, backfill) comes back with the job as
    stored (`stored_job`): the definition it runs, of the version its row names.

    The job's cursor (migration 0014) is locked too, for the update that may follow: a
    tick is claimed, or counted before its cursor, by one statement at a time. A claim
    never waits for a cursor: where the audit, a skip, an edit or another claim holds
    it, the tick is `contended` (its lock given back) and asked again a moment
    later, so one busy job never holds up a batch of ticks. Ticks not claimed are
    answered from the rows as the statement saw them. A scheduled tick before the
    cursor has its outcome (`ticked`), and an admitted one at the cursor moves it on to
    the tick after (`following`; `opens`: the tick is the job's first after its threshold,
    where a cursor starts). Manual runs and backfills are no nominal ticks: they
    neither wait for the cursor nor move it. A tick claimed `while_active` finds
    a job that is not active `inactive`.
    """
    row_lock = "FOR NO KEY UPDATE" if counted else "FOR KEY SHARE"
    counting = (
        """, counted AS (
        UPDATE tickgate_jobs SET runs_started = runs_started + 1
        WHERE name IN (SELECT job FROM claimed WHERE trigger NOT IN ('manual', 'chain'))
        RETURNING name)"""
        if counted
        else ""
    )
    return f"""WITH ticks AS (
        SELECT * FROM unnest($1::text[], $2::uuid[], $3::timestamptz[], $4::text[],
                             $5::bigint[], $6::boolean[], $7::uuid[], $8::bigint[],
                             $9::boolean[], $12::timestamptz[], $13::boolean[],
                             $14::boolean[], $15::jsonb[], $16::text[])
            WITH ORDINALITY AS t(job, id, scheduled_for, trigger, lock_key, locking,
                                 incarnation, version, any_version, following, opens,
                                 while_active, run_args, run_note, n)
    ), gated AS MATERIALIZED (
        -- CASE, not AND: the lock must not be tried for a key this session holds.
        SELECT ticks.*, CASE WHEN NOT locking THEN true
                             WHEN lock_key = ANY($11::bigint[]) THEN false
                             ELSE pg_try_advisory_lock(lock_key) END AS got,
               EXISTS (SELECT 1 FROM tickgate_pending p
                       WHERE p.job = ticks.job AND p.scheduled_for < ticks.scheduled_for
                         AND {_waits("p")}) AS queued_before
        FROM ticks
    ), current AS MATERIALIZED (
        -- Locked only where a tick got its lock. The cursor is never waited for: one
        -- another statement holds (the audit, a skip, an edit, a claim elsewhere)
        -- leaves its ticks `contended`, asked again, and the rest of the batch goes on.
        -- The job row is (a delete, or an edit of a counted job: both brief). A manual
        -- run or backfill runs the job as stored, read here from the row as locked:
        -- after waiting on an edit, that is the edited row, which the snapshot is not.
        SELECT {_CURSORED_JOB}, CASE WHEN j.name IN (SELECT job FROM gated WHERE any_version)
                                     THEN {job_document("j", None)} END AS stored
        FROM tickgate_jobs j JOIN tickgate_cursors k ON k.job = j.name
        -- An array, not IN (SELECT ...): probes by key, where a semi-join may hash
        -- every job's cursor for each batch.
        WHERE j.name = ANY (ARRAY(SELECT job FROM gated WHERE got))
        {row_lock} OF j FOR NO KEY UPDATE OF k SKIP LOCKED
    ), looked AS (
        -- The answers' view of each job: as locked, or else as this statement saw it.
        SELECT *, true AS locked FROM current
        UNION ALL
        SELECT {_CURSORED_JOB}, NULL, false
        FROM tickgate_jobs j JOIN tickgate_cursors k ON k.job = j.name
        WHERE j.name = ANY($1::text[]) AND j.name NOT IN (SELECT name FROM current)
    ), admitted AS (
        SELECT g.*, c.version AS current_version, c.fire_after
        FROM gated g JOIN current c ON c.name = g.job
        WHERE g.got AND c.incarnation = g.incarnation
          AND ((g.any_version AND (c.state = 'active' OR NOT g.while_active))
               OR (c.version = g.version AND c.state = 'active'))
          AND (c.max_runs IS NULL OR c.runs_started < c.max_runs
               OR g.trigger IN ('manual', 'chain'))
          AND NOT g.queued_before AND NOT {_passed("g", "c")}
    ), claimed AS (
        INSERT INTO tickgate_runs (id, job, scheduled_for, trigger, status, started_at,
            runner, job_version, lock_key, locked, backend_pid, backend_start, args, note)
        SELECT id, job, scheduled_for, trigger, 'running', clock_timestamp(), $10,
            current_version, lock_key, locking, pg_backend_pid(), {OWN_BACKEND_START},
            run_args, run_note
        FROM admitted ORDER BY job, scheduled_for
        ON CONFLICT (job, scheduled_for) DO UPDATE SET
            trigger = EXCLUDED.trigger, status = 'running', skip_reason = NULL,
            missed_ticks = NULL, error = NULL, started_at = EXCLUDED.started_at,
            attempts = 1, runner = EXCLUDED.runner, job_version = EXCLUDED.job_version,
            lock_key = EXCLUDED.lock_key, locked = EXCLUDED.locked,
            backend_pid = EXCLUDED.backend_pid, backend_start = EXCLUDED.backend_start,
            finished_at = NULL, duration_ms = NULL,
            result = NULL, args = EXCLUDED.args, note = EXCLUDED.note
        WHERE tickgate_runs.status = 'skipped' AND EXCLUDED.trigger = 'backfill'
        RETURNING {RUN_COLUMNS}
    ), freed AS (
        -- A claimed tick waits no longer: the queue_one slot naming it goes, whoever
        -- reserved it (a replica that died waiting would hold it until it expired).
        DELETE FROM tickgate_pending p USING claimed c
        WHERE p.job = c.job AND p.scheduled_for = c.scheduled_for
    ), advanced AS (
        {_advance("admitted")}
    ){counting}
    SELECT g.got, c.name IS NOT NULL AS job_exists,
           COALESCE(c.incarnation = g.incarnation, false) AS same_incarnation,
           COALESCE(c.incarnation = g.incarnation AND c.version = g.version, false)
               AS same_revision,
           COALESCE(c.runs_started >= c.max_runs AND g.trigger NOT IN ('manual', 'chain'),
                    false) AS capped,
           COALESCE(g.while_active AND c.state <> 'active', false) AS inactive,
           claimed.id IS NULL
               AND (ticked.found IS NOT NULL OR COALESCE({_passed("g", "c")}, false)) AS ticked,
           (NOT g.got AND running.found IS NOT NULL)
               OR (claimed.id IS NULL AND g.queued_before) AS busy,
           COALESCE(g.got AND NOT c.locked, false) AS contended,
           CASE WHEN g.got AND g.locking AND claimed.id IS NULL
                THEN pg_advisory_unlock(g.lock_key) ELSE false END AS released,
           CASE WHEN claimed.id IS NOT NULL THEN c.stored END AS stored_job,
           statement_timestamp() AS seen_at, claimed.*
    FROM gated g LEFT JOIN looked c ON c.name = g.job
        LEFT JOIN claimed ON claimed.job = g.job AND claimed.scheduled_for = g.scheduled_for
    -- One index probe per tick (LIMIT 1 keeps the planner from hashing the whole ledger).
    -- A skip is no outcome to a backfill, which may claim it once it has the lock.
    LEFT JOIN LATERAL (
        SELECT true AS found FROM tickgate_runs r
        WHERE r.job = g.job AND r.scheduled_for = g.scheduled_for
          AND (r.status <> 'skipped' OR g.trigger <> 'backfill') LIMIT 1) AS ticked ON true
    -- Asked only of a tick that did not get its lock: `NOT g.got` in each WHERE, not in
    -- ON, where it would be checked only after the probes had run for every tick.
    LEFT JOIN LATERAL (
        -- A backfill gives way to the scheduled ticks: one due during a backfill run
        -- waits for it within its grace, not judged by the overlap policy; but
        -- queue_one's waiting is its policy, which outlasts the grace.
        SELECT true AS found FROM tickgate_runs r
        WHERE NOT g.got AND r.job = g.job AND r.status = 'running'
          AND r.scheduled_for <> g.scheduled_for
          AND (r.trigger <> 'backfill' OR c.overlap = 'queue_one')
        UNION ALL
        -- A run of the name's deleted incarnation holds the key until its cancel has
        -- stopped it (migration 0031): a run of the job in progress, as the policy sees it.
        -- The run's status is a subquery, so the few detached rows drive the probe: a
        -- join may be planned from every running run instead.
        SELECT true FROM tickgate_detached_runs d
        WHERE NOT g.got AND g.locking AND d.lock_key = g.lock_key
          AND (SELECT r.status FROM tickgate_runs r WHERE r.id = d.run_id) = 'running'
        LIMIT 1) AS running ON true
    ORDER BY g.n"""


CLAIM = claim_statement(counted=False)
CLAIM_COUNTED = claim_statement(counted=True)


def cursor_moves(
    job: Job, at: datetime, trigger: RunTrigger, following: NextTick = Following.UNKNOWN
) -> tuple[datetime | None, bool]:
    """Where the job's cursor goes once the tick `at` is decided (`following`, where
    known), and whether `at` is the job's first tick (a cursor still at the threshold waits
    for it). Manual runs and backfills move no cursor."""
    if trigger in {RunTrigger.MANUAL, RunTrigger.CHAIN, RunTrigger.BACKFILL}:
        return None, False
    if following is Following.UNKNOWN:
        following = job.tick_after(at)
    return following, job.first_tick == at


def claim_arguments(ticks: Sequence[TickClaim], held: Collection[int] = ()) -> tuple[object, ...]:
    """The claim's arguments; `held`: the lock keys the claiming session holds now."""
    moves = [cursor_moves(t.job, t.scheduled_for, t.trigger, t.following) for t in ticks]
    return (
        [tick.job.name for tick in ticks],
        [tick.run_id for tick in ticks],
        [tick.scheduled_for for tick in ticks],
        [tick.trigger.value for tick in ticks],
        [tick.job.lock_key for tick in ticks],
        [tick.lock for tick in ticks],
        [tick.job.incarnation for tick in ticks],
        [tick.job.version for tick in ticks],
        [tick.any_version for tick in ticks],
        ticks[0].runner if ticks else "",
        list(held),
        [following for following, _ in moves],
        [opens for _, opens in moves],
        [tick.while_active for tick in ticks],
        [tick.args for tick in ticks],
        [tick.note for tick in ticks],
    )


# Records runs' ends, each only while it is still `running`: a run is finished once.
# An end recorded from elsewhere names the backend that held the run ($6 its PID, $10
# its start): once another replica has taken the run over (an orphan resumed), it is
# that replica's to record, even on a backend that got the same PID.
# Times come from the database's clock, like `started_at`. It releases no lock: a
# session lock ignores transactions, so one released here would stay released if a
# later step of the statement failed (its outputs, its deliveries, a constraint checked
# at its end), leaving a run `running` and its lock gone. UNLOCK_ENDED follows it.
FINISH = f"""WITH ends AS (
        SELECT * FROM unnest($1::uuid[], $2::text[], $3::text[], $4::jsonb[], $5::int[],
                             $7::jsonb[], $8::jsonb[], $9::jsonb[])
            WITH ORDINALITY AS e(run_id, new_status, new_error, new_result, new_attempts,
                                 new_output, new_log, calls, n)
    ), finished AS (
        UPDATE tickgate_runs r SET status = e.new_status, error = e.new_error,
            result = e.new_result, attempts = e.new_attempts,
            finished_at = clock_timestamp(),
            duration_ms = round(extract(epoch FROM clock_timestamp() - r.started_at) * 1000)
        FROM ends e
        WHERE r.id = e.run_id AND r.status = 'running'
          AND ($6::int IS NULL
               OR {same_backend("r.backend_pid", "r.backend_start", "$6", "$10::timestamptz")})
        RETURNING {_RUN_COLUMNS_OF_R}
    ), kept AS (
        -- What the last attempt answered and what the run logged, beside the run
        -- (migrations 0019, 0020).
        INSERT INTO tickgate_run_outputs (run_id, output, log)
        SELECT e.run_id, e.new_output, e.new_log FROM ends e JOIN finished f ON f.id = e.run_id
        WHERE e.new_output IS NOT NULL OR e.new_log IS NOT NULL
        ON CONFLICT (run_id) DO UPDATE SET output = EXCLUDED.output, log = EXCLUDED.log
    ), hooked AS (
        {
    deliveries('''(SELECT f.id AS run_id, f.job, f.started_at, e.calls
            FROM ends e JOIN finished f ON f.id = e.run_id WHERE e.calls IS NOT NULL)''')
}
    )
    SELECT e.n, finished.*
    FROM ends e LEFT JOIN finished ON finished.id = e.run_id
    ORDER BY e.n"""


def finish_arguments(
    ends: Sequence[tuple[UUID, RunEnd]], backend: BackendId | None = None
) -> tuple[object, ...]:
    """`backend`: record the ends only of rows that still name this backend."""
    return (
        [run_id for run_id, _ in ends],
        [end.status.value for _, end in ends],
        [end.error for _, end in ends],
        [end.result for _, end in ends],
        [end.attempts for _, end in ends],
        backend.pid if backend else None,
        [end.output for _, end in ends],
        [end.log for _, end in ends],
        [encoded_calls(end.hooks) for _, end in ends],
        backend.started_at if backend else None,
    )


# The locks of ends FINISH has recorded ($1, in order; NULL: an end that holds none),
# each released once, on the session that holds them: only now, once the ends are
# committed, does a lock go (whoever takes it next finds the run ended). Whether each
# was held, in order.
UNLOCK_ENDED = """SELECT CASE WHEN u.key IS NULL THEN false
                   ELSE pg_advisory_unlock(u.key) END AS released
    FROM unnest($1::bigint[]) WITH ORDINALITY AS u(key, n)
    ORDER BY u.n"""

UNLOCK = "SELECT pg_advisory_unlock($1)"

# Release, once each, the keys of $1 this session holds now (pg_locks names them; a
# key it does not hold is left alone, so the server logs no warning): the locks a
# claim took before the server ended it at its statement or lock timeout.
UNLOCK_HELD = """SELECT pg_advisory_unlock(held.key)
    FROM (SELECT (classid::bigint << 32) | objid::bigint AS key FROM pg_locks
          WHERE locktype = 'advisory' AND objsubid = 1 AND granted
            AND pid = pg_backend_pid()) AS held
    WHERE held.key = ANY($1::bigint[])"""

# Skips hold no lock: the ledger's uniqueness alone makes the first outcome of a tick
# the only one. The job row is read under a key-share lock, so a job deleted meanwhile
# loses only its own skips, never the statement; its cursor locked, as a claim locks it: a
# scheduled tick before it is not recorded again, and one at it moves it on ($10
# following; $11 opens), only for a skip worked out from the job's threshold as it
# stands ($12, `fire_after`): the tick after it, and the first tick, are those of the
# ticks the job has now. A skip of an older definition's tick that the new one has too
# (it stands at the new cursor) is recorded, and leaves the cursor for a claim or the
# audit of the new definition to move: its `following` would pass the new ticks between.
RECORD_SKIPS = f"""WITH skips AS (
        SELECT * FROM unnest($1::text[], $2::uuid[], $3::timestamptz[], $4::text[],
                             $5::text[], $6::text[], $7::uuid[], $9::int[],
                             $10::timestamptz[], $11::boolean[], $12::timestamptz[],
                             $13::jsonb[], $14::timestamptz[])
            WITH ORDINALITY AS s(job, id, scheduled_for, trigger, reason, note, incarnation,
                                 missed_ticks, following, opens, fence, calls, at, n)
    ), jobs AS MATERIALIZED (
        SELECT {_CURSORED_JOB}, j.lock_key
        FROM tickgate_jobs j JOIN tickgate_cursors k ON k.job = j.name
        WHERE j.name = ANY($1::text[]) ORDER BY j.name FOR KEY SHARE OF j FOR NO KEY UPDATE OF k
    ), recordable AS (
        -- Each of these ends the statement with a row: this one, or the one already there.
        SELECT s.id, s.job, s.scheduled_for, s.trigger, s.reason, s.note, s.missed_ticks,
            s.following, s.opens, COALESCE(s.at, clock_timestamp()) AS at, j.fire_after,
            s.fence = j.fire_after AS same_fence,
            j.version AS job_version, j.lock_key
        FROM skips s JOIN jobs j ON j.name = s.job AND j.incarnation = s.incarnation
        WHERE NOT {_passed("s", "j")}
    ), inserted AS (
        INSERT INTO tickgate_runs (id, job, scheduled_for, trigger, status, skip_reason, error,
            missed_ticks, started_at, finished_at, duration_ms, attempts, runner, job_version,
            lock_key, locked, backend_pid, backend_start)
        SELECT id, job, scheduled_for, trigger, 'skipped', reason, note, missed_ticks,
            at, at, 0, 0, $8, job_version, lock_key, false,
            pg_backend_pid(), {OWN_BACKEND_START}
        FROM recordable
        ORDER BY job, scheduled_for
        ON CONFLICT (job, scheduled_for) DO NOTHING
        RETURNING {RUN_COLUMNS}
    ), advanced AS (
        {_advance("(SELECT * FROM recordable WHERE same_fence)")}
    ), hooked AS (
        {
    deliveries('''(SELECT i.id AS run_id, i.job, i.started_at, s.calls
            FROM inserted i JOIN skips s ON s.id = i.id WHERE s.calls IS NOT NULL)''')
}
    )
    SELECT * FROM inserted"""


def skip_arguments(
    skips: Sequence[Skip], runner: str, ids: Sequence[UUID], plan: HookPlan
) -> tuple[object, ...]:
    moves = [cursor_moves(s.job, s.scheduled_for, s.trigger, s.following) for s in skips]
    return (
        [skip.job.name for skip in skips],
        list(ids),
        [skip.scheduled_for for skip in skips],
        [skip.trigger.value for skip in skips],
        [skip.reason.value for skip in skips],
        [skip.note for skip in skips],
        [skip.job.incarnation for skip in skips],
        runner,
        [skip.missed_ticks for skip in skips],
        [following for following, _ in moves],
        [opens for _, opens in moves],
        [skip.job.fire_after for skip in skips],
        [encoded_calls(_skip_calls(skip, plan)) for skip in skips],
        [skip.at for skip in skips],
    )


def _skip_calls(skip: Skip, plan: HookPlan) -> tuple[HookCall, ...]:
    return plan.calls(skip.job.hooks, skip.job.default_hooks, events_of_skip(skip.reason))


# queue_one: the one tick per job allowed to wait for the run in progress. Whoever
# inserts the row owns the wait; it holds no connection meanwhile, so the row expires
# instead of dying with a session, and the audit gives the wait of a waiter that left
# the cluster to a live replica (`cursor_sql.WAITING`: by `reserved_at`, migration
# 0028, it tells a waiter from a replica restarted under its name). Answers the tick
# that holds the slot now.
RESERVE_PENDING = f"""WITH taken AS (
        INSERT INTO tickgate_pending (job, scheduled_for, runner, expires_at, reserved_at)
        VALUES ($1, $2, $3, clock_timestamp() + make_interval(secs => $4), clock_timestamp())
        ON CONFLICT (job) DO UPDATE SET scheduled_for = EXCLUDED.scheduled_for,
            runner = EXCLUDED.runner, expires_at = EXCLUDED.expires_at,
            reserved_at = EXCLUDED.reserved_at
        WHERE NOT {_waits("tickgate_pending")}
        RETURNING scheduled_for)
    SELECT scheduled_for FROM taken
    UNION ALL
    SELECT scheduled_for FROM tickgate_pending
    WHERE job = $1 AND NOT EXISTS (SELECT 1 FROM taken)"""

RELEASE_PENDING = "DELETE FROM tickgate_pending WHERE job = $1 AND scheduled_for = $2"

# The tick waiting in the job's slot, unless its waiter's time ran out or it was decided.
PENDING_TICK = f"""SELECT p.scheduled_for FROM tickgate_pending p
    WHERE p.job = $1 AND {_waits("p")}"""

# Orphans: `running` rows whose session is gone. A run's session holds the job's
# advisory lock (every overlap mode but "allow") for the whole run, so a row whose backend
# is gone (no backend of its PID and start, migration 0026: a new backend may have got
# its PID) and whose lock nobody holds lost its session. Rows younger than a few seconds
# are left alone: their claim may not be visible to pg_locks' snapshot yet. The first
# sweep to find one stamps it `orphaned_at`; each comes with how long ago that was,
# whether its runner is still a live member (then it is recording the run's end itself,
# the run fenced), and its job as stored, whose retry policy says whether it gets
# another attempt.
_ORPHANED = f"""r.status = 'running'
    AND r.started_at < clock_timestamp() - interval '2 seconds'
    AND NOT EXISTS (SELECT 1 FROM pg_stat_activity a
        WHERE {same_backend("a.pid", "a.backend_start", "r.backend_pid", "r.backend_start")})
    AND NOT (r.locked AND EXISTS (
        SELECT 1 FROM pg_locks l
        WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 1
          AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
          AND l.classid = ((r.lock_key >> 32) & 4294967295)::oid
          AND l.objid = (r.lock_key & 4294967295)::oid))"""

# The condition, on a run named r, for other statements (retention of detached runs).
ORPHANED = _ORPHANED

ORPHANS = f"""WITH found AS (
        SELECT r.id FROM tickgate_runs r WHERE {_ORPHANED} ORDER BY r.started_at LIMIT $1
    ), live AS MATERIALIZED (
        -- Once per statement, not once per orphan: each look reads pg_locks whole, and a
        -- crash mid-crowd leaves a thousand orphans while thousands of locks are held.
        SELECT m.runner_id FROM tickgate_members m WHERE {MEMBER_IS_LIVE}
    ), stamped AS (
        UPDATE tickgate_runs r SET orphaned_at = clock_timestamp() FROM found
        WHERE r.id = found.id AND r.orphaned_at IS NULL
        RETURNING r.id, r.orphaned_at
    )
    SELECT {_RUN_COLUMNS_OF_R}, r.backend_pid, r.backend_start, r.locked, r.lock_key,
        stored.job AS stored_job,
        extract(epoch FROM clock_timestamp() - COALESCE(s.orphaned_at, r.orphaned_at))::float8
            AS orphaned_seconds,
        EXISTS (SELECT 1 FROM live WHERE live.runner_id = r.runner) AS runner_live,
        r.cancel_requested_at IS NOT NULL AS cancel_requested
    FROM found JOIN tickgate_runs r ON r.id = found.id
        JOIN LATERAL (SELECT {job_document("j")} FROM tickgate_jobs j WHERE j.name = r.job)
            AS stored ON true
        LEFT JOIN stamped s ON s.id = r.id
    ORDER BY r.started_at"""

# The orphans of $1 (ids) that get no other attempt end `abandoned` ($2: the error;
# one someone asked to cancel says so), if still orphaned.
ABANDONED_ERROR = "the replica running this stopped without finishing it"
ABANDON = f"""WITH abandoned AS (
        UPDATE tickgate_runs r SET status = 'abandoned',
            finished_at = clock_timestamp(),
            duration_ms = round(extract(epoch FROM clock_timestamp() - started_at) * 1000),
            error = CASE WHEN r.cancel_requested_at IS NULL THEN $2
                         ELSE $2 || '; cancelled by ' || r.cancelled_by
                              || COALESCE(': ' || r.cancel_reason, '') END
        WHERE r.id = ANY($1::uuid[]) AND {_ORPHANED}
        RETURNING {RUN_COLUMNS}
    ), hooked AS (
        {
    deliveries('''(SELECT a.id AS run_id, a.job, a.started_at, c.calls
            FROM abandoned a JOIN unnest($1::uuid[], $3::jsonb[]) AS c (run_id, calls)
                ON c.run_id = a.id
            WHERE c.calls IS NOT NULL)''')
}
    )
    SELECT * FROM abandoned"""


def abandon_arguments(orphans: Sequence[Orphan], plan: HookPlan) -> tuple[object, ...]:
    """The abandoned runs' `failure` hooks go with them (by their jobs as stored)."""
    failed = events_of_end(RunStatus.ABANDONED)
    return (
        [orphan.run.id for orphan in orphans],
        ABANDONED_ERROR,
        [encoded_calls(plan.calls(o.job.hooks, o.job.default_hooks, failed)) for o in orphans],
    )


# Orphans' next attempts move to this session, a batch in one statement ($1 run ids, $2
# the backends that held them and $6 their starts, $3 whether each holds a lock, $4 its
# key; at most one orphan per key): each takes its job's lock, then its row, by
# compare-and-set on the backend that held it, so of several replicas resuming it at
# once one wins. Its attempts count the one its replica lost. A lock taken for a row
# another session won is given back. The backends alive are read once per statement,
# not once per orphan.
# The attempts before a run's last, kept beside it (migration 0025): one more, {rows}.
_KEEP_EARLIER = """INSERT INTO tickgate_run_outputs AS o (run_id, earlier_attempts)
    {rows}
    ON CONFLICT (run_id) DO UPDATE
    SET earlier_attempts = COALESCE(o.earlier_attempts, '[]') || EXCLUDED.earlier_attempts"""

LOST_ATTEMPT = "its replica was lost during the attempt; another took the run over"
_LOST = f"""SELECT m.id, jsonb_build_array(jsonb_build_object(
            'attempt', m.attempts - 1, 'status', 'abandoned',
            'error', '{LOST_ATTEMPT}',
            'ended_at', NULL, 'next_at', clock_timestamp()))
        FROM moved m"""
RESUME = f"""WITH orphans AS (
        SELECT * FROM unnest($1::uuid[], $2::int[], $3::boolean[], $4::bigint[],
                             $6::timestamptz[])
            WITH ORDINALITY AS o(id, backend_pid, locking, lock_key, backend_start, n)
    ), gate AS MATERIALIZED (
        SELECT o.*, CASE WHEN o.locking THEN pg_try_advisory_lock(o.lock_key) ELSE true END
            AS got
        FROM orphans o
    ), alive AS MATERIALIZED (
        SELECT pid, backend_start FROM pg_stat_activity
    ), moved AS (
        UPDATE tickgate_runs r SET runner = $5, backend_pid = pg_backend_pid(),
            backend_start = {OWN_BACKEND_START}, attempts = r.attempts + 1, orphaned_at = NULL
        FROM gate g
        WHERE g.got AND r.id = g.id AND r.backend_pid = g.backend_pid
          AND r.backend_start IS NOT DISTINCT FROM g.backend_start AND r.status = 'running'
          AND r.cancel_requested_at IS NULL
          AND NOT EXISTS (SELECT 1 FROM alive a WHERE
              {same_backend("a.pid", "a.backend_start", "g.backend_pid", "g.backend_start")})
        RETURNING {_RUN_COLUMNS_OF_R}
    ), lost AS (
        -- The attempt its replica was lost in, its times not known.
        {_KEEP_EARLIER.format(rows=_LOST)}
    )
    SELECT gate.got, gate.got AND moved.id IS NOT NULL AND gate.locking AS holds_lock,
           CASE WHEN gate.got AND gate.locking AND moved.id IS NULL
                THEN pg_advisory_unlock(gate.lock_key) ELSE false END AS released,
           moved.*
    FROM gate LEFT JOIN moved ON moved.id = gate.id
    ORDER BY gate.n"""


def resume_arguments(orphans: Sequence[Orphan], runner: str) -> tuple[object, ...]:
    return (
        [orphan.run.id for orphan in orphans],
        [orphan.backend.pid for orphan in orphans],
        [orphan.locked for orphan in orphans],
        [orphan.lock_key for orphan in orphans],
        runner,
        [orphan.backend.started_at for orphan in orphans],
    )


# Cancel a run (POST /v1/runs/{id}/cancel): $1 the run, $2 who asks, $3 why. A `running`
# run keeps the request on its row, and every replica hears of it (NOTIFY, sent when
# this commits); the one running it reads it with CANCELS_ASKED. Answers the run as it
# was, whether it was asked now (it was running), and whether its replica is gone (an
# orphan: nobody is left to cancel it, and the sweep marks it abandoned).
CANCELS_CHANNEL = "tickgate_cancels"
REQUEST_CANCEL = f"""WITH asked AS (
        UPDATE tickgate_runs SET cancel_requested_at = COALESCE(cancel_requested_at,
                clock_timestamp()), cancelled_by = $2, cancel_reason = $3
        WHERE id = $1 AND status = 'running'
        RETURNING id, pg_notify('{CANCELS_CHANNEL}', id::text)
    )
    SELECT {_RUN_COLUMNS_OF_R}, EXISTS (SELECT 1 FROM asked) AS asked, ({_ORPHANED}) AS gone
    FROM tickgate_runs r WHERE r.id = $1"""

# The cancels asked of runs `running` on runner $1 (by the partial index of 0022).
CANCELS_ASKED = """SELECT id, cancelled_by, cancel_reason FROM tickgate_runs
    WHERE runner = $1 AND status = 'running' AND cancel_requested_at IS NOT NULL"""

# A retry is about to start ($1 the run; $2 the attempt that ended, $3 its status, $4
# its error, $5 the backoff since): the row counts it, so a replica that resumes the run
# after a crash knows how many attempts were made, and the ended attempt is kept with
# when it ended and when this one starts, on the database's clock. The same statement
# reads the job as stored ($6 its name, $7 the run's incarnation of it, by the primary
# key): the attempt runs that definition, and the row names its version. It counts
# nothing (the attempt does not start) if the run is no longer running, a cancel was
# asked of it, or the job is gone, another incarnation (deleted and made again), or
# paused since ($8: it was paused already, a manual run of a paused job); the answer
# says which.
_NOTED = """SELECT c.id, jsonb_build_array(jsonb_build_object(
        'attempt', $2::int, 'status', $3::text, 'error', $4::text,
        'ended_at', clock_timestamp() - make_interval(secs => $5),
        'next_at', clock_timestamp()))
    FROM counted c"""
NOTE_ATTEMPT = f"""WITH stored AS MATERIALIZED (
        SELECT {job_document("j")}, j.version, j.state, j.incarnation
        FROM tickgate_jobs j WHERE j.name = $6
    ), counted AS (
        UPDATE tickgate_runs r SET attempts = $2 + 1, job_version = s.version
        FROM stored s
        WHERE r.id = $1 AND r.status = 'running' AND r.cancel_requested_at IS NULL
          AND s.incarnation = $7 AND (s.state <> 'paused' OR $8)
        RETURNING r.id
    ), kept AS (
        {_KEEP_EARLIER.format(rows=_NOTED)}
    )
    SELECT EXISTS (SELECT 1 FROM counted) AS counted, s.job,
        COALESCE(s.incarnation = $7, false) AS same_job,
        s.state = 'paused' AND NOT $8 AS paused,
        r.status = 'running' AS running, r.cancel_requested_at IS NOT NULL AS cancel_asked,
        r.cancelled_by, r.cancel_reason
    FROM (SELECT 1) AS one LEFT JOIN stored s ON true LEFT JOIN tickgate_runs r ON r.id = $1"""


def note_attempt_arguments(run: Run, job: Job, ended: AttemptEnd) -> tuple[object, ...]:
    return (
        run.id,
        ended.attempt,
        ended.status.value,
        ended.error,
        ended.waited_seconds,
        run.job,
        job.incarnation,
        job.state is JobState.PAUSED,
    )


# Run once on every new lock-pool connection before it is handed out: statements are
# prepared and their types known, so a replica's very first runs end as fast as later
# ones. Empty arrays claim, finish and unlock nothing.
WARM_UP: tuple[tuple[str, tuple[object, ...]], ...] = (
    (CLAIM, claim_arguments([])),
    (CLAIM_COUNTED, claim_arguments([])),
    (FINISH, finish_arguments([])),
    (UNLOCK_ENDED, ([],)),
)
