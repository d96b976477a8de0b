-- The next-tick book: each active job's next nominal tick ('infinity' when it has none
-- left), so that GET /v1/jobs?sort=next_run pages through 100,000 jobs in next-run order
-- with one index range per page. Nothing on the fire path writes it: the overdue check
-- (one replica per reconcile round, already walking every active job) files every job's
-- tick, and the API files a job's tick when it creates or changes the job. A job with
-- no row, or no longer active, sorts after every tick, by name.
CREATE TABLE tickgate_next_ticks (
    job  text COLLATE "C" PRIMARY KEY REFERENCES tickgate_jobs (name) ON DELETE CASCADE,
    tick timestamptz NOT NULL
);
CREATE INDEX tickgate_next_ticks_order ON tickgate_next_ticks (tick, job);
