"""Every statement of the tick cursors' audit (migration 0014), one constant each.

The audit runs in one transaction per batch: set `due_at` again where claims moved the
cursor on, lock the lagging cursors, read the rows of the ticks they wait for, then write
the misfires and move the cursors (the owed ticks are claimed afterwards, as any). Claims and skips
lock a job's cursor too, so the audit's lock and theirs wait for each other: no tick is
claimed while the audit counts it as missed.
"""

from datetime import datetime
from typing import NamedTuple
from uuid import UUID

from service.store.columns import Column, Columns, Params, Statement
from service.store.fire_sql import OWN_BACKEND_START
from service.store.hooks_sql import deliveries
from service.store.members_sql import MEMBER_IS_LIVE
from service.store.rows import Encoded, job_document


class MissedRun(NamedTuple):
    """A run of ticks one skipped row counts: its job, the row's id, the run's last tick,
    how many ticks, what the row says of them, and its hooks' calls (None: none)."""

    job: str
    id: UUID
    tick: datetime
    missed: int
    note: str
    calls: Encoded | None = None


class CursorPlace(NamedTuple):
    """Where an audit moves a job's cursor (`tick`; None: no tick left), and when to
    look again (`due_at`; None: never)."""

    job: str
    tick: datetime | None
    due_at: datetime | None


class FirstTick(NamedTuple):
    """A job just written, at the revision written, and its first tick (None: none)."""

    job: str
    incarnation: UUID
    version: int
    first: datetime | None


_MISSED: tuple[Column[MissedRun], ...] = (
    Column("job", "text", lambda m: m.job),
    Column("id", "uuid", lambda m: m.id),
    Column("tick", "timestamptz", lambda m: m.tick),
    Column("missed", "int", lambda m: m.missed),
    Column("note", "text", lambda m: m.note),
)
# The rows of `superseded` runs; of misfires, with their hooks' calls.
SUPERSEDED_COLUMNS: Columns[MissedRun] = Columns(*_MISSED)
MISFIRE_COLUMNS: Columns[MissedRun] = Columns(*_MISSED, Column("calls", "jsonb", lambda m: m.calls))
PLACE_COLUMNS: Columns[CursorPlace] = Columns(
    Column("job", "text", lambda c: c.job),
    Column("tick", "timestamptz", lambda c: c.tick),
    Column("due_at", "timestamptz", lambda c: c.due_at),
)
FIRST_TICK_COLUMNS: Columns[FirstTick] = Columns(
    Column("job", "text", lambda c: c.job),
    Column("incarnation", "uuid", lambda c: c.incarnation),
    Column("version", "bigint", lambda c: c.version),
    Column("first", "timestamptz", lambda c: c.first),
)
# Each job's cursor as read: where the ticks it waits for begin.
CURSOR_COLUMNS: Columns[tuple[str, datetime]] = Columns(
    Column("job", "text", lambda c: c[0]),
    Column("cursor", "timestamptz", lambda c: c[1]),
)

# The cursors whose `due_at` is more than the takeover time (the second argument, in
# seconds) behind the database's clock and whose claims moved them on since (the tick is
# no longer behind), at most as many as the first argument: `due_at` is set again from
# the tick, no schedule math needed. Rows a claim, a skip, an edit or another audit
# holds are skipped, never waited for.
REFRESH = """WITH moved AS (
        SELECT job FROM tickgate_cursors
        WHERE due_at < clock_timestamp() - make_interval(secs => $2)
          AND tick >= clock_timestamp() - make_interval(secs => $2)
        ORDER BY due_at LIMIT $1
        FOR UPDATE SKIP LOCKED)
    UPDATE tickgate_cursors k SET due_at = k.tick FROM moved WHERE k.job = moved.job"""

# The cursors that do lag: the tick they wait for is due more than the takeover time
# (`takeover_seconds`) ago, the longest lagging first, at most `most`, with their jobs
# as they stand, locked, skipping (never waiting for) rows others hold: this round
# leaves them to the next. An audit that takes nothing over (`taking` false) reads only
# the cursors with a tick past its job's reach to record, and leaves the others alone
# (its lock would make their claims wait).
_lagging = Params()
LAGGING = _lagging.statement(f"""SELECT {job_document("j")}, k.tick AS cursor,
        clock_timestamp() AS now
    FROM tickgate_cursors k JOIN tickgate_jobs j ON j.name = k.job
    WHERE k.due_at < clock_timestamp() - make_interval(secs => {_lagging("takeover_seconds")})
      AND k.tick < clock_timestamp() - make_interval(secs => {_lagging("takeover_seconds")})
      AND j.state = 'active'
      AND ({_lagging("taking")} OR k.tick < clock_timestamp()
          - make_interval(secs => j.misfire_grace_seconds + j.jitter_seconds))
    ORDER BY k.due_at LIMIT {_lagging("most")}
    FOR UPDATE OF k SKIP LOCKED FOR KEY SHARE OF j SKIP LOCKED""")

