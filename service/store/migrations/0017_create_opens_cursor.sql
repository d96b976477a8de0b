-- A create opens its job's cursor itself (#22): the create statement
-- (`jobs_sql.INSERT_JOB`) inserts the cursor at the job's first tick beside the job's
-- row, so a create is one statement, not a second one to move the cursor from the
-- threshold. The trigger still makes the cursor of every other insert (a bulk apply, a
-- migration's) at the threshold, and leaves one the inserting statement made alone: a
-- job's cursor is deleted with the job, so a cursor that exists when its job's row is
-- inserted was made by that very statement.
CREATE OR REPLACE FUNCTION tickgate_job_cursor() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    IF TG_OP = 'INSERT' THEN
        INSERT INTO tickgate_cursors AS c (job, tick, due_at, bucket)
        VALUES (NEW.name, NEW.fire_after, CASE WHEN NEW.state = 'active'
                                               THEN NEW.fire_after ELSE 'infinity' END,
                NEW.lock_key & 4095)
        ON CONFLICT (job) DO NOTHING;
    ELSIF NEW.fire_after IS DISTINCT FROM OLD.fire_after THEN
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
