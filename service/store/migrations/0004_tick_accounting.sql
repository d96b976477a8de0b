-- Tick accounting: every nominal tick of an active job ends in one ledger row, a run
-- or a recorded skip with its reason. Ticks missed while no replica was up may be
-- summed up in one `misfire` row that carries how many there were.
ALTER TABLE tickgate_runs DROP CONSTRAINT tickgate_runs_status_check;
ALTER TABLE tickgate_runs ADD CONSTRAINT tickgate_runs_status_check CHECK (status IN
    ('running', 'succeeded', 'failed', 'timed_out', 'cancelled', 'abandoned', 'skipped'));
ALTER TABLE tickgate_runs
    ADD COLUMN skip_reason  text,
    ADD COLUMN missed_ticks integer CHECK (missed_ticks >= 1),
    ADD CONSTRAINT tickgate_runs_skip_reason CHECK ((status = 'skipped') = (skip_reason IS NOT NULL));

-- "Is another run of this job in progress?" is asked of every tick that finds the job's
-- lock held: one probe by job. It replaces the index of running rows by start, which the
-- planner preferred for that question, scanning every running row per tick; the orphan
-- sweep reads all running rows through this one as well.
CREATE INDEX tickgate_runs_running_job ON tickgate_runs (job, scheduled_for)
    WHERE status = 'running';
DROP INDEX tickgate_runs_running;

-- A job's identity that survives no delete: versions restart at 1 when a name is
-- deleted and created again; incarnations never repeat.
ALTER TABLE tickgate_jobs ADD COLUMN incarnation uuid NOT NULL DEFAULT gen_random_uuid();
