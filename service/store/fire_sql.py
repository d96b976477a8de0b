"""Every statement of the fire path, one builder per statement, and their arguments.

The fire path is: gather due ticks, admit, claim, run, record. Claims and ends go over
the pinned connection that holds the job's advisory lock; skips and the queue_one slot
go over the API pool, since they hold no lock. Values are passed as parallel arrays
(unnest), so a crowd of ticks costs one round trip, and rows come back in the order the
ticks were given (`n`).
"""

from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import NamedTuple
from uuid import UUID

from service.domain.jobs import Job, JobState
from service.domain.runs import AttemptEnd, Run
from service.store.columns import Column, Columns, Params, Statement, one
from service.store.hooks_sql import deliveries
from service.store.members_sql import MEMBER_IS_LIVE
from service.store.ports import BackendId, Orphan
from service.store.rows import RUN_COLUMNS, Encoded, encoded_calls, job_document
from service.store.values import RunEnd, Skip, TickClaim


class CursorMove(NamedTuple):
    """Where the cursor goes once a tick is decided (`following`; None: it stays, or
    the job has no tick after), and whether the tick is the job's first (`opens`: a
    cursor still at the threshold waits for it), as `moves.cursor_moves` worked out."""

    following: datetime | None
    opens: bool


@dataclass(frozen=True)
class ClaimedTick:
    """A tick to claim, with the move of its cursor: CLAIM's row."""

    tick: TickClaim
    move: CursorMove


@dataclass(frozen=True)
class SkippedTick:
    """A skip to record, with its row's id, the move of its cursor and its hooks' calls:
    RECORD_SKIPS' row."""

    skip: Skip
    id: UUID
    move: CursorMove
    calls: Encoded | None


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


# A claim's rows: each tick, and where its cursor moves once it is decided.
CLAIM_COLUMNS: Columns[ClaimedTick] = Columns(
    Column("job", "text", lambda c: c.tick.job.name),
    Column("id", "uuid", lambda c: c.tick.run_id),
    Column("scheduled_for", "timestamptz", lambda c: c.tick.scheduled_for),
    Column("trigger", "text", lambda c: c.tick.trigger.value),
    Column("lock_key", "bigint", lambda c: c.tick.job.lock_key),
    Column("locking", "boolean", lambda c: c.tick.lock),
    Column("incarnation", "uuid", lambda c: c.tick.job.incarnation),
    Column("version", "bigint", lambda c: c.tick.job.version),
    Column("any_version", "boolean", lambda c: c.tick.any_version),
    Column("following", "timestamptz", lambda c: c.move.following),
    Column("opens", "boolean", lambda c: c.move.opens),
    Column("while_active", "boolean", lambda c: c.tick.while_active),
    Column("run_args", "jsonb", lambda c: c.tick.args),
    Column("run_note", "text", lambda c: c.tick.note),
)


def claim_statement(*, counted: bool) -> Statement:
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
    p = Params()
    ticks = p.rows("ticks", CLAIM_COLUMNS)
    row_lock = "FOR NO KEY UPDATE" if counted else "FOR KEY SHARE"
    counting = (
        """, counted AS (
        UPDATE tickgate_jobs SET runs_started = runs_started + 1
        WHERE name IN (SELECT job FROM claimed WHERE trigger NOT IN ('manual', 'chain'))
        RETURNING name)"""
        if counted
        else ""
    )
    return p.statement(f"""WITH ticks AS (
        SELECT * FROM {ticks.unnest("t", ordinality=True)}
    ), gated AS MATERIALIZED (
        -- CASE, not AND: the lock must not be tried for a key this session holds.
        SELECT ticks.*, CASE WHEN NOT locking THEN true
                             WHEN lock_key = ANY({p("held", "bigint[]")}) THEN false
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
        WHERE j.name = ANY({ticks.array("job")}) AND j.name NOT IN (SELECT name FROM current)
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
        SELECT id, job, scheduled_for, trigger, 'running', clock_timestamp(), {p("runner")},
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
    ORDER BY g.n""")


CLAIM = claim_statement(counted=False)
CLAIM_COUNTED = claim_statement(counted=True)