# The ticks of each job from its cursor on (`cursors`) that have a ledger row, the first
# `most` of each: one range of the (job, scheduled_for) index per job. A manual run is no
# tick's outcome, whenever it was asked for; a backfill run is the outcome of its tick.
_deciding = Params()
DECIDED = _deciding.statement(f"""SELECT c.job, r.scheduled_for
    FROM {_deciding.rows("cursors", CURSOR_COLUMNS).unnest("c")}
    CROSS JOIN LATERAL (
        SELECT scheduled_for FROM tickgate_runs
        WHERE job = c.job AND scheduled_for >= c.cursor AND trigger NOT IN ('manual', 'chain')
        ORDER BY scheduled_for LIMIT {_deciding("most")}) AS r""")

# The queue_one slots (migration 0003) of the lagging jobs (`jobs`) that still hold a
# tick: the
# waiter's time has not run out and the tick has no row. Such a tick runs after the run
# in progress, whatever its grace: the audit neither records it nor hands it over while
# its waiter is live, a live member of its name that joined before it took the slot
# (migration 0028: one restarted under the same name forgot the tick). When the audit
# takes over (`taking`), the slot of a waiter not live passes to the auditing replica
# (`runner`), which waits in its place for the time the slot has left (`seconds_left`, `adopted`).
# The members are read (pg_locks, whole) only if some slot is found.
_waiting = Params()
WAITING = _waiting.statement(f"""WITH live AS MATERIALIZED (
        SELECT m.runner_id, m.started_at FROM tickgate_members m WHERE {MEMBER_IS_LIVE}
    ), slots AS (
        SELECT p.job, p.scheduled_for, p.runner, p.expires_at,
            EXISTS (SELECT 1 FROM live WHERE live.runner_id = p.runner
                    AND live.started_at <= coalesce(p.reserved_at, 'infinity')) AS live
        FROM tickgate_pending p
        WHERE p.job = ANY({_waiting("jobs", "text[]")}) AND p.expires_at > clock_timestamp()
          AND NOT EXISTS (SELECT 1 FROM tickgate_runs r
                          WHERE r.job = p.job AND r.scheduled_for = p.scheduled_for)
    ), adopted AS (
        UPDATE tickgate_pending p SET runner = {_waiting("runner")},
            reserved_at = clock_timestamp()
        FROM slots s
        WHERE {_waiting("taking")} AND NOT s.live AND p.job = s.job
          AND p.scheduled_for = s.scheduled_for AND p.runner = s.runner
        RETURNING p.job
    )
    SELECT s.job, s.scheduled_for, a.job IS NOT NULL AS adopted,
        extract(epoch FROM s.expires_at - clock_timestamp())::float8 AS seconds_left
    FROM slots s LEFT JOIN adopted a ON a.job = s.job""")


def _move_cursors() -> Statement:
    """The misfire rows of the runs of ticks nobody started (`misfires`, recorded for
    `runner`), and each cursor's new place (`places`: its tick, NULL for none left, and
    when to look again, NULL for never)."""
    p = Params()
    misfires = p.rows("misfires", MISFIRE_COLUMNS)
    return p.statement(f"""WITH misfires AS (
        SELECT * FROM {misfires.unnest("m")}
    ), recorded AS (
        INSERT INTO tickgate_runs (id, job, scheduled_for, trigger, status, skip_reason, error,
            missed_ticks, started_at, finished_at, duration_ms, attempts, runner, job_version,
            lock_key, locked, backend_pid, backend_start)
        SELECT m.id, m.job, m.tick, 'schedule', 'skipped', 'misfire', m.note, m.missed,
            clock_timestamp(), clock_timestamp(), 0, 0, {p("runner")}, j.version, j.lock_key,
            false, pg_backend_pid(), {OWN_BACKEND_START}
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
    FROM {p.rows("places", PLACE_COLUMNS).unnest("c")}
    WHERE k.job = c.job""")


MOVE_CURSORS = _move_cursors()

# A job's cursor, for the API and the tests.
CURSOR = "SELECT tick FROM tickgate_cursors WHERE job = $1"

# The window (migration 0016): each active job of the buckets given whose cursor may
# fall due before the window's end (the second argument), with its cursor; one range of
# the (bucket, due_at) index per bucket. `due_at` is a bound at or before the cursor's
# due time, so a job whose claims moved its cursor on a moment ago is read too, until
# the audit sets it again: the plan then files nothing for it. Each job's revision, not
# the job: a crowd is read again while it drains, and the window reads the definitions
# only of the jobs it does not hold at that revision (WINDOW_JOBS).
WINDOW = """SELECT j.name, j.incarnation, j.version, k.tick AS cursor
    FROM tickgate_cursors k JOIN tickgate_jobs j ON j.name = k.job
    WHERE k.bucket = ANY($1::smallint[]) AND k.due_at < $2 AND j.state = 'active'"""

