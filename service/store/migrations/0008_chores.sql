-- The overdue book: the jobs the last overdue check found with a tick past its grace
-- that never ran, and the tick. Finding them takes the schedule math of every active
-- job, so one replica per round does it (service/scheduler/overdue.py) and /metrics and
-- the API read the book: a scrape costs the same with 100 jobs or 100,000.
CREATE TABLE tickgate_overdue (
    job  text COLLATE "C" PRIMARY KEY REFERENCES tickgate_jobs (name) ON DELETE CASCADE,
    tick timestamptz NOT NULL
);

-- Cluster-wide chores done by one replica per round: a replica takes the round by moving
-- `started_at` forward only if the last round began long enough ago (one statement, so
-- two replicas never both take it); `finished_at` says when the book was last filed.
CREATE TABLE tickgate_chores (
    name        text PRIMARY KEY,
    started_at  timestamptz NOT NULL DEFAULT '-infinity',
    finished_at timestamptz
);
INSERT INTO tickgate_chores (name) VALUES ('overdue'), ('retention');