def claim_arguments(ticks: Sequence[ClaimedTick], held: Collection[int] = ()) -> tuple[object, ...]:
    """The claim's arguments (of CLAIM and CLAIM_COUNTED alike); `held`: the lock keys
    the claiming session holds now."""
    runner = ticks[0].tick.runner if ticks else ""
    return CLAIM.arguments(ticks=ticks, held=list(held), runner=runner)


# The ends' rows: each run's id and how it ended.
END_COLUMNS: Columns[tuple[UUID, RunEnd]] = Columns(
    Column("run_id", "uuid", lambda e: e[0]),
    Column("new_status", "text", lambda e: e[1].status.value),
    Column("new_error", "text", lambda e: e[1].error),
    Column("new_result", "jsonb", lambda e: e[1].result),
    Column("new_attempts", "int", lambda e: e[1].attempts),
    Column("new_output", "jsonb", lambda e: e[1].output),
    Column("new_log", "jsonb", lambda e: e[1].log),
    Column("calls", "jsonb", lambda e: encoded_calls(e[1].hooks)),
)


def _finish() -> Statement:
    """Records runs' ends, each only while it is still `running`: a run is finished
    once. An end recorded from elsewhere names the backend that held the run (its PID
    and start): once another replica has taken the run over (an orphan resumed), it is
    that replica's to record, even on a backend that got the same PID.
    Times come from the database's clock, like `started_at`. It releases no lock: a
    session lock ignores transactions, so one released here would stay released if a
    later step of the statement failed (its outputs, its deliveries, a constraint
    checked at its end), leaving a run `running` and its lock gone. UNLOCK_ENDED
    follows it."""
    p = Params()
    ends = p.rows("ends", END_COLUMNS)
    return p.statement(f"""WITH ends AS (
        SELECT * FROM {ends.unnest("e", ordinality=True)}
    ), finished AS (
        UPDATE tickgate_runs r SET status = e.new_status, error = e.new_error,
            result = e.new_result, attempts = e.new_attempts,
            finished_at = clock_timestamp(),
            duration_ms = round(extract(epoch FROM clock_timestamp() - r.started_at) * 1000)
        FROM ends e
        WHERE r.id = e.run_id AND r.status = 'running'
          AND ({p("backend_pid", "int")} IS NULL
               OR {
        same_backend(
            "r.backend_pid",
            "r.backend_start",
            p("backend_pid", "int"),
            p("backend_start", "timestamptz"),
        )
    })
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
    ORDER BY e.n""")


FINISH = _finish()


def finish_arguments(
    ends: Sequence[tuple[UUID, RunEnd]], backend: BackendId | None = None
) -> tuple[object, ...]:
    """`backend`: record the ends only of rows that still name this backend."""
    return FINISH.arguments(
        ends=ends,
        backend_pid=backend.pid if backend else None,
        backend_start=backend.started_at if backend else None,
    )


def _unlock_ended() -> Statement:
    """The locks of ends FINISH has recorded (`keys`, in order; NULL: an end that holds
    none), each released once, on the session that holds them: only now, once the ends
    are committed, does a lock go (whoever takes it next finds the run ended). Whether
    each was held, in order."""
    p = Params()
    return p.statement(f"""SELECT CASE WHEN u.key IS NULL THEN false
                   ELSE pg_advisory_unlock(u.key) END AS released
    FROM {p.rows("keys", one("key", "bigint")).unnest("u", ordinality=True)}
    ORDER BY u.n""")


UNLOCK_ENDED = _unlock_ended()

UNLOCK = "SELECT pg_advisory_unlock($1)"

# Release, once each, the keys given (an array) that this session holds now (pg_locks names them; a
# key it does not hold is left alone, so the server logs no warning): the locks a
# claim took before the server ended it at its statement or lock timeout.
UNLOCK_HELD = """SELECT pg_advisory_unlock(held.key)
    FROM (SELECT (classid::bigint << 32) | objid::bigint AS key FROM pg_locks
          WHERE locktype = 'advisory' AND objsubid = 1 AND granted
            AND pid = pg_backend_pid()) AS held
    WHERE held.key = ANY($1::bigint[])"""

