-- Outcome hooks (#24). A job's hooks, and whether the cluster's default hooks apply to it.
ALTER TABLE tickgate_jobs
    ADD COLUMN hooks jsonb NOT NULL DEFAULT '[]',
    ADD COLUMN default_hooks boolean NOT NULL DEFAULT true;

-- A run a hook started: trigger `chain`.
ALTER TABLE tickgate_runs DROP CONSTRAINT tickgate_runs_trigger_check;
ALTER TABLE tickgate_runs ADD CONSTRAINT tickgate_runs_trigger_check
    CHECK (trigger IN ('schedule', 'manual', 'catchup', 'backfill', 'chain'));

-- The outbox: one delivery per hook and event, written by the statement that records the
-- run's end or the tick's skip, so it survives the replica that wrote it. Any replica
-- sends it: it takes the delivery for a lease (`sending`, until `due_at`), and a
-- delivery whose lease ran out (its sender died) is taken again. `action` and `retry`
-- are the hook's as they were when the run ended. It goes with its run.
CREATE TABLE tickgate_hook_deliveries (
    id          uuid PRIMARY KEY,
    run_id      uuid NOT NULL REFERENCES tickgate_runs (id) ON DELETE CASCADE,
    job         text NOT NULL,
    hook        integer NOT NULL,
    is_default  boolean NOT NULL,
    event       text NOT NULL,
    action      jsonb NOT NULL,
    retry       jsonb NOT NULL,
    status      text NOT NULL DEFAULT 'pending'
        CHECK (status IN ('pending', 'sending', 'delivered', 'failed')),
    attempts    integer NOT NULL DEFAULT 0,
    due_at      timestamptz NOT NULL,
    sender      text,
    last_error  text,
    answer      jsonb,
    created_at  timestamptz NOT NULL,
    finished_at timestamptz
);
CREATE INDEX tickgate_hook_deliveries_of_run ON tickgate_hook_deliveries (run_id);
-- What senders poll: only the deliveries not yet done.
CREATE INDEX tickgate_hook_deliveries_due ON tickgate_hook_deliveries (due_at)
    WHERE status IN ('pending', 'sending');
