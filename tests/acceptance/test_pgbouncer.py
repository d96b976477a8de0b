"""Tickgate behind a real PgBouncer (tests/support/pgbouncer.py).

Transaction pooling lends each transaction whichever server session is free, so
Tickgate's session advisory locks would be taken, held and released on sessions it
does not own: `tickgate serve` refuses to start behind it. Session pooling keeps each
client on one server session: Tickgate runs as on PostgreSQL itself, and a replica
killed with kill -9 leaves its server session to PgBouncer, whose reset frees its locks.
"""

import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from harness.accounting import await_accounting
from harness.cluster import serve, serve_many
from harness.faulty import faulty
from harness.postgres import Sql
from harness.receiver import Receiver
from harness.replicas import START_DEADLINE_SECONDS, start_replica
from harness.waiting import eventually
from service.store.errors import SharedSessionError
from service.store.members_sql import MEMBER_LOCK_CLASS
from service.store.pooling import PROBE_LOCK_KEY, refuse_shared_sessions
from tests.support.cluster import (
    EVERY_FIVE_SECONDS_CRON,
    FAST_ORPHAN_SWEEPS,
    create,
    create_all,
    every_second_specs,
    http_job,
    next_whole_second,
    report,
    sleep_until,
    status_of,
    utc,
)
from tests.support.db import advisory_lock_holders
from tests.support.pgbouncer import PgBouncer, StartPgBouncer

# What the refusal must tell an operator: the cause and both ways out.
REFUSAL_WORDS = (
    "transaction pooling",
    "Point DATABASE_URL at PostgreSQL directly",
    "PgBouncer in session mode (pool_mode = session)",
)


async def warm_pool(dsn: str, servers: int) -> None:
    """Have PgBouncer open `servers` server sessions: as many connections, each holding a
    transaction at once."""
    connections = [await asyncpg.connect(dsn) for _ in range(servers)]
    try:
        transactions = [connection.transaction() for connection in connections]
        for connection, transaction in zip(connections, transactions, strict=True):
            await transaction.start()
            await connection.fetchval("SELECT pg_backend_pid()")
        for transaction in transactions:
            await transaction.commit()
    finally:
        for connection in connections:
            await connection.close()


async def leave_a_lock(dsn: str) -> None:
    """A client that takes a session advisory lock and disconnects holding it."""
    connection = await asyncpg.connect(dsn)
    await connection.execute("SELECT pg_advisory_lock(42)")
    await connection.close()


@pytest.mark.parametrize(
    ("settings", "servers", "seen"),
    [
        # PgBouncer's default lends the session released last: the second connection
        # gets the first one's session.
        ({}, 0, "two connections were on backend"),
        # In turn, from a pool of several: the next statement runs elsewhere.
        ({"server_round_robin": "1"}, 4, "was looked for on backend"),
    ],
    ids=["last-released-first", "round-robin"],
)
async def test_the_session_check_refuses_transaction_pooling(
    pgbouncer: StartPgBouncer,
    database_url: str,
    settings: dict[str, str],
    servers: int,
    seen: str,
) -> None:
    bouncer = pgbouncer("transaction", **settings)
    dsn = bouncer.dsn_for(database_url)
    await warm_pool(dsn, servers)
    with pytest.raises(SharedSessionError) as refused:
        await refuse_shared_sessions(dsn)
    message = str(refused.value)
    assert seen in message, message
    assert "goes through a pooler in transaction pooling mode" in message, message
    for words in REFUSAL_WORDS:
        assert words in message, message


async def test_the_session_check_refuses_sessions_handed_on_without_a_reset(
    pgbouncer: StartPgBouncer, database_url: str
) -> None:
    """Session mode with an empty server_reset_query hands the next client a session
    still holding the last one's advisory locks."""
    bouncer = pgbouncer("session", server_reset_query="")
    dsn = bouncer.dsn_for(database_url)
    await leave_a_lock(dsn)
    with pytest.raises(SharedSessionError) as refused:
        await refuse_shared_sessions(dsn)
    message = str(refused.value)
    assert "held 1 advisory locks already" in message, message
    assert "empty server_reset_query" in message, message
    for words in REFUSAL_WORDS:
        assert words in message, message


async def test_the_session_check_passes_session_pooling_and_postgresql(
    pgbouncer: StartPgBouncer, database_url: str
) -> None:
    """No false alarm, and the probe lock is gone once the check returns. Under session
    pooling the last client's lock is gone too: PgBouncer's default server_reset_query,
    DISCARD ALL, released it as that client disconnected."""
    bouncer = pgbouncer("session")
    dsn = bouncer.dsn_for(database_url)
    await leave_a_lock(dsn)
    await refuse_shared_sessions(dsn)
    await refuse_shared_sessions(database_url)
    assert await advisory_lock_holders(database_url, PROBE_LOCK_KEY) == []
    assert await advisory_lock_holders(database_url, 42) == []