# A skip's row: the skip, its row's id, its cursor's move and its hooks' calls.
SKIP_COLUMNS: Columns[SkippedTick] = Columns(
    Column("job", "text", lambda s: s.skip.job.name),
    Column("id", "uuid", lambda s: s.id),
    Column("scheduled_for", "timestamptz", lambda s: s.skip.scheduled_for),
    Column("trigger", "text", lambda s: s.skip.trigger.value),
    Column("reason", "text", lambda s: s.skip.reason.value),
    Column("note", "text", lambda s: s.skip.note),
    Column("incarnation", "uuid", lambda s: s.skip.job.incarnation),
    Column("missed_ticks", "int", lambda s: s.skip.missed_ticks),
    Column("following", "timestamptz", lambda s: s.move.following),
    Column("opens", "boolean", lambda s: s.move.opens),
    Column("fence", "timestamptz", lambda s: s.skip.job.fire_after),
    Column("calls", "jsonb", lambda s: s.calls),
    Column("at", "timestamptz", lambda s: s.skip.at),
)


def _record_skips() -> Statement:
    """Skips hold no lock: the ledger's uniqueness alone makes the first outcome of a
    tick the only one. The job row is read under a key-share lock, so a job deleted
    meanwhile loses only its own skips, never the statement; its cursor locked, as a
    claim locks it: a scheduled tick before it is not recorded again, and one at it
    moves it on (`following`, `opens`), only for a skip worked out from the job's
    threshold as it stands (`fence`: the `fire_after` the skip was worked out from): the
    tick after it, and the first tick, are those of the ticks the job has now. A skip of
    an older definition's tick that the new one has too (it stands at the new cursor) is
    recorded, and leaves the cursor for a claim or the audit of the new definition to
    move: its `following` would pass the new ticks between."""
    p = Params()
    skips = p.rows("skips", SKIP_COLUMNS)
    return p.statement(f"""WITH skips AS (
        SELECT * FROM {skips.unnest("s", ordinality=True)}
    ), jobs AS MATERIALIZED (
        SELECT {_CURSORED_JOB}, j.lock_key
        FROM tickgate_jobs j JOIN tickgate_cursors k ON k.job = j.name
        WHERE j.name = ANY({skips.array("job")})
        ORDER BY j.name FOR KEY SHARE OF j FOR NO KEY UPDATE OF k
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
            at, at, 0, 0, {p("runner")}, job_version, lock_key, false,
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
    SELECT * FROM inserted""")


RECORD_SKIPS = _record_skips()


# queue_one: the one tick per job allowed to wait for the run in progress. Whoever
# inserts the row owns the wait; it holds no connection meanwhile, so the row expires
# instead of dying with a session, and the audit gives the wait of a waiter that left
# the cluster to a live replica (`cursor_sql.WAITING`: by `reserved_at`, migration
# 0028, it tells a waiter from a replica restarted under its name). Answers the tick
# that holds the slot now.
_reserving = Params()
RESERVE_SLOT = _reserving.statement(f"""WITH taken AS (
        INSERT INTO tickgate_pending (job, scheduled_for, runner, expires_at, reserved_at)
        VALUES ({_reserving("job")}, {_reserving("tick")}, {_reserving("runner")},
            clock_timestamp() + make_interval(secs => {_reserving("expires_in_seconds")}),
            clock_timestamp())
        ON CONFLICT (job) DO UPDATE SET scheduled_for = EXCLUDED.scheduled_for,
            runner = EXCLUDED.runner, expires_at = EXCLUDED.expires_at,
            reserved_at = EXCLUDED.reserved_at
        WHERE NOT {_waits("tickgate_pending")}
        RETURNING scheduled_for)
    SELECT scheduled_for FROM taken
    UNION ALL
    SELECT scheduled_for FROM tickgate_pending
    WHERE job = {_reserving("job")} AND NOT EXISTS (SELECT 1 FROM taken)""")

# Free the job's slot (the job, then the tick), if that tick still holds it.
RELEASE_SLOT = "DELETE FROM tickgate_pending WHERE job = $1 AND scheduled_for = $2"

