-- When an orphan sweep first found a run orphaned (its backend gone, its lock free). A
-- replica that is alive (it lost the run's connection, not its life) records such a run
-- itself within a grace measured from here; the run of a replica that died is taken over
-- at once. Nullable and without a default: adding it rewrites no row.
ALTER TABLE tickgate_runs ADD COLUMN orphaned_at timestamptz;
