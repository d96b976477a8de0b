-- The tick cursor (#22): per job, the instant before which every nominal tick has its
-- outcome, kept in the database rather than inferred from the newest ledger row.
--
-- The invariant: every nominal tick of the job before `tick` has exactly one ledger
-- row, or is counted in the `missed_ticks` of the misfire row that ends its run of
-- rowless ticks; ticks at or after it are still to be decided. A claim or a skip of the
-- tick at the cursor moves it on to the next tick, by compare-and-set in the statement
-- that writes the tick's row; the audit (service/scheduler/audit.py) moves a cursor that
-- lags past its reach, writing the misfire rows of the ticks it passes, in one
-- transaction. No statement writes a schedule row for a tick before the cursor, so a
-- tick once passed never runs, however its row was lost (retention, say).
--
-- `tick` is the next undecided tick itself, or a bound at or before it: the job's fence
-- (`fire_after`, never a tick) until its first tick is decided, or, after this
-- migration, the newest scheduled row's tick. `overdue_at` is at or before the moment the
-- cursor lags past the job's reach (tick + misfire grace + jitter: no replica may start
-- that tick any more), 'infinity' for a job that is not active or has no tick left. The
-- audit reads the cursors whose `overdue_at` passed by its index: it accounts for those
-- that lag, and sets it again from the tick for the others. Claims move `tick` alone,
-- an update made in place (a heap-only tuple: no index names `tick`, and half of each
-- page is kept free for it), so the cursor costs a claim little, and the audit visits a
-- job at most once per reach or tick, whichever is longer: a round costs in proportion
-- to the fire rate, never to the number of jobs.
CREATE TABLE tickgate_cursors (
    job        text COLLATE "C" PRIMARY KEY REFERENCES tickgate_jobs (name) ON DELETE CASCADE,
    tick       timestamptz NOT NULL,
    overdue_at timestamptz NOT NULL
) WITH (fillfactor = 50);
CREATE INDEX tickgate_cursors_overdue ON tickgate_cursors (overdue_at);

-- Every write of a job keeps its cursor, whichever statement makes it (a create, a bulk
-- apply, an edit, a completion): a new fence (a create, a changed schedule or zone, a
-- resume) starts the cursor again at it, since ticks before it are no ticks of the job
-- as it stands; another state or reach only moves `overdue_at`.
CREATE FUNCTION tickgate_job_cursor() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    reach interval := make_interval(secs => NEW.misfire_grace_seconds + NEW.jitter_seconds);
BEGIN
    IF TG_OP = 'INSERT' OR NEW.fire_after IS DISTINCT FROM OLD.fire_after THEN
        INSERT INTO tickgate_cursors AS c (job, tick, overdue_at)
        VALUES (NEW.name, NEW.fire_after, CASE WHEN NEW.state = 'active'
                                               THEN NEW.fire_after + reach
                                               ELSE 'infinity' END)
        ON CONFLICT (job) DO UPDATE SET tick = excluded.tick, overdue_at = excluded.overdue_at;
    ELSE
        UPDATE tickgate_cursors SET overdue_at = CASE
            WHEN NEW.state = 'active' AND tick < 'infinity' THEN tick + reach
            ELSE 'infinity' END
        WHERE job = NEW.name;
    END IF;
    RETURN NULL;
END $$;

CREATE TRIGGER tickgate_jobs_cursor_insert AFTER INSERT ON tickgate_jobs
    FOR EACH ROW EXECUTE FUNCTION tickgate_job_cursor();
CREATE TRIGGER tickgate_jobs_cursor_update AFTER UPDATE ON tickgate_jobs
    FOR EACH ROW WHEN (OLD.fire_after IS DISTINCT FROM NEW.fire_after
                       OR OLD.state IS DISTINCT FROM NEW.state
                       OR OLD.misfire_grace_seconds IS DISTINCT FROM NEW.misfire_grace_seconds
                       OR OLD.jitter_seconds IS DISTINCT FROM NEW.jitter_seconds)
    EXECUTE FUNCTION tickgate_job_cursor();

-- Existing jobs: what the replicas of the previous release inferred at load, the newest
-- scheduled row (or the fence), becomes the cursor; the audit counts any tick after it
-- that has no row.
INSERT INTO tickgate_cursors (job, tick, overdue_at)
SELECT j.name, s.tick,
       CASE WHEN j.state = 'active'
            THEN s.tick + make_interval(secs => j.misfire_grace_seconds + j.jitter_seconds)
            ELSE 'infinity' END
FROM tickgate_jobs j
CROSS JOIN LATERAL (
    SELECT greatest(j.fire_after, (
        SELECT max(r.scheduled_for) FROM tickgate_runs r
        WHERE r.job = j.name AND r.trigger IN ('schedule', 'catchup'))) AS tick) AS s;

-- The audit is a chore of one replica per round, like the overdue check.
INSERT INTO tickgate_chores (name) VALUES ('audit');
