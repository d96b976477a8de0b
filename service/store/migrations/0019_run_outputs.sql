-- Output you can read (#24): what a run's last attempt answered (the http task's
-- response: status, chosen headers, the body up to the job's cap), written with the
-- run's end by the same statement. A table of its own, so listing runs never reads it;
-- it goes with its run (retention, a deleted job).
CREATE TABLE tickgate_run_outputs (
    run_id uuid PRIMARY KEY REFERENCES tickgate_runs (id) ON DELETE CASCADE,
    output jsonb NOT NULL
);
