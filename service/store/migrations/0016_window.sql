-- The window and ownership by bucket (#22): a replica reads the ticks due in the next
-- few seconds for the jobs of the buckets it owns, through one index range per bucket,
-- instead of mirroring (and ranking) every job it owns.
--
-- A job's bucket is the low 12 bits of its lock key (`service/domain/ownership.py`:
-- `bucket_of`, BUCKETS = 4096): fixed for the job's name, kept with its cursor.
-- `due_at` stays what 0015 made it, a bound at or before the moment the tick at the
-- cursor falls due: claims move `tick` alone (in place, no index names it), so a job
-- whose claims moved it on is read by a window until the audit sets `due_at` again, and
-- a window read costs the jobs due in it and those that fired a moment ago, never all.
ALTER TABLE tickgate_cursors ADD COLUMN bucket smallint;
UPDATE tickgate_cursors k SET bucket = j.lock_key & 4095
FROM tickgate_jobs j WHERE j.name = k.job;
ALTER TABLE tickgate_cursors ALTER COLUMN bucket SET NOT NULL;
CREATE INDEX tickgate_cursors_window ON tickgate_cursors (bucket, due_at);

CREATE OR REPLACE FUNCTION tickgate_job_cursor() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' OR NEW.fire_after IS DISTINCT FROM OLD.fire_after THEN
        INSERT INTO tickgate_cursors AS c (job, tick, due_at, bucket)
        VALUES (NEW.name, NEW.fire_after, CASE WHEN NEW.state = 'active'
                                               THEN NEW.fire_after ELSE 'infinity' END,
                NEW.lock_key & 4095)
        ON CONFLICT (job) DO UPDATE SET tick = excluded.tick, due_at = excluded.due_at;
    ELSE
        UPDATE tickgate_cursors SET due_at = CASE
            WHEN NEW.state = 'active' AND tick < 'infinity' THEN tick ELSE 'infinity' END
        WHERE job = NEW.name;
    END IF;
    RETURN NULL;
END $$;
