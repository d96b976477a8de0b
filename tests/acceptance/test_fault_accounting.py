"""The accounting test (#22): every nominal tick ends in exactly one recorded outcome,
whatever happens to the cluster, and the database alone shows it.

Three `tickgate serve` replicas (the third through a TCP proxy) run 200 jobs calling a
loopback receiver: one-second crons and intervals, jittered ones and queue_one ones
whose calls outlast a tick, all with a 2 s misfire grace. For 40 s a random schedule of
faults plays, one after the other: kill -9 of a replica, SIGTERM of one, a PostgreSQL
restart, the proxied replica's link blackholed past the grace, and a replica's scheduler
stalled (SIGSTOP) past it. Afterwards every job's tick cursor has passed the window, and
for every job each nominal tick from its creation to its cursor has exactly one ledger
row, or is counted in a misfire row (`harness.accounting.cursor_problems`); no tick was
delivered twice.

`make soak` plays the same faults for 5 minutes (TICKGATE_FAULT_ACCOUNTING_SECONDS).
"""

import math
import os
import random
import signal
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx

from harness.accounting import cursor_problems
from harness.cluster import Slot, start_slots
from harness.postgres import Sql
from harness.receiver import Receiver
from harness.replicas import stop_all
from harness.tcpproxy import TcpProxy, Upstream
from service.embedded import start_embedded
from tests.support.cluster import (
    EVERY_SECOND_CRON,
    EVERY_SECOND_INTERVAL,
    create_all,
    http_job,
    report,
    wait_until,
)

WINDOW_SECONDS = float(os.environ.get("TICKGATE_FAULT_ACCOUNTING_SECONDS", "40"))
GRACE_SECONDS = 2
FAULT_SECONDS = 5.0  # how long each fault lasts: past the grace, so ticks misfire
REPLICA_ENV = {"TICKGATE_SHUTDOWN_GRACE_SECONDS": "3", "TICKGATE_RECONCILE_SECONDS": "5"}
FAULTS = ("kill", "sigterm", "pg_restart", "blackhole", "stall")


def _jobs(receiver: Receiver) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """200 one-second jobs: 90 crons, 90 intervals, 10 jittered by up to 3 s, and 10
    queue_one jobs whose calls take 1.5 s (a tick waits, the next is skipped)."""
    kinds: list[tuple[str, int, dict[str, Any], dict[str, Any]]] = [
        ("cron", 90, EVERY_SECOND_CRON, {}),
        ("interval", 90, EVERY_SECOND_INTERVAL, {}),
        ("jittered", 10, EVERY_SECOND_INTERVAL, {"jitter_seconds": 3}),
        ("queued", 10, EVERY_SECOND_CRON, {"overlap": "queue_one", "seconds": 1.5}),
    ]
    specs = []
    for kind, count, schedule, fields in kinds:
        for index in range(count):
            name = f"{kind}-{index:03d}"
            extra = dict(fields)
            seconds = extra.pop("seconds", None)
            spec = http_job(name, receiver, schedule, seconds=seconds, **extra)
            specs.append(spec | {"misfire_grace_seconds": GRACE_SECONDS})
    return specs, {spec["name"]: 1 for spec in specs}


