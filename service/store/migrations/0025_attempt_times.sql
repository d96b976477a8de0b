-- Attempts with their times (#25): each attempt before a run's last, kept beside the run
-- as the next attempt starts (NOTE_ATTEMPT) or another replica takes it over (RESUME):
-- {attempt, status, error, ended_at, next_at}; each started at the next_at before it (the
-- first, with the run). The last attempt is the run.
ALTER TABLE tickgate_run_outputs ADD COLUMN earlier_attempts jsonb;
