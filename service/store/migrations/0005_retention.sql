-- Retention's watermark: per job, the newest tick whose ledger row retention deleted.
-- A pruned row reads as "never ran", so backfill refuses ranges starting at or before
-- it rather than rerun ticks that already ran.
--
-- A table of its own rather than a column on tickgate_jobs: the sweep would otherwise
-- write job rows, taking their row locks in its own order against the API's edits
-- (which lock jobs in name order, FOR UPDATE) and adding dead tuples to the table every
-- replica's mirror reads. Deleting a job deletes its runs (ON DELETE CASCADE) and, the
-- same way, its watermark: a job created again under that name has no history.
CREATE TABLE tickgate_pruned (
    job     text COLLATE "C" PRIMARY KEY REFERENCES tickgate_jobs (name) ON DELETE CASCADE,
    through timestamptz NOT NULL
);