class Cluster:
    """The replicas' slots, the proxy in front of the third, and the database."""

    def __init__(self, workdir: Path, data: Path) -> None:
        self.data = data
        self.database = start_embedded(data)
        self.url = self.database.url
        self.proxy = TcpProxy(Upstream.of_dsn(self.url)).start()
        self.slots = [Slot("acct", i, self.url, workdir, REPLICA_ENV) for i in range(2)]
        proxied = self.proxy.dsn_for(self.url)
        self.slots.append(Slot("acct", 2, proxied, workdir, REPLICA_ENV, proxied=True))

    def close(self) -> None:
        stop_all([slot.replica for slot in self.slots if slot.replica is not None])
        self.proxy.close()
        self.database.stop()

    def ready(self) -> bool:
        return all(slot.alive for slot in self.slots) and all(
            _answers(slot.url + "/readyz") for slot in self.slots
        )

    # --- the faults, each over when it returns ------------------------------------

    def kill(self, slot: Slot) -> None:
        slot.kill()
        time.sleep(FAULT_SECONDS)
        slot.start()
        slot.wait_ready()

    def sigterm(self, slot: Slot) -> None:
        slot.stop()
        time.sleep(FAULT_SECONDS)
        slot.start()
        slot.wait_ready()

    def pg_restart(self, _slot: Slot) -> None:
        self.database.stop()
        time.sleep(FAULT_SECONDS)
        self.database = start_embedded(self.data)
        wait_until(self.ready, 120, "the cluster after the restart", self._replicas())

    def blackhole(self, _slot: Slot) -> None:
        self.proxy.blackhole()
        time.sleep(FAULT_SECONDS)
        self.proxy.restore()
        wait_until(self.ready, 120, "the cluster after the blackhole", self._replicas())

    def stall(self, slot: Slot) -> None:
        assert slot.replica is not None
        scheduler = slot.replica.children()["scheduler"]
        scheduler.send_signal(signal.SIGSTOP)
        try:
            time.sleep(FAULT_SECONDS)
        finally:
            scheduler.send_signal(signal.SIGCONT)
        wait_until(self.ready, 120, "the cluster after the stall", self._replicas())

    def _replicas(self) -> list[Any]:
        return [slot.replica for slot in self.slots if slot.replica is not None]


def _answers(url: str) -> bool:
    try:
        return httpx.get(url, timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


@contextmanager
def _cluster(tmp_path: Path) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path, tmp_path / "pg")
    try:
        start_slots(cluster.slots)
        yield cluster
    finally:
        cluster.close()


def _schedule(seed: int, until: float) -> Iterator[tuple[str, int]]:
    """Rounds of every kind of fault, each round in a random order and each fault on a
    random replica (the blackhole on the proxied one), until `until` (time.time()); the
    first round is always played whole."""
    chosen = random.Random(seed)
    first = True
    while first or time.time() < until:
        for fault in chosen.sample(FAULTS, len(FAULTS)):
            if not first and time.time() >= until:
                return
            yield fault, 2 if fault == "blackhole" else chosen.randrange(3)
        first = False


def test_every_tick_has_one_outcome_under_a_random_fault_schedule(
    tmp_path: Path, receiver: Receiver
) -> None:
    seed = int(os.environ.get("TICKGATE_FAULT_SEED", str(int(time.time()))))
    played: list[str] = []
    with _cluster(tmp_path) as cluster:
        specs, periods = _jobs(receiver)
        replicas = cluster._replicas()
        create_all(replicas, specs)
        ends = time.time() + WINDOW_SECONDS
        for fault, index in _schedule(seed, ends):
            played.append(f"{fault}@{index}")
            fault_of: Callable[[Slot], None] = getattr(cluster, fault)
            fault_of(cluster.slots[index])
            time.sleep(2)  # the cluster whole between faults
        window_end = math.ceil(time.time())
        sql = Sql(cluster.url)
        try:
            wait_until(
                lambda: _cursors_past(sql, window_end),
                90,
                "every cursor past the window",
                cluster._replicas(),
            )
            stop_all(cluster._replicas())
            problems = cursor_problems(sql, periods)
            outcomes = dict(sql.fetch(_OUTCOMES_BY_KIND))
        finally:
            sql.close()
    context = f"seed {seed}, faults {played}, outcomes {outcomes}"
    # Not vacuous: the faults outlasted the grace (misfires), and ticks ran throughout.
    assert outcomes.get("misfire", 0) > 0, context
    assert outcomes.get("ran", 0) > 200 * WINDOW_SECONDS / 2, context
    assert not problems, report([context, *problems], [])
    assert not receiver.duplicates(), report([context, *receiver.duplicates()], [])


# Ticks by outcome: run, or skipped by reason (a misfire row counting all its ticks).
_OUTCOMES_BY_KIND = """SELECT coalesce(skip_reason, 'ran') AS kind,
        sum(coalesce(missed_ticks, 1))::int AS ticks
    FROM tickgate_runs GROUP BY 1"""


def _cursors_past(sql: Sql, moment: float) -> bool:
    lagging = sql.value(
        "SELECT count(*) FROM tickgate_cursors WHERE tick <= to_timestamp($1)", float(moment)
    )
    return bool(lagging == 0)
