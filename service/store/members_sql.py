"""Every statement of cluster membership and job ownership, one constant per statement.

A member is live while a session holds the advisory lock (MEMBER_LOCK_CLASS, seed), in
PostgreSQL's two-int form: pg_locks shows it as classid = MEMBER_LOCK_CLASS, objid =
seed, objsubid = 2. Job locks use the one-bigint form (objsubid = 1), so the two never
collide, whatever the keys. The lock is taken by the statement that inserts the row and
lives as long as the member's connection: a replica that dies, or whose link breaks,
stops being live the moment PostgreSQL ends its session, with nothing to expire.
Advisory locks are per database, so only this database's locks count.

Which member owns which job is computed from the live members' seeds, the same way on
every replica (`service/domain/ownership.py`: buckets by rendezvous hashing).
"""

# "tgmb" in ASCII; below 2**31, so it fits the int4 key of the two-int lock form.
MEMBER_LOCK_CLASS = 0x74676D62
# Rows of members dead this long are deleted; a heartbeat deletes at most this many.
DEAD_MEMBER_RETENTION = "1 hour"
DEAD_MEMBERS_PER_HEARTBEAT = 100

MEMBER_COLUMNS = (
    "m.seed, m.runner_id, m.version, m.tzdata, m.started_at, m.heartbeat_at, m.runs_in_flight,"
    " m.last_sync"
)

# Whether the member of the row named m is live (its session holds its seed's lock).
MEMBER_IS_LIVE = f"""EXISTS (SELECT 1 FROM pg_locks l
        WHERE l.locktype = 'advisory' AND l.granted AND l.objsubid = 2
          AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())
          AND l.classid = {MEMBER_LOCK_CLASS}::oid AND l.objid = m.seed::oid)"""

# A new seed, its lock, then its row, in one statement: the row is visible to others
# only once it is committed, by which time the lock is held. No row is written (and
# none returned) if something else holds the seed's key (a foreign application using
# the two-int form): that seed is no member. `started_at` is when the replica first
# joined (the fourth argument, kept across its rejoins; the first three: its runner id,
# version and tzdata), or now for a first join: a replica that lost
# only its membership's connection (a PostgreSQL restart, a heartbeat past its
# deadline) was up all along, and the cluster with it (`Takeover.since`).
JOIN = f"""WITH drawn AS (
        SELECT nextval('tickgate_member_seeds')::integer AS seed),
    locked AS (
        SELECT seed FROM drawn WHERE pg_try_advisory_lock({MEMBER_LOCK_CLASS}, seed))
    INSERT INTO tickgate_members (seed, runner_id, version, tzdata, heartbeat_at, started_at)
    SELECT seed, $1, $2, $3, clock_timestamp(), COALESCE($4::timestamptz, clock_timestamp())
    FROM locked
    RETURNING seed, started_at"""

# Live members in seed order.
LIVE_MEMBERS = (
    f"SELECT {MEMBER_COLUMNS} FROM tickgate_members m WHERE {MEMBER_IS_LIVE} ORDER BY m.seed"
)

# Arguments: the seed, the runs in flight, the last sync. Writes this member's row,
# deletes a bounded batch of long-dead members' rows (SKIP LOCKED: two members sweeping
# at once never wait on each other), and reads the live members, all in one round trip.
# The read sees the table as it was before this statement's writes, so the member's own
# row shows its previous heartbeat.
HEARTBEAT = f"""WITH beat AS (
        UPDATE tickgate_members SET heartbeat_at = clock_timestamp(),
            runs_in_flight = $2, last_sync = $3
        WHERE seed = $1),
    dead AS (
        SELECT m.seed FROM tickgate_members m
        WHERE m.heartbeat_at < clock_timestamp() - interval '{DEAD_MEMBER_RETENTION}'
          AND NOT {MEMBER_IS_LIVE}
        ORDER BY m.seed LIMIT {DEAD_MEMBERS_PER_HEARTBEAT}
        FOR UPDATE SKIP LOCKED),
    swept AS (
        DELETE FROM tickgate_members m USING dead WHERE m.seed = dead.seed)
    {LIVE_MEMBERS}"""
