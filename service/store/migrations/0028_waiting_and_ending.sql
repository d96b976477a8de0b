-- queue_one and the audit (#41): when a waiter took its job's slot. The audit leaves a
-- tick waiting in its slot to its waiter while the waiter is live, and gives the wait to
-- a live replica otherwise (`cursor_sql.WAITING`). A member of the waiter's name that
-- joined after this instant is a replica restarted under that name, which forgot the
-- tick: the waiter is gone. NULL (slots taken before this migration): the name alone
-- decides. A column without a default: no rewrite, a moment's lock.
ALTER TABLE tickgate_pending ADD COLUMN reserved_at timestamptz;

-- The sweep (#41): every replica looks for the active jobs that have ended every round.
-- A window's end has its index (0003); the jobs that may end by their run cap or their
-- one tick get one of their own, holding only those while active, so the look reads
-- them and never every job. Built in a moment: the table is small beside the ledger.
CREATE INDEX tickgate_jobs_may_end ON tickgate_jobs (name)
    WHERE state = 'active' AND (max_runs IS NOT NULL OR schedule->>'kind' = 'once');
