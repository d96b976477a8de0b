-- Takeover from the cursor (#22): no replica mirrors a job to stand by for it any more.
-- Every replica audits, every half takeover period, the cursors whose `due_at` is more
-- than TICKGATE_TAKEOVER_SECONDS behind the database's clock, through its index, and
-- claims the ticks their owner left (service/scheduler/audit.py).
--
-- `due_at` (was `overdue_at`, which was the tick plus the job's reach) is now a bound at
-- or before the moment the tick at the cursor falls due: the tick itself, or its jittered
-- due time, for an active job with a tick left; 'infinity' otherwise. Claims still move
-- `tick` alone, in place; a cursor they keep moving has a `due_at` that falls behind, and
-- the audit sets it again from the tick in one statement per batch, with no schedule
-- math: a job is revisited once per takeover period at most, and a job whose ticks are
-- further apart than that costs nothing between them. A change of grace or jitter no
-- longer concerns the cursor: the audit reads both from the job when it walks.
ALTER TABLE tickgate_cursors RENAME COLUMN overdue_at TO due_at;
ALTER INDEX tickgate_cursors_overdue RENAME TO tickgate_cursors_due;
UPDATE tickgate_cursors SET due_at = tick WHERE due_at < 'infinity';

CREATE OR REPLACE FUNCTION tickgate_job_cursor() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' OR NEW.fire_after IS DISTINCT FROM OLD.fire_after THEN
        INSERT INTO tickgate_cursors AS c (job, tick, due_at)
        VALUES (NEW.name, NEW.fire_after, CASE WHEN NEW.state = 'active'
                                               THEN NEW.fire_after ELSE 'infinity' END)
        ON CONFLICT (job) DO UPDATE SET tick = excluded.tick, due_at = excluded.due_at;
    ELSE
        UPDATE tickgate_cursors SET due_at = CASE
            WHEN NEW.state = 'active' AND tick < 'infinity' THEN tick ELSE 'infinity' END
        WHERE job = NEW.name;
    END IF;
    RETURN NULL;
END $$;

DROP TRIGGER tickgate_jobs_cursor_update ON tickgate_jobs;
CREATE TRIGGER tickgate_jobs_cursor_update AFTER UPDATE ON tickgate_jobs
    FOR EACH ROW WHEN (OLD.fire_after IS DISTINCT FROM NEW.fire_after
                       OR OLD.state IS DISTINCT FROM NEW.state)
    EXECUTE FUNCTION tickgate_job_cursor();

-- Every replica audits now (a cursor is locked by the one auditing it), so the audit is
-- no chore of one replica per round any more.
DELETE FROM tickgate_chores WHERE name = 'audit';
