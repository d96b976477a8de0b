-- Two migrations were edited after databases had applied them, and migrations were
-- then recorded by version alone: a database migrated in between kept what the first
-- text made. This repairs what each edit changed, and is a no-op elsewhere.
--
-- 0004_tick_accounting (edited in bbc8359): the first text kept 0002's index of running
-- rows by start, which the planner preferred for "is another run of this job in
-- progress?", scanning every running row on every claim that found a job's lock held.
-- The edit dropped it in favour of tickgate_runs_running_job; databases that ran the
-- first text still have it. Nothing reads it since.
DROP INDEX IF EXISTS tickgate_runs_running;

-- 0014_cursors (edited in 08239ce): the first text made tickgate_cursors without
-- `fillfactor = 50`, so a claim's move of the cursor could not stay on its page (no
-- heap-only update) on a database migrated in between. Setting it again is harmless
-- where it is set; it shapes the pages written from now on (a rewrite, VACUUM FULL,
-- would take the table's exclusive lock for its whole length: not here).
ALTER TABLE tickgate_cursors SET (fillfactor = 50);
