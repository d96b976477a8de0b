-- A backend is its PID and when it started (#41). PIDs are reused: after a PostgreSQL
-- restart in a new PID namespace (a pod restart) a new backend may get the PID of one
-- that held a run, and that run would then look alive for ever. A row names the backend
-- that holds it by both; a row without a start (written before this migration, or by a
-- replica of the release before) is judged by its PID alone, as it was.
-- Nullable and without a default: adding it rewrites no row.
ALTER TABLE tickgate_runs ADD COLUMN backend_start timestamptz;

-- A replica of the release before, during a rolling upgrade, moves a row to its own
-- backend (an orphan resumed, a skip backfilled) by its PID alone: the start the row
-- had would then name another backend than the PID does. Such a move forgets the start,
-- so the row falls back to the PID-only rule instead of naming a backend that never was.
CREATE FUNCTION tickgate_runs_backend_moved() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    NEW.backend_start := NULL;
    RETURN NEW;
END $$;
CREATE TRIGGER tickgate_runs_backend_moved BEFORE UPDATE OF backend_pid ON tickgate_runs
    FOR EACH ROW
    WHEN (NEW.backend_pid IS DISTINCT FROM OLD.backend_pid
          AND NEW.backend_start IS NOT DISTINCT FROM OLD.backend_start)
    EXECUTE FUNCTION tickgate_runs_backend_moved();
