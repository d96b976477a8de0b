-- Jobs, addressed by name. Names sort in byte order (COLLATE "C") so cursors are stable.
CREATE TABLE tickgate_jobs (
    name                  text COLLATE "C" PRIMARY KEY,
    lock_key              bigint NOT NULL,
    description           text NOT NULL DEFAULT '',
    schedule              jsonb NOT NULL,
    timezone              text NOT NULL,
    task                  text NOT NULL,
    args                  jsonb NOT NULL,
    state                 text NOT NULL CHECK (state IN ('active', 'paused', 'completed')),
    overlap               text NOT NULL CHECK (overlap IN ('skip', 'allow')),
    timeout_seconds       integer NOT NULL CHECK (timeout_seconds > 0),
    misfire_grace_seconds integer NOT NULL CHECK (misfire_grace_seconds >= 0),
    created_at            timestamptz NOT NULL,
    updated_at            timestamptz NOT NULL,
    fire_after            timestamptz NOT NULL,
    version               bigint NOT NULL CHECK (version >= 1),
    CONSTRAINT tickgate_jobs_lock_key_unique UNIQUE (lock_key)
);

CREATE INDEX tickgate_jobs_task ON tickgate_jobs (task, name);
CREATE INDEX tickgate_jobs_state ON tickgate_jobs (state, name);
