-- Cluster membership: one row per replica that joined (service/store/members_sql.py).
-- A member is live while a session holds the advisory lock (MEMBER_LOCK_CLASS, seed),
-- taken by the statement that inserts its row (before it, so a seed whose lock is held
-- by something else gets no row), on a connection of its own; the row alone proves
-- nothing (a killed replica leaves it behind). The other columns are for display.
-- Rows of members dead for an hour are deleted by live members' heartbeats.
--
-- No index but the key: each member rewrites its row every second, and an update that
-- changes no indexed column stays a HOT update, cheap to write and to clean up.
CREATE SEQUENCE tickgate_member_seeds AS integer;
CREATE TABLE tickgate_members (
    seed           integer PRIMARY KEY DEFAULT nextval('tickgate_member_seeds'),
    runner_id      text NOT NULL,
    version        text NOT NULL,
    started_at     timestamptz NOT NULL DEFAULT clock_timestamp(),
    heartbeat_at   timestamptz NOT NULL,
    runs_in_flight integer NOT NULL DEFAULT 0,
    last_sync      timestamptz
);
ALTER SEQUENCE tickgate_member_seeds OWNED BY tickgate_members.seed;
