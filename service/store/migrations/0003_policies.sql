-- Scheduling policies (retries, window, run cap, jitter, catch-up), pause notes,
-- queue_one overlap and backfill runs.
ALTER TABLE tickgate_jobs
    ADD COLUMN retry          jsonb NOT NULL DEFAULT '{}',
    ADD COLUMN start_at       timestamptz,
    ADD COLUMN end_at         timestamptz,
    ADD COLUMN max_runs       bigint CHECK (max_runs >= 1),
    ADD COLUMN jitter_seconds integer NOT NULL DEFAULT 0 CHECK (jitter_seconds >= 0),
    ADD COLUMN catchup        text NOT NULL DEFAULT 'latest' CHECK (catchup IN ('latest', 'none')),
    ADD COLUMN pause_note     text,
    -- Ticks claimed so far (manual runs excluded); counted only for jobs with max_runs.
    ADD COLUMN runs_started   bigint NOT NULL DEFAULT 0;

ALTER TABLE tickgate_jobs DROP CONSTRAINT tickgate_jobs_overlap_check;
ALTER TABLE tickgate_jobs ADD CONSTRAINT tickgate_jobs_overlap_check
    CHECK (overlap IN ('skip', 'allow', 'queue_one'));

ALTER TABLE tickgate_runs DROP CONSTRAINT tickgate_runs_trigger_check;
ALTER TABLE tickgate_runs ADD CONSTRAINT tickgate_runs_trigger_check
    CHECK (trigger IN ('schedule', 'manual', 'catchup', 'backfill'));

CREATE INDEX tickgate_jobs_ending ON tickgate_jobs (end_at) WHERE state = 'active';

-- queue_one: the one tick per job allowed to wait for the run in progress. Whoever
-- inserts the row owns the wait; it holds no connection meanwhile, so the row expires
-- instead of dying with a session.
CREATE TABLE tickgate_pending (
    job           text COLLATE "C" PRIMARY KEY REFERENCES tickgate_jobs (name) ON DELETE CASCADE,
    scheduled_for timestamptz NOT NULL,
    runner        text NOT NULL,
    expires_at    timestamptz NOT NULL
);
