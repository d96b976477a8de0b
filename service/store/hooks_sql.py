"""The outbox of hook deliveries (#24): written with the ends and skips that cause them
(`deliveries`, a part of those statements), taken and sent by any replica, listed under
their run. Statements only; `hooks` runs them."""

from service.store.columns import Params
from service.store.rows import RUN_COLUMNS


def deliveries(rows: str) -> str:
    """The outbox's insert of the hook deliveries (#24) of `rows`, a set of (run_id, job,
    started_at, calls): each call in `calls` (a JSON array of `HookCall.stored()`, or
    NULL: `rows.encoded_calls`) becomes one delivery, due now, in the statement that
    records the run's end or the tick's skip. A `recovery` call becomes one only if the
    job's run before this one (the last to have started, among those that ran and ended)
    failed."""
    return f"""INSERT INTO tickgate_hook_deliveries (id, run_id, job, hook, is_default, event,
            action, retry, due_at, created_at)
        SELECT (c->>'id')::uuid, h.run_id, h.job, (c->>'hook')::int, (c->>'default')::boolean,
            c->>'event', c->'action', c->'retry', clock_timestamp(), clock_timestamp()
        FROM {rows} AS h CROSS JOIN LATERAL jsonb_array_elements(h.calls) AS c
        WHERE c->>'event' <> 'recovery' OR (
            SELECT p.status FROM tickgate_runs p
            WHERE p.job = h.job AND p.id <> h.run_id AND p.started_at <= h.started_at
              AND p.status NOT IN ('running', 'skipped')
            ORDER BY p.started_at DESC, p.id DESC LIMIT 1)
            IN ('failed', 'timed_out', 'abandoned')"""


_DELIVERY_COLUMNS = """d.id AS delivery_id, d.run_id, d.job AS delivery_job, d.hook, d.is_default,
    d.event, d.action, d.retry, d.status AS delivery_status, d.attempts AS delivery_attempts,
    d.due_at, d.sender, d.last_error, d.answer, d.created_at, d.finished_at AS delivered_at"""

# Up to `most` deliveries that are due: pending ones, and those whose sender's lease ran
# out (it died mid-send), the longest due first, skipping those another replica is
# taking. Each becomes `sending` for `sender`, one attempt more, its lease the action's
# timeout and `lease_margin` seconds. With each come its run and its job's labels (the
# job may be gone).
_taking = Params()
TAKE = _taking.statement(f"""WITH due AS (
        SELECT id FROM tickgate_hook_deliveries
        WHERE status IN ('pending', 'sending') AND due_at <= clock_timestamp()
        ORDER BY due_at LIMIT {_taking("most")}
        FOR UPDATE SKIP LOCKED
    ), taken AS (
        UPDATE tickgate_hook_deliveries d SET status = 'sending', sender = {_taking("sender")},
            attempts = d.attempts + 1,
            due_at = clock_timestamp() + make_interval(secs =>
                COALESCE((d.action->'args'->>'timeout_seconds')::float8, 30)
                + {_taking("lease_margin")})
        FROM due WHERE d.id = due.id
        RETURNING d.*
    )
    SELECT {_DELIVERY_COLUMNS}, {", ".join(f"r.{c.strip()}" for c in RUN_COLUMNS.split(","))},
        COALESCE(j.labels, '{{}}'::jsonb) AS labels
    FROM taken d JOIN tickgate_runs r ON r.id = d.run_id
        LEFT JOIN tickgate_jobs j ON j.name = d.job
    ORDER BY d.created_at""")

# How a delivery's attempt went (the delivery `id`, its `sender`): its `status`
# (`delivered`, `failed`, or `pending` again in `retry_in` seconds), the `error`, and
# what the target or the gate answered (`answer`). Only while this sender still holds it.
_settling = Params()
_status = _settling("status")
SETTLE = _settling.statement(f"""UPDATE tickgate_hook_deliveries SET status = {_status},
        last_error = {_settling("error")}, answer = {_settling("answer")},
        due_at = clock_timestamp() + make_interval(secs => COALESCE({_settling("retry_in")}, 0)),
        finished_at = CASE WHEN {_status} = 'pending' THEN NULL ELSE clock_timestamp() END
    WHERE id = {_settling("id")} AND sender = {_settling("sender")} AND status = 'sending'""")

# A run's deliveries, oldest first; no row at all: no such run.
OF_RUN = f"""SELECT r.id AS found, {_DELIVERY_COLUMNS}
    FROM tickgate_runs r LEFT JOIN tickgate_hook_deliveries d ON d.run_id = r.id
    WHERE r.id = $1 ORDER BY d.created_at, d.event, d.hook"""

# The newest deliveries of the job's runs (the job, then how many).
OF_JOB = f"""SELECT {_DELIVERY_COLUMNS} FROM tickgate_hook_deliveries d
    WHERE d.job = $1 ORDER BY d.created_at DESC, d.id LIMIT $2"""

# The jobs with trigger hooks, with their hooks: the edges a cycle would run along.
CHAIN_EDGES = """SELECT name, hooks FROM tickgate_jobs
    WHERE hooks @> '[{"action": {"kind": "trigger"}}]'"""