# The same for every bucket (a replica alone, or with ownership off).
WINDOW_ALL = """SELECT j.name, j.incarnation, j.version, k.tick AS cursor
    FROM tickgate_cursors k JOIN tickgate_jobs j ON j.name = k.job
    WHERE k.due_at < $1 AND j.state = 'active'"""

# The jobs of the names given that a window read and has not filed at their revision,
# as they stand if still active, each with its cursor.
WINDOW_JOBS = f"""SELECT {job_document("j")}, k.tick AS cursor
    FROM tickgate_jobs j JOIN tickgate_cursors k ON k.job = j.name
    WHERE j.name = ANY($1::text[]) AND j.state = 'active'"""

# The jobs of the names given as they stand, in any state, each with its cursor: what a
# window makes of a change it was notified of.
CURSORED_JOBS = f"""SELECT {job_document("j")}, k.tick AS cursor
    FROM tickgate_jobs j JOIN tickgate_cursors k ON k.job = j.name
    WHERE j.name = ANY($1::text[])"""

# A write of jobs (each at the revision written) moves each cursor still at its job's
# threshold (just made, or made anew by a new threshold) on to the job's first tick
# (which the writer worked out; NULL: none), if the job is still the revision written
# and active: no tick lies between them, so the invariant holds, and `due_at` is right
# from the start. A job is then read by no window before its first tick's, and by no
# audit at all, however many are made at once.
_opening = Params()
OPEN_CURSORS = _opening.statement(f"""UPDATE tickgate_cursors k
    SET tick = coalesce(c.first, 'infinity'), due_at = coalesce(c.first, 'infinity')
    FROM {_opening.rows("jobs", FIRST_TICK_COLUMNS).unnest("c")}
    JOIN tickgate_jobs j ON j.name = c.job AND j.incarnation = c.incarnation
        AND j.version = c.version AND j.state = 'active'
    WHERE k.job = c.job AND k.tick = j.fire_after""")

# An edit that gives active jobs other ticks (a new threshold), or pauses them, first
# locks their cursors (the names given, in name order, as RECORD_SKIPS does), waiting
# for a claim, skip or audit that holds one: no tick of the old definition is claimed
# or recorded behind the edit's back (a claim finds the cursor held, asks again, and
# then meets the new version). Answers each cursor, and the database's clock read under
# the locks: the edit's moment.
LOCK_CURSORS = """SELECT job, tick, clock_timestamp() AS now FROM tickgate_cursors
    WHERE job = ANY($1::text[]) ORDER BY job FOR NO KEY UPDATE"""

# The ticks of each job from its cursor (`cursors`) through the edit's moment (`now`)
# that have a ledger row, the first `most` of each: which of the old definition's ticks
# are decided.
_through = Params()
DECIDED_THROUGH = _through.statement(f"""SELECT c.job, r.scheduled_for
    FROM {_through.rows("cursors", CURSOR_COLUMNS).unnest("c")}
    CROSS JOIN LATERAL (
        SELECT scheduled_for FROM tickgate_runs
        WHERE job = c.job AND scheduled_for >= c.cursor AND scheduled_for <= {_through("now")}
          AND trigger NOT IN ('manual', 'chain')
        ORDER BY scheduled_for LIMIT {_through("most")}) AS r""")

# The `superseded` rows of the ticks the old definition left undecided (`runs`,
# recorded for `runner`), written before the job row changes, under the cursors' locks:
# the version they name is the old one. A row already there (the first writer wins)
# keeps its tick. No hook fires for them: the user's own edit replaced them.
_superseding = Params()
RECORD_SUPERSEDED = _superseding.statement(f"""INSERT INTO tickgate_runs (id, job,
        scheduled_for, trigger, status, skip_reason, error, missed_ticks, started_at,
        finished_at, duration_ms, attempts, runner, job_version, lock_key, locked,
        backend_pid)
    SELECT s.id, s.job, s.tick, 'schedule', 'skipped', 'superseded', s.note, s.missed,
        clock_timestamp(), clock_timestamp(), 0, 0, {_superseding("runner")}, j.version,
        j.lock_key, false, pg_backend_pid()
    FROM {_superseding.rows("runs", SUPERSEDED_COLUMNS).unnest("s")}
    JOIN tickgate_jobs j ON j.name = s.job
    ORDER BY s.job, s.tick
    ON CONFLICT (job, scheduled_for) DO NOTHING""")
