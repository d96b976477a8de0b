-- Run now with other arguments (#24): a manual run may carry arguments of its own,
-- which it runs with instead of its job's (NULL: the job's), and a note saying why.
-- Both are written by the claim that makes the run, so a replica resuming the run
-- after a crash runs it with the same arguments.
ALTER TABLE tickgate_runs ADD COLUMN args jsonb, ADD COLUMN note text;
