-- A delete is a cancel (#41). A run's row must not disappear under a run that still
-- holds its job's lock: the run would go on unseen (its cancel answering 404), and a job
-- created again under the name would find the lock held by no run it can see. So a
-- job's runs no longer go with it by a cascade: the delete itself deletes the ended
-- ones and asks the cancel of the `running` ones (jobs_sql.DETACH_RUNS), which stay
-- until they end, detached: their `job` becomes `name@deleted:incarnation`, which no
-- job can be named, so a job made again under the name shares no (job, tick) with them.
-- Dropping the constraint rewrites nothing.
ALTER TABLE tickgate_runs DROP CONSTRAINT IF EXISTS tickgate_runs_job_fkey;

-- The runs a delete detached: the job's name and incarnation they belonged to, and the
-- lock key they hold until they end: a claim that finds that key held by one of them
-- answers `busy` (a run of the job is in progress), not `locked`. Retention deletes each
-- once it has ended (or its replica is gone). A table of its own, not a column, so that
-- no index need be built over the whole ledger here.
CREATE TABLE tickgate_detached_runs (
    run_id      uuid PRIMARY KEY REFERENCES tickgate_runs (id) ON DELETE CASCADE,
    job         text COLLATE "C" NOT NULL,
    incarnation uuid NOT NULL,
    lock_key    bigint NOT NULL,
    detached_at timestamptz NOT NULL
);
CREATE INDEX tickgate_detached_runs_lock_key ON tickgate_detached_runs (lock_key);
