-- A run's log (#24): the lines logged through its logger (its task's, its retries'),
-- kept beside its output by the statement that records its end. A run may have a log
-- and no output, so the output may be NULL now.
ALTER TABLE tickgate_run_outputs ALTER COLUMN output DROP NOT NULL, ADD COLUMN log jsonb;
