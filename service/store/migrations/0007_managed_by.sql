-- Who manages a job (a GitOps tool, a Helm release). A bulk apply with prune deletes
-- the active and paused jobs of its manager that it does not name: the index finds them.
ALTER TABLE tickgate_jobs ADD COLUMN managed_by text;
CREATE INDEX tickgate_jobs_managed_by ON tickgate_jobs (managed_by, name)
    WHERE managed_by IS NOT NULL;
