"""Samples, every ~10 s, of what must stay flat over a long run.

Each sample holds: RSS of each replica's process tree (`tickgate serve` with its
scheduler and API children; psutil) and which incarnation it was; the ledger's rows
(`count(*)`, or `pg_class.reltuples` if counting takes over 5 s); fire lateness p50/p99
(`started_at - scheduled_for`) and runs/s and skips/s over the ticks 10 to 20 s old (a
tick has had 10 s to be claimed); how long each replica's `/metrics` took to answer and
how big it was, on the whole second (with the crowd of ticks due then: samples fall on
whole seconds, as the jobs' ticks do) and again half a second later, between two crowds
(`scrape_mid_ms`: what the exposition itself costs); jobs in the database; and the box's
CPU. A figure that could not be read
(PostgreSQL restarting, a replica down) is null.
"""

import asyncio
import threading
import time
from collections.abc import Sequence
from typing import Any

import asyncpg
import httpx
import psutil

from harness.cluster import Slot
from harness.replicas import tree_rss_bytes
from reliability.soak import Worker

INTERVAL_SECONDS = 10.0
LAG_SECONDS = 10.0  # the sampled ticks are this old at least...
SPAN_SECONDS = 10.0  # ...and span this long
QUERY_TIMEOUT_SECONDS = 5.0
SCRAPE_TIMEOUT_SECONDS = 10.0
MID_SECOND = 0.5  # the second scrape of a sample: this long after the first began

_COUNT = "SELECT count(*) FROM tickgate_runs"
_ESTIMATE = "SELECT reltuples::bigint FROM pg_class WHERE relname = 'tickgate_runs'"
_JOBS = "SELECT count(*) FROM tickgate_jobs"
_WINDOW = """
SELECT count(*) FILTER (WHERE status <> 'skipped') AS runs,
       count(*) FILTER (WHERE status = 'skipped') AS skips,
       percentile_cont(ARRAY[0.5, 0.99]) WITHIN GROUP (
           ORDER BY extract(epoch FROM started_at - scheduled_for))
           FILTER (WHERE status <> 'skipped') AS lateness
FROM tickgate_runs
WHERE scheduled_for >= to_timestamp($1) AND scheduled_for < to_timestamp($2)
  AND trigger <> 'manual'
"""


async def _ledger(url: str, now: float) -> dict[str, Any]:
    connection = await asyncpg.connect(url, timeout=QUERY_TIMEOUT_SECONDS)
    try:
        try:
            rows, method = await connection.fetchval(_COUNT, timeout=QUERY_TIMEOUT_SECONDS), "count"
        except TimeoutError:
            rows, method = await connection.fetchval(_ESTIMATE), "reltuples"
        jobs = await connection.fetchval(_JOBS, timeout=QUERY_TIMEOUT_SECONDS)
        window = (now - LAG_SECONDS - SPAN_SECONDS, now - LAG_SECONDS)
        found = await connection.fetchrow(_WINDOW, *window, timeout=QUERY_TIMEOUT_SECONDS)
    finally:
        await connection.close()
    assert found is not None  # an aggregate always has its row
    lateness = found["lateness"] or [None, None]
    return {
        "ledger_rows": rows,
        "ledger_rows_method": method,
        "jobs_in_database": jobs,
        "runs_per_s": round(found["runs"] / SPAN_SECONDS, 1),
        "skips_per_s": round(found["skips"] / SPAN_SECONDS, 2),
        "lateness_p50_ms": _ms(lateness[0]),
        "lateness_p99_ms": _ms(lateness[1]),
    }


def _ms(seconds: float | None) -> float | None:
    return None if seconds is None else round(seconds * 1000, 1)


def ledger_figures(url: str, now: float) -> dict[str, Any]:
    try:
        return asyncio.run(_ledger(url, now))
    except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as error:
        return {"ledger_error": repr(error)[:200]}


def scrape(client: httpx.Client, slot: Slot) -> tuple[float | None, int | None]:
    """How long `/metrics` took (ms) and its size (bytes); None when it did not answer."""
    if not slot.alive:
        return None, None
    began = time.perf_counter()
    try:
        response = client.get(f"{slot.url}/metrics")
    except httpx.HTTPError:
        return None, None
    elapsed = (time.perf_counter() - began) * 1000
    if response.status_code != 200:
        return None, None
    return round(elapsed, 1), len(response.content)


class Sampler(Worker):
    def __init__(self, slots: Sequence[Slot], database_url: str, began: float) -> None:
        super().__init__("soak-sampler")
        self._slots = slots
        self._url = database_url
        self._began = began
        self.samples: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def snapshot(self) -> list[dict[str, Any]]:
        with self._lock:
            return list(self.samples)

    def run(self) -> None:
        psutil.cpu_percent(interval=None)
        with httpx.Client(timeout=SCRAPE_TIMEOUT_SECONDS) as client:
            while not self._halt.wait(self._until_next()):
                sample = self._sample(client)
                with self._lock:
                    self.samples.append(sample)

    def _until_next(self) -> float:
        """Samples fall on whole multiples of the interval from the run's start."""
        return INTERVAL_SECONDS - (time.time() - self._began) % INTERVAL_SECONDS

    def _sample(self, client: httpx.Client) -> dict[str, Any]:
        now = time.time()
        rss = [
            tree_rss_bytes(s.replica.pid) if s.alive and s.replica else None for s in self._slots
        ]
        scrapes = [scrape(client, slot) for slot in self._slots]
        time.sleep(max(0.0, now + MID_SECOND - time.time()))
        between = [scrape(client, slot)[0] for slot in self._slots]
        return {
            "at": round(now, 3),
            "t": round(now - self._began, 1),
            "runner": [s.incarnations[-1].runner_id if s.alive else None for s in self._slots],
            "rss_mib": [None if b is None else round(b / 2**20, 1) for b in rss],
            "scrape_ms": [ms for ms, _ in scrapes],
            "scrape_bytes": [size for _, size in scrapes],
            "scrape_mid_ms": between,
            "box_cpu_percent": psutil.cpu_percent(interval=None),
            "load_average": round(psutil.getloadavg()[0], 2),
            **ledger_figures(self._url, now),
        }