# The tick waiting in the job's slot (the job given), unless its waiter's time ran out
# or it was decided.
SLOT_TICK = f"""SELECT p.scheduled_for FROM tickgate_pending p
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

# An orphan abandoned: its run's id, and its `failure` hooks' calls (by its job as
# stored), which the adapter worked out.
ABANDON_COLUMNS: Columns[tuple[UUID, Encoded | None]] = Columns(
    Column("run_id", "uuid", lambda a: a[0]),
    Column("calls", "jsonb", lambda a: a[1]),
)
ABANDONED_ERROR = "the replica running this stopped without finishing it"


def _abandon() -> Statement:
    """The orphans given that get no other attempt end `abandoned` (`error`: why; one
    someone asked to cancel says so), if still orphaned, with their hooks' calls."""
    p = Params()
    orphans = p.rows("orphans", ABANDON_COLUMNS)
    error = p("error")
    return p.statement(f"""WITH abandoned AS (
        UPDATE tickgate_runs r SET status = 'abandoned',
            finished_at = clock_timestamp(),
            duration_ms = round(extract(epoch FROM clock_timestamp() - started_at) * 1000),
            error = CASE WHEN r.cancel_requested_at IS NULL THEN {error}
                         ELSE {error} || '; cancelled by ' || r.cancelled_by
                              || COALESCE(': ' || r.cancel_reason, '') END
        WHERE r.id = ANY({orphans.array("run_id")}) AND {_ORPHANED}
        RETURNING {RUN_COLUMNS}
    ), hooked AS (
        {
        deliveries(f'''(SELECT a.id AS run_id, a.job, a.started_at, c.calls
            FROM abandoned a JOIN {orphans.unnest("c")} ON c.run_id = a.id
            WHERE c.calls IS NOT NULL)''')
    }
    )
    SELECT * FROM abandoned""")


ABANDON = _abandon()

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

# An orphan resumed: its run, the backend that held it, and its job's lock.
RESUME_COLUMNS: Columns[Orphan] = Columns(
    Column("id", "uuid", lambda o: o.run.id),
    Column("backend_pid", "int", lambda o: o.backend.pid),
    Column("locking", "boolean", lambda o: o.locked),
    Column("lock_key", "bigint", lambda o: o.lock_key),
    Column("backend_start", "timestamptz", lambda o: o.backend.started_at),
)


def _resume() -> Statement:
    """Orphans' next attempts move to this session (for `runner`), a batch in one
    statement (at most one orphan per lock key): each takes its job's lock, then its
    row, by compare-and-set on the backend that held it, so of several replicas resuming
    it at once one wins. Its attempts count the one its replica lost. A lock taken for a
    row another session won is given back. The backends alive are read once per
    statement, not once per orphan."""
    p = Params()
    orphans = p.rows("orphans", RESUME_COLUMNS)
    return p.statement(f"""WITH orphans AS (
        SELECT * FROM {orphans.unnest("o", ordinality=True)}
    ), gate AS MATERIALIZED (
        SELECT o.*, CASE WHEN o.locking THEN pg_try_advisory_lock(o.lock_key) ELSE true END
            AS got
        FROM orphans o
    ), alive AS MATERIALIZED (
        SELECT pid, backend_start FROM pg_stat_activity
    ), moved AS (
        UPDATE tickgate_runs r SET runner = {p("runner")}, backend_pid = pg_backend_pid(),
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
    ORDER BY gate.n""")


RESUME = _resume()

CANCELS_CHANNEL = "tickgate_cancels"


def _request_cancel() -> Statement:
    """Cancel a run (POST /v1/runs/{id}/cancel): the run, who asks (`by`), and why
    (`reason`). A `running` run keeps the request on its row, and every replica hears of
    it (NOTIFY, sent when this commits); the one running it reads it with CANCELS_ASKED.
    Answers the run as it was, whether it was asked now (it was running), and whether
    its replica is gone (an orphan: nobody is left to cancel it, and the sweep marks it
    abandoned)."""
    p = Params()
    return p.statement(f"""WITH asked AS (
        UPDATE tickgate_runs SET cancel_requested_at = COALESCE(cancel_requested_at,
                clock_timestamp()), cancelled_by = {p("by")}, cancel_reason = {p("reason")}
        WHERE id = {p("run_id")} AND status = 'running'
        RETURNING id, pg_notify('{CANCELS_CHANNEL}', id::text)
    )
    SELECT {_RUN_COLUMNS_OF_R}, EXISTS (SELECT 1 FROM asked) AS asked, ({_ORPHANED}) AS gone
    FROM tickgate_runs r WHERE r.id = {p("run_id")}""")


