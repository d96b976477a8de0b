-- The run ledger: one row per (job, nominal tick). The UNIQUE constraint is the gate
-- that stops a late replica from running a tick that already ran elsewhere.
CREATE TABLE tickgate_runs (
    id            uuid PRIMARY KEY,
    job           text COLLATE "C" NOT NULL REFERENCES tickgate_jobs (name) ON DELETE CASCADE,
    scheduled_for timestamptz NOT NULL,
    trigger       text NOT NULL CHECK (trigger IN ('schedule', 'manual', 'catchup')),
    status        text NOT NULL CHECK (status IN
                    ('running', 'succeeded', 'failed', 'timed_out', 'cancelled', 'abandoned')),
    started_at    timestamptz NOT NULL,
    finished_at   timestamptz,
    duration_ms   bigint,
    attempts      integer NOT NULL DEFAULT 1,
    runner        text NOT NULL,
    error         text,
    result        jsonb,
    job_version   bigint NOT NULL,
    -- Who holds the run: orphan detection asks pg_locks / pg_stat_activity about these.
    lock_key      bigint NOT NULL,
    locked        boolean NOT NULL,
    backend_pid   integer NOT NULL,
    CONSTRAINT tickgate_runs_tick_unique UNIQUE (job, scheduled_for)
);

CREATE INDEX tickgate_runs_newest ON tickgate_runs (job, started_at DESC, id DESC);
CREATE INDEX tickgate_runs_running ON tickgate_runs (started_at) WHERE status = 'running';
