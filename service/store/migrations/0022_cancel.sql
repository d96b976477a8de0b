-- Cancel a run (#24). The request stays on the run's row: the replica running it hears
-- of it by NOTIFY (tickgate_cancels) and reads who asked and why from here, or finds it
-- at its next look should the notification be lost; an orphan sweep never resumes a run
-- someone cancelled. The index holds only the runs waiting for their cancel.
ALTER TABLE tickgate_runs
    ADD COLUMN cancel_requested_at timestamptz,
    ADD COLUMN cancelled_by text,
    ADD COLUMN cancel_reason text;
CREATE INDEX tickgate_runs_cancels ON tickgate_runs (runner)
    WHERE status = 'running' AND cancel_requested_at IS NOT NULL;
