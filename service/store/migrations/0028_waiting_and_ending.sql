-- queue_one and the audit (#41): when a waiter took its job's slot. The audit leaves a
-- tick waiting in its slot to its waiter while the waiter is live, and gives the wait to
-- a live replica otherwise (`cursor_sql.WAITING`). A member of the waiter's name that
-- joined after this instant is a replica restarted under that name, which forgot the
-- tick: the waiter is gone. NULL (slots taken before this migration): the name alone
-- decides. A column without a default: no rewrite, a moment's lock.
ALTER TABLE tickgate_pending ADD COLUMN reserved_at timestamptz;