REQUEST_CANCEL = _request_cancel()

# The cancels asked of runs `running` on the runner given (by the partial index of 0022).
CANCELS_ASKED = """SELECT id, cancelled_by, cancel_reason FROM tickgate_runs
    WHERE runner = $1 AND status = 'running' AND cancel_requested_at IS NOT NULL"""


def _note_attempt() -> Statement:
    """A retry is about to start (`run_id`; the attempt that ended, `attempt`, with its
    `status` and `error`, and the backoff since, `waited_seconds`): the row counts it,
    so a replica that resumes the run after a crash knows how many attempts were made,
    and the ended attempt is kept with when it ended and when this one starts, on the
    database's clock. The same statement reads the job as stored (`job`, its name, and
    `incarnation`, the run's incarnation of it, by the primary key): the attempt runs
    that definition, and the row names its version. It counts nothing (the attempt does
    not start) if the run is no longer running, a cancel was asked of it, or the job is
    gone, another incarnation (deleted and made again), or paused since (`was_paused`:
    it was paused already, a manual run of a paused job); the answer says which."""
    p = Params()
    run_id, attempt, incarnation, was_paused = (
        p("run_id"),
        p("attempt"),
        p("incarnation"),
        p("was_paused"),
    )
    noted = f"""SELECT c.id, jsonb_build_array(jsonb_build_object(
        'attempt', {p("attempt", "int")}, 'status', {p("status", "text")},
        'error', {p("error", "text")},
        'ended_at', clock_timestamp() - make_interval(secs => {p("waited_seconds")}),
        'next_at', clock_timestamp()))
    FROM counted c"""
    return p.statement(f"""WITH stored AS MATERIALIZED (
        SELECT {job_document("j")}, j.version, j.state, j.incarnation
        FROM tickgate_jobs j WHERE j.name = {p("job")}
    ), counted AS (
        UPDATE tickgate_runs r SET attempts = {attempt} + 1, job_version = s.version
        FROM stored s
        WHERE r.id = {run_id} AND r.status = 'running' AND r.cancel_requested_at IS NULL
          AND s.incarnation = {incarnation} AND (s.state <> 'paused' OR {was_paused})
        RETURNING r.id
    ), kept AS (
        {_KEEP_EARLIER.format(rows=noted)}
    )
    SELECT EXISTS (SELECT 1 FROM counted) AS counted, s.job,
        COALESCE(s.incarnation = {incarnation}, false) AS same_job,
        s.state = 'paused' AND NOT {was_paused} AS paused,
        r.status = 'running' AS running, r.cancel_requested_at IS NOT NULL AS cancel_asked,
        r.cancelled_by, r.cancel_reason
    FROM (SELECT 1) AS one LEFT JOIN stored s ON true
        LEFT JOIN tickgate_runs r ON r.id = {run_id}""")


NOTE_ATTEMPT = _note_attempt()


def note_attempt_arguments(run: Run, job: Job, ended: AttemptEnd) -> tuple[object, ...]:
    return NOTE_ATTEMPT.arguments(
        run_id=run.id,
        attempt=ended.attempt,
        status=ended.status.value,
        error=ended.error,
        waited_seconds=ended.waited_seconds,
        job=run.job,
        incarnation=job.incarnation,
        was_paused=job.state is JobState.PAUSED,
    )


# Run once on every new lock-pool connection before it is handed out: statements are
# prepared and their types known, so a replica's very first runs end as fast as later
# ones. Empty arrays claim, finish and unlock nothing.
WARM_UP: tuple[tuple[str, tuple[object, ...]], ...] = (
    (CLAIM.text, claim_arguments([])),
    (CLAIM_COUNTED.text, claim_arguments([])),
    (FINISH.text, finish_arguments([])),
    (UNLOCK_ENDED.text, UNLOCK_ENDED.arguments(keys=[])),
)