@pytest.mark.parametrize("roles", [{}, {"TICKGATE_API": "false"}], ids=["pod", "scheduler-only"])
def test_serve_refuses_to_start_behind_transaction_pooling(
    pgbouncer: StartPgBouncer, database_url: str, tmp_path: Path, sql: Sql, roles: dict[str, str]
) -> None:
    """`tickgate serve` exits 2 with one line naming transaction pooling and the fix,
    before it joins the cluster or opens a lock session."""
    bouncer = pgbouncer("transaction")
    replica = start_replica(tmp_path, database_url=bouncer.dsn_for(database_url), **roles)
    code = replica.wait_exit(60)
    log = replica.log()
    assert code == 2, log
    for words in REFUSAL_WORDS:
        assert words in log, log
    assert "Traceback" not in log, log
    assert sql.value("SELECT count(*) FROM tickgate_members") == 0


def test_serve_behind_session_pooling_runs_each_tick_once(
    pgbouncer: StartPgBouncer, database_url: str, tmp_path: Path, receiver: Receiver, sql: Sql
) -> None:
    """Two replicas through PgBouncer in session mode: ready, and every tick of a window
    runs exactly once (delivered once, one ledger row)."""
    bouncer = pgbouncer("session")
    through = bouncer.dsn_for(database_url)
    with serve_many(tmp_path, 2, database_url=through) as replicas:
        for replica in replicas:
            eventually(lambda: status_of(replica, "/readyz") == 200, 30, f"{replica.url} ready")  # noqa: B023 - called at once
        specs, periods = every_second_specs(receiver, {"cron": 3, "interval": 3})
        create_all(replicas, specs)
        first = next_whole_second(time.time(), 2)
        last = first + 7
        accounting = await_accounting(receiver, sql, periods, first, last)
        problems = accounting.problems()
        assert not problems, report(problems, replicas)
    assert not receiver.duplicates()
    assert "login attempt" in bouncer.log(), "the replicas did not go through PgBouncer"


# --- kill -9 of a replica behind session pooling ---------------------------------------

# A run of the slow job in flight now (started within the last 1.5 s: its 3 s call is
# surely still going), on the victim's lock session.
SLOW_RUN_IN_FLIGHT = """
    SELECT id::text AS id, backend_pid FROM tickgate_runs
    WHERE job = 'slow' AND status = 'running' AND runner = $1
      AND started_at > clock_timestamp() - interval '1500 milliseconds'
"""
# The backend holding a member's lock: its membership connection.
MEMBER_BACKEND = f"""
    SELECT l.pid FROM pg_locks l JOIN tickgate_members m
      ON l.classid = {MEMBER_LOCK_CLASS}::oid AND l.objid = m.seed::oid AND l.objsubid = 2
    WHERE l.locktype = 'advisory' AND m.runner_id = $1
"""
ADVISORY_LOCKS_OF = "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND pid = ANY($1)"
BACKENDS = "SELECT pid, state, query FROM pg_stat_activity WHERE pid = ANY($1)"
RUN_STATUS = "SELECT status FROM tickgate_runs WHERE id = $1::uuid"
BACKENDS_ALIVE = "SELECT count(*) FROM pg_stat_activity WHERE pid = ANY($1)"
RUN_STARTED_SINCE = """
    SELECT count(*) FROM tickgate_runs
    WHERE job = 'slow' AND status <> 'skipped' AND started_at > $1
"""
# Both replicas claim every tick, the survivor a second late: the victim wins each tick
# while it lives (so the first run is on it), the survivor is up to sweep and takes the
# ticks after the kill.
EVERY_JOB_EVERYWHERE = FAST_ORPHAN_SWEEPS | {"TICKGATE_OWNERSHIP": "false"}
A_SECOND_LATE = faulty(fire_delay=1000)


@contextmanager
def connections(dsn: str, count: int) -> Iterator[set[int]]:
    """`count` connections opened one after another, each on a server session (PgBouncer
    lends its idle ones first); their backends' pids."""
    opened: list[Sql] = []
    try:
        for _ in range(count):
            opened.append(Sql(dsn))
        yield {connection.value("SELECT pg_backend_pid()") for connection in opened}
    finally:
        for connection in opened:
            connection.close()


@dataclass(frozen=True)
class Killed:
    """A replica killed with kill -9 mid-run: the run, and the backends of its lock
    session and of its membership connection."""

    run_id: str
    run_backend: int
    backends: list[int]
    at: float


@contextmanager
def killed_mid_run(
    bouncer: PgBouncer, database_url: str, tmp_path: Path, receiver: Receiver, sql: Sql
) -> Iterator[Killed]:
    """A victim replica through `bouncer`, killed with kill -9 while a run of the `slow`
    job (a 3 s call every 5 s) is in flight on it; beside it for the block, a survivor
    connected directly, sweeping orphans every 2 s."""
    survivor_env = EVERY_JOB_EVERYWHERE | A_SECOND_LATE
    with serve(tmp_path, database_url=database_url, **survivor_env) as survivor:
        victim = start_replica(
            tmp_path, database_url=bouncer.dsn_for(database_url), **EVERY_JOB_EVERYWHERE
        )
        try:
            eventually(victim.answers, START_DEADLINE_SECONDS, "the victim")
            create(survivor, http_job("slow", receiver, EVERY_FIVE_SECONDS_CRON, seconds=3))
            runs: list[Any] = []

            def run_in_flight() -> bool:
                runs[:] = sql.fetch(SLOW_RUN_IN_FLIGHT, victim.runner_id)
                return bool(runs)

            eventually(run_in_flight, 90, "a run in flight on the victim")
            member = sql.value(MEMBER_BACKEND, victim.runner_id)
            killed_at = time.time()
            victim.kill()
        finally:
            victim.stop()
        run = runs[0]
        yield Killed(run["id"], run["backend_pid"], [run["backend_pid"], member], killed_at)


# Short, for the test's sake, yet well past the 8 s in which the survivor's orphan
# sweeps (every 2 s) would have ended the killed run on a direct connection.
IDLE_SECONDS = 12


def test_kill_9_behind_session_pooling_frees_the_locks_but_not_the_backends(
    pgbouncer: StartPgBouncer, database_url: str, tmp_path: Path, receiver: Receiver, sql: Sql
) -> None:
    """What PgBouncer 1.18 in session mode does with a replica killed with kill -9: it
    sees the client go, runs its server_reset_query (DISCARD ALL) on the dead client's
    server sessions at once, which releases their advisory locks (the job's, the
    membership's), and keeps the sessions for its next clients. So the job's next tick
    runs, but the killed run stays `running` (its backend lives) until PgBouncer
    closes that server session: after server_idle_timeout when no client takes it, and
    only after the client that took it over leaves when one did."""
    bouncer = pgbouncer("session", server_idle_timeout=str(IDLE_SECONDS))
    with killed_mid_run(bouncer, database_url, tmp_path, receiver, sql) as killed:
        eventually(
            lambda: sql.value(ADVISORY_LOCKS_OF, killed.backends) == 0,
            10,
            "the killed replica's sessions to hold no advisory lock",
        )
        backends = sql.fetch(BACKENDS, killed.backends)
        assert sorted(row["pid"] for row in backends) == sorted(killed.backends), backends
        assert {(row["state"], row["query"]) for row in backends} == {("idle", "DISCARD ALL")}

        # The survivor sweeps orphans every 2 s; on a direct connection the run would
        # be `abandoned` by now (tests/faults/test_replica_crash.py).
        sleep_until(killed.at + 8)
        assert sql.value(RUN_STATUS, killed.run_id) == "running"
        assert sql.value(BACKENDS_ALIVE, killed.backends) == 2
        eventually(
            lambda: bool(sql.value(RUN_STARTED_SINCE, utc(killed.at))),
            10,
            "the job's next tick to run on the survivor",
        )

        # PgBouncer hands the dead sessions to its next clients (a restarted replica,
        # say): while they hold them, the run stays `running`, past server_idle_timeout.
        with connections(bouncer.dsn_for(database_url), 20) as pids:
            assert killed.run_backend in pids
            sleep_until(killed.at + IDLE_SECONDS + 4)
            assert sql.value(RUN_STATUS, killed.run_id) == "running"
        # They leave; the sessions idle out (server_idle_timeout) and close.
        eventually(
            lambda: sql.value(RUN_STATUS, killed.run_id) == "abandoned",
            90,
            "the killed run to be marked abandoned",
        )
        assert sql.value(BACKENDS_ALIVE, killed.backends) == 0
    assert "closing because: server idle timeout" in bouncer.log()
    assert not receiver.duplicates()


def test_kill_9_behind_session_pooling_with_server_lifetime_0(
    pgbouncer: StartPgBouncer, database_url: str, tmp_path: Path, receiver: Receiver, sql: Sql
) -> None:
    """The advice: `server_lifetime = 0` has PgBouncer close a server session as its
    client leaves, so a killed replica's backends end as they would without PgBouncer,
    and its run is marked `abandoned` by the next sweeps."""
    bouncer = pgbouncer("session", server_lifetime="0")
    with killed_mid_run(bouncer, database_url, tmp_path, receiver, sql) as killed:
        eventually(
            lambda: sql.value(BACKENDS_ALIVE, killed.backends) == 0,
            10,
            "the killed replica's backends to end",
        )
        eventually(
            lambda: sql.value(RUN_STATUS, killed.run_id) == "abandoned",
            30,
            "the killed run to be marked abandoned",
        )
    assert "closing because: server lifetime over" in bouncer.log()
    assert not receiver.duplicates()
